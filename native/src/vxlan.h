// vxlan.h: VXLAN decapsulation (TNL_POP), inline so the worker's batch loop
// can pop without a call; see vxlan.cc for encapsulation and the contract.
//
// Uses:  the packet's parsed outer offsets (l3_ofs/l4_ofs) and the tunnel's
//        TnlHeader (address family, strict mode).
// Sets:  strips the outer headers; md.tun_id/tun_src/tun_dst (or tun6),
//        md.tun_flags, md.in_port = the tunnel port. Returns DROP_NONE or why
//        the packet must be dropped. Worker thread only; pure on the packet.
#pragma once

#include "checksum.h"
#include "dpu/batch.h"
#include "dpu/dp_actions.h"
#include "dpu/drops.h"

namespace dpu {

__attribute__((always_inline)) inline uint16_t vxlan_pop(Packet* p, const TnlHeader& a, uint32_t tunnel_port) {
  if (p->l3_ofs == kNoOffset || p->l4_ofs == kNoOffset) return DROP_VXLAN_TRUNCATED;
  uint8_t* d = p->data();
  uint8_t* ip = d + p->l3_ofs;
  uint8_t* udp = d + p->l4_ofs;
  const uint32_t avail = p->len - p->l4_ofs;
  const uint32_t udp_len = be16(load16(udp + 4));
  if (avail < 16 || udp_len < 16 || udp_len > avail) return DROP_VXLAN_TRUNCATED;
  if (udp_len - 16 < 14) return DROP_VXLAN_TRUNCATED;  // no room for the inner Ethernet header
  if (a.ipv6) {
    if (be16(load16(ip + 4)) < udp_len + (p->l4_ofs - p->l3_ofs - 40u)) return DROP_VXLAN_TRUNCATED;
  } else {
    const uint32_t ihl = (ip[0] & 15u) * 4;
    if (be16(load16(ip + 2)) < ihl + udp_len) return DROP_VXLAN_TRUNCATED;
    uint64_t sum;
    if (ihl == 20) {  // the usual header: five 32-bit words
      uint32_t w[5];
      std::memcpy(w, ip, 20);
      sum = static_cast<uint64_t>(w[0]) + w[1] + w[2] + w[3] + w[4];
    } else {
      sum = csum_partial(ip, ihl);
    }
    if (csum_fold(sum) != 0xffff) return DROP_VXLAN_BAD_CHECKSUM;  // outer IPv4 header
  }
  const uint16_t c = load16(udp + 6);
  if (c != 0) {
    uint64_t s = a.ipv6 ? pseudo_sum_v6(ip + 8, ip + 24, kIpUdp, udp_len)
                            : pseudo_sum_v4(ip + 12, ip + 16, kIpUdp, udp_len);
    if (csum_fold(csum_partial(udp, udp_len, s)) != 0xffff) return DROP_VXLAN_BAD_CHECKSUM;
  }
  const uint8_t* vx = udp + 8;
  if (!(vx[0] & 0x08)) return DROP_VXLAN_BAD_FLAGS;
  if (a.strict && ((vx[0] & ~0x08) || vx[1] || vx[2] || vx[3] || vx[7])) return DROP_VXLAN_BAD_FLAGS;
  PacketMeta& md = p->md;
  uint64_t vni = (static_cast<uint64_t>(vx[4]) << 16) | (vx[5] << 8) | vx[6];
  md.tun_id = be64(vni);
  if (a.ipv6) {
    std::memcpy(p->tun6.src, ip + 8, 16);
    std::memcpy(p->tun6.dst, ip + 24, 16);
    md.tun_flags = kTunPresent | kTunIpv6;
  } else {
    std::memcpy(&md.tun_src, ip + 12, 4);
    std::memcpy(&md.tun_dst, ip + 16, 4);
    md.tun_flags = kTunPresent;
  }
  md.in_port = tunnel_port;
  const uint32_t strip = p->l4_ofs + 16u;
  p->data_off = static_cast<uint16_t>(p->data_off + strip);
  p->len = static_cast<uint16_t>(udp_len - 16);
  p->l3_ofs = p->l4_ofs = kNoOffset;
  return DROP_NONE;
}

}  // namespace dpu
