// ct_tcp.cc: TCP connection tracking with sequence-window checks.
//
// Each side's sequence space is tracked as in Guido van Rooij's "Real
// Stateful TCP Packet Filtering in IP Filter" (the model pf and Open vSwitch
// also use): seqlo is the highest sequence number a side has sent, seqhi
// the highest the other side's acknowledgements and window let it send, and
// max_win the largest window it has advertised. A packet is accepted when
//   * it ends inside the window the peer granted (seqhi),
//   * it starts no more than a window before what was already sent
//     (retransmissions),
//   * it acknowledges neither data never sent nor data more than a window
//     back (with a fudge factor of 64 KiB + 1500 bytes), and
//   * a RST carries the expected sequence number (+-1).
// That is lenient enough for real stacks (retransmissions, window scaling,
// SACK-less recovery) and strict enough that injected or stale segments are
// +inv. Right after the handshake or the close the checks are looser (no
// window yet, or packets of a connection that is going away), as in those
// trackers, but such packets do not refresh the connection's timeout.
//
// States advance SYN_SENT -> ESTABLISHED (the other side acknowledged)
// -> CLOSING (sent FIN) -> FIN_WAIT_2 (FIN acknowledged); a RST moves both
// sides to TIME_WAIT. A SYN once both sides are past FIN_WAIT_2 starts a new
// connection. Timeouts: established (default 2 h 4 min, RFC 5382 REQ-5) once
// both sides are established and neither is closing, transitory (4 min)
// otherwise.
#include <algorithm>

#include "ct_proto.h"

namespace dpu {
namespace {


inline bool seq_gt(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) > 0; }
inline bool seq_geq(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) >= 0; }

// Flag combinations no stack sends: SYN with RST or FIN, and anything but a
// SYN or a RST without ACK (FIN alone, a null or Christmas-tree scan).
bool flags_invalid(uint16_t f) {
  if (f & kTcpSyn) return (f & (kTcpRst | kTcpFin)) != 0;
  if (f & kTcpRst) return false;
  return !(f & kTcpAck);
}

bool tcp_valid_new(const CtPacket& p) {
  return !flags_invalid(p.tcp_flags) && (p.tcp_flags & (kTcpSyn | kTcpAck)) == kTcpSyn;
}

void tcp_init(Conn* c, const CtPacket& p) {
  TcpTrack& t = c->tcp;
  t = TcpTrack{};
  t.seqlo[0] = p.seq;
  t.seqhi[0] = p.seq + p.payload + 1 + ((p.tcp_flags & kTcpSyn) ? 1 : 0) + ((p.tcp_flags & kTcpFin) ? 1 : 0);
  // A SYN's window is never scaled (RFC 7323 2.2); it is kept in the units
  // its side's scaled windows will use, rounded up (as pf and Open vSwitch),
  // and shifted back if the responder does not agree to scaling.
  t.max_win[0] = p.win ? p.win : 1;
  if (p.wscale >= 0) {
    t.wscale[0] = static_cast<uint8_t>(p.wscale | kTcpWscaleSet);
    t.max_win[0] = (t.max_win[0] + (1u << p.wscale) - 1) >> p.wscale;
  }
  t.state[0] = TCPS_SYN_SENT;
  t.state[1] = TCPS_CLOSED;
  t.seqhi[1] = 1;  // nothing known of the responder yet
  t.max_win[1] = 1;
  c->tmo = TM_TCP_TRANSITORY;
}

uint8_t timeout_class(const TcpTrack& t, int s, int d) {
  if (t.state[s] < TCPS_ESTABLISHED || t.state[d] < TCPS_ESTABLISHED) return TM_TCP_TRANSITORY;
  if (t.state[s] >= TCPS_CLOSING || t.state[d] >= TCPS_CLOSING) return TM_TCP_TRANSITORY;
  return TM_TCP_ESTABLISHED;
}

CtUpdate tcp_update(Conn* c, const CtPacket& p, bool reply) {
  TcpTrack& t = c->tcp;
  const int s = reply ? 1 : 0, d = 1 - s;  // sender, receiver
  const uint16_t f = p.tcp_flags;
  if (flags_invalid(f)) return CtUpdate::INVALID;

  if ((f & (kTcpSyn | kTcpAck)) == kTcpSyn) {
    if (t.state[s] >= TCPS_FIN_WAIT_2 && t.state[d] >= TCPS_FIN_WAIT_2) return CtUpdate::NEW;  // port reuse
    if (t.state[s] <= TCPS_SYN_SENT) {  // a retransmitted SYN: still a new connection
      t.state[s] = TCPS_SYN_SENT;
      c->tmo = TM_TCP_TRANSITORY;
      return CtUpdate::VALID_NEW;
    }
  }

  uint8_t sws = 0, dws = 0;
  if (!(f & kTcpSyn) && (t.wscale[s] & kTcpWscaleSet) && (t.wscale[d] & kTcpWscaleSet)) {
    sws = t.wscale[s] & kTcpWscaleMask;
    dws = t.wscale[d] & kTcpWscaleMask;
  }
  uint32_t win = p.win;
  const uint32_t orig_seq = p.seq;
  uint32_t seq = p.seq, ack = p.ack;
  uint32_t end = seq + p.payload + ((f & kTcpSyn) ? 1 : 0) + ((f & kTcpFin) ? 1 : 0);
  bool check_ackskew = true;

  if (t.state[s] < TCPS_SYN_SENT) {
    // The first packet from this side (normally the SYN-ACK). The peer has
    // only sent its SYN, whose window (its max_win, see tcp_init) is what
    // may come back now.
    if ((f & kTcpSyn) && (t.wscale[d] & kTcpWscaleSet)) {
      if (p.wscale >= 0) {  // both sides scale (RFC 7323)
        t.wscale[s] = static_cast<uint8_t>(p.wscale | kTcpWscaleSet);
        sws = static_cast<uint8_t>(p.wscale);
        win = (win + (1u << sws) - 1) >> sws;  // store windows in scaled units
        dws = t.wscale[d] & kTcpWscaleMask;
      } else {  // the option was not agreed: nobody scales, the SYN's window is bytes again
        t.max_win[d] <<= t.wscale[d] & kTcpWscaleMask;
        t.wscale[d] = 0;
      }
    }
    uint32_t room = t.max_win[d] << dws;
    t.seqlo[s] = seq;
    t.state[s] = TCPS_SYN_SENT;
    room = std::max<uint32_t>(1, room);
    if (t.seqhi[s] == 1 || seq_geq(end + room, t.seqhi[s])) {
      t.seqhi[s] = end + room;
      check_ackskew = false;  // picking the connection up: no acknowledgement history yet
    }
    if (win > t.max_win[s]) t.max_win[s] = win;
  }

  if (!(f & kTcpAck)) ack = t.seqlo[d];  // nothing acknowledged: passes the skew check
  else if (ack == 0 && (f & (kTcpAck | kTcpRst)) == (kTcpAck | kTcpRst)) ack = t.seqlo[d];  // stacks that leave it 0
  if (seq == end) {  // no data: ease the sequence checks
    seq = t.seqlo[s];
    end = seq;
  }
  const int64_t ackskew = check_ackskew ? static_cast<int32_t>(t.seqlo[d] - ack) : 0;
  const bool in_window = seq_geq(t.seqhi[s], end) &&
                         seq_geq(seq, t.seqlo[s] - (t.max_win[d] << dws)) && ackskew >= -kTcpMaxAckWindow &&
                         ackskew <= (kTcpMaxAckWindow << sws) &&
                         (!(f & kTcpRst) || orig_seq == t.seqlo[s] || orig_seq == t.seqlo[s] + 1 ||
                          orig_seq + 1 == t.seqlo[s]);
  auto slide = [&] {
    if (win > t.max_win[s]) t.max_win[s] = win;
    if (seq_gt(end, t.seqlo[s])) t.seqlo[s] = end;
    uint32_t granted = win << sws;
    if (seq_geq(ack + granted, t.seqhi[d])) t.seqhi[d] = ack + std::max<uint32_t>(granted, 1);
  };
  if (in_window) {
    slide();
    if ((f & kTcpSyn) && t.state[s] < TCPS_SYN_SENT) t.state[s] = TCPS_SYN_SENT;
    if ((f & kTcpFin) && t.state[s] < TCPS_CLOSING) t.state[s] = TCPS_CLOSING;
    if (f & kTcpAck) {
      if (t.state[d] == TCPS_SYN_SENT) t.state[d] = TCPS_ESTABLISHED;
      else if (t.state[d] == TCPS_CLOSING) t.state[d] = TCPS_FIN_WAIT_2;
    }
    if (f & kTcpRst) t.state[s] = t.state[d] = TCPS_TIME_WAIT;
    c->tmo = timeout_class(t, s, d);
    return CtUpdate::VALID;
  }
  // Looser: the other side has not spoken yet (SYNs shotgunned, a flushed
  // table), or the connection is going away. Tracked, but not refreshed.
  const bool loose_phase =
      t.state[d] < TCPS_SYN_SENT || t.state[d] >= TCPS_FIN_WAIT_2 || t.state[s] >= TCPS_FIN_WAIT_2;
  if (loose_phase && seq_geq(t.seqhi[s] + kTcpMaxAckWindow, end) && seq_geq(seq, t.seqlo[s] - kTcpMaxAckWindow)) {
    slide();
    if ((f & kTcpFin) && t.state[s] < TCPS_CLOSING) t.state[s] = TCPS_CLOSING;
    if (f & kTcpRst) t.state[s] = t.state[d] = TCPS_TIME_WAIT;
    return CtUpdate::VALID_LOOSE;
  }
  return CtUpdate::INVALID;
}

const char* const kTcpStateNames[] = {"CLOSED",     "LISTEN",     "SYN_SENT", "SYN_RECV",   "ESTABLISHED", "CLOSE_WAIT",
                                      "FIN_WAIT_1", "CLOSING",    "LAST_ACK", "FIN_WAIT_2", "TIME_WAIT"};

// One state for both sides, as dpctl/dump-conntrack prints it: the further
// side's, with FIN_WAIT_2 shown as TIME_WAIT and SYN_RECV as ESTABLISHED.
const char* tcp_state(const Conn* c) {
  uint8_t st = std::max(c->tcp.state[0], c->tcp.state[1]);
  if (st == TCPS_FIN_WAIT_2) st = TCPS_TIME_WAIT;
  if (st == TCPS_SYN_RECV) st = TCPS_ESTABLISHED;
  return st <= TCPS_TIME_WAIT ? kTcpStateNames[st] : "UNKNOWN";
}

}  // namespace

const CtProto kCtTcp = {tcp_valid_new, tcp_init, tcp_update, tcp_state};

uint64_t ct_tcp_selftest(uint64_t iterations, uint64_t seed, uint64_t* fast, uint64_t* refused) {
  // Connections mostly ESTABLISHED both ways, with windows from 1 byte to
  // 2^32 - 1, scaled on both, one or no side, near the sequence space's wrap;
  // segments with every flag mix ct_tcp_fast() tells apart (ECE, CWR and NS
  // included), aimed at each bound of the window check to within one: the
  // end of the granted window, the oldest sequence number a retransmission
  // may start at, both ends of the acknowledgement skew, and where the slide
  // starts moving the peer's window. Each is decided by ct_tcp_update() and
  // by tcp_update() on copies of one connection.
  XorShift rnd{seed | 1};
  static const uint16_t kFlags[] = {kTcpAck, kTcpAck | kTcpPsh, kTcpAck | kTcpUrg, kTcpAck | 0x40, kTcpAck | 0x80,
                                    kTcpAck | 0x100, kTcpAck | kTcpFin, kTcpAck | kTcpRst, kTcpSyn | kTcpAck,
                                    kTcpSyn, kTcpRst, 0};
  static const uint8_t kStates[] = {TCPS_ESTABLISHED, TCPS_ESTABLISHED, TCPS_ESTABLISHED, TCPS_ESTABLISHED,
                                    TCPS_SYN_SENT,    TCPS_CLOSING,     TCPS_FIN_WAIT_2,  TCPS_CLOSED};
  static const uint8_t kScales[] = {0, kTcpWscaleSet, kTcpWscaleSet | 1, kTcpWscaleSet | 7, kTcpWscaleSet | 14, 14};
  static const uint32_t kWins[] = {1, 2, 1000, 65535, 65535u << 14, 0x7fffffffu, 0xffffffffu};
  static const uint32_t kBases[] = {0, 1, 0x7fffffffu, 0x80000000u, 0xffffffffu};
  auto pick = [&](const auto& a) { return a[rnd() % (sizeof a / sizeof a[0])]; };
  auto off1 = [&]() { return static_cast<uint32_t>(rnd() % 3) - 1u; };  // -1, 0 or +1
  uint64_t mismatches = 0;
  for (uint64_t it = 0; it < iterations; it++) {
    TcpTrack t{};
    for (int k = 0; k < 2; k++) {
      t.seqlo[k] = rnd() % 2 ? pick(kBases) + off1() : static_cast<uint32_t>(rnd());
      t.max_win[k] = rnd() % 2 ? pick(kWins) : 1 + static_cast<uint32_t>(rnd() % 65535);
      const uint32_t span = rnd() % 4 ? static_cast<uint32_t>(rnd() % 131072) : static_cast<uint32_t>(rnd());
      t.seqhi[k] = rnd() % 8 ? t.seqlo[k] + span : t.seqlo[k] - span;  // now and then behind seqlo
      t.wscale[k] = pick(kScales);
      t.state[k] = pick(kStates);
    }
    const bool reply = rnd() & 1;
    const int s = reply ? 1 : 0, d = 1 - s;
    const bool scaled = (t.wscale[s] & kTcpWscaleSet) && (t.wscale[d] & kTcpWscaleSet);
    const uint8_t sws = scaled ? t.wscale[s] & kTcpWscaleMask : 0, dws = scaled ? t.wscale[d] & kTcpWscaleMask : 0;
    CtPacket p;
    p.tcp_flags = pick(kFlags);
    const uint32_t payloads[] = {0, 0, 1, 1460, static_cast<uint32_t>(rnd() % 70000)};
    p.payload = pick(payloads);
    switch (rnd() % 4) {
      case 0: p.seq = t.seqhi[s] - p.payload + off1(); break;                  // the window's end
      case 1: p.seq = t.seqlo[s] - (t.max_win[d] << dws) + off1(); break;      // the oldest start
      case 2: p.seq = t.seqlo[s] + off1(); break;
      default: p.seq = static_cast<uint32_t>(rnd());
    }
    switch (rnd() % 4) {
      case 0: p.ack = t.seqlo[d] + static_cast<uint32_t>(kTcpMaxAckWindow) + off1(); break;         // skew -max
      case 1: p.ack = t.seqlo[d] - static_cast<uint32_t>(kTcpMaxAckWindow << sws) + off1(); break;  // skew +max
      case 2: p.ack = t.seqlo[d] + off1(); break;
      default: p.ack = static_cast<uint32_t>(rnd());
    }
    const uint16_t wins[] = {0, 1, 65535, static_cast<uint16_t>(rnd())};
    p.win = pick(wins);
    if (rnd() % 3 == 0) t.seqhi[d] = p.ack + (uint32_t{p.win} << sws) + off1();  // where the slide starts
    p.wscale = rnd() % 2 ? -1 : static_cast<int8_t>(rnd() % 15);
    Conn a, b, c;
    a.tcp = b.tcp = c.tcp = t;
    a.tmo = b.tmo = c.tmo = static_cast<uint8_t>(rnd() % 2);
    const CtUpdate ua = ct_tcp_update(&a, p, reply), ub = tcp_update(&b, p, reply);
    if (ua != ub || std::memcmp(&a.tcp, &b.tcp, sizeof a.tcp) != 0 || a.tmo != b.tmo) mismatches++;
    CtUpdate uc;
    if (ct_tcp_fast(&c, p, reply, &uc)) {
      ++*fast;
    } else if ((p.tcp_flags & (kTcpSyn | kTcpFin | kTcpRst | kTcpAck)) == kTcpAck &&
               t.state[0] == TCPS_ESTABLISHED && t.state[1] == TCPS_ESTABLISHED) {
      ++*refused;
      if (std::memcmp(&c.tcp, &t, sizeof t) != 0 || c.tmo != a.tmo) mismatches++;  // refused: nothing changed
    }
  }
  return mismatches;
}

}  // namespace dpu
