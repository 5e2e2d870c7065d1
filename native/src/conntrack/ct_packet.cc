// ct_packet.cc: tuple extraction and NAT rewriting (see ct_packet.h).
#include "ct_packet.h"

#include "checksum.h"

namespace dpu {
namespace {

bool icmp4_is_error(uint8_t t) { return t == 3 || t == 4 || t == 5 || t == 11 || t == 12; }
bool icmp4_is_query(uint8_t t) { return t == 0 || t == 8 || t == 13 || t == 14; }
bool icmp6_is_error(uint8_t t) { return t >= 1 && t <= 4; }
bool icmp6_is_query(uint8_t t) { return t == 128 || t == 129; }

// The IP header at `ip` (avail bytes): addresses into k, protocol, and the L4
// header's position and length. Fragments and cut headers are refused.
bool parse_ip(uint8_t* ip, uint32_t avail, bool allow_cut, CtKey* k, uint8_t** l4, uint32_t* l4_len) {
  if (avail < 1) return false;
  const int v = ip[0] >> 4;
  if (v == 4) {
    if (avail < 20) return false;
    uint32_t ihl = (ip[0] & 15u) * 4;
    uint32_t tot = be16(load16(ip + 2));
    if (ihl < 20 || ihl > avail || tot < ihl) return false;
    if (be16(load16(ip + 6)) & 0x3fff) return false;  // a fragment: no reassembly
    if (tot > avail) {
      if (!allow_cut) return false;
      tot = avail;  // an ICMP error quotes only the start of the packet
    }
    k->v6 = 0;
    k->proto = ip[9];
    k->src[0] = load32(ip + 12);
    k->dst[0] = load32(ip + 16);
    *l4 = ip + ihl;
    *l4_len = tot - ihl;
    return true;
  }
  if (v == 6) {
    if (avail < 40) return false;
    uint32_t end = 40 + be16(load16(ip + 4));
    if (end > avail) {
      if (!allow_cut) return false;
      end = avail;
    }
    uint32_t pos = 40;
    uint8_t nh = ip[6];
    for (int hops = 0; hops < 8 && (nh == 0 || nh == 43 || nh == 60 || nh == 51); hops++) {
      if (pos + 2 > end) return false;
      uint32_t len = nh == 51 ? (ip[pos + 1] + 2u) * 4 : (ip[pos + 1] + 1u) * 8;
      nh = ip[pos];
      pos += len;
    }
    if (nh == 44 || pos > end) return false;  // fragment header: no reassembly
    k->v6 = 1;
    k->proto = nh;
    std::memcpy(k->src, ip + 8, 16);
    std::memcpy(k->dst, ip + 24, 16);
    *l4 = ip + pos;
    *l4_len = end - pos;
    return true;
  }
  return false;
}

// Ports (or ICMP identifier and type) of the L4 header into k.
bool parse_ports(const uint8_t* l4, uint32_t len, CtKey* k, bool quoted) {
  switch (k->proto) {
    case kIpTcp:
      if (len < (quoted ? 8u : 20u)) return false;
      k->sport = load16(l4);
      k->dport = load16(l4 + 2);
      return true;
    case kIpUdp:
      if (len < 8) return false;
      k->sport = load16(l4);
      k->dport = load16(l4 + 2);
      return true;
    case kIpIcmp:
    case kIpIcmpv6: {
      if (len < 8 || (k->proto == kIpIcmpv6) != (k->v6 != 0)) return false;
      bool query = k->v6 ? icmp6_is_query(l4[0]) : icmp4_is_query(l4[0]);
      if (!query) return false;
      k->sport = load16(l4 + 4);
      uint8_t tc[2] = {l4[0], l4[1]};
      std::memcpy(&k->dport, tc, 2);
      return true;
    }
    default:
      return false;
  }
}

void parse_tcp(CtPacket* cp) {
  const uint8_t* t = cp->l4;
  cp->tcp_flags = static_cast<uint16_t>(t[13] | ((t[12] & 1) << 8));
  cp->seq = be32(load32(t + 4));
  cp->ack = be32(load32(t + 8));
  cp->win = be16(load16(t + 14));
  uint32_t doff = (t[12] >> 4) * 4u;
  cp->payload = cp->l4_len - doff;
  cp->wscale = -1;
  if (!(cp->tcp_flags & kTcpSyn)) return;
  for (uint32_t i = 20; i < doff;) {  // options: the window scale of a SYN
    uint8_t kind = t[i];
    if (kind == 0) break;
    if (kind == 1) {
      i++;
      continue;
    }
    if (i + 1 >= doff || t[i + 1] < 2) break;
    if (kind == 3 && t[i + 1] == 3 && i + 2 < doff) cp->wscale = static_cast<int8_t>(t[i + 2] > 14 ? 14 : t[i + 2]);
    i += t[i + 1];
  }
}

// ct_extract() of the common packet, IPv4 without options carrying TCP or
// UDP: the same checks and fields as the general path, in a straight line.
// False when the packet is not one (the general path then decides).
inline bool extract_simple(uint8_t* ip, uint32_t avail, uint16_t zone, CtPacket* cp) {
  if (avail < 20 || ip[0] != 0x45) return false;
  const uint8_t proto = ip[9];
  const uint32_t tot = be16(load16(ip + 2));
  if ((proto != kIpTcp && proto != kIpUdp) || tot < 20 || tot > avail || (be16(load16(ip + 6)) & 0x3fff))
    return false;
  uint8_t* l4 = ip + 20;
  const uint32_t l4_len = tot - 20;
  if (proto == kIpTcp ? l4_len < 20 || (l4[12] >> 4) < 5 || (l4[12] >> 4) * 4u > l4_len : l4_len < 8) return false;
  ct_key_set_v4(&cp->key, load32(ip + 12), load32(ip + 16), load32(l4), zone, proto);
  cp->icmp_error = false;
  cp->l3 = ip;
  cp->l4 = l4;
  cp->l4_len = l4_len;
  if (proto == kIpTcp) parse_tcp(cp);
  return true;
}

}  // namespace

bool ct_extract(Packet* p, uint16_t zone, CtPacket* cp) {
  if (p->l3_ofs == kNoOffset) return false;
  uint8_t* ip = p->data() + p->l3_ofs;
  if (extract_simple(ip, p->len - p->l3_ofs, zone, cp)) return true;
  CtKey& k = cp->key;
  std::memset(&k, 0, sizeof k);
  k.zone = zone;
  cp->icmp_error = false;
  if (!parse_ip(ip, p->len - p->l3_ofs, false, &k, &cp->l4, &cp->l4_len)) return false;
  cp->l3 = ip;
  if (k.proto == kIpTcp) {
    if (cp->l4_len < 20) return false;
    uint32_t doff = (cp->l4[12] >> 4) * 4u;
    if (doff < 20 || doff > cp->l4_len) return false;
    if (!parse_ports(cp->l4, cp->l4_len, &k, false)) return false;
    parse_tcp(cp);
    return true;
  }
  const bool icmp = (k.proto == kIpIcmp && !k.v6) || (k.proto == kIpIcmpv6 && k.v6);
  if (icmp && cp->l4_len >= 8 && (k.v6 ? icmp6_is_error(cp->l4[0]) : icmp4_is_error(cp->l4[0]))) {
    // Related to the connection of the quoted packet.
    CtKey q{};
    q.zone = zone;
    uint8_t* inner = cp->l4 + 8;
    if (!parse_ip(inner, cp->l4_len - 8, true, &q, &cp->inner_l4, &cp->inner_l4_len)) return false;
    if (q.v6 != k.v6 || !parse_ports(cp->inner_l4, cp->inner_l4_len, &q, true)) return false;
    // An error goes to the sender of the packet it quotes (as OVS checks).
    if (std::memcmp(k.dst, q.src, k.v6 ? 16 : 4) != 0) return false;
    cp->icmp_error = true;
    cp->inner_l3 = inner;
    k = ct_key_reverse(q);
    return true;
  }
  return parse_ports(cp->l4, cp->l4_len, &k, false);
}

namespace {

// Replaces the 16-bit word at `w`, keeping the checksum at `c` right (none
// when null; a zero UDP checksum over IPv4 means none and stays zero).
struct Patcher {
  uint8_t* outer_icmp = nullptr;  // an ICMP error's checksum, which covers everything quoted

  void csum(uint8_t* c, uint16_t old_w, uint16_t new_w, bool udp) const {
    if (!c) return;
    uint16_t v = load16(c);
    if (udp && v == 0) return;
    uint16_t n = csum_replace16(v, old_w, new_w);
    store16(c, udp && n == 0 ? 0xffff : n);
  }
  // A checksum inside the quoted packet changes: the outer ICMP checksum covers it.
  void inner_csum(uint8_t* c, uint16_t old_w, uint16_t new_w, bool udp) const {
    if (!c) return;
    uint16_t before = load16(c);
    csum(c, old_w, new_w, udp);
    csum(outer_icmp, before, load16(c), false);
  }
  void word(uint8_t* w, uint16_t nw, uint8_t* c1, uint8_t* c2, bool c2_udp, bool inner) const {
    uint16_t ow = load16(w);
    if (ow == nw) return;
    store16(w, nw);
    if (inner) {
      csum(outer_icmp, ow, nw, false);
      inner_csum(c1, ow, nw, false);
      inner_csum(c2, ow, nw, c2_udp);
    } else {
      csum(c1, ow, nw, false);
      csum(c2, ow, nw, c2_udp);
    }
  }
  // An IPv4 address: two words, in the IP header checksum (c1) and the L4
  // pseudo-header checksum (c2).
  void addr(uint8_t* at, uint32_t nv, uint8_t* c1, uint8_t* c2, bool c2_udp, bool inner) const {
    uint16_t w[2];
    std::memcpy(w, &nv, 4);
    word(at, w[0], c1, c2, c2_udp, inner);
    word(at + 2, w[1], c1, c2, c2_udp, inner);
  }
};

// The L4 checksum of a TCP/UDP header with `len` bytes present, or null.
uint8_t* l4_csum(uint8_t proto, uint8_t* l4, uint32_t len, bool* udp) {
  *udp = proto == kIpUdp;
  if (proto == kIpTcp && len >= 18) return l4 + 16;
  if (proto == kIpUdp && len >= 8) return l4 + 6;
  return nullptr;
}

// A 16-bit word of the packet takes a new value; its RFC 1624 term
// (~m + m') joins *sum.
inline void replace_word(uint8_t* w, uint16_t nw, uint64_t* sum) {
  const uint16_t ow = load16(w);
  if (ow == nw) return;
  store16(w, nw);
  *sum += csum_term(ow, nw);
}

// The same for a 32-bit field (an IPv4 address, or both ports).
inline void replace_field(uint8_t* f, uint32_t nv, uint64_t* sum) {
  const uint32_t ov = load32(f);
  if (ov == nv) return;
  store32(f, nv);
  *sum += csum_term32(ov, nv);
}

// HC' = ~(~HC + the summed terms), the checksum at `c`; a zero UDP checksum
// (none) stays zero and a computed zero is sent as 0xffff.
inline void apply_sum(uint8_t* c, uint64_t sum, bool udp) {
  if (!sum) return;
  const uint16_t hc = load16(c);
  if (udp && hc == 0) return;
  const uint16_t n = csum_apply_sum(hc, sum);
  store16(c, udp && n == 0 ? 0xffff : n);
}

}  // namespace

void ct_nat_xlat(const CtXlat& o, CtPacket* cp) {
  // The target tuple is the other key reversed (ct_key_reverse keeps an echo
  // identifier in sport). The changed fields' RFC 1624 terms (~m + m') are
  // summed 32 bits at a time (a ones'-complement sum does not depend on how
  // its words are grouped), then each checksum is updated once: the IP
  // header's by the addresses, the L4 one's by the addresses (pseudo-header)
  // and the ports; ICMP's by the identifier alone.
  const uint8_t proto = cp->key.proto;
  uint8_t* ip = cp->l3;
  uint64_t d_addr = 0;
  replace_field(ip + 12, o.dst, &d_addr);
  replace_field(ip + 16, o.src, &d_addr);
  if (proto == kIpIcmp) {
    uint64_t d_id = 0;
    replace_word(cp->l4 + 4, o.sport, &d_id);  // echo identifier
    apply_sum(cp->l4 + 2, d_id, false);
  } else {
    uint64_t d_l4 = d_addr;
    // The header's ports are o's swapped: its sport and dport as one word,
    // the halves exchanged (built in a register: two 16-bit stores read back
    // as one word would stall on store forwarding).
    uint32_t o_ports;
    std::memcpy(&o_ports, &o.sport, 4);
    replace_field(cp->l4, (o_ports >> 16) | (o_ports << 16), &d_l4);
    bool udp = false;
    if (uint8_t* l4c = l4_csum(proto, cp->l4, cp->l4_len, &udp)) apply_sum(l4c, d_l4, udp);
  }
  apply_sum(ip + 10, d_addr, false);
}

void ct_nat_packet(const Conn& c, int dir, CtPacket* cp) {
  if (cp->key.v6) return;  // no NAT66
  if (!cp->icmp_error) {
    ct_nat_xlat(ct_xlat(c.key[1 - dir]), cp);
    return;
  }
  const CtKey& from = c.key[dir];
  const uint8_t proto = from.proto;
  const bool icmp = proto == kIpIcmp;
  const CtKey to = ct_key_reverse(c.key[1 - dir]);
  Patcher pt;
  // An ICMP error of direction `dir`: the outer header like any packet of
  // that direction (its source only when it is the translated endpoint
  // itself), and the quoted packet, which went the other way, back to what
  // its sender sent (RFC 5508 section 4).
  uint8_t* ip = cp->l3;
  pt.outer_icmp = cp->l4 + 2;
  if (load32(ip + 12) == from.src[0]) pt.addr(ip + 12, to.src[0], ip + 10, nullptr, false, false);
  if (load32(ip + 16) == from.dst[0]) pt.addr(ip + 16, to.dst[0], ip + 10, nullptr, false, false);
  uint8_t* in = cp->inner_l3;
  uint8_t* il4 = cp->inner_l4;
  bool udp = false;
  uint8_t* il4c = icmp ? nullptr : l4_csum(proto, il4, cp->inner_l4_len, &udp);
  pt.addr(in + 12, to.dst[0], in + 10, il4c, udp, true);
  pt.addr(in + 16, to.src[0], in + 10, il4c, udp, true);
  if (icmp) {
    uint8_t* ic = cp->inner_l4_len >= 4 ? il4 + 2 : nullptr;
    pt.word(il4 + 4, to.sport, ic, nullptr, false, true);
  } else {
    pt.word(il4, to.dport, nullptr, il4c, udp, true);
    pt.word(il4 + 2, to.sport, nullptr, il4c, udp, true);
  }
}

}  // namespace dpu
