// afpacket.cc: AF_PACKET TPACKET_V3 receive ring and sendmmsg transmit
// (see afpacket.h).
#include "afpacket.h"

#include <arpa/inet.h>
#include <linux/ethtool.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "../checksum.h"

namespace dpu {

namespace {

// linux/virtio_net.h's struct virtio_net_hdr (that header is not C++-clean):
// what PACKET_VNET_HDR puts before each frame, in host byte order.
struct VnetHdr {
  uint8_t flags;
  uint8_t gso_type;
  uint16_t hdr_len, gso_size, csum_start, csum_offset;
};
static_assert(sizeof(VnetHdr) == 10, "virtio_net_hdr is 10 bytes");
constexpr uint8_t kVnetNeedsCsum = 1, kGsoTcpV4 = 1, kGsoTcpV6 = 4, kGsoEcn = 0x80;

Status sys_error(const std::string& ifname, const char* what, int err) {
  std::string msg = "interface " + ifname + ": " + what + ": " + std::strerror(err);
  if (err == EPERM || err == EACCES) msg += " (needs root or CAP_NET_RAW)";
  return Status::Error(Err::IO, msg);
}

// Finishes a TCP/UDP checksum the sender left for offload (the kernel marks
// such frames TP_STATUS_CSUMNOTREADY): what a NIC would have put on the wire.
void finish_checksum(uint8_t* d, uint32_t n) {
  uint32_t off = 12;
  uint16_t type = be16(load16(d + off));
  off += 2;
  if ((type == kEthVlan || type == kEthQinQ) && n >= 18) {
    type = be16(load16(d + 16));
    off = 18;
  }
  uint8_t* ip = d + off;
  uint8_t proto;
  uint32_t l4_off, l4_len;
  uint64_t pseudo;
  if (type == kEthIp && n >= off + 20) {
    uint32_t ihl = (ip[0] & 15u) * 4, tot = be16(load16(ip + 2));
    if (ihl < 20 || tot < ihl || off + tot > n) return;
    proto = ip[9];
    l4_off = off + ihl;
    l4_len = tot - ihl;
    pseudo = pseudo_sum_v4(ip + 12, ip + 16, proto, l4_len);
  } else if (type == kEthIpv6 && n >= off + 40) {
    proto = ip[6];  // no extension headers in offloaded frames
    l4_off = off + 40;
    l4_len = be16(load16(ip + 4));
    if (l4_off + l4_len > n) return;
    pseudo = pseudo_sum_v6(ip + 8, ip + 24, proto, l4_len);
  } else {
    return;
  }
  uint32_t at = proto == kIpTcp ? 16 : proto == kIpUdp ? 6 : 0;
  if (!at || l4_len < at + 2) return;
  uint8_t* l4 = d + l4_off;
  store16(l4 + at, 0);
  uint16_t c = csum(l4, l4_len, pseudo);
  if (proto == kIpUdp && c == 0) c = 0xffff;
  store16(l4 + at, c);
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

// The kernel keeps a received frame's VLAN tag aside: put it back where it was.
void put_tag_back(uint8_t* d, const uint8_t* frame, uint32_t len, const tpacket3_hdr* h) {
  std::memcpy(d, frame, 12);
  uint16_t tpid = (h->tp_status & TP_STATUS_VLAN_TPID_VALID) ? h->hv1.tp_vlan_tpid : kEthVlan;
  store16(d + 12, be16(tpid));
  store16(d + 14, be16(static_cast<uint16_t>(h->hv1.tp_vlan_tci)));
  std::memcpy(d + 16, frame + 12, len - 12);
}

}  // namespace

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

AfPacketQueue::~AfPacketQueue() {
  if (ring_) munmap(ring_, ring_bytes_);
  if (fd_ >= 0) close(fd_);
  if (tx_fd_ >= 0) close(tx_fd_);
}

Status AfPacketQueue::open(const AfPacketConfig& cfg) {
  ofport_ = cfg.ofport;
  ifindex_ = static_cast<int>(if_nametoindex(cfg.ifname.c_str()));
  if (!ifindex_) return Status::Error(Err::IO, "no interface named " + cfg.ifname);
  fd_ = socket(AF_PACKET, SOCK_RAW, 0);
  if (fd_ < 0) return sys_error(cfg.ifname, "AF_PACKET socket", errno);
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, cfg.ifname.c_str(), IFNAMSIZ - 1);
  if (ioctl(fd_, SIOCGIFMTU, &ifr) == 0 && ifr.ifr_mtu >= 68) mtu_ = static_cast<uint32_t>(ifr.ifr_mtu);
  int one_v = 1;  // before the ring: the kernel sizes frame slots with it
  vnet_ = setsockopt(fd_, SOL_PACKET, PACKET_VNET_HDR, &one_v, sizeof one_v) == 0;
  int v3 = TPACKET_V3;
  if (setsockopt(fd_, SOL_PACKET, PACKET_VERSION, &v3, sizeof v3) < 0)
    return sys_error(cfg.ifname, "TPACKET_V3", errno);
  tpacket_req3 req{};
  req.tp_block_size = cfg.block_size;
  req.tp_block_nr = cfg.block_nr;
  req.tp_frame_size = cfg.frame_size;
  req.tp_frame_nr = cfg.block_size / cfg.frame_size * cfg.block_nr;
  req.tp_retire_blk_tov = cfg.retire_ms;
  if (setsockopt(fd_, SOL_PACKET, PACKET_RX_RING, &req, sizeof req) < 0)
    return sys_error(cfg.ifname, "receive ring", errno);
  ring_bytes_ = static_cast<size_t>(cfg.block_size) * cfg.block_nr;
  void* m = mmap(nullptr, ring_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_LOCKED | MAP_POPULATE, fd_, 0);
  if (m == MAP_FAILED) m = mmap(nullptr, ring_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (m == MAP_FAILED) return sys_error(cfg.ifname, "mapping the ring", errno);
  ring_ = static_cast<uint8_t*>(m);
  block_size_ = cfg.block_size;
  block_nr_ = cfg.block_nr;
  int one = 1;
  setsockopt(fd_, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof one);
  setsockopt(fd_, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one);
  sockaddr_ll sll{};
  sll.sll_family = AF_PACKET;
  sll.sll_protocol = htons(ETH_P_ALL);
  sll.sll_ifindex = ifindex_;
  if (bind(fd_, reinterpret_cast<sockaddr*>(&sll), sizeof sll) < 0) return sys_error(cfg.ifname, "bind", errno);
  packet_mreq mr{};
  mr.mr_ifindex = ifindex_;
  mr.mr_type = PACKET_MR_PROMISC;
  if (setsockopt(fd_, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mr, sizeof mr) < 0)
    return sys_error(cfg.ifname, "promiscuous mode", errno);
  // Transmit goes through a socket of its own without PACKET_VNET_HDR: a
  // frame is then one iovec, with no header to copy in and parse. Protocol
  // 0: it receives nothing. Without it, the receive socket sends.
  tx_fd_ = socket(AF_PACKET, SOCK_RAW, 0);
  if (tx_fd_ >= 0) {
    sockaddr_ll tsll{};
    tsll.sll_family = AF_PACKET;
    tsll.sll_ifindex = ifindex_;
    setsockopt(tx_fd_, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof one);
    if (bind(tx_fd_, reinterpret_cast<sockaddr*>(&tsll), sizeof tsll) < 0) {
      close(tx_fd_);
      tx_fd_ = -1;
    }
  }
  if (cfg.fanout_id >= 0) {
    int arg = (cfg.fanout_id & 0xffff) | (PACKET_FANOUT_HASH << 16) | (PACKET_FANOUT_FLAG_DEFRAG << 16);
    if (setsockopt(fd_, SOL_PACKET, PACKET_FANOUT, &arg, sizeof arg) < 0)
      return sys_error(cfg.ifname, "PACKET_FANOUT", errno);
  }
  return Status::Ok();
}

// The kernel sets a packet socket's interface to -1 when that interface is
// unregistered; getsockname() reports it.
bool AfPacketQueue::bound() const {
  sockaddr_ll sll{};
  socklen_t len = sizeof sll;
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&sll), &len) < 0) return true;  // cannot tell: as it was
  return sll.sll_ifindex > 0;
}

void AfPacketQueue::refresh_counters() {
  tpacket_stats_v3 st{};
  socklen_t len = sizeof st;
  if (getsockopt(fd_, SOL_PACKET, PACKET_STATISTICS, &st, &len) == 0)  // reading resets the kernel's count
    __atomic_fetch_add(&counters.rx_ring_drops, static_cast<uint64_t>(st.tp_drops), __ATOMIC_RELAXED);
}

void AfPacketQueue::clear_error() {
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err)  // reading clears it
    __atomic_fetch_add(&counters.link_errors, 1, __ATOMIC_RELAXED);
}

bool AfPacketQueue::next_block() {
  auto* desc = reinterpret_cast<tpacket_block_desc*>(ring_ + static_cast<size_t>(cur_) * block_size_);
  auto* status = reinterpret_cast<std::atomic<uint32_t>*>(&desc->hdr.bh1.block_status);
  if (!(status->load(std::memory_order_acquire) & TP_STATUS_USER)) return false;
  left_ = desc->hdr.bh1.num_pkts;
  pkt_ = reinterpret_cast<uint8_t*>(desc) + desc->hdr.bh1.offset_to_first_pkt;
  if (!left_) release_block();
  return left_ != 0;
}

void AfPacketQueue::release_block() {
  auto* desc = reinterpret_cast<tpacket_block_desc*>(ring_ + static_cast<size_t>(cur_) * block_size_);
  reinterpret_cast<std::atomic<uint32_t>*>(&desc->hdr.bh1.block_status)->store(TP_STATUS_KERNEL,
                                                                                std::memory_order_release);
  cur_ = (cur_ + 1) % block_nr_;
  pkt_ = nullptr;
  left_ = 0;
}

uint32_t AfPacketQueue::segment(const uint8_t* f, uint32_t n, uint32_t gso_size, uint64_t ts, PacketPool& pool,
                                Packet** pkts, uint32_t room) {
  uint32_t l2 = 14;
  uint16_t type = be16(load16(f + 12));
  if (type == kEthVlan || type == kEthQinQ) {
    if (n < 18) return 0;
    l2 = 18;
    type = be16(load16(f + 16));
  }
  const uint8_t* ip = f + l2;
  uint32_t iphl, ip_len;
  if (type == kEthIp && n >= l2 + 20) {
    iphl = (ip[0] & 15u) * 4;
    ip_len = be16(load16(ip + 2));
    if (ip[9] != kIpTcp || iphl < 20 || (be16(load16(ip + 6)) & 0x3fff)) return 0;  // not TCP, or a fragment
  } else if (type == kEthIpv6 && n >= l2 + 40) {
    iphl = 40;
    ip_len = 40 + be16(load16(ip + 4));
    if (ip[6] != kIpTcp) return 0;
  } else {
    return 0;
  }
  if ((!gso_size && ip_len <= mtu_) || l2 + ip_len > n || ip_len < iphl + 20) return 0;
  const uint8_t* tcp = ip + iphl;
  const uint32_t thl = (tcp[12] >> 4) * 4u;
  if (thl < 20 || iphl + thl >= ip_len || (!gso_size && iphl + thl + 8 > mtu_)) return 0;
  const uint32_t hl = l2 + iphl + thl, payload = ip_len - iphl - thl;
  const uint32_t mss = gso_size ? gso_size : mtu_ - iphl - thl;
  const uint32_t k = (payload + mss - 1) / mss;
  if (k > room) return kNoRoom;
  const uint32_t seq0 = be32(load32(tcp + 4));
  const uint16_t id0 = type == kEthIp ? be16(load16(ip + 4)) : 0;
  for (uint32_t i = 0; i < k; i++) {
    const uint32_t off = i * mss, len = std::min(mss, payload - off);
    Packet* p = pool.get_for(hl + len);
    if (!p) {
      for (uint32_t j = 0; j < i; j++) pool.put(pkts[j]);
      return kNoRoom;
    }
    uint8_t* d = p->data();
    std::memcpy(d, f, hl);
    std::memcpy(d + hl, f + hl + off, len);
    uint8_t* sip = d + l2;
    uint8_t* st = sip + iphl;
    uint64_t pseudo;
    if (type == kEthIp) {
      store16(sip + 2, be16(static_cast<uint16_t>(iphl + thl + len)));
      store16(sip + 4, be16(static_cast<uint16_t>(id0 + i)));
      store16(sip + 10, 0);
      store16(sip + 10, csum(sip, iphl));
      pseudo = pseudo_sum_v4(sip + 12, sip + 16, kIpTcp, thl + len);
    } else {
      store16(sip + 4, be16(static_cast<uint16_t>(thl + len)));
      pseudo = pseudo_sum_v6(sip + 8, sip + 24, kIpTcp, thl + len);
    }
    store32(st + 4, be32(seq0 + off));
    if (i + 1 < k) st[13] &= static_cast<uint8_t>(~0x09);  // FIN, PSH: the last segment's
    if (i > 0) st[13] &= static_cast<uint8_t>(~0x80);      // CWR: the first segment's
    store16(st + 16, 0);
    store16(st + 16, csum(st, thl + len, pseudo));
    p->len = static_cast<uint16_t>(hl + len);
    p->md.in_port = ofport_;
    p->md.timestamp_ns = ts;
    pkts[i] = p;
  }
  return k;
}

uint32_t AfPacketQueue::rx_burst(PacketPool& pool, Packet** pkts, uint32_t max, uint32_t cap) {
  uint32_t got = 0, frames = 0;
  while (frames < max && got < cap) {
    if (!left_ && !next_block()) break;
    auto* h = reinterpret_cast<tpacket3_hdr*>(pkt_);
    const uint8_t* frame = pkt_ + h->tp_mac;
    const uint32_t len = h->tp_snaplen;
    const bool tagged = (h->tp_status & TP_STATUS_VLAN_VALID) != 0;
    const uint32_t need = len + (tagged ? 4 : 0);
    const uint64_t ts = static_cast<uint64_t>(h->tp_sec) * 1000000000ull + h->tp_nsec;
    uint32_t gso = 0;
    int cs_start = -1, cs_off = 0;
    if (vnet_) {
      VnetHdr vh;
      std::memcpy(&vh, frame - sizeof vh, sizeof vh);
      const uint8_t g = vh.gso_type & static_cast<uint8_t>(~kGsoEcn);
      if (g == kGsoTcpV4 || g == kGsoTcpV6) gso = vh.gso_size;
      if (vh.flags & kVnetNeedsCsum) {
        cs_start = vh.csum_start + (tagged ? 4 : 0);
        cs_off = vh.csum_offset;
      }
    } else if (h->tp_status & TP_STATUS_CSUMNOTREADY) {
      cs_start = -2;  // somewhere: at the L4 header
    }
    bool taken = true;
    if (h->tp_snaplen < h->tp_len) {
      counters.rx_truncated++;
      rejects.push_back({ofport_, h->tp_len});
    } else if (gso || (!vnet_ && need > mtu_ + (tagged ? 18u : 14u))) {  // a super-frame (or just too long)
      const uint8_t* f = frame;
      if (tagged) {
        scratch_.resize(need);
        put_tag_back(scratch_.data(), frame, len, h);
        f = scratch_.data();
      }
      uint32_t k = segment(f, need, gso, ts, pool, pkts + got, cap - got);
      if (k == kNoRoom) {
        taken = false;
      } else if (k) {
        got += k;
      } else if (need > Packet::max_capacity()) {
        counters.rx_truncated++;
      rejects.push_back({ofport_, h->tp_len});
      } else if (Packet* p = pool.get_for(need)) {  // not TCP: as it came (the port may refuse it)
        std::memcpy(p->data(), f, need);
        fill(p, need, ts, cs_start, cs_off);
        pkts[got++] = p;
      } else {
        taken = false;
      }
    } else if (need > Packet::max_capacity()) {
      counters.rx_truncated++;
      rejects.push_back({ofport_, h->tp_len});
    } else if (Packet* p = pool.get_for(need)) {
      if (tagged) put_tag_back(p->data(), frame, len, h);
      else copy_frame(p->data(), frame, len);
      fill(p, need, ts, cs_start, cs_off);
      pkts[got++] = p;
    } else {
      taken = false;
    }
    if (!taken) break;  // pool or batch full: this frame waits for the next burst
    frames++;
    left_--;
    if (left_) pkt_ += h->tp_next_offset;
    else release_block();
  }
  return got;
}

void AfPacketQueue::fill(Packet* p, uint32_t len, uint64_t ts, int cs_start, int cs_off) {
  p->len = static_cast<uint16_t>(len);
  p->md.in_port = ofport_;
  p->md.timestamp_ns = ts;
  uint8_t* d = p->data();
  if (cs_start >= 0 && static_cast<uint32_t>(cs_start + cs_off + 2) <= len) {
    // the field holds the pseudo-header sum: summing from csum_start folds it in
    store16(d + cs_start + cs_off, csum(d + cs_start, len - cs_start));
  } else if (cs_start == -2) {
    finish_checksum(d, len);
  }
}

uint32_t AfPacketQueue::tx_burst(Packet* const* pkts, uint32_t n) {
  constexpr uint32_t kMax = 64;
  static const VnetHdr kNoOffload{};  // with PACKET_VNET_HDR every frame sent starts with one
  mmsghdr msgs[kMax];
  iovec iov[kMax][2];
  uint32_t sent = 0;
  const int fd = tx_fd_ >= 0 ? tx_fd_ : fd_;
  const bool vnet = tx_fd_ < 0 && vnet_;
  while (sent < n) {
    uint32_t k = std::min(n - sent, kMax);
    for (uint32_t i = 0; i < k; i++) {
      iov[i][0].iov_base = const_cast<VnetHdr*>(&kNoOffload);
      iov[i][0].iov_len = sizeof kNoOffload;
      iov[i][1].iov_base = pkts[sent + i]->data();
      iov[i][1].iov_len = pkts[sent + i]->len;
      std::memset(&msgs[i], 0, sizeof msgs[i]);
      msgs[i].msg_hdr.msg_iov = vnet ? &iov[i][0] : &iov[i][1];
      msgs[i].msg_hdr.msg_iovlen = vnet ? 2 : 1;
    }
    int r = sendmmsg(fd, msgs, k, MSG_DONTWAIT);
    if (r <= 0) break;  // down, or the queue is full: what is left is refused
    sent += static_cast<uint32_t>(r);
    if (static_cast<uint32_t>(r) < k) break;
  }
  counters.tx_refused += n - sent;
  return sent;
}

Status open_afpacket_queue(const QueueSpec& spec, std::unique_ptr<PortQueue>* out) {
  AfPacketConfig ac;
  ac.ifname = spec.ifname;
  ac.ofport = spec.ofport;
  ac.fanout_id = spec.n_workers > 1 ? spec.group : -1;
  auto q = std::make_unique<AfPacketQueue>();
  Status st = q->open(ac);
  if (st.ok()) *out = std::move(q);
  return st;
}

}  // namespace dpu
