// execute.h: stage "execute": run a megaflow's datapath actions on a packet.
//
// Uses:  the packet, its parsed offsets (l3_ofs/l4_ofs), its flow key (for
//        hashes and ICMP replies), and the DpAction list (dp_actions.h).
// Sets:  header bytes (masked writes with RFC 1624 incremental checksum updates
//        of IPv4 header, TCP, UDP and ICMPv6 checksums; SCTP's CRC32c is
//        patched), VLAN tags, VXLAN headers (push and pop: vxlan.cc), and the
//        per-arrival output/drop bookkeeping (Arrivals, stage.h).
//        Which checksums a write touches, and when a header is too short to
//        be written, follow Open vSwitch 3.1's datapath (lib/odp-execute.c,
//        lib/packets.c); parse.h sets the offsets accordingly.
// Next:  the transmit stage (transmit.h), the recirculation list (TNL_POP),
//        or the conntrack stage (CT, ct_stage.h).
//
// The last action that sends the packet takes the buffer itself; earlier ones
// send copies. A UDP checksum of 0 over IPv4 means "none" and stays 0; a
// recomputed UDP checksum of 0 is sent as 0xffff. Never allocates except for
// packet copies from the worker's pool, never throws. Worker thread only.
// Header-only (but for the CRC32c of SCTP, the clones' recursion and VXLAN,
// in execute.cc and vxlan.cc) so the batch loop inlines the executor.
#pragma once

#include <algorithm>

#include "checksum.h"
#include "ct_stage.h"
#include "stage.h"
#include "transmit.h"

namespace dpu {

uint32_t crc32c(const uint8_t* p, size_t n);  // execute.cc

namespace exec {

// End of the IP datagram whose header is at l3_ofs (the Ethertype in front of
// the header says which IP); what follows is Ethernet padding. Parsing
// guaranteed that it lies within the frame.
inline uint32_t ip_end(const Packet* p) {
  const uint8_t* ip = p->data() + p->l3_ofs;
  const uint32_t end = load16(ip - 2) == be16(kEthIpv6) ? p->l3_ofs + 40u + be16(load16(ip + 4))
                                                         : p->l3_ofs + static_cast<uint32_t>(be16(load16(ip + 2)));
  return std::min<uint32_t>(end, p->len);
}

// Bytes of the L4 header region (to the end of the datagram), 0 if none.
inline uint32_t l4_size(const Packet* p) {
  if (p->l4_ofs == kNoOffset || p->l3_ofs == kNoOffset) return 0;
  const uint32_t end = ip_end(p);
  return end > p->l4_ofs ? end - p->l4_ofs : 0;
}

// The TCP/UDP/ICMPv6 checksum that covers the pseudo-header, or nullptr: as
// OVS's packet_set_ipv4_addr / packet_update_csum128, by the protocol and the
// length of the L4 region, whether or not the L4 header parsed (a TCP header
// with a bad data offset still has its checksum updated).
inline uint8_t* pseudo_csum(Packet* p, uint8_t proto, bool* is_udp) {
  const uint32_t n = l4_size(p);
  uint8_t* l4 = p->data() + p->l4_ofs;
  *is_udp = false;
  if (proto == kIpTcp && n >= 20) return l4 + 16;
  if (proto == kIpUdp && n >= 8) {
    *is_udp = true;
    return l4 + 6;
  }
  if (proto == kIpIcmpv6 && n >= 4) return l4 + 2;
  return nullptr;
}

// IPv6: the protocol whose checksum an address change updates, found as OVS's
// packet_rh_present walks the extension headers (from the packet, not the
// flow); 0 when nothing is updated: a routing header with segments left (the
// checksum covers the final destination), a fragment other than a first one
// (offset 0, M set), or headers that do not fit.
inline uint8_t ipv6_csum_proto(const Packet* p) {
  if (p->l4_ofs == kNoOffset) return 0;
  const uint8_t* d = p->data();
  uint32_t pos = p->l3_ofs + 40u;
  const uint32_t stop = p->l4_ofs;
  uint8_t nh = d[p->l3_ofs + 6];
  bool recalc = true;
  while (nh == 0 || nh == 43 || nh == 60 || nh == 51 || nh == 44) {
    if (pos + 8 > stop) return 0;
    const uint8_t* e = d + pos;
    uint32_t len;
    if (nh == 51) {
      len = (e[1] + 2u) * 4;
    } else if (nh == 44) {
      const uint16_t offlg = be16(load16(e + 2));
      recalc = !(offlg & 0xfff8) && (offlg & 1);
      len = 8;
    } else {
      if (nh == 43 && e[3] > 0) return 0;
      len = (e[1] + 1u) * 8;
    }
    nh = e[0];
    if (pos + len > stop) return 0;
    pos += len;
  }
  return recalc ? nh : 0;
}

// Masked write of a whole window when no checksum depends on it (Ethernet,
// ARP, VLAN): a plain copy when the mask is full, else whole words at a time.
// (always_inline, as apply_window: see PacketPool::take.)
__attribute__((always_inline)) inline void masked_copy(uint8_t* h, const DpAction& a) {
  size_t i = 0;
  const size_t n = a.len;
  if (a.full) {
    for (; i + 8 <= n; i += 8) std::memcpy(h + i, a.set.val + i, 8);
    if (i + 4 <= n) {
      std::memcpy(h + i, a.set.val + i, 4);
      i += 4;
    }
    if (i < n) std::memcpy(h + i, a.set.val + i, 2);
    return;
  }
  for (; i + 8 <= n; i += 8) {
    uint64_t d, v, m;
    std::memcpy(&d, h + i, 8);
    std::memcpy(&v, a.set.val + i, 8);
    std::memcpy(&m, a.set.msk + i, 8);
    d = (d & ~m) | (v & m);
    std::memcpy(h + i, &d, 8);
  }
  for (; i < n; i += 2) {
    uint16_t d = load16(h + i), v = load16(a.set.val + i), m = load16(a.set.msk + i);
    store16(h + i, static_cast<uint16_t>((d & ~m) | (v & m)));
  }
}

// Masked write of the changed 16-bit words of a set window at `h`; keeps the
// checksum at `csum` (if any) and, for address words, the L4 checksum at
// `l4c` (if any) up to date, one RFC 1624 step per changed word.
__attribute__((always_inline)) inline void apply_window(uint8_t* h, const DpAction& a, uint8_t* csum, uint8_t* l4c,
                                                        bool udp) {
  uint16_t hc = csum ? load16(csum) : 0;
  uint16_t lc = l4c ? load16(l4c) : 0;
  if (udp && lc == 0) l4c = nullptr;  // no UDP checksum (IPv4): stays 0
  for (uint32_t w = a.words; w; w &= w - 1) {
    int k = __builtin_ctz(w);
    uint8_t* at = h + 2 * k;
    uint16_t old = load16(at);
    uint16_t m = load16(a.set.msk + 2 * k), v = load16(a.set.val + 2 * k);
    uint16_t nw = static_cast<uint16_t>((old & ~m) | (v & m));
    store16(at, nw);
    if (csum) hc = csum_replace16(hc, old, nw);
    if (l4c && (a.addr_words >> k & 1)) lc = csum_replace16(lc, old, nw);
  }
  if (csum) store16(csum, hc);
  if (l4c) store16(l4c, udp && lc == 0 ? 0xffff : lc);
}

inline void set_ipv4(Packet* p, const DpAction& a) {
  if (p->l3_ofs == kNoOffset) return;
  uint8_t* ip = p->data() + p->l3_ofs;
  uint8_t* l4c = nullptr;
  bool udp = false;
  // (l4_ofs is unset for a later fragment: its payload is left alone, where
  // OVS 3.1 would patch the bytes at a checksum's offset; README.)
  if (a.addr_words && p->l4_ofs != kNoOffset) l4c = pseudo_csum(p, ip[9], &udp);
  apply_window(ip + a.ofs, a, ip + 10, l4c, udp);
}

inline void set_ipv6(Packet* p, const DpAction& a) {
  if (p->l3_ofs == kNoOffset) return;
  uint8_t* ip = p->data() + p->l3_ofs;
  uint8_t* l4c = nullptr;
  bool udp = false;
  if (a.addr_words) {
    const uint8_t proto = ipv6_csum_proto(p);
    if (proto) l4c = pseudo_csum(p, proto, &udp);
  }
  apply_window(ip + a.ofs, a, nullptr, l4c, udp);
}

// Ports, as OVS's odp_set_tcp/udp/sctp: TCP needs a whole header (data offset
// >= 5 and within the datagram), UDP 8 bytes, SCTP 12. ICMP type and code
// (the window's first word) need the header parsing reads them from: 4 bytes
// of ICMP, 8 of ICMPv6; its checksum is updated as a port rewrite's (the
// pseudo-header ICMPv6's covers does not change). An ICMP checksum that comes
// to 0 is sent as 0xffff: RFC 1624 eqn. 3 gives 0 for a message of zeros
// (an echo reply with id 0, sequence 0 and no data), where only 0xffff is
// right, and for any other message both are.
inline void set_l4(Packet* p, const DpAction& a) {
  const uint32_t len = l4_size(p);
  if (!len) return;
  uint8_t* l4 = p->data() + p->l4_ofs;
  if (a.proto == kIpIcmp || a.proto == kIpIcmpv6) {
    if (len < (a.proto == kIpIcmp ? 4u : 8u)) return;
    apply_window(l4 + a.ofs, a, l4 + 2, nullptr, false);
    if (a.proto == kIpIcmp && load16(l4 + 2) == 0) store16(l4 + 2, 0xffff);
    return;
  }
  if (a.proto == kIpSctp) {
    if (len < 12) return;
    // As OVS: the CRC32c (stored little-endian) is patched by the difference
    // between the correct CRCs before and after, so a wrong one stays wrong.
    uint32_t stored, before, after;
    std::memcpy(&stored, l4 + 8, 4);
    std::memset(l4 + 8, 0, 4);
    before = crc32c(l4, len);
    apply_window(l4 + a.ofs, a, nullptr, nullptr, false);
    after = crc32c(l4, len);
    stored ^= before ^ after;
    std::memcpy(l4 + 8, &stored, 4);
    return;
  }
  uint8_t* csum;
  if (a.proto == kIpTcp) {
    const uint32_t doff = (l4[12] >> 4) * 4u;
    if (len < 20 || doff < 20 || doff > len) return;
    csum = l4 + 16;
  } else {
    if (len < 8) return;
    csum = l4 + 6;
    if (load16(csum) == 0) csum = nullptr;  // no UDP checksum (IPv4): stays 0
  }
  const uint16_t before = csum ? load16(csum) : 0;
  apply_window(l4 + a.ofs, a, csum, nullptr, false);
  if (a.proto == kIpUdp && csum && before != 0 && load16(csum) == 0) store16(csum, 0xffff);
}

inline void set_arp(Packet* p, const DpAction& a) {
  if (p->l3_ofs == kNoOffset || p->len < p->l3_ofs + 28u) return;
  masked_copy(p->data() + p->l3_ofs + a.ofs, a);
}

inline void shift_offsets(Packet* p, int delta) {
  if (p->l3_ofs != kNoOffset) p->l3_ofs = static_cast<uint16_t>(p->l3_ofs + delta);
  if (p->l4_ofs != kNoOffset) p->l4_ofs = static_cast<uint16_t>(p->l4_ofs + delta);
}

inline bool push_vlan(Packet* p, uint16_t tpid, uint16_t tci) {
  if (p->len < 12 || p->data_off < 4) return false;
  p->data_off = static_cast<uint16_t>(p->data_off - 4);
  p->len = static_cast<uint16_t>(p->len + 4);
  uint8_t* d = p->data();
  std::memmove(d, d + 4, 12);
  uint16_t t = be16(tpid), c = be16(tci);
  std::memcpy(d + 12, &t, 2);
  std::memcpy(d + 14, &c, 2);
  shift_offsets(p, 4);
  return true;
}

inline void pop_vlan(Packet* p) {
  uint8_t* d = p->data();
  if (p->len < 18) return;
  uint16_t t = be16(load16(d + 12));
  if (t != kEthVlan && t != kEthQinQ) return;
  std::memmove(d + 4, d, 12);
  p->data_off = static_cast<uint16_t>(p->data_off + 4);
  p->len = static_cast<uint16_t>(p->len - 4);
  shift_offsets(p, -4);
}

inline void set_vlan(Packet* p, const DpAction& a) {
  uint8_t* d = p->data();
  if (p->len < 18) return;
  uint16_t t = be16(load16(d + 12));
  if (t != kEthVlan && t != kEthQinQ) return;
  masked_copy(d + 14 + a.ofs, a);
}

}  // namespace exec

struct ExecuteCounters {
#define DPU_EXECUTE_COUNTER(m, n, h) uint64_t m = 0;
#include "dpu/counters.def"
#undef DPU_EXECUTE_COUNTER
};

// Where the execute stage sends packets, with the worker's environment: the
// transmit stage, the conntrack stage and the list of the next pass (TNL_POP).
// run_nested takes them as one argument so that all of its arguments travel
// in registers (nine, with these apart, put three on the stack and made its
// frame realign through another register: more work on every packet that
// conntrack resumes). The inlined run takes them apart: bound in a struct,
// the pass reached its own members through it.
struct ExecPath {
  StageEnv& env;
  TransmitStage& tx;
  CtStage& ct;
  std::vector<Packet*>& recirc;
};

class ExecuteStage {
 public:
  // The actions a[0..n) on p (key: its pass's flow key). Packets leave to
  // the transmit stage, the conntrack stage or the next pass, or die.
  __attribute__((always_inline)) inline void run(StageEnv& env, TransmitStage& tx, CtStage& ct, Packet* p,
                                                 const Flow& key, const DpAction* a, size_t n,
                                                 std::vector<Packet*>& recirc);
  // The same, out of line: clones (group buckets) recurse through it, and
  // the conntrack stage runs what follows a ct through it.
  void run_nested(const ExecPath& to, Packet* p, const Flow& key, const DpAction* a, size_t n);
  const ExecuteCounters& counters() const { return counters_; }

 private:
  // vxlan.cc
  bool tnl_push(StageEnv& env, TransmitStage& tx, Packet* p, const Flow& key, const DpAction& a);
  // Validates and strips VXLAN (the TNL_POP action); DROP_NONE on success.
  uint16_t tnl_pop(StageEnv& env, Packet* p, const DpAction& a);
  void send_too_big(StageEnv& env, TransmitStage& tx, Packet* p, const Flow& key, const TnlHeader& a);
  ExecuteCounters counters_;
};

inline void ExecuteStage::run(StageEnv& env, TransmitStage& tx, CtStage& ct, Packet* p, const Flow& key,
                              const DpAction* a, size_t n, std::vector<Packet*>& recirc) {
  // (Walked by pointer, `last` computed where an action asks, and a default
  // that cannot happen: the jump table then needs no range check, and
  // -Wswitch-enum, an error here, still names a Dp value without a case. Per
  // action, that was half the dispatch's instructions.)
  const DpAction* const end = a + n;
  for (const DpAction* at = a; at < end; at++) {
    const DpAction& act = *at;
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wswitch-enum"
    switch (act.type) {
      case Dp::OUTPUT: {
        if (at + 1 == end) {
          tx.emit(env, act.port, p, true);
          return;
        }
        Packet* c = env.copy(p);
        if (c) tx.emit(env, act.port, c, true);
        else env.arrivals.set_reason(p, DROP_NO_BUFFER);
        break;
      }
      case Dp::SET_ETH:
        if (p->len >= 14) exec::masked_copy(p->data() + act.ofs, act);  // as OVS, only with a whole Ethernet header (dp_packet_eth)
        break;
      case Dp::SET_VLAN:
        exec::set_vlan(p, act);
        break;
      case Dp::PUSH_VLAN:
        exec::push_vlan(p, act.tpid, act.tci);
        break;
      case Dp::POP_VLAN:
        exec::pop_vlan(p);
        break;
      case Dp::SET_IPV4:
        exec::set_ipv4(p, act);
        break;
      case Dp::SET_IPV6:
        exec::set_ipv6(p, act);
        break;
      case Dp::SET_L4:
        exec::set_l4(p, act);
        break;
      case Dp::SET_ARP:
        exec::set_arp(p, act);
        break;
      case Dp::TNL_PUSH: {
        const bool last = at + 1 == end;
        Packet* c = last ? p : env.copy(p);
        if (!c) {
          env.arrivals.set_reason(p, DROP_NO_BUFFER);
          break;
        }
        if (tnl_push(env, tx, c, key, act)) tx.emit(env, act.port, c, true);
        if (last) return;
        break;
      }
      case Dp::TNL_POP: {
        uint16_t r = tnl_pop(env, p, act);
        if (r != DROP_NONE) env.drop(p, r);
        else recirc.push_back(p);
        return;  // always the last action
      }
      case Dp::CLONE: {
        size_t inner = act.n_nested;
        if (at + inner + 1 == end) {
          // Nothing follows the clone: run it on the packet itself.
          run_nested(ExecPath{env, tx, ct, recirc}, p, key, at + 1, inner);
          return;
        }
        Packet* c = env.copy(p);
        if (c) run_nested(ExecPath{env, tx, ct, recirc}, c, key, at + 1, inner);
        else env.arrivals.set_reason(p, DROP_NO_BUFFER);
        at += inner;
        break;
      }
      case Dp::DROP:
        env.drop(p, act.reason);
        return;
      case Dp::CT: {
        if (act.ct->recirc_id == 0) {  // ct without table: the packet itself, the rest after the stage
          ct.enqueue(p, act, key, at + 1, static_cast<size_t>(end - at - 1));
          return;
        }
        if (at + 1 == end) {
          ct.enqueue(p, act, key, nullptr, 0);
          return;
        }
        Packet* c = env.copy(p);  // the tracked copy resumes elsewhere; this one goes on untracked
        if (c) ct.enqueue(c, act, key, nullptr, 0);
        else env.arrivals.set_reason(p, DROP_NO_BUFFER);
        break;
      }
      case Dp::CT_CLEAR:
        p->md.ct_state = 0;
        p->md.ct_zone = 0;
        p->md.ct_mark = 0;
        break;
      default:  // every Dp value has its case (translation writes nothing else)
        __builtin_unreachable();
    }
#pragma GCC diagnostic pop
  }
  env.drop(p, DROP_NONE);
}

}  // namespace dpu
