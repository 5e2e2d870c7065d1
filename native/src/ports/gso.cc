// gso.cc: GRO turned off, partial checksums finished and super-frames cut
// on receive (see gso.h).
#include "gso.h"

#include <linux/ethtool.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "../checksum.h"

namespace dpu {

namespace {

constexpr uint8_t kIpGre = 47, kIpIpip = 4, kIpIpv6 = 41;

// An Ethernet header at off (one VLAN tag allowed): where its payload starts
// and its type; false when the frame is too short.
bool l2_at(const uint8_t* f, uint32_t n, uint32_t off, uint32_t* next, uint16_t* type) {
  if (n < off + 14) return false;
  uint16_t t = be16(load16(f + off + 12));
  uint32_t at = off + 14;
  if (t == kEthVlan || t == kEthQinQ) {
    if (n < off + 18) return false;
    t = be16(load16(f + off + 16));
    at = off + 18;
  }
  *next = at;
  *type = t;
  return true;
}

struct L3 {
  uint32_t off = 0, l4 = 0, end = 0;  // IP header, its payload, its end (by its length field)
  uint8_t proto = 0;
  bool v4 = false;
};

// The IP header at off: false when it is neither IPv4 nor IPv6, is short, is
// a fragment, says it is longer than the n bytes there are, or (IPv6) has
// extension headers (a super-frame's L4 header follows the fixed one).
bool l3_at(const uint8_t* f, uint32_t n, uint32_t off, uint16_t type, L3* out) {
  const uint8_t* ip = f + off;
  if (type == kEthIp) {
    if (n < off + 20 || (ip[0] >> 4) != 4) return false;
    const uint32_t ihl = (ip[0] & 15u) * 4, tot = be16(load16(ip + 2));
    if (ihl < 20 || tot < ihl || off + tot > n || (be16(load16(ip + 6)) & 0x3fff)) return false;
    out->off = off;
    out->l4 = off + ihl;
    out->end = off + tot;
    out->proto = ip[9];
    out->v4 = true;
    return true;
  }
  if (type == kEthIpv6) {
    if (n < off + 40 || (ip[0] >> 4) != 6) return false;
    const uint32_t end = off + 40 + be16(load16(ip + 4));
    if (end > n) return false;
    out->off = off;
    out->l4 = off + 40;
    out->end = end;
    out->proto = ip[6];
    out->v4 = false;
    return true;
  }
  return false;
}

uint64_t pseudo_sum(const uint8_t* ip, bool v4, uint8_t proto, uint32_t l4_len) {
  return v4 ? pseudo_sum_v4(ip + 12, ip + 16, proto, l4_len) : pseudo_sum_v6(ip + 8, ip + 24, proto, l4_len);
}

// An IP header's length (and IPv4 id and header checksum) for a segment of
// `total` frame bytes; returns the pseudo-header sum of its L4 bytes.
uint64_t set_ip(uint8_t* d, uint32_t ip, uint32_t l4, uint32_t total, bool v4, uint16_t id, uint8_t proto) {
  uint8_t* h = d + ip;
  if (v4) {
    store16(h + 2, be16(static_cast<uint16_t>(total - ip)));
    store16(h + 4, be16(id));
    store16(h + 10, 0);
    store16(h + 10, csum(h, l4 - ip));
  } else {
    store16(h + 4, be16(static_cast<uint16_t>(total - ip - 40)));
  }
  return pseudo_sum(h, v4, proto, total - l4);
}

void ethtool_set(int fd, const std::string& ifname, uint32_t cmd, uint32_t value) {
  ethtool_value ev{};
  ev.cmd = cmd;
  ev.data = value;
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, ifname.c_str(), IFNAMSIZ - 1);
  ifr.ifr_data = reinterpret_cast<char*>(&ev);
  ioctl(fd, SIOCETHTOOL, &ifr);  // best effort: not every device has every offload
}

// GRO off; true when it was on (the caller turns it back on when it lets
// the interface go).
bool disable_receive_offloads(const std::string& ifname) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return false;
  ethtool_value ev{};
  ev.cmd = ETHTOOL_GGRO;
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, ifname.c_str(), IFNAMSIZ - 1);
  ifr.ifr_data = reinterpret_cast<char*>(&ev);
  const bool was_on = ioctl(fd, SIOCETHTOOL, &ifr) == 0 && ev.data != 0;
  if (was_on) ethtool_set(fd, ifname, ETHTOOL_SGRO, 0);
  close(fd);
  return was_on;
}

void restore_receive_offloads(const std::string& ifname) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return;
  ethtool_set(fd, ifname, ETHTOOL_SGRO, 1);
  close(fd);
}

}  // namespace

void GroOff::turn_off(const std::string& ifname) {
  if (!disable_receive_offloads(ifname)) return;
  std::lock_guard<std::mutex> g(mu_);
  if (std::find(ifnames_.begin(), ifnames_.end(), ifname) == ifnames_.end()) ifnames_.push_back(ifname);
}

void GroOff::restore() {
  std::lock_guard<std::mutex> g(mu_);
  for (const std::string& ifname : ifnames_) restore_receive_offloads(ifname);
  ifnames_.clear();
}

OffloadFix offload_fix(uint32_t kind) {
  switch (kind) {
    case kOffloadGsoType:
      return {"gso_type", "super-frames of a GSO type other than TCP and UDP", "tso gso"};
    case kOffloadUdpTunnel:
      return {"udp_tunnel", "UDP-tunnel super-frames of a tunnel other than VXLAN",
              "tx-udp_tnl-segmentation tx-udp_tnl-csum-segmentation"};
    case kOffloadGre:
      return {"gre", "GRE super-frames", "tx-gre-segmentation tx-gre-csum-segmentation"};
    case kOffloadIpip:
      return {"ipip", "IP-in-IP super-frames", "tx-ipxip4-segmentation tx-ipxip6-segmentation"};
    case kOffloadHeaders:
      return {"headers", "super-frames with headers dpu cannot follow", "tso gso tx-udp-segmentation"};
    default:
      return {"", "", ""};
  }
}

void finish_partial(uint8_t* d, uint32_t len, int csum_start, int csum_offset) {
  if (csum_start >= 0) {
    const uint32_t at = static_cast<uint32_t>(csum_start);
    if (at + static_cast<uint32_t>(csum_offset) + 2 > len) return;
    // the field holds the pseudo-header sum: summing from csum_start folds it in
    store16(d + at + csum_offset, csum(d + at, len - at));
    return;
  }
  if (csum_start != -2) return;
  // Somewhere: at the L4 header of the outermost IP packet (no vnet header to say where).
  uint32_t l3;
  uint16_t type;
  L3 a;
  if (!l2_at(d, len, 0, &l3, &type) || !l3_at(d, len, l3, type, &a)) return;
  const uint32_t at = a.proto == kIpTcp ? 16 : a.proto == kIpUdp ? 6 : 0;
  const uint32_t l4_len = a.end - a.l4;
  if (!at || l4_len < at + 2) return;
  uint8_t* l4 = d + a.l4;
  store16(l4 + at, 0);
  uint16_t c = csum(l4, l4_len, pseudo_sum(d + a.off, a.v4, a.proto, l4_len));
  if (a.proto == kIpUdp && c == 0) c = 0xffff;
  store16(l4 + at, c);
}

uint32_t GsoCutter::start(const uint8_t* f, uint32_t n, const FrameOffload& o, uint32_t mtu) {
  next_ = count_ = 0;
  const uint8_t g = o.gso_type;
  if (g && g != kGsoTcpV4 && g != kGsoTcpV6 && g != kGsoUdpL4) return kOffloadGsoType;
  // Without a GSO type (no vnet header: a frame longer than the MTU) a frame
  // this does not understand is no offload's doing: it passes as it came.
  const uint32_t refuse = g ? static_cast<uint32_t>(kOffloadHeaders) : kNone;
  const uint8_t want = g == kGsoUdpL4 ? kIpUdp : kIpTcp;
  uint32_t l3;
  uint16_t type;
  L3 a, in;
  if (!l2_at(f, n, 0, &l3, &type) || !l3_at(f, n, l3, type, &a)) return refuse;
  in = a;
  oip_ = oudp_ = 0;
  if (a.proto == kIpUdp && !(want == kIpUdp && (o.csum_start < 0 || static_cast<uint32_t>(o.csum_start) == a.l4))) {
    // A UDP tunnel: 8 bytes of tunnel header (VXLAN), then an Ethernet frame
    // that ends where the outer packet does, its L4 header where the kernel
    // put the checksum to finish.
    const uint32_t tunnel = g ? static_cast<uint32_t>(kOffloadUdpTunnel) : kNone;
    uint32_t il3;
    uint16_t itype;
    if (a.end < a.l4 + 8 || be16(load16(f + a.l4 + 4)) != a.end - a.l4) return tunnel;
    if (!l2_at(f, a.end, a.l4 + 16, &il3, &itype) || !l3_at(f, a.end, il3, itype, &in) || in.end != a.end)
      return tunnel;
    if (o.csum_start >= 0 && static_cast<uint32_t>(o.csum_start) != in.l4) return tunnel;
    oip_ = a.off;
    oudp_ = a.l4;
    o4_ = a.v4;
    ocsum_ = load16(f + a.l4 + 6) != 0;  // zero: the tunnel sends no checksum (noudpcsum)
  } else if (g && a.proto == kIpGre) {
    return kOffloadGre;
  } else if (g && (a.proto == kIpIpip || a.proto == kIpIpv6)) {
    return kOffloadIpip;
  }
  if (in.proto != want || (g == kGsoTcpV4 && !in.v4) || (g == kGsoTcpV6 && in.v4)) return refuse;
  if (o.csum_start >= 0 && static_cast<uint32_t>(o.csum_start) != in.l4) return refuse;
  uint32_t l4hl = 8;
  if (want == kIpTcp) {
    if (in.end < in.l4 + 20) return refuse;
    l4hl = (f[in.l4 + 12] >> 4) * 4u;
    if (l4hl < 20) return refuse;
  }
  if (in.end < in.l4 + l4hl) return refuse;
  hl_ = in.l4 + l4hl;
  payload_ = in.end - hl_;
  uint32_t mss = o.gso_size;
  if (!g) {  // cut at the MTU: what is left of it after the headers (outer ones included)
    const uint32_t headers = hl_ - l3;
    if (mtu < headers + 8 || payload_ <= mtu - headers) return kNone;
    mss = mtu - headers;
  }
  if (!mss || hl_ + mss > Packet::max_capacity()) return refuse;
  f_ = f;
  ip_ = in.off;
  l4_ = in.l4;
  v4_ = in.v4;
  proto_ = want;
  mss_ = mss;
  seq0_ = want == kIpTcp ? be32(load32(f + l4_ + 4)) : 0;
  id0_ = v4_ ? be16(load16(f + ip_ + 4)) : 0;
  oid0_ = oip_ && o4_ ? be16(load16(f + oip_ + 4)) : 0;
  count_ = payload_ ? (payload_ + mss - 1) / mss : 1;
  return 0;
}

uint32_t GsoCutter::take(PacketPool& pool, Packet** pkts, uint32_t room) {
  uint32_t k = 0;
  while (next_ < count_ && k < room) {
    Packet* p = pool.get_for(hl_ + mss_);
    if (!p) break;
    p->len = static_cast<uint16_t>(write(next_++, p->data()));
    pkts[k++] = p;
  }
  return k;
}

uint32_t GsoCutter::write(uint32_t i, uint8_t* d) const {
  const uint32_t off = i * mss_, len = std::min(mss_, payload_ - off);
  const uint32_t total = hl_ + len;
  std::memcpy(d, f_, hl_);
  std::memcpy(d + hl_, f_ + hl_ + off, len);
  const uint64_t pseudo = set_ip(d, ip_, l4_, total, v4_, static_cast<uint16_t>(id0_ + i), proto_);
  uint8_t* l4 = d + l4_;
  if (proto_ == kIpTcp) {
    store32(l4 + 4, be32(seq0_ + off));
    if (i + 1 < count_) l4[13] &= static_cast<uint8_t>(~0x09);  // FIN, PSH: the last segment's
    if (i > 0) l4[13] &= static_cast<uint8_t>(~0x80);           // CWR: the first segment's
    store16(l4 + 16, 0);
    store16(l4 + 16, csum(l4, total - l4_, pseudo));
  } else {
    store16(l4 + 4, be16(static_cast<uint16_t>(total - l4_)));
    store16(l4 + 6, 0);
    const uint16_t c = csum(l4, total - l4_, pseudo);
    store16(l4 + 6, c ? c : 0xffff);
  }
  if (oip_) {
    uint8_t* u = d + oudp_;
    store16(u + 4, be16(static_cast<uint16_t>(total - oudp_)));
    const uint64_t opseudo = set_ip(d, oip_, oudp_, total, o4_, static_cast<uint16_t>(oid0_ + i), kIpUdp);
    if (ocsum_) {
      // The inner L4 bytes, checksum included, sum to the complement of
      // their pseudo-header sum (local checksum offload, as the kernel's
      // lco_csum): only the headers between the two are summed again.
      store16(u + 6, 0);
      const uint64_t inner = static_cast<uint16_t>(~csum_fold(pseudo));
      const uint16_t c = csum(u, l4_ - oudp_, opseudo + inner);
      store16(u + 6, c ? c : 0xffff);
    }
  }
  return total;
}

}  // namespace dpu
