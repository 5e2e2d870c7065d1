// afpacket.cc: AF_PACKET TPACKET_V3 receive ring and sendmmsg transmit
// (see afpacket.h).
#include "afpacket.h"

#include <arpa/inet.h>
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

Status sys_error(const std::string& ifname, const char* what, int err) {
  std::string msg = "interface " + ifname + ": " + what + ": " + std::strerror(err);
  if (err == EPERM || err == EACCES) msg += " (needs root or CAP_NET_RAW)";
  return Status::Error(Err::IO, msg);
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
    const FrameOffload off = frame_offload(frame, vnet_, (h->tp_status & TP_STATUS_CSUMNOTREADY) != 0, tagged ? 4 : 0);
    bool taken = true;
    if (h->tp_snaplen < h->tp_len) {
      counters.rx_too_long++;
      rejects.push_back({ofport_, h->tp_len});
    } else if (__builtin_expect(off.gso_type || (!vnet_ && need > mtu_ + (tagged ? 18u : 14u)), 0)) {
      taken = rx_super(h, frame, need, off, ts, pool, pkts, cap, &got);  // a super-frame (or just too long)
    } else if (need > Packet::max_capacity()) {
      counters.rx_too_long++;
      rejects.push_back({ofport_, h->tp_len});
    } else if (Packet* p = pool.get_for(need)) {
      if (tagged) put_tag_back(p->data(), frame, len, h);
      else copy_frame(p->data(), frame, len);
      fill(p, need, ts, off);
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

void AfPacketQueue::fill(Packet* p, uint32_t len, uint64_t ts, const FrameOffload& off) {
  p->len = static_cast<uint16_t>(len);
  p->md.in_port = ofport_;
  p->md.timestamp_ns = ts;
  if (off.csum_start != -1) finish_partial(p->data(), len, off.csum_start, off.csum_offset);
}

__attribute__((noinline, cold)) bool AfPacketQueue::rx_super(const tpacket3_hdr* h, const uint8_t* frame,
                                                             uint32_t need, const FrameOffload& off, uint64_t ts,
                                                             PacketPool& pool, Packet** pkts, uint32_t cap,
                                                             uint32_t* got) {
  if (!cutter_.busy()) {  // a new frame (else: the one a previous burst began to cut)
    const uint8_t* f = frame;
    if (h->tp_status & TP_STATUS_VLAN_VALID) {
      scratch_.resize(need);
      put_tag_back(scratch_.data(), frame, h->tp_snaplen, h);
      f = scratch_.data();
    }
    const uint32_t why = cutter_.start(f, need, off, mtu_);
    if (why == GsoCutter::kNone) {  // nothing to cut: as it came (the port may refuse it)
      if (need > Packet::max_capacity()) {
        counters.rx_too_long++;
        rejects.push_back({ofport_, h->tp_len});
        return true;
      }
      Packet* p = pool.get_for(need);
      if (!p) return false;
      std::memcpy(p->data(), f, need);
      fill(p, need, ts, off);
      pkts[(*got)++] = p;
      return true;
    }
    if (why) {
      __atomic_fetch_or(&counters.offload_kinds, static_cast<uint64_t>(why), __ATOMIC_RELAXED);
      rejects.push_back({ofport_, h->tp_len, DROP_OFFLOAD_UNSUPPORTED});
      return true;
    }
  }
  const uint32_t k = cutter_.take(pool, pkts + *got, cap - *got);
  for (uint32_t i = *got; i < *got + k; i++) {
    pkts[i]->md.in_port = ofport_;
    pkts[i]->md.timestamp_ns = ts;
  }
  *got += k;
  return !cutter_.busy();
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

namespace {

class AfPacketBackend final : public IoBackend {
 public:
  const char* name() const override { return "afpacket"; }
  bool built() const override { return true; }
  uint32_t queues(const std::string&, uint32_t n_workers) const override { return n_workers; }

  Status open(const QueueSpec& spec, std::unique_ptr<PortQueue>* out) const override {
    AfPacketConfig ac;
    ac.ifname = spec.ifname;
    ac.ofport = spec.ofport;
    ac.fanout_id = spec.n_workers > 1 ? spec.group : -1;
    auto q = std::make_unique<AfPacketQueue>();
    Status st = q->open(ac);
    if (st.ok()) *out = std::move(q);
    return st;
  }

  // The new fanout group: the first of kGroupTries numbers, a sequence drawn
  // from the new index, that the kernel accepts. Every worker walks the same
  // sequence, so they meet in one group even if a number is taken.
  Status reopen(const QueueSpec& first, int ifindex, std::unique_ptr<PortQueue>* out) const override {
    constexpr int kGroupTries = 8;
    QueueSpec spec = first;
    const uint32_t base = static_cast<uint32_t>(first.group);
    Status st;
    for (int t = 0; t < kGroupTries; t++) {
      spec.group = static_cast<int>((base + (static_cast<uint32_t>(ifindex) + t) * 40503u) & 0xffff);
      st = open(spec, out);
      if (st.ok()) break;
    }
    return st;
  }
};

}  // namespace

const IoBackend& afpacket_backend() {
  static const AfPacketBackend b;
  return b;
}

}  // namespace dpu
