// vxlan.cc: VXLAN encapsulation and decapsulation (RFC 7348) for the worker.
//
// TNL_PUSH  Uses the header template the slow path built (outer Ethernet,
//           IPv4 with DF or IPv6, UDP, VXLAN with the I flag and the VNI) and
//           prepends it into the headroom. Per packet it fills the lengths,
//           the IPv4 header checksum (from the template's precomputed sum), the
//           UDP source port (the documented 5-tuple hash of the inner flow as
//           it arrived, scaled into [sport_min, sport_max]) and, over IPv6, the
//           UDP checksum. Over IPv4 the UDP checksum is 0. A frame whose outer
//           packet would exceed the underlay MTU is dropped (reason "mtu"),
//           never fragmented; for an IPv4 inner packet with DF an ICMP
//           "fragmentation needed" (for IPv6: "packet too big") carrying the
//           usable MTU goes back out of the port the packet came in on.
// TNL_POP   Checks the outer IPv4 header checksum, the IP and UDP lengths, a
//           non-zero UDP checksum, the I flag (and, in
//           strict mode, that reserved bits are zero), strips the outer headers
//           and records VNI, outer source and destination in the packet
//           metadata; the packet is then looked up again from the tunnel port.
//
// Counters: a push counts the inner frame as tx of the tunnel port (the one
// on that underlay, of that address family) and in tunnel_pushes; a pop
// counts the decapsulated frame as rx of the tunnel port (classify.h counts
// the pops it fuses into parsing the same way).
//
// Part of the execute stage (execute.h). Worker thread only; no allocation
// except the ICMP reply from the pool.
#include <algorithm>

#include "checksum.h"
#include "dpu/mem.h"
#include "execute.h"
#include "vxlan.h"

namespace dpu {

bool ExecuteStage::tnl_push(StageEnv& env, TransmitStage& tx, Packet* p, const Flow& key, const DpAction& act) {
  const TnlHeader& a = *act.tnl;
  const uint32_t inner = p->len;
  const uint32_t hdr = a.hdr_len;
  const uint32_t ip_hdr = a.ipv6 ? 40 : 20;
  if (ip_hdr + 16 + inner > a.mtu) {
    send_too_big(env, tx, p, key, a);
    env.drop(p, DROP_MTU);
    return false;
  }
  if (p->data_off < hdr) {  // headroom used up (nested encapsulation): re-centre the frame
    if (kHeadroom + p->len > p->buf_size()) {
      env.drop(p, DROP_OVERSIZE);
      return false;
    }
    std::memmove(p->buf + kHeadroom, p->data(), p->len);
    p->data_off = kHeadroom;
  }
  p->data_off = static_cast<uint16_t>(p->data_off - hdr);
  p->len = static_cast<uint16_t>(p->len + hdr);
  uint8_t* d = p->data();
  copy_frame(d, a.hdr, hdr);  // overlapping vector moves: memcpy of a variable 50/70 bytes is a rep movs
  uint8_t* ip = d + 14;
  uint8_t* udp = ip + ip_hdr;
  const uint16_t udp_len = static_cast<uint16_t>(16 + inner);
  uint32_t range = static_cast<uint32_t>(a.sport_max - a.sport_min) + 1;
  uint16_t sport = static_cast<uint16_t>(a.sport_min + ((static_cast<uint64_t>(hash_5tuple(key)) * range) >> 32));
  store16(udp, be16(sport));
  store16(udp + 4, be16(udp_len));
  if (a.ipv6) {
    store16(ip + 4, be16(udp_len));
    uint64_t s = pseudo_sum_v6(ip + 8, ip + 24, kIpUdp, udp_len);
    uint16_t c = csum(udp, udp_len, s);
    store16(udp + 6, c == 0 ? 0xffff : c);
  } else {
    const uint16_t tot = be16(static_cast<uint16_t>(20 + udp_len));
    store16(ip + 2, tot);
    store16(ip + 10, static_cast<uint16_t>(~csum_fold(static_cast<uint64_t>(a.ip_csum_base) + tot)));
  }
  p->l3_ofs = 14;
  p->l4_ofs = static_cast<uint16_t>(14 + ip_hdr);
  counters_.tunnel_pushes++;
  for (const PortView::TunnelTx& t : env.view.tnl_tx) {
    if (t.underlay == act.port && t.ipv6 == a.ipv6) {
      env.ports[t.port].tx_packets++;
      env.ports[t.port].tx_bytes += inner;
      break;
    }
  }
  return true;
}

uint16_t ExecuteStage::tnl_pop(StageEnv& env, Packet* p, const DpAction& act) {
  uint16_t r = vxlan_pop(p, *act.tnl, act.port);
  if (r == DROP_NONE) env.count_tunnel_rx(act.port, p->len);
  return r;
}

// ICMP "fragmentation needed" / ICMPv6 "packet too big" back to the sender,
// addressed from the original destination (as Linux does for bridged tunnels).
void ExecuteStage::send_too_big(StageEnv& env, TransmitStage& tx, Packet* p, const Flow& key, const TnlHeader& a) {
  const uint32_t in = p->md.in_port;
  const std::vector<uint8_t>& is_tunnel = env.view.is_tunnel;
  if (in >= is_tunnel.size() || is_tunnel[in] || p->l3_ofs == kNoOffset) return;
  // One error per arrival (a flood to several VTEPs fails once per copy), and
  // never for broadcast/multicast or from a non-unicast source (RFC 1122 3.2.2).
  if (env.arrivals.icmp_sent(p)) return;
  if ((key.dl_dst[0] & 1) || (key.dl_src[0] & 1)) return;
  const uint16_t type = be16(key.dl_type);
  const uint8_t* orig = p->data() + p->l3_ofs;
  const uint32_t orig_len = p->len - p->l3_ofs;
  const uint32_t overhead = (a.ipv6 ? 40u : 20u) + 16u + 14u;
  if (type == kEthIp) {
    if (!(be16(load16(orig + 6)) & 0x4000)) return;  // DF clear: nothing to report
    const uint32_t src = be32(key.nw_src), dst = be32(key.nw_dst);
    if (src == 0 || (src >> 28) == 14 || (dst >> 28) == 14 || dst == 0xffffffffu || (dst >> 24) == 0) return;
    if (key.nw_proto == kIpIcmp && (key.tp_src == be16(3) || key.tp_src == be16(11) || key.tp_src == be16(12)))
      return;  // never answer an ICMP error with one
  } else if (type == kEthIpv6) {
    if (key.nw_proto == kIpIcmpv6 && be16(key.tp_src) < 128) return;
    static const uint8_t kZero[16] = {};
    if (key.ipv6_dst[0] == 0xff || key.ipv6_src[0] == 0xff || std::memcmp(key.ipv6_src, kZero, 16) == 0) return;
  } else {
    return;
  }
  Packet* r = env.pool.get();
  if (!r) return;
  r->md = p->md;
  r->tun6 = p->tun6;
  if (p->md.ct_state) r->ct = p->ct;  // valid whenever ct_state is set, as in a clone
  r->origin = p->origin;
  uint8_t* d = r->data();
  std::memcpy(d, key.dl_src, 6);
  std::memcpy(d + 6, key.dl_dst, 6);
  uint32_t off = 12;
  if (key.vlan_tci & be16(kVlanPresent)) {
    store16(d + 12, key.vlan_tpid ? key.vlan_tpid : be16(kEthVlan));
    store16(d + 14, static_cast<uint16_t>(key.vlan_tci & be16(static_cast<uint16_t>(~kVlanPresent))));
    off = 16;
  }
  uint32_t mtu = a.mtu > overhead ? a.mtu - overhead : 0;
  if (type == kEthIp) {
    store16(d + off, be16(kEthIp));
    uint8_t* ip = d + off + 2;
    uint32_t quote = std::min<uint32_t>(orig_len, 576 - 28);
    uint32_t tot = 20 + 8 + quote;
    std::memset(ip, 0, 28);
    ip[0] = 0x45;
    store16(ip + 2, be16(static_cast<uint16_t>(tot)));
    ip[8] = 64;
    ip[9] = kIpIcmp;
    std::memcpy(ip + 12, &key.nw_dst, 4);
    std::memcpy(ip + 16, &key.nw_src, 4);
    store16(ip + 10, csum(ip, 20));
    uint8_t* icmp = ip + 20;
    icmp[0] = 3;
    icmp[1] = 4;
    store16(icmp + 6, be16(static_cast<uint16_t>(std::min<uint32_t>(mtu, 0xffff))));
    std::memcpy(icmp + 8, orig, quote);
    store16(icmp + 2, csum(icmp, 8 + quote));
    r->len = static_cast<uint16_t>(off + 2 + tot);
  } else {
    store16(d + off, be16(kEthIpv6));
    uint8_t* ip = d + off + 2;
    uint32_t quote = std::min<uint32_t>(orig_len, 1280 - 48);
    uint32_t plen = 8 + quote;
    std::memset(ip, 0, 48);
    ip[0] = 0x60;
    store16(ip + 4, be16(static_cast<uint16_t>(plen)));
    ip[6] = kIpIcmpv6;
    ip[7] = 64;
    std::memcpy(ip + 8, key.ipv6_dst, 16);
    std::memcpy(ip + 24, key.ipv6_src, 16);
    uint8_t* icmp = ip + 40;
    icmp[0] = 2;
    uint32_t m = std::max<uint32_t>(mtu, 1280);
    uint32_t mbe = be32(m);
    std::memcpy(icmp + 4, &mbe, 4);
    std::memcpy(icmp + 8, orig, quote);
    store16(icmp + 2, csum(icmp, plen, pseudo_sum_v6(ip + 8, ip + 24, kIpIcmpv6, plen)));
    r->len = static_cast<uint16_t>(off + 2 + 40 + plen);
  }
  env.arrivals.mark_icmp_sent(p);
  tx.emit(env, in, r, false);
}

}  // namespace dpu
