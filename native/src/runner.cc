// runner.cc: in-memory processing, the benchmark loop and pcap replay (see
// runner.h).
#include "runner.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

Status check_input_ports(Dataplane* dp, const uint32_t* ports, size_t n, bool per_packet) {
  std::vector<uint8_t> known;
  for (const PortInfo& p : dp->ports()) {
    if (known.size() <= p.ofport) known.resize(p.ofport + 1);
    known[p.ofport] = 1;
  }
  for (size_t i = 0; i < n; i++)
    if (ports[i] >= known.size() || !known[ports[i]])
      return unknown_input_port(ports[i], per_packet ? static_cast<long>(i) : -1);
  return Status::Ok();
}

std::vector<ReplayOutput> replay_outputs(Dataplane* dp, const std::string& out_dir) {
  std::vector<ReplayOutput> out;
  for (const PortInfo& p : dp->ports())
    if (!p.tunnel) out.push_back({p.ofport, p.name, out_dir + "/" + p.name + ".pcap"});
  return out;
}

std::pair<int, int> find_overwrite(const std::vector<std::string>& outputs, const std::vector<std::string>& inputs) {
  auto file = [](const std::string& path, struct stat* st) {
    return path.find('\0') == std::string::npos && ::stat(path.c_str(), st) == 0;
  };
  std::vector<std::pair<dev_t, ino_t>> in;
  in.reserve(inputs.size());
  for (const std::string& path : inputs) {
    struct stat st;
    in.emplace_back(file(path, &st) ? std::make_pair(st.st_dev, st.st_ino) : std::make_pair(dev_t(0), ino_t(0)));
  }
  for (size_t o = 0; o < outputs.size(); o++) {
    struct stat st;
    if (!file(outputs[o], &st)) continue;  // not there yet: it cannot be an input
    for (size_t i = 0; i < in.size(); i++)
      if (in[i].second && in[i].first == st.st_dev && in[i].second == st.st_ino)
        return {static_cast<int>(o), static_cast<int>(i)};
  }
  return {-1, -1};
}

Status process_buffers(Dataplane* dp, const uint8_t* data, const uint64_t* offsets, const uint32_t* lens,
                       const uint32_t* ports, const uint64_t* ts, size_t n, MemOutput* out, size_t worker) {
  if (worker >= dp->n_workers())
    return Status::Error(Err::INVALID, "no worker " + std::to_string(worker) + " (the dataplane has " +
                                           std::to_string(dp->n_workers()) + ")");
  Status st = check_input_ports(dp, ports, n, true);
  if (!st.ok()) return st;
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
  std::vector<uint32_t> in_ports;
  std::vector<std::string> in_paths;
  for (const ReplayInput& ri : spec_) {
    in_ports.push_back(ri.port);
    in_paths.push_back(ri.path);
  }
  Status st = check_input_ports(dp_, in_ports.data(), in_ports.size(), false);
  if (!st.ok()) return st;
  for (const ReplayInput& ri : spec_) {
    st = rx_->add(ri.port, ri.path);
    if (!st.ok()) return st;
  }
  // Every output against every input before any output is opened (opening
  // one truncates it).
  const std::vector<ReplayOutput> outs = replay_outputs(dp_, out_dir_);
  std::vector<std::string> out_paths;
  for (const ReplayOutput& o : outs) out_paths.push_back(o.path);
  const auto hit = find_overwrite(out_paths, in_paths);
  if (hit.first >= 0) {
    Status s = Status::Error(Err::INVALID, "this input is also the output of port " + outs[hit.first].port +
                                               ": writing it would destroy it (use another --out-dir)");
    s.file = outs[hit.first].path;
    return s;
  }
  if (!drops_path_.empty()) {
    st = check_drops(in_paths, outs);
    if (!st.ok()) return st;
  }
  for (const ReplayOutput& o : outs) {
    if (writers_->files.size() <= o.ofport) writers_->files.resize(o.ofport + 1);
    auto w = std::make_unique<PcapWriter>();
    st = w->open(o.path);
    if (!st.ok()) return st;
    writers_->files[o.ofport] = std::move(w);
    writers_->names.emplace_back(o.port, o.path);
  }
  if (!drops_path_.empty()) {
    drops_ = std::make_unique<PcapngDropWriter>(drops_path_, dp_->ports(), "dpu replay --drops-pcap");
    st = drops_->open();
    if (!st.ok()) return st;
  }
  rx_->start();
  return Status::Ok();
}

// Two names of one file that does not exist yet: the same name in the same
// directory (however the directory is spelled).
static bool same_new_file(const std::string& a, const std::string& b) {
  auto split = [](const std::string& p) {
    const size_t slash = p.rfind('/');
    std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : p.substr(0, slash);
    char* real = ::realpath(dir.c_str(), nullptr);
    if (real) {
      dir = real;
      std::free(real);
    }
    return std::make_pair(dir, slash == std::string::npos ? p : p.substr(slash + 1));
  };
  return a == b || split(a) == split(b);
}

// The drops file must be none of the inputs and none of the outputs.
Status Replayer::check_drops(const std::vector<std::string>& in_paths, const std::vector<ReplayOutput>& outs) const {
  if (find_overwrite({drops_path_}, in_paths).first >= 0) {
    Status s = Status::Error(Err::INVALID, "the drops file is one of the inputs: writing it would destroy it");
    s.file = drops_path_;
    return s;
  }
  std::vector<std::string> out_paths;
  for (const ReplayOutput& o : outs) out_paths.push_back(o.path);
  int same = find_overwrite({drops_path_}, out_paths).second;
  for (size_t i = 0; i < outs.size() && same < 0; i++)
    if (same_new_file(outs[i].path, drops_path_)) same = static_cast<int>(i);  // neither there yet
  if (same >= 0) {
    Status s = Status::Error(Err::INVALID, "the drops file is the output of port " + outs[same].port);
    s.file = drops_path_;
    return s;
  }
  return Status::Ok();
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
