// afxdp.cc: AF_XDP queues (see afxdp.h): the per-interface XDP program and
// the per-(port, worker) UMEM and XSK.
#include "afxdp.h"
#include "afxdp_lib.h"

#include <algorithm>
#include <string>

#ifndef DPU_HAVE_AFXDP

namespace dpu {
namespace {

constexpr bool kBuilt = false;

Status open_afxdp_queue(const QueueSpec& spec, std::unique_ptr<PortQueue>*) {
  return Status::Error(Err::INVALID, "interface " + spec.ifname +
                                         ": AF_XDP is not in this build (install libxdp-dev and libbpf-dev, rebuild)");
}

}  // namespace
}  // namespace dpu

#else  // DPU_HAVE_AFXDP

#include <dirent.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/if_link.h>
#include <linux/if_packet.h>
#include <linux/if_xdp.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <vector>

#include "../core_log.h"

// Newer than the kernel headers Debian 12 ships (Linux 6.6): multi-buffer.
#ifndef XDP_USE_SG
#define XDP_USE_SG (1 << 4)
#endif
#ifndef XDP_PKT_CONTD
#define XDP_PKT_CONTD (1 << 0)
#endif
#ifndef BPF_F_XDP_HAS_FRAGS
#define BPF_F_XDP_HAS_FRAGS (1U << 5)
#endif

namespace dpu {

namespace {

constexpr uint32_t kChunk = 4096;      // a UMEM chunk: one page (the largest aligned chunk)
constexpr uint32_t kRxChunks = 2048;   // fill and RX rings hold all of them
constexpr uint32_t kTxChunks = 1024;   // TX and completion rings hold all of them
constexpr uint32_t kMaxDescs = 16;     // descriptors one frame may take (multi-buffer)
constexpr uint32_t kFillBatch = 64;    // received chunks returned to the fill ring at once (of kRxChunks)
constexpr uint32_t kKicks = 64;        // sendto calls per kick (copy mode sends 32 frames a call)

// libxdp and libbpf (afxdp_lib.h), which open_afxdp_queue loaded before anything here runs.
const XdpLib& xdp() {
  std::string unused;
  return *xdp_lib(&unused);
}

Status xdp_error(const std::string& ifname, const char* what, int err) {
  std::string msg = "interface " + ifname + ": AF_XDP: " + what + ": " + std::strerror(err);
  if (err == EPERM || err == EACCES) msg += " (needs root, or CAP_NET_ADMIN, CAP_NET_RAW and CAP_BPF)";
  return Status::Error(Err::IO, msg);
}

// ---- the XDP program -------------------------------------------------------
//   r2 = ctx->rx_queue_index
//   return bpf_redirect_map(&xsks, r2, XDP_PASS)   (no XSK on that queue: the kernel's)
bpf_insn insn(uint8_t code, uint8_t dst, uint8_t src, int16_t off, int32_t imm) {
  bpf_insn i{};
  i.code = code;
  i.dst_reg = dst & 15;
  i.src_reg = src & 15;
  i.off = off;
  i.imm = imm;
  return i;
}

int load_program(int map_fd, bool frags) {
  const bpf_insn prog[] = {
      insn(BPF_LDX | BPF_MEM | BPF_W, BPF_REG_2, BPF_REG_1, offsetof(xdp_md, rx_queue_index), 0),
      insn(BPF_LD | BPF_DW | BPF_IMM, BPF_REG_1, BPF_PSEUDO_MAP_FD, 0, map_fd),
      insn(0, 0, 0, 0, 0),  // the upper half of the 64-bit immediate
      insn(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_3, 0, 0, XDP_PASS),
      insn(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_redirect_map),
      insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0),
  };
  bpf_prog_load_opts opts{};
  opts.sz = sizeof opts;
  opts.expected_attach_type = BPF_XDP;
  opts.prog_flags = frags ? BPF_F_XDP_HAS_FRAGS : 0;
  return xdp().bpf_prog_load(BPF_PROG_TYPE_XDP, "dpu_xsk", "Dual BSD/GPL", prog, sizeof prog / sizeof prog[0], &opts);
}

// ---- per interface: program, map, link, promiscuous mode ----------------------
struct XdpAttachment {
  std::string ifname;
  int ifindex = 0;
  int map_fd = -1, prog_fd = -1, link_fd = -1, promisc_fd = -1;
  bool native = false;  // driver mode (else generic)
  bool frags = false;   // the program takes multi-buffer frames
  std::string mode;     // for the description: "native XDP" / "generic XDP (...)"
  // The socket each XSKMAP slot (a receive queue) names now, under
  // g_attach_mu: a queue replaced by a new one on the same attachment (an
  // interface moved away and back) must not clear its successor's slot.
  std::map<uint32_t, const void*> slot_owner;

  ~XdpAttachment() {
    for (int fd : {link_fd, prog_fd, map_fd, promisc_fd})  // the link first: that detaches the program
      if (fd >= 0) close(fd);
  }
};

// Why a driver refused native mode, where the error number alone is cryptic.
const char* native_hint(int err) {
  switch (err) {
    case EOPNOTSUPP: return ", the driver has no native XDP";
    case ENOSPC: return ", veth: its peer transmits on more queues than this end receives on";
    case ERANGE: return ", veth: its peer's MTU is too large for XDP on this kernel";
    default: return "";
  }
}

std::mutex g_attach_mu;
std::map<int, std::weak_ptr<XdpAttachment>> g_attached;  // by ifindex

// The interface an attachment's link is on now (0: none; -1: cannot tell).
int link_ifindex(const XdpAttachment& a) {
  if (a.link_fd < 0) return -1;
  bpf_link_info info{};
  __u32 len = sizeof info;
  if (xdp().bpf_obj_get_info_by_fd(a.link_fd, &info, &len) != 0) return -1;
  return static_cast<int>(info.xdp.ifindex);
}

Status attach(const QueueSpec& spec, int ifindex, std::shared_ptr<XdpAttachment>* out, bool* fresh) {
  std::lock_guard<std::mutex> g(g_attach_mu);
  *fresh = false;
  for (auto it = g_attached.begin(); it != g_attached.end();)  // interfaces gone or detached
    it = it->second.expired() ? g_attached.erase(it) : std::next(it);
  if (auto a = g_attached[ifindex].lock()) {
    *out = a;
    return Status::Ok();
  }
  // An interface moved to another namespace and back keeps its program (the
  // link follows it) but may come back under another index: ours, re-keyed.
  for (auto& kv : g_attached) {
    auto a = kv.second.lock();
    if (a && kv.first != ifindex && link_ifindex(*a) == ifindex) {
      a->ifindex = ifindex;
      g_attached[ifindex] = a;
      *out = a;
      return Status::Ok();
    }
  }
  auto a = std::make_shared<XdpAttachment>();
  a->ifname = spec.ifname;
  a->ifindex = ifindex;
  a->map_fd = xdp().bpf_map_create(BPF_MAP_TYPE_XSKMAP, "dpu_xsks", sizeof(int), sizeof(int),
                             std::max<uint32_t>({spec.n_queues, spec.n_workers, 1}), nullptr);
  if (a->map_fd < 0) return xdp_error(spec.ifname, "XSKMAP", errno);
  a->frags = true;
  a->prog_fd = load_program(a->map_fd, true);
  if (a->prog_fd < 0) {  // a kernel without multi-buffer XDP (before 5.18)
    a->frags = false;
    a->prog_fd = load_program(a->map_fd, false);
  }
  if (a->prog_fd < 0) return xdp_error(spec.ifname, "loading the XDP program", errno);
  bpf_link_create_opts lo{};
  lo.sz = sizeof lo;
  lo.flags = XDP_FLAGS_DRV_MODE;
  a->link_fd = xdp().bpf_link_create(a->prog_fd, ifindex, BPF_XDP, &lo);
  a->native = a->link_fd >= 0;
  if (a->native) {
    a->mode = "native XDP";
  } else {
    const int drv_err = errno;
    if (drv_err == EBUSY || drv_err == EEXIST)
      return Status::Error(Err::IO, "interface " + spec.ifname +
                                        ": AF_XDP: it already has an XDP program (another dpu?); "
                                        "`ip link set dev " + spec.ifname + " xdp off` if nothing needs it");
    lo.flags = XDP_FLAGS_SKB_MODE;
    a->link_fd = xdp().bpf_link_create(a->prog_fd, ifindex, BPF_XDP, &lo);
    if (a->link_fd < 0) return xdp_error(spec.ifname, "attaching the XDP program", errno);
    a->mode = std::string("generic XDP (SKB mode: native attach failed: ") + std::strerror(drv_err) +
              native_hint(drv_err) + ")";
  }
  // Promiscuous for as long as this socket lives (a membership, not a flag left set).
  a->promisc_fd = socket(AF_PACKET, SOCK_RAW, 0);
  if (a->promisc_fd < 0) return xdp_error(spec.ifname, "packet socket", errno);
  packet_mreq mr{};
  mr.mr_ifindex = ifindex;
  mr.mr_type = PACKET_MR_PROMISC;
  if (setsockopt(a->promisc_fd, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mr, sizeof mr) < 0)
    return xdp_error(spec.ifname, "promiscuous mode", errno);
  g_attached[ifindex] = a;
  *out = a;
  *fresh = true;
  return Status::Ok();
}

uint64_t realtime_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// ---- per (port, worker): UMEM and XSK ---------------------------------------------
class AfXdpQueue : public PortQueue {
 public:
  ~AfXdpQueue() override;
  Status open(const QueueSpec& spec);
  uint32_t rx_burst(PacketPool& pool, Packet** pkts, uint32_t max, uint32_t cap) override;
  uint32_t tx_burst(Packet* const* pkts, uint32_t n) override;
  int fd() const override { return fd_; }
  void refresh_counters() override;
  bool bound() const override;
  const std::string& description() const { return desc_; }

 private:
  Status create_socket(const QueueSpec& spec, uint16_t bind_flags);
  void close_socket();
  uint8_t* chunk(uint64_t addr) { return area_ + addr; }
  // Back to the fill ring, kFillBatch at a time: the ring's lines are read
  // by the kernel on another CPU, and each submit moves them over.
  void recycle(const uint64_t* addrs, uint32_t n);
  void flush_fill();
  void reap();                                      // completion ring -> free TX chunks
  uint32_t tx_pending() const { return tx_.cached_prod - __atomic_load_n(tx_.consumer, __ATOMIC_ACQUIRE); }
  void kick();

  std::shared_ptr<XdpAttachment> att_;
  uint8_t* area_ = nullptr;
  size_t area_bytes_ = 0;
  xsk_umem* umem_ = nullptr;
  xsk_socket* xsk_ = nullptr;
  xsk_ring_prod fill_{}, tx_{};
  xsk_ring_cons comp_{}, rx_{};
  int fd_ = -1;
  uint32_t ofport_ = 0, queue_ = 0;
  bool sg_ = false, zc_ = false, up_ = true;
  std::vector<uint64_t> tx_free_;
  std::vector<uint64_t> fill_wait_;  // received chunks not yet back in the fill ring
  xdp_statistics seen_{};  // the kernel's counts at the last refresh (they never reset)
  std::string desc_;
};

AfXdpQueue::~AfXdpQueue() {
  if (att_ && xsk_) {
    std::lock_guard<std::mutex> g(g_attach_mu);
    if (att_->slot_owner[queue_] == this) {
      xdp().bpf_map_delete_elem(att_->map_fd, &queue_);
      att_->slot_owner.erase(queue_);
    }
  }
  close_socket();
  if (area_) munmap(area_, area_bytes_);
  // att_ goes last: the last queue of an interface detaches its program.
}

void AfXdpQueue::close_socket() {
  if (xsk_) xdp().xsk_socket__delete(xsk_);
  if (umem_) xdp().xsk_umem__delete(umem_);
  xsk_ = nullptr;
  umem_ = nullptr;
  fd_ = -1;
}

Status AfXdpQueue::create_socket(const QueueSpec& spec, uint16_t bind_flags) {
  xsk_umem_config uc{};
  uc.fill_size = kRxChunks;
  uc.comp_size = kTxChunks;
  uc.frame_size = kChunk;
  uc.frame_headroom = 0;
  uc.flags = 0;
  int r = xdp().xsk_umem__create(&umem_, area_, area_bytes_, &fill_, &comp_, &uc);
  if (r) {
    umem_ = nullptr;
    return xdp_error(spec.ifname, "registering the UMEM", -r);
  }
  xsk_socket_config sc{};
  sc.rx_size = kRxChunks;
  sc.tx_size = kTxChunks;
  sc.libxdp_flags = XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD;  // ours is attached already
  sc.xdp_flags = 0;
  sc.bind_flags = bind_flags;
  r = xdp().xsk_socket__create(&xsk_, spec.ifname.c_str(), queue_, umem_, &rx_, &tx_, &sc);
  if (r) {
    xsk_ = nullptr;
    close_socket();
    return xdp_error(spec.ifname, ("binding queue " + std::to_string(queue_)).c_str(), -r);
  }
  fd_ = xdp().xsk_socket__fd(xsk_);
  return Status::Ok();
}

Status AfXdpQueue::open(const QueueSpec& spec) {
  ofport_ = spec.ofport;
  queue_ = spec.queue;
  const int ifindex = static_cast<int>(if_nametoindex(spec.ifname.c_str()));
  if (!ifindex) return Status::Error(Err::IO, "no interface named " + spec.ifname);
  const uint32_t nq = interface_queues(spec.ifname);
  if (nq && nq < spec.n_workers)
    return Status::Error(Err::INVALID, "interface " + spec.ifname + " has " + std::to_string(nq) + " queue(s), " +
                                           std::to_string(spec.n_workers) +
                                           " workers need as many with AF_XDP (one queue per worker)");
  bool fresh = false;
  Status st = attach(spec, ifindex, &att_, &fresh);
  if (!st.ok()) return st;
  area_bytes_ = static_cast<size_t>(kRxChunks + kTxChunks) * kChunk;
  void* m = mmap(nullptr, area_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (m == MAP_FAILED) return xdp_error(spec.ifname, "UMEM memory", errno);
  area_ = static_cast<uint8_t*>(m);
  // The kernel picks zero-copy where it can, unless generic XDP (copy only).
  // Multi-buffer first; a kernel or driver without it binds without.
  const uint16_t base = XDP_USE_NEED_WAKEUP | (att_->native ? 0 : XDP_COPY);
  sg_ = att_->frags && create_socket(spec, base | XDP_USE_SG).ok();
  if (!sg_) {
    st = create_socket(spec, base);
    if (!st.ok()) return st;
  }
  uint32_t idx = 0;
  if (xsk_ring_prod__reserve(&fill_, kRxChunks, &idx) != kRxChunks)
    return Status::Error(Err::IO, "interface " + spec.ifname + ": AF_XDP: the fill ring is short");
  for (uint32_t i = 0; i < kRxChunks; i++) *xsk_ring_prod__fill_addr(&fill_, idx + i) = uint64_t{i} * kChunk;
  xsk_ring_prod__submit(&fill_, kRxChunks);
  tx_free_.clear();
  for (uint32_t i = kTxChunks; i-- > 0;) tx_free_.push_back(uint64_t{kRxChunks + i} * kChunk);
  xdp_options opt{};
  socklen_t len = sizeof opt;
  zc_ = getsockopt(fd_, SOL_XDP, XDP_OPTIONS, &opt, &len) == 0 && (opt.flags & XDP_OPTIONS_ZEROCOPY);
  len = sizeof seen_;
  getsockopt(fd_, SOL_XDP, XDP_STATISTICS, &seen_, &len);
  {
    std::lock_guard<std::mutex> g(g_attach_mu);
    if (int r = xdp().xsk_socket__update_xskmap(xsk_, att_->map_fd))  // from here on frames flow
      return xdp_error(spec.ifname, "XSKMAP update", -r);
    att_->slot_owner[queue_] = this;
  }
  desc_ = "interface " + spec.ifname + " queue " + std::to_string(queue_) + ": AF_XDP, " + att_->mode + ", " +
          (zc_ ? "zero-copy" : "copy mode") + ", " +
          (sg_ ? "multi-buffer (jumbo frames)"
               : "single buffer (frames over " + std::to_string(kChunk - XDP_PACKET_HEADROOM) + " bytes are dropped)");
  if (fresh && (!att_->native || !sg_)) corelog::say(corelog::Level::kInfo, desc_);
  return Status::Ok();
}

// An XDP socket is unbound when its interface is unregistered (deleted, or
// moved to another namespace): sending then fails with ENXIO, where a bound
// socket with nothing to send takes a zero-length send as a kick (ENETDOWN:
// bound, the link is down).
bool AfXdpQueue::bound() const {
  if (fd_ < 0) return true;
  return sendto(fd_, nullptr, 0, MSG_DONTWAIT, nullptr, 0) >= 0 || errno != ENXIO;
}

void AfXdpQueue::recycle(const uint64_t* addrs, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) fill_wait_.push_back(addrs[i] & ~uint64_t{kChunk - 1});
  if (fill_wait_.size() >= kFillBatch) flush_fill();
}

void AfXdpQueue::flush_fill() {
  const uint32_t n = static_cast<uint32_t>(fill_wait_.size());
  uint32_t idx = 0;
  // Never short: the fill ring holds every RX chunk, and these were not in it.
  if (!n || xsk_ring_prod__reserve(&fill_, n, &idx) != n) return;
  for (uint32_t i = 0; i < n; i++) *xsk_ring_prod__fill_addr(&fill_, idx + i) = fill_wait_[i];
  xsk_ring_prod__submit(&fill_, n);
  fill_wait_.clear();
}

uint32_t AfXdpQueue::rx_burst(PacketPool& pool, Packet** pkts, uint32_t max, uint32_t cap) {
  const uint32_t frames_max = std::min(max, cap);
  uint32_t idx = 0;
  // Enough descriptors for frames_max frames when some take several.
  const uint32_t n = xsk_ring_cons__peek(&rx_, frames_max + (sg_ ? kMaxDescs : 0), &idx);
  if (!n) {
    flush_fill();  // an idle queue holds none back
    if (xsk_ring_prod__needs_wakeup(&fill_))  // zero-copy drivers wait for a nudge
      recvfrom(fd_, nullptr, 0, MSG_DONTWAIT, nullptr, nullptr);
    return 0;
  }
  uint64_t done[kBatchMax + kMaxDescs];
  uint32_t used = 0, got = 0;
  const uint64_t ts = realtime_ns();
  while (got < frames_max && used < n) {
    // One frame: descriptors used..last (all but the last marked "continued").
    uint32_t last = used, len = 0;
    while (last < n && (xsk_ring_cons__rx_desc(&rx_, idx + last)->options & XDP_PKT_CONTD))
      len += xsk_ring_cons__rx_desc(&rx_, idx + last++)->len;
    if (last == n) break;  // its last descriptor is past this peek: next burst
    len += xsk_ring_cons__rx_desc(&rx_, idx + last)->len;
    if (len > Packet::max_capacity()) {
      counters.rx_too_long++;
      rejects.push_back({ofport_, len});
    } else {
      Packet* p = pool.get_for(len);
      if (!p) break;  // pool full: this frame waits for the next burst
      uint8_t* d = p->data();
      for (uint32_t i = used; i <= last; i++) {
        const xdp_desc* x = xsk_ring_cons__rx_desc(&rx_, idx + i);
        copy_frame(d, chunk(x->addr), x->len);
        d += x->len;
      }
      p->len = static_cast<uint16_t>(len);
      p->md.in_port = ofport_;
      p->md.timestamp_ns = ts;
      pkts[got++] = p;
    }
    for (; used <= last; used++) done[used] = xsk_ring_cons__rx_desc(&rx_, idx + used)->addr;
  }
  xsk_ring_cons__release(&rx_, used);
  xsk_ring_cons__cancel(&rx_, n - used);
  recycle(done, used);
  return got;
}

void AfXdpQueue::reap() {
  uint32_t idx = 0;
  const uint32_t n = xsk_ring_cons__peek(&comp_, kTxChunks, &idx);
  for (uint32_t i = 0; i < n; i++) tx_free_.push_back(*xsk_ring_cons__comp_addr(&comp_, idx + i));
  if (n) xsk_ring_cons__release(&comp_, n);
}

void AfXdpQueue::kick() {
  if (!xsk_ring_prod__needs_wakeup(&tx_)) return;  // a zero-copy driver already polls the ring
  for (uint32_t i = 0; i < kKicks && tx_pending(); i++) {
    if (sendto(fd_, nullptr, 0, MSG_DONTWAIT, nullptr, 0) >= 0) continue;
    if (errno == EAGAIN || errno == EBUSY) continue;  // more than one call's worth / one frame not taken
    if (errno == ENETDOWN || errno == ENXIO) up_ = false;
    break;  // what is left goes with the next kick
  }
}

uint32_t AfXdpQueue::tx_burst(Packet* const* pkts, uint32_t n) {
  reap();
  uint32_t sent = 0, descs = 0;
  if (up_) {
    for (uint32_t k = 0; k < n; k++) {
      const Packet* p = pkts[k];
      const uint32_t need = (p->len + kChunk - 1) / kChunk;
      if (!need || need > kMaxDescs || (need > 1 && !sg_)) continue;  // cannot go: refused
      uint32_t idx = 0;
      if (tx_free_.size() < need || xsk_ring_prod__reserve(&tx_, need, &idx) != need) break;  // full
      const uint8_t* s = p->data();
      for (uint32_t i = 0, off = 0; i < need; i++, off += kChunk) {
        const uint64_t addr = tx_free_.back();
        tx_free_.pop_back();
        const uint32_t len = std::min<uint32_t>(kChunk, p->len - off);
        copy_frame(chunk(addr), s + off, len);
        xdp_desc* x = xsk_ring_prod__tx_desc(&tx_, idx + i);
        x->addr = addr;
        x->len = len;
        x->options = i + 1 < need ? XDP_PKT_CONTD : 0;
      }
      descs += need;
      sent++;
    }
  }
  if (descs) {
    xsk_ring_prod__submit(&tx_, descs);
    kick();
  }
  counters.tx_refused += n - sent;
  return sent;
}

void AfXdpQueue::refresh_counters() {
  xdp_statistics st{};
  socklen_t len = sizeof st;
  if (getsockopt(fd_, SOL_XDP, XDP_STATISTICS, &st, &len) == 0) {
    const uint64_t drops = (st.rx_dropped - seen_.rx_dropped) + (st.rx_ring_full - seen_.rx_ring_full);
    __atomic_fetch_add(&counters.rx_ring_drops, drops, __ATOMIC_RELAXED);
    __atomic_fetch_add(&counters.tx_refused, st.tx_invalid_descs - seen_.tx_invalid_descs, __ATOMIC_RELAXED);
    seen_ = st;
  }
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, att_->ifname.c_str(), IFNAMSIZ - 1);
  if (ioctl(att_->promisc_fd, SIOCGIFFLAGS, &ifr) == 0)
    up_ = (ifr.ifr_flags & IFF_UP) && (ifr.ifr_flags & IFF_RUNNING);
  if (up_ && tx_pending()) kick();
}

constexpr bool kBuilt = true;

Status open_afxdp_queue(const QueueSpec& spec, std::unique_ptr<PortQueue>* out) {
  std::string why;
  if (!xdp_lib(&why)) return Status::Error(Err::IO, "interface " + spec.ifname + ": " + why);
  auto q = std::make_unique<AfXdpQueue>();
  Status st = q->open(spec);
  if (st.ok()) *out = std::move(q);
  return st;
}

}  // namespace
}  // namespace dpu

#endif  // DPU_HAVE_AFXDP

namespace dpu {
namespace {

class AfXdpBackend final : public IoBackend {
 public:
  const char* name() const override { return "afxdp"; }
  bool built() const override { return kBuilt; }
  // Every receive queue of the interface, and at least one per worker (an
  // interface with fewer is refused when the queue opens).
  uint32_t queues(const std::string& ifname, uint32_t n_workers) const override {
    return std::max(n_workers, interface_queues(ifname));
  }
  Status open(const QueueSpec& spec, std::unique_ptr<PortQueue>* out) const override {
    return open_afxdp_queue(spec, out);
  }
  // The interface must come back with the queues dpu started with: each
  // worker binds the ones it had.
  Status reopen(const QueueSpec& spec, int, std::unique_ptr<PortQueue>* out) const override {
    const uint32_t nq = interface_queues(spec.ifname);
    if (nq && nq != spec.n_queues)
      return Status::Error(Err::INVALID, "it has " + std::to_string(nq) + " queue(s), dpu started with " +
                                             std::to_string(spec.n_queues) + " (restart dpu to use them)");
    return open(spec, out);
  }
};

}  // namespace

const IoBackend& afxdp_backend() {
  static const AfXdpBackend b;
  return b;
}

}  // namespace dpu
