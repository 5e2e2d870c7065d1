// execute.cc: stage "execute": run a megaflow's datapath actions on a packet.
//
// Uses:  the packet, its parsed offsets (l3_ofs/l4_ofs), its flow key (for
//        hashes and ICMP replies), and the DpAction list (dp_actions.h).
// Sets:  header bytes (masked writes with RFC 1624 incremental checksum updates
//        of IPv4 header, TCP, UDP and ICMPv6 checksums; SCTP's CRC32c is
//        recomputed), VLAN tags, and the per-arrival output/drop bookkeeping.
// Next:  per-port tx queues (Worker::emit), or the recirculation list (TNL_POP).
//
// The last action that sends the packet takes the buffer itself; earlier ones
// send copies. A UDP checksum of 0 over IPv4 means "none" and stays 0; a
// recomputed UDP checksum of 0 is sent as 0xffff. Never allocates except for
// packet copies from the worker's pool, never throws. Worker thread only.
#include <algorithm>

#include "checksum.h"
#include "worker.h"

namespace dpu {
namespace {

// Masked write of `n` bytes; returns true if anything changed.
inline void masked_write(uint8_t* dst, const uint8_t* val, const uint8_t* msk, int n) {
  for (int i = 0; i < n; i++) dst[i] = static_cast<uint8_t>((dst[i] & ~msk[i]) | (val[i] & msk[i]));
}

// Checksum delta for bytes [0,n) of a header going from `old_b` to `new_b`,
// both starting at an even offset of the checksummed area.
inline uint16_t csum_delta(uint16_t hc, const uint8_t* old_b, const uint8_t* new_b, int n) {
  return csum_replace_bytes(hc, old_b, new_b, static_cast<size_t>(n));
}

uint32_t crc32c(const uint8_t* p, size_t n) {
  static uint32_t table[256];
  static bool init = [] {
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
      table[i] = c;
    }
    return true;
  }();
  (void)init;
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return ~c;
}

// L4 header and its checksum offset for a packet (nullptr if absent).
struct L4Ref {
  uint8_t* hdr = nullptr;
  uint8_t proto = 0;
  int csum_off = -1;  // within hdr
  uint32_t len = 0;   // bytes from hdr to end of packet
};

L4Ref l4_ref(Packet* p, uint8_t proto) {
  L4Ref r;
  if (p->l4_ofs == kNoOffset) return r;
  r.hdr = p->data() + p->l4_ofs;
  r.proto = proto;
  r.len = p->len - p->l4_ofs;
  if (proto == kIpTcp && r.len >= 20) r.csum_off = 16;
  else if (proto == kIpUdp && r.len >= 8) r.csum_off = 6;
  else if (proto == kIpIcmpv6 && r.len >= 4) r.csum_off = 2;
  return r;
}

// Applies an address change (pseudo-header) to the L4 checksum.
void l4_pseudo_update(const L4Ref& r, const uint8_t* old_b, const uint8_t* new_b, int n, bool v6) {
  if (r.csum_off < 0) return;
  if (r.proto == kIpIcmpv6 && !v6) return;
  uint16_t c = load16(r.hdr + r.csum_off);
  if (r.proto == kIpUdp && c == 0) {
    if (!v6) return;  // IPv4 UDP without checksum stays without
  }
  c = csum_delta(c, old_b, new_b, n);
  if (r.proto == kIpUdp && c == 0) c = 0xffff;
  store16(r.hdr + r.csum_off, c);
}

void set_ipv4(Packet* p, const DpAction& a) {
  if (p->l3_ofs == kNoOffset) return;
  uint8_t* ip = p->data() + p->l3_ofs;
  uint8_t old[20];
  std::memcpy(old, ip, 20);
  masked_write(ip, a.set.val, a.set.msk, 20);
  uint16_t hc = load16(ip + 10);
  hc = csum_delta(hc, old, ip, 20);
  store16(ip + 10, hc);
  if (std::memcmp(old + 12, ip + 12, 8) != 0) {
    uint16_t frag = be16(load16(ip + 6));
    if ((frag & 0x1fff) == 0) l4_pseudo_update(l4_ref(p, ip[9]), old + 12, ip + 12, 8, false);
  }
}

void set_ipv6(Packet* p, const DpAction& a, uint8_t proto) {
  if (p->l3_ofs == kNoOffset) return;
  uint8_t* ip = p->data() + p->l3_ofs;
  uint8_t old[40];
  std::memcpy(old, ip, 40);
  masked_write(ip, a.set.val, a.set.msk, 40);
  if (std::memcmp(old + 8, ip + 8, 32) != 0) l4_pseudo_update(l4_ref(p, proto), old + 8, ip + 8, 32, true);
}

void set_l4(Packet* p, const DpAction& a) {
  if (p->l4_ofs == kNoOffset) return;
  uint8_t* l4 = p->data() + p->l4_ofs;
  uint8_t old[4];
  std::memcpy(old, l4, 4);
  masked_write(l4, a.set.val, a.set.msk, 4);
  if (a.proto == kIpSctp) {
    uint32_t len = p->len - p->l4_ofs;
    if (len >= 12) {
      std::memset(l4 + 8, 0, 4);
      uint32_t c = crc32c(l4, len);
      std::memcpy(l4 + 8, &c, 4);  // CRC32c is stored little-endian on the wire
    }
    return;
  }
  L4Ref r = l4_ref(p, a.proto);
  if (r.csum_off < 0) return;
  uint16_t c = load16(l4 + r.csum_off);
  if (a.proto == kIpUdp && c == 0) return;  // no checksum (IPv4)
  c = csum_delta(c, old, l4, 4);
  if (a.proto == kIpUdp && c == 0) c = 0xffff;
  store16(l4 + r.csum_off, c);
}

void set_arp(Packet* p, const DpAction& a) {
  if (p->l3_ofs == kNoOffset) return;
  masked_write(p->data() + p->l3_ofs, a.set.val, a.set.msk, kSetArpLen);
}

void shift_offsets(Packet* p, int delta) {
  if (p->l3_ofs != kNoOffset) p->l3_ofs = static_cast<uint16_t>(p->l3_ofs + delta);
  if (p->l4_ofs != kNoOffset) p->l4_ofs = static_cast<uint16_t>(p->l4_ofs + delta);
}

bool push_vlan(Packet* p, uint16_t tpid, uint16_t tci) {
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

void pop_vlan(Packet* p) {
  uint8_t* d = p->data();
  if (p->len < 18) return;
  uint16_t t = be16(load16(d + 12));
  if (t != kEthVlan && t != kEthQinQ) return;
  std::memmove(d + 4, d, 12);
  p->data_off = static_cast<uint16_t>(p->data_off + 4);
  p->len = static_cast<uint16_t>(p->len - 4);
  shift_offsets(p, -4);
}

void set_vlan(Packet* p, const DpAction& a) {
  uint8_t* d = p->data();
  if (p->len < 18) return;
  uint16_t t = be16(load16(d + 12));
  if (t != kEthVlan && t != kEthQinQ) return;
  masked_write(d + 14, a.set.val, a.set.msk, 2);
}

}  // namespace

void Worker::run_actions(Packet* p, const Flow& key, const DpAction* a, size_t n, std::vector<Packet*>& recirc) {
  for (size_t i = 0; i < n; i++) {
    const DpAction& act = a[i];
    const bool last = i + 1 == n;
    switch (act.type) {
      case Dp::OUTPUT: {
        if (last) {
          emit(act.port, p, true);
          return;
        }
        Packet* c = copy(p);
        if (c) emit(act.port, c, true);
        else reason_[p->origin] = DROP_NO_BUFFER;
        break;
      }
      case Dp::SET_ETH:
        if (p->len >= 12) masked_write(p->data(), act.set.val, act.set.msk, kSetEthLen);
        break;
      case Dp::SET_VLAN:
        set_vlan(p, act);
        break;
      case Dp::PUSH_VLAN:
        push_vlan(p, act.tpid, act.tci);
        break;
      case Dp::POP_VLAN:
        pop_vlan(p);
        break;
      case Dp::SET_IPV4:
        set_ipv4(p, act);
        break;
      case Dp::SET_IPV6:
        set_ipv6(p, act, key.nw_proto);
        break;
      case Dp::SET_L4:
        set_l4(p, act);
        break;
      case Dp::SET_ARP:
        set_arp(p, act);
        break;
      case Dp::TNL_PUSH: {
        Packet* c = last ? p : copy(p);
        if (!c) {
          reason_[p->origin] = DROP_NO_BUFFER;
          break;
        }
        if (tnl_push(c, key, act)) emit(act.port, c, true);
        if (last) return;
        break;
      }
      case Dp::TNL_POP: {
        uint16_t r = tnl_pop(p, act);
        if (r != DROP_NONE) drop(p, r);
        else recirc.push_back(p);
        return;  // always the last action
      }
      case Dp::CLONE: {
        size_t inner = act.n_nested;
        if (i + inner + 1 == n) {
          // Nothing follows the clone: run it on the packet itself.
          run_actions(p, key, a + i + 1, inner, recirc);
          return;
        }
        Packet* c = copy(p);
        if (c) run_actions(c, key, a + i + 1, inner, recirc);
        else reason_[p->origin] = DROP_NO_BUFFER;
        i += inner;
        break;
      }
      case Dp::DROP:
        drop(p, act.reason);
        return;
    }
  }
  drop(p, DROP_NONE);
}

}  // namespace dpu
