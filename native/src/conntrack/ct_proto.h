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

enum CtTimeoutClass : uint8_t { TM_TCP_TRANSITORY, TM_TCP_ESTABLISHED, TM_UDP, TM_ICMP, TM_COUNT };

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

}  // namespace dpu
