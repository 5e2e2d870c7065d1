// drop_writer.h: the drops file of `dpu replay --drops-pcap` and
// `dpu run --drops-pcap`: every arrival the dataplane dropped, as it arrived,
// with its port and reason.
//
// Records are whole pcapng blocks appended to a buffer; the buffer goes to
// the file in one write(2) when a worker ends a batch (DropSink::end_batch)
// and either the writer is prompt (`dpu run`: as `tcpdump -U` does, so the
// file can be read while dpu runs and holds every batch's drops if the
// process is killed) or the buffer holds kBuffered bytes (a replay: few,
// large writes). The file is a valid pcapng after every write: a block is
// never split across two.
//
// Thread-safety: dropped(), end_batch() and close() take a mutex (a live
// dataplane's workers share one file); packets() may be read from any thread.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "dpu/drops.h"
#include "dpu/ofparse.h"
#include "dpu/status.h"
#include "ports.h"
#include "stage.h"

namespace dpu {

// The drops file: pcapng (section header, one interface description per
// input port the first time it drops something, an enhanced packet block per
// drop with an opt_comment), so Wireshark shows the reason beside each
// packet (frame.comment). Timestamps in ns (if_tsresol 9). An oversize frame
// never had a buffer: its record has no bytes, only its length.
class PcapngDropWriter : public DropSink {
 public:
  enum class Flush { kWhenFull, kEachBatch };
  static constexpr size_t kBuffered = 1 << 20;  // kWhenFull: bytes held before a write

  // `ports`: the dataplane's, for their names; `app`: the writer, as the section header names it.
  PcapngDropWriter(std::string path, const std::vector<PortInfo>& ports, std::string app,
                   Flush flush = Flush::kWhenFull)
      : path_(std::move(path)), app_(std::move(app)), prompt_(flush == Flush::kEachBatch) {
    for (const PortInfo& p : ports) {
      if (names_.size() <= p.ofport) names_.resize(p.ofport + 1);
      names_[p.ofport] = p.name;
    }
  }
  ~PcapngDropWriter() {
    if (fd_ >= 0) ::close(fd_);
  }
  // Creates the file and writes its section header at once (a reader finds a pcapng file
  // with no packets, not an empty one).
  Status open() {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd_ < 0) return fail(errno);
    std::string b;
    u32(&b, 0x1A2B3C4D);  // byte-order magic
    u16(&b, 1);
    u16(&b, 0);
    u32(&b, 0xffffffffu);  // section length: unknown
    u32(&b, 0xffffffffu);
    option(&b, 4, app_);  // shb_userappl
    u32(&b, 0);                                 // opt_endofopt
    block(0x0A0D0D0A, b);
    write_out();
    return error_ ? fail(errno_) : Status::Ok();
  }
  void dropped(uint32_t port, uint64_t ts_ns, const uint8_t* data, uint32_t len, uint32_t wire_len,
               uint16_t reason) override {
    std::lock_guard<std::mutex> g(mu_);  // live workers share the file
    if (fd_ < 0 || error_) return;
    if (iface_.size() <= port) iface_.resize(port + 1, -1);
    std::string name = port < names_.size() ? names_[port] : std::to_string(port);
    if (iface_[port] < 0) {
      std::string b;
      u16(&b, 1);  // LINKTYPE_ETHERNET
      u16(&b, 0);
      u32(&b, 0);  // no snap length
      option(&b, 2, name);                        // if_name
      option(&b, 9, std::string(1, '\x09'));      // if_tsresol: 10^-9 s
      u32(&b, 0);
      block(1, b);
      iface_[port] = n_ifaces_++;
    }
    std::string b;
    u32(&b, static_cast<uint32_t>(iface_[port]));
    u32(&b, static_cast<uint32_t>(ts_ns >> 32));
    u32(&b, static_cast<uint32_t>(ts_ns));
    u32(&b, len);
    u32(&b, wire_len);
    if (len) b.append(reinterpret_cast<const char*>(data), len);
    b.append((4 - len % 4) % 4, '\0');
    option(&b, 1, std::string("drop_reason=") + drop_reason_name(reason) + " in_port=" + name);  // opt_comment
    u32(&b, 0);
    block(6, b);
    __atomic_store_n(&packets_, packets_ + 1, __ATOMIC_RELAXED);
    held_.store(true, std::memory_order_relaxed);
  }
  // A worker's batch ended: its records go to the file now (prompt) or once kBuffered
  // bytes are held. Without records held it takes no lock.
  void end_batch() override {
    if (!held_.load(std::memory_order_relaxed)) return;
    std::lock_guard<std::mutex> g(mu_);
    if (prompt_ || buf_.size() >= kBuffered) write_out();
  }
  Status close() {
    std::lock_guard<std::mutex> g(mu_);
    if (fd_ < 0) return Status::Ok();  // closed already (or never opened)
    write_out();
    if (::close(fd_) != 0 && !error_) {
      error_ = true;
      errno_ = errno;
    }
    fd_ = -1;
    return error_ ? fail(errno_) : Status::Ok();
  }
  uint64_t packets() const { return __atomic_load_n(&packets_, __ATOMIC_RELAXED); }

 private:
  static void u16(std::string* b, uint16_t v) { b->append(reinterpret_cast<const char*>(&v), 2); }
  static void u32(std::string* b, uint32_t v) { b->append(reinterpret_cast<const char*>(&v), 4); }
  static void option(std::string* b, uint16_t code, const std::string& v) {
    u16(b, code);
    u16(b, static_cast<uint16_t>(v.size()));
    b->append(v);
    b->append((4 - v.size() % 4) % 4, '\0');
  }
  // One whole block onto the buffer (under mu_).
  void block(uint32_t type, const std::string& body) {
    const uint32_t total = static_cast<uint32_t>(12 + body.size());
    u32(&buf_, type);
    u32(&buf_, total);
    buf_.append(body);
    u32(&buf_, total);
  }
  // The buffer to the file (under mu_); a failed write is kept for close() to report, and
  // what follows it is discarded (the file would have a hole).
  void write_out() {
    size_t off = 0;
    while (off < buf_.size() && !error_) {
      const ssize_t n = ::write(fd_, buf_.data() + off, buf_.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        error_ = true;
        errno_ = n < 0 ? errno : ENOSPC;
        break;
      }
      off += static_cast<size_t>(n);
    }
    buf_.clear();
    held_.store(false, std::memory_order_relaxed);
  }
  Status fail(int err) const {
    Status s = Status::Error(Err::IO, std::string("cannot write the drops file: ") + std::strerror(err ? err : EIO));
    s.file = path_;
    return s;
  }

  std::string path_;
  std::vector<std::string> names_;  // by ofport
  std::string app_;
  const bool prompt_;
  std::mutex mu_;
  int fd_ = -1;
  std::string buf_;                 // whole blocks not yet written
  std::atomic<bool> held_{false};   // buf_ holds records (read without mu_ by end_batch)
  std::vector<int> iface_;          // interface id by ofport, -1: not described yet
  int n_ifaces_ = 0;
  uint64_t packets_ = 0;
  bool error_ = false;
  int errno_ = 0;
};

}  // namespace dpu
