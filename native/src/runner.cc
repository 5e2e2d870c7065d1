// runner.cc: in-memory processing, the benchmark loop and pcap replay (see
// runner.h).
#include "runner.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "ports/mem_rx.h"

namespace dpu {

namespace {

class CaptureSink : public PortSink {
 public:
  explicit CaptureSink(MemOutput* out, const uint32_t* index_of) : out_(out), index_of_(index_of) {}
  uint32_t send(uint32_t port, Packet* const* pkts, uint32_t n) override {
    for (uint32_t i = 0; i < n; i++) {
      const Packet* p = pkts[i];
      MemPacket m;
      m.port = port;
      m.index = index_of_[p->origin];
      m.seq = p->emit_seq;
      m.ts_ns = p->md.timestamp_ns;
      m.offset = static_cast<uint32_t>(out_->data.size());
      m.len = p->len;
      out_->data.insert(out_->data.end(), p->data(), p->data() + p->len);
      out_->pkts.push_back(m);
    }
    return n;
  }

 private:
  MemOutput* out_;
  const uint32_t* index_of_;
};

class CountSink : public PortSink {
 public:
  uint32_t send(uint32_t, Packet* const*, uint32_t n) override {
    count += n;
    return n;
  }
  uint64_t count = 0;
};

// BenchCheck's sink: every output against the stamp its route had at the
// version its batch ran at.
class CheckSink : public PortSink {
 public:
  CheckSink(const Worker& w, BenchCheck* c) : w_(w), c_(c) {}
  uint32_t send(uint32_t, Packet* const* pkts, uint32_t n) override {
    const uint64_t v = w_.batch_version();
    for (uint32_t i = 0; i < n; i++) {
      const uint8_t* d = pkts[i]->data();
      const uint32_t route = be16(load16(d + 2));
      const uint16_t dst = be16(load16(d + 4)), src = be16(load16(d + 10));
      const bool ok = pkts[i]->len >= 14 && route == be16(load16(d + 8)) && route < c_->routes && dst == src &&
                      dst == static_cast<uint16_t>(expected(route, v));
      c_->wrong += ok ? 0 : 1;
    }
    c_->checked += n;
    return n;
  }

 private:
  uint64_t expected(uint32_t route, uint64_t v) const {
    if (v <= c_->base) return c_->base;
    const uint64_t kmax = v - c_->base - 1;
    if (route > kmax) return c_->base;
    return c_->base + 1 + route + (kmax - route) / c_->routes * c_->routes;
  }
  const Worker& w_;
  BenchCheck* c_;
};

}  // namespace

Status process_buffers(Dataplane* dp, const uint8_t* data, const uint64_t* offsets, const uint32_t* lens,
                       const uint32_t* ports, const uint64_t* ts, size_t n, MemOutput* out, size_t worker) {
  if (worker >= dp->n_workers())
    return Status::Error(Err::INVALID, "no worker " + std::to_string(worker) + " (the dataplane has " +
                                           std::to_string(dp->n_workers()) + ")");
  std::vector<PortInfo> known = dp->ports();
  for (size_t i = 0; i < n; i++) {
    bool ok = false;
    for (const PortInfo& p : known) ok |= p.ofport == ports[i];
    if (!ok) return Status::Error(Err::UNKNOWN_PORT, "packet " + std::to_string(i) + ": unknown input port " +
                                                         std::to_string(ports[i]));
  }
  Worker& w = dp->worker(worker);
  MemRx rx(data, offsets, lens, ports, ts, n, false, true);
  CaptureSink sink(out, rx.burst_index());
  while (rx.more()) w.receive(rx, kBatchMax, &sink);  // one burst at a time, as a live worker takes them
  w.push_stats();  // the call's counts reach the rules before it returns (stats() reads them without a lock)
  // Input order, then the order the actions emitted (as OVS's ofproto/trace reads).
  std::stable_sort(out->pkts.begin(), out->pkts.end(), [](const MemPacket& a, const MemPacket& b) {
    return a.index != b.index ? a.index < b.index : a.seq < b.seq;
  });
  return Status::Ok();
}

BenchStats bench_run(Dataplane* dp, const uint8_t* data, const uint64_t* offsets, const uint32_t* lens,
                     const uint32_t* ports, size_t n, uint64_t total, uint32_t burst, BenchCheck* check) {
  BenchStats bs;
  if (n == 0) return bs;
  burst = std::clamp<uint32_t>(burst, 1, kBatchMax);
  Worker& w = dp->worker(0);
  CountSink count;
  CheckSink checked(w, check);
  PortSink* sink = check && check->on ? static_cast<PortSink*>(&checked) : &count;
  MemRx rx(data, offsets, lens, ports, nullptr, n, true, false);
  auto t0 = std::chrono::steady_clock::now();
  uint64_t done = 0;
  while (done < total)  // the worker's lock per burst, as a live worker takes it
    done += w.receive(rx, static_cast<uint32_t>(std::min<uint64_t>(burst, total - done)), sink);
  auto t1 = std::chrono::steady_clock::now();
  w.push_stats();
  bs.packets = done;
  bs.seconds = std::chrono::duration<double>(t1 - t0).count();
  return bs;
}

// ---- replay ------------------------------------------------------------------------

class Replayer::Writers : public PortSink {
 public:
  uint32_t send(uint32_t port, Packet* const* pkts, uint32_t n) override {
    if (port >= files.size() || !files[port]) return n;  // a port without an output file: sent, not kept
    for (uint32_t i = 0; i < n; i++) files[port]->write(pkts[i]->md.timestamp_ns, pkts[i]->data(), pkts[i]->len);
    return n;
  }
  std::vector<std::unique_ptr<PcapWriter>> files;  // by ofport
  std::vector<std::pair<std::string, std::string>> names;
};


Replayer::Replayer(Dataplane* dp, std::vector<ReplayInput> inputs, std::string out_dir, std::string drops_pcap)
    : dp_(dp),
      spec_(std::move(inputs)),
      out_dir_(std::move(out_dir)),
      rx_(new PcapRx),
      writers_(new Writers),
      drops_path_(std::move(drops_pcap)) {}

Replayer::~Replayer() { close(); }

Status Replayer::open() {
  for (const ReplayInput& ri : spec_) {
    if (dp_->port_name(ri.port).empty())
      return Status::Error(Err::UNKNOWN_PORT, "unknown input port " + std::to_string(ri.port));
    Status st = rx_->add(ri.port, ri.path);
    if (!st.ok()) return st;
  }
  std::vector<struct stat> in_st;  // every input: an output that is any of them is refused
  in_st.reserve(spec_.size());
  for (const ReplayInput& ri : spec_) {
    struct stat st;
    if (::stat(ri.path.c_str(), &st) == 0) in_st.push_back(st);
  }
  for (const PortInfo& p : dp_->ports()) {
    if (p.tunnel) continue;
    if (writers_->files.size() <= p.ofport) writers_->files.resize(p.ofport + 1);
    std::string path = out_dir_ + "/" + p.name + ".pcap";
    struct stat out_st;
    if (::stat(path.c_str(), &out_st) == 0) {
      for (const struct stat& in : in_st) {
        if (in.st_dev == out_st.st_dev && in.st_ino == out_st.st_ino) {
          Status s = Status::Error(Err::INVALID, "this input is also the output of port " + p.name +
                                                     ": writing it would destroy it (use another --out-dir)");
          s.file = path;
          return s;
        }
      }
    }
    auto w = std::make_unique<PcapWriter>();
    Status st = w->open(path);
    if (!st.ok()) return st;
    writers_->files[p.ofport] = std::move(w);
    writers_->names.emplace_back(p.name, path);
  }
  if (!drops_path_.empty()) {
    Status st = open_drops();
    if (!st.ok()) return st;
  }
  rx_->start();
  return Status::Ok();
}

// The drops file must be none of the inputs and none of the outputs.
Status Replayer::open_drops() {
  struct stat d;
  if (::stat(drops_path_.c_str(), &d) == 0) {
    for (const ReplayInput& ri : spec_) {
      struct stat in;
      if (::stat(ri.path.c_str(), &in) == 0 && in.st_dev == d.st_dev && in.st_ino == d.st_ino) {
        Status s = Status::Error(Err::INVALID, "the drops file is one of the inputs: writing it would destroy it");
        s.file = drops_path_;
        return s;
      }
    }
  }
  for (const auto& o : writers_->names) {
    struct stat os;
    if (o.second == drops_path_ ||
        (::stat(o.second.c_str(), &os) == 0 && ::stat(drops_path_.c_str(), &d) == 0 && os.st_dev == d.st_dev &&
         os.st_ino == d.st_ino)) {
      Status s = Status::Error(Err::INVALID, "the drops file is the output of port " + o.first);
      s.file = drops_path_;
      return s;
    }
  }
  drops_ = std::make_unique<PcapngDropWriter>(drops_path_, dp_->ports(), "dpu replay --drops-pcap");
  return drops_->open();
}

bool Replayer::run(uint64_t max_packets, Status* st) {
  if (done_) return false;
  Worker& w = dp_->worker(0);
  const uint64_t start = rx_->records();
  while (rx_->more() && (max_packets == 0 || rx_->records() - start < max_packets)) {
    uint64_t left = max_packets ? max_packets - (rx_->records() - start) : kBatchMax;
    // (this replay's bursts only: their drops to this replay's file)
    w.receive(*rx_, static_cast<uint32_t>(std::min<uint64_t>(kBatchMax, left)), writers_.get(), drops_.get());
  }
  w.push_stats();
  if (!rx_->status().ok()) {
    *st = rx_->status();
    done_ = true;
    return false;
  }
  if (!rx_->more()) {
    done_ = true;
    return false;
  }
  return true;
}

Status Replayer::close() {
  Status first;
  for (auto& f : writers_->files) {
    if (!f) continue;
    Status s = f->close();
    if (first.ok() && !s.ok()) first = s;
  }
  if (drops_) {
    Status s = drops_->close();
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

uint64_t Replayer::packets() const { return rx_->records(); }
uint64_t Replayer::drops_written() const { return drops_ ? drops_->packets() : 0; }
uint64_t Replayer::bytes_done() const { return rx_->bytes_done(); }
uint64_t Replayer::bytes_total() const { return rx_->bytes_total(); }

std::vector<std::pair<std::string, std::string>> Replayer::outputs() const { return writers_->names; }

}  // namespace dpu
