// drop_writer.h: the drops file of `dpu replay --drops-pcap` and
// `dpu run --drops-pcap`: every arrival the dataplane dropped, as it arrived,
// with its port and reason.
//
// Thread-safety: dropped() and close() take a mutex (a live dataplane's
// workers share one file); packets() may be read from any thread.
#pragma once

#include <cerrno>
#include <cstdio>
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
  // `ports`: the dataplane's, for their names; `app`: the writer, as the section header names it.
  PcapngDropWriter(std::string path, const std::vector<PortInfo>& ports, std::string app)
      : path_(std::move(path)), app_(std::move(app)) {
    for (const PortInfo& p : ports) {
      if (names_.size() <= p.ofport) names_.resize(p.ofport + 1);
      names_[p.ofport] = p.name;
    }
  }
  ~PcapngDropWriter() {
    if (f_) std::fclose(f_);
  }
  Status open() {
    f_ = std::fopen(path_.c_str(), "wb");
    if (!f_) return fail(errno);
    std::string b;
    u32(&b, 0x1A2B3C4D);  // byte-order magic
    u16(&b, 1);
    u16(&b, 0);
    u32(&b, 0xffffffffu);  // section length: unknown
    u32(&b, 0xffffffffu);
    option(&b, 4, app_);  // shb_userappl
    u32(&b, 0);                                 // opt_endofopt
    block(0x0A0D0D0A, b);
    return Status::Ok();
  }
  void dropped(uint32_t port, uint64_t ts_ns, const uint8_t* data, uint32_t len, uint32_t wire_len,
               uint16_t reason) override {
    std::lock_guard<std::mutex> g(mu_);  // live workers share the file
    if (!f_ || error_) return;
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
  }
  Status close() {
    std::lock_guard<std::mutex> g(mu_);
    if (!f_) return Status::Ok();  // closed already (or never opened)
    if (std::fclose(f_) != 0 && !error_) {
      error_ = true;
      errno_ = errno;
    }
    f_ = nullptr;
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
  void block(uint32_t type, const std::string& body) {
    std::string b;
    const uint32_t total = static_cast<uint32_t>(12 + body.size());
    u32(&b, type);
    u32(&b, total);
    b.append(body);
    u32(&b, total);
    if (std::fwrite(b.data(), 1, b.size(), f_) != b.size() && !error_) {
      error_ = true;
      errno_ = errno;
    }
  }
  Status fail(int err) const {
    Status s = Status::Error(Err::IO, std::string("cannot write the drops file: ") + std::strerror(err ? err : EIO));
    s.file = path_;
    return s;
  }

  std::string path_;
  std::vector<std::string> names_;  // by ofport
  std::string app_;
  std::mutex mu_;
  std::FILE* f_ = nullptr;
  std::vector<int> iface_;          // interface id by ofport, -1: not described yet
  int n_ifaces_ = 0;
  uint64_t packets_ = 0;
  bool error_ = false;
  int errno_ = 0;
};

}  // namespace dpu
