// ct_packet.h: a packet as connection tracking sees it, and NAT's rewrite of
// it.
//
// ct_extract() reads the tuple (and, for TCP, the sequence numbers, flags
// and window) from the packet's bytes at its parsed offsets: the bytes as the
// actions before the ct left them, which the flow key no longer describes.
// Packets conntrack cannot follow (not IP, fragments, a cut or impossible L4
// header, an unsupported protocol or ICMP type) are refused: their state is
// +trk+inv. An ICMP or ICMPv6 error is tracked as related to the connection
// of the packet it quotes: its key is the reverse of the quoted tuple, which
// is the key of the connection in the direction the error travels.
//
// ct_nat_packet() rewrites addresses, ports and ICMP identifiers so that a
// packet of one direction leaves with the tuple the other direction's key
// expects, updating every checksum incrementally (RFC 1624): IPv4 header,
// TCP, UDP (a zero UDP checksum stays zero), ICMP; for an ICMP error also the
// quoted IP header and L4 ports and their checksums (RFC 5508).
//
// The common case of each, IPv4 TCP or UDP (ct_extract_v4, ct_nat_xlat), is
// inline here: the stage's path for a known connection calls nothing.
//
// Pure on the packet; worker threads.
#pragma once

#include <cstdint>

#include "checksum.h"
#include "conn.h"
#include "dpu/batch.h"

namespace dpu {

enum : uint16_t { kTcpFin = 0x01, kTcpSyn = 0x02, kTcpRst = 0x04, kTcpPsh = 0x08, kTcpAck = 0x10, kTcpUrg = 0x20 };

// Fields are written by ct_extract() as the packet has them: the TCP
// fields for TCP, the inner ones for an ICMP error; nothing is cleared
// beforehand (no 100-byte memset per packet).
struct CtPacket {
  CtPacket() {}
  CtKey key;                   // the lookup key (an ICMP error: the reverse of its quote)
  uint8_t* l3;
  uint8_t* l4;
  uint32_t l4_len;             // L4 header and payload within the IP packet
  bool icmp_error = false;
  uint8_t* inner_l3;           // the quoted packet (ICMP errors)
  uint8_t* inner_l4;
  uint32_t inner_l4_len;       // quoted L4 bytes present
  // TCP
  uint16_t tcp_flags;
  uint32_t seq, ack, payload;
  uint16_t win;
  int8_t wscale;               // window scale option of a SYN, -1 if absent
};

bool ct_extract(Packet* p, uint16_t zone, CtPacket* out);

// The TCP fields of cp->l4 (a whole header of cp->l4_len bytes).
__attribute__((always_inline)) inline void ct_parse_tcp(CtPacket* cp) {
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
// UDP, from its IP header at `ip` (avail bytes): the same checks and fields
// as the general path, in a straight line, inlined where the known
// connection's packets are tracked (Conntrack::execute_known). False when
// the packet is not one (the general path then decides).
__attribute__((always_inline)) inline bool ct_extract_v4(uint8_t* ip, uint32_t avail, uint16_t zone, CtPacket* cp) {
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
  if (proto == kIpTcp) ct_parse_tcp(cp);
  return true;
}

// NAT for a packet of connection `c` travelling in direction `dir` (0 orig,
// 1 reply); `cp` from ct_extract.
void ct_nat_packet(const Conn& c, int dir, CtPacket* cp);

namespace ct_nat_detail {

// The L4 checksum of a TCP/UDP header with `len` bytes present, or null.
inline uint8_t* l4_csum(uint8_t proto, uint8_t* l4, uint32_t len, bool* udp) {
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
__attribute__((always_inline)) inline void apply_sum(uint8_t* c, uint64_t sum, bool udp) {
  if (!sum) return;
  const uint16_t hc = load16(c);
  if (udp && hc == 0) return;
  const uint16_t n = csum_apply_sum(hc, sum);
  store16(c, udp && n == 0 ? 0xffff : n);
}

}  // namespace ct_nat_detail

// The same for an IPv4 packet that is not an ICMP error, from the
// translation of c's other key (ct_xlat(c.key[1 - dir])) alone.
__attribute__((always_inline)) inline void ct_nat_xlat(const CtXlat& o, CtPacket* cp) {
  // The target tuple is the other key reversed (ct_key_reverse keeps an echo
  // identifier in sport). The changed fields' RFC 1624 terms (~m + m') are
  // summed 32 bits at a time (a ones'-complement sum does not depend on how
  // its words are grouped), then each checksum is updated once: the IP
  // header's by the addresses, the L4 one's by the addresses (pseudo-header)
  // and the ports; ICMP's by the identifier alone.
  using namespace ct_nat_detail;
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

}  // namespace dpu
