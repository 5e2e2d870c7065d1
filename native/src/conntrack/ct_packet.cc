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

}  // namespace

bool ct_extract(Packet* p, uint16_t zone, CtPacket* cp) {
  if (p->l3_ofs == kNoOffset) return false;
  uint8_t* ip = p->data() + p->l3_ofs;
  if (ct_extract_v4(ip, p->len - p->l3_ofs, zone, cp)) return true;
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
    ct_parse_tcp(cp);
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

}  // namespace


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
  uint8_t* il4c = icmp ? nullptr : ct_nat_detail::l4_csum(proto, il4, cp->inner_l4_len, &udp);
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
