// traffic.cc: blaster and counter (see traffic.h).
#include "traffic.h"

#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace dpu {

namespace {

using Clock = std::chrono::steady_clock;

Status os_error(const std::string& ifname, const char* what) {
  return Status::Error(Err::IO, "interface " + ifname + ": " + what + ": " + std::strerror(errno));
}

// An AF_PACKET socket bound to ifname (protocol 0: receives nothing unless asked).
int bound_socket(const std::string& ifname, uint16_t proto, Status* st) {
  int ifindex = static_cast<int>(if_nametoindex(ifname.c_str()));
  if (!ifindex) {
    *st = Status::Error(Err::IO, "no interface named " + ifname);
    return -1;
  }
  int fd = socket(AF_PACKET, SOCK_RAW, htons(proto));
  if (fd < 0) {
    *st = os_error(ifname, "AF_PACKET socket");
    return -1;
  }
  sockaddr_ll sll{};
  sll.sll_family = AF_PACKET;
  sll.sll_protocol = htons(proto);
  sll.sll_ifindex = ifindex;
  if (bind(fd, reinterpret_cast<sockaddr*>(&sll), sizeof sll) < 0) {
    *st = os_error(ifname, "bind");
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

Status blast(const std::string& ifname, const uint8_t* data, const uint64_t* offsets, const uint32_t* lens, size_t n,
             double seconds, double rate_pps, TrafficResult* out) {
  if (!n) return Status::Error(Err::INVALID, "no frames to send");
  Status st;
  int fd = bound_socket(ifname, 0, &st);
  if (fd < 0) return st;
  int one = 1;
  setsockopt(fd, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof one);
  constexpr size_t kBurst = 64;
  std::vector<mmsghdr> msgs(kBurst);
  std::vector<iovec> iov(kBurst);
  size_t next = 0;
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration<double>(seconds);
  uint64_t sent = 0, bytes = 0;
  while (true) {
    const auto now = Clock::now();
    if (now >= end) break;
    size_t k = kBurst;
    if (rate_pps > 0) {  // pace: never ahead of the schedule
      const double due = std::chrono::duration<double>(now - t0).count() * rate_pps;
      if (static_cast<double>(sent) >= due) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      k = std::min<size_t>(kBurst, static_cast<size_t>(due - static_cast<double>(sent)) + 1);
    }
    for (size_t i = 0; i < k; i++) {
      iov[i].iov_base = const_cast<uint8_t*>(data + offsets[next]);
      iov[i].iov_len = lens[next];
      std::memset(&msgs[i], 0, sizeof msgs[i]);
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
      if (++next == n) next = 0;
    }
    int r = sendmmsg(fd, msgs.data(), static_cast<unsigned>(k), 0);
    if (r < 0) {
      if (errno == ENOBUFS || errno == EAGAIN || errno == EINTR) continue;
      st = os_error(ifname, "sendmmsg");
      break;
    }
    for (int i = 0; i < r; i++) bytes += msgs[i].msg_len;
    sent += static_cast<uint64_t>(r);
    // frames not taken are sent again in the next burst's order: the flow mix stays the same
    if (static_cast<size_t>(r) < k) next = (next + n - (k - static_cast<size_t>(r)) % n) % n;
  }
  out->packets = sent;
  out->bytes = bytes;
  out->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  close(fd);
  return st;
}

Status count_rx(const std::string& ifname, double seconds, TrafficResult* out) {
  Status st;
  int fd = bound_socket(ifname, ETH_P_ALL, &st);
  if (fd < 0) return st;
  int v3 = TPACKET_V3;
  tpacket_req3 req{};
  req.tp_block_size = 1u << 20;
  req.tp_block_nr = 32;
  req.tp_frame_size = 2048;
  req.tp_frame_nr = req.tp_block_size / req.tp_frame_size * req.tp_block_nr;
  req.tp_retire_blk_tov = 1;
  if (setsockopt(fd, SOL_PACKET, PACKET_VERSION, &v3, sizeof v3) < 0 ||
      setsockopt(fd, SOL_PACKET, PACKET_RX_RING, &req, sizeof req) < 0) {
    st = os_error(ifname, "receive ring");
    close(fd);
    return st;
  }
  const size_t ring_bytes = static_cast<size_t>(req.tp_block_size) * req.tp_block_nr;
  void* m = mmap(nullptr, ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    st = os_error(ifname, "mapping the ring");
    close(fd);
    return st;
  }
  auto* ring = static_cast<uint8_t*>(m);
  uint32_t cur = 0;
  uint64_t pkts = 0, bytes = 0;
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration<double>(seconds);
  pollfd pfd{fd, POLLIN, 0};
  while (Clock::now() < end) {
    auto* desc = reinterpret_cast<tpacket_block_desc*>(ring + static_cast<size_t>(cur) * req.tp_block_size);
    auto* status = reinterpret_cast<std::atomic<uint32_t>*>(&desc->hdr.bh1.block_status);
    if (!(status->load(std::memory_order_acquire) & TP_STATUS_USER)) {
      poll(&pfd, 1, 10);
      continue;
    }
    pkts += desc->hdr.bh1.num_pkts;
    bytes += desc->hdr.bh1.blk_len;  // block bytes in use: frames plus their headers
    status->store(TP_STATUS_KERNEL, std::memory_order_release);
    cur = (cur + 1) % req.tp_block_nr;
  }
  tpacket_stats_v3 ks{};
  socklen_t kl = sizeof ks;
  getsockopt(fd, SOL_PACKET, PACKET_STATISTICS, &ks, &kl);
  out->packets = pkts;
  out->bytes = bytes;
  out->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  munmap(m, ring_bytes);
  close(fd);
  return st;
}

}  // namespace dpu
