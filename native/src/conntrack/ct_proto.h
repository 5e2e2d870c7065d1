// ct_proto.h: per-protocol connection tracking behind a small table of
// functions (as Open vSwitch's ct_l4_proto): TCP in ct_tcp.cc, UDP and ICMP
// echo in ct_other.cc.
//
//   valid_new  may this packet start a connection? (TCP: a SYN without ACK;
//              ICMP: a query such as an echo request; UDP: anything)
//   init       the state of a connection created by that packet
//   update     a packet of an existing connection, in the original (reply =
//              false) or reply direction: VALID (+est), VALID_NEW (+new: the
//              connection has not been answered yet), VALID_LOOSE (+est,
//              no timeout refresh), NEW (the old
//              connection is over and this packet starts another: TCP SYN
//              after both sides closed) or INVALID (+inv, state unchanged)
//   state      protoinfo text for dumps (TCP: ESTABLISHED...), or nullptr
//
// Each sets the connection's timeout class; conntrack.cc turns it into an
// expiry time. Callers hold the connection's lock for TCP (updates of UDP
// and ICMP connections are single atomic stores).
#pragma once

#include <cstdint>

#include "conn.h"
#include "ct_packet.h"

namespace dpu {

enum CtTimeoutClass : uint8_t {
#define DPU_CT_TIMEOUT(e, name, seconds, help) e,
#include "dpu/ct_timeouts.def"
#undef DPU_CT_TIMEOUT
  TM_COUNT
};

// TCP states of one side, in the order the window tracker advances them (the
// names dumps print, as OVS and Linux do).
enum TcpState : uint8_t {
  TCPS_CLOSED, TCPS_LISTEN, TCPS_SYN_SENT, TCPS_SYN_RECV, TCPS_ESTABLISHED, TCPS_CLOSE_WAIT, TCPS_FIN_WAIT_1,
  TCPS_CLOSING, TCPS_LAST_ACK, TCPS_FIN_WAIT_2, TCPS_TIME_WAIT,
};

// VALID_LOOSE: valid, but accepted only by the looser checks around the
// handshake and the close: the state is followed, the timeout not refreshed.
enum class CtUpdate : uint8_t { VALID, VALID_LOOSE, VALID_NEW, NEW, INVALID };

struct CtProto {
  bool (*valid_new)(const CtPacket& p);
  void (*init)(Conn* c, const CtPacket& p);
  CtUpdate (*update)(Conn* c, const CtPacket& p, bool reply);
  const char* (*state)(const Conn* c);
};

const CtProto& ct_proto(uint8_t ip_proto);  // TCP, UDP, ICMP/ICMPv6 (ct_packet refuses the rest)

extern const CtProto kCtTcp, kCtUdp, kCtIcmp;

// kCtUdp.update and kCtIcmp.update (every protocol but TCP), inline for the
// stage: a call there costs the caller's live registers as stores, and the
// stage runs at about one store a cycle (docs/performance.md). A reply makes
// the connection established (state 1); until then a packet is VALID_NEW.
__attribute__((always_inline)) inline CtUpdate ct_other_update(Conn* c, bool reply) {
  if (reply && c->other_state() == 0) c->set_other_state(1);
  return c->other_state() ? CtUpdate::VALID : CtUpdate::VALID_NEW;
}

// TCP window tracking's constants (ct_tcp.cc): a side's wscale byte holds
// its shift and whether it was agreed; an acknowledgement may lag or lead by
// up to a window plus this fudge.
constexpr uint8_t kTcpWscaleSet = 0x80, kTcpWscaleMask = 0x0f;
constexpr int64_t kTcpMaxAckWindow = 0xffff + 1500;

// ct_tcp_update() against tcp_update() on random connections and segments
// aimed at every bound of the window check (ct_tcp.cc): the disagreements
// (result, TCP state or timeout class). *fast counts the segments
// ct_tcp_fast() decided, *refused those it left to tcp_update() although
// their flags and states were its case (tests/test_selftest.py).
uint64_t ct_tcp_selftest(uint64_t iterations, uint64_t seed, uint64_t* fast, uint64_t* refused);

// kCtTcp.update's commonest case in a straight line, inline: an ACK (with
// or without data) carrying no SYN, FIN or RST, between two sides that are
// both ESTABLISHED. Then the flags are valid, no state moves and the timeout
// class stays established, so what is left of tcp_update() is its window
// check and the window's slide, which this repeats exactly. True with *u
// set when it decided; false, having changed nothing, for every other
// packet and for one outside the window, which tcp_update() decides (the
// same way). Caller holds c's lock.
__attribute__((always_inline)) inline bool ct_tcp_fast(Conn* c, const CtPacket& p, bool reply, CtUpdate* u) {
  TcpTrack& t = c->tcp;
  const int s = reply ? 1 : 0, d = 1 - s;  // sender, receiver
  if ((p.tcp_flags & (kTcpSyn | kTcpFin | kTcpRst | kTcpAck)) != kTcpAck || t.state[s] != TCPS_ESTABLISHED ||
      t.state[d] != TCPS_ESTABLISHED)
    return false;
  const bool scaled = (t.wscale[s] & kTcpWscaleSet) && (t.wscale[d] & kTcpWscaleSet);
  const uint8_t sws = scaled ? t.wscale[s] & kTcpWscaleMask : 0, dws = scaled ? t.wscale[d] & kTcpWscaleMask : 0;
  const uint32_t win = p.win, ack = p.ack;
  uint32_t seq = p.seq, end = p.seq + p.payload;
  if (seq == end) seq = end = t.seqlo[s];  // no data: ease the sequence checks
  const int64_t ackskew = static_cast<int32_t>(t.seqlo[d] - ack);
  if (static_cast<int32_t>(t.seqhi[s] - end) < 0 ||
      static_cast<int32_t>(seq - (t.seqlo[s] - (t.max_win[d] << dws))) < 0 || ackskew < -kTcpMaxAckWindow ||
      ackskew > (kTcpMaxAckWindow << sws))
    return false;
  if (win > t.max_win[s]) t.max_win[s] = win;
  if (static_cast<int32_t>(end - t.seqlo[s]) > 0) t.seqlo[s] = end;
  const uint32_t granted = win << sws;
  if (static_cast<int32_t>(ack + granted - t.seqhi[d]) >= 0) t.seqhi[d] = ack + (granted ? granted : 1);
  c->tmo = TM_TCP_ESTABLISHED;
  *u = CtUpdate::VALID;
  return true;
}

// kCtTcp.update, its commonest case inline (ct_tcp_fast).
__attribute__((always_inline)) inline CtUpdate ct_tcp_update(Conn* c, const CtPacket& p, bool reply) {
  CtUpdate u;
  return ct_tcp_fast(c, p, reply, &u) ? u : kCtTcp.update(c, p, reply);
}

}  // namespace dpu
