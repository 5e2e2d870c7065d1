// runner.cc: in-memory processing, the benchmark loop and pcap replay (see
// runner.h).
#include "runner.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace dpu {

constexpr uint32_t kRxBurst = 32;
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

// Counts a packet that cannot be loaded into a buffer (caller holds w.mu).
void count_oversize(Worker& w, uint32_t port, uint32_t len) {
  w.ports.grow(port + 1);
  PortCounters& pc = w.ports[port];
  pc.rx_packets++;
  pc.rx_bytes += len;
  pc.dropped++;
  pc.drops[DROP_OVERSIZE]++;
}

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
  uint32_t index_of[kBatchMax];
  CaptureSink sink(out, index_of);
  Batch b;
  size_t i = 0;
  while (i < n) {
    // One batch at a time under the worker's lock: a commit waits at most a batch.
    std::lock_guard<std::mutex> g(w.mu);
    b.clear();
    // A batch holds packets of one input port, as a receive burst does: a
    // packet arriving on another port waits for the next batch, so it sees
    // every connection the ones before it committed.
    while (i < n && !b.full() && (b.count == 0 || ports[i] == b.pkts[0]->md.in_port)) {
      if (lens[i] > Packet::max_capacity()) {
        count_oversize(w, ports[i], lens[i]);
        i++;
        continue;
      }
      Packet* p = w.pool().get_for(lens[i]);
      if (!p) break;  // every big buffer is in this batch: the rest waits for the next
      copy_frame(p->data(), data + offsets[i], lens[i]);
      p->len = static_cast<uint16_t>(lens[i]);
      p->md.in_port = ports[i];
      p->md.timestamp_ns = ts ? ts[i] : 0;
      index_of[b.count] = static_cast<uint32_t>(i);
      b.push(p);
      i++;
    }
    if (b.count) {
      w.set_sink(&sink);
      w.process(b);
      w.set_sink(nullptr);
    }
  }
  // Input order, then the order the actions emitted (as OVS's ofproto/trace reads).
  std::stable_sort(out->pkts.begin(), out->pkts.end(), [](const MemPacket& a, const MemPacket& b) {
    return a.index != b.index ? a.index < b.index : a.seq < b.seq;
  });
  return Status::Ok();
}

BenchStats bench_run(Dataplane* dp, const uint8_t* data, const uint64_t* offsets, const uint32_t* lens,
                     const uint32_t* ports, size_t n, uint64_t total) {
  BenchStats bs;
  if (n == 0) return bs;
  Worker& w = dp->worker(0);
  CountSink sink;
  Batch b;
  size_t next = 0;
  auto t0 = std::chrono::steady_clock::now();
  uint64_t done = 0;
  while (done < total) {
    std::lock_guard<std::mutex> g(w.mu);  // per burst, as a live worker would
    w.set_sink(&sink);
    b.clear();
    uint32_t want = static_cast<uint32_t>(std::min<uint64_t>(kRxBurst, total - done));
    for (uint32_t k = 0; k < want; k++) {
      Packet* p = w.pool().get_for(lens[next]);
      if (!p) break;  // every big buffer is in this burst
      p->len = static_cast<uint16_t>(lens[next]);
      copy_frame(p->data(), data + offsets[next], lens[next]);
      p->md.in_port = ports[next];
      b.push(p);
      if (++next == n) next = 0;
    }
    done += b.count;
    w.process(b);
    w.set_sink(nullptr);
  }
  auto t1 = std::chrono::steady_clock::now();
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

Replayer::Replayer(Dataplane* dp, std::vector<ReplayInput> inputs, std::string out_dir)
    : dp_(dp), spec_(std::move(inputs)), out_dir_(std::move(out_dir)), writers_(new Writers) {}

Replayer::~Replayer() { close(); }

Status Replayer::open() {
  for (const ReplayInput& ri : spec_) {
    if (dp_->port_name(ri.port).empty())
      return Status::Error(Err::UNKNOWN_PORT, "unknown input port " + std::to_string(ri.port));
    Input in;
    in.port = ri.port;
    in.reader = std::make_unique<PcapReader>();
    Status st = in.reader->open(ri.path);
    if (!st.ok()) return st;
    inputs_.push_back(std::move(in));
  }
  struct stat in_st[64];
  size_t n_in = 0;
  for (const ReplayInput& ri : spec_)
    if (n_in < 64 && ::stat(ri.path.c_str(), &in_st[n_in]) == 0) n_in++;
  for (const PortInfo& p : dp_->ports()) {
    if (p.tunnel) continue;
    if (writers_->files.size() <= p.ofport) writers_->files.resize(p.ofport + 1);
    std::string path = out_dir_ + "/" + p.name + ".pcap";
    struct stat out_st;
    if (::stat(path.c_str(), &out_st) == 0) {
      for (size_t i = 0; i < n_in; i++) {
        if (in_st[i].st_dev == out_st.st_dev && in_st[i].st_ino == out_st.st_ino) {
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
  for (Input& in : inputs_) {
    Status st;
    advance(in, &st);
    if (!st.ok()) {
      error_ = st;
      break;
    }
  }
  return Status::Ok();
}

bool Replayer::advance(Input& in, Status* st) {
  in.has_head = in.reader->next(&in.head);
  if (!in.has_head && !in.reader->status().ok()) *st = in.reader->status();
  return in.has_head;
}

bool Replayer::run(uint64_t max_packets, Status* st) {
  if (done_) return false;
  Worker& w = dp_->worker(0);
  Batch b;
  uint64_t taken = 0;
  for (;;) {
    b.clear();
    {
      std::lock_guard<std::mutex> g(w.mu);
      while (!b.full() && error_.ok() && (max_packets == 0 || taken < max_packets)) {
        Input* best = nullptr;
        for (Input& in : inputs_)
          if (in.has_head && (!best || in.head.ts_ns < best->head.ts_ns)) best = &in;
        if (!best) break;
        if (b.count && best->port != b.pkts[0]->md.in_port) break;  // one input port per batch (process_buffers)
        const PcapRecord& r = best->head;
        if (r.caplen > Packet::max_capacity()) {
          count_oversize(w, best->port, r.caplen);
        } else {
          Packet* p = w.pool().get_for(r.caplen);
          if (!p) break;  // every big buffer is in this batch: the rest waits for the next
          copy_frame(p->data(), r.data, r.caplen);
          p->len = static_cast<uint16_t>(r.caplen);
          p->md.in_port = best->port;
          p->md.timestamp_ns = r.ts_ns;
          b.push(p);
        }
        taken++;
        packets_++;
        Status rs;
        advance(*best, &rs);
        if (!rs.ok()) error_ = rs;
      }
      if (b.count) {
        w.set_sink(writers_.get());
        w.process(b);
        w.set_sink(nullptr);
      }
    }
    if (!error_.ok()) {
      *st = error_;
      done_ = true;
      return false;
    }
    bool any = false;
    for (Input& in : inputs_) any |= in.has_head;
    if (!any) {
      done_ = true;
      return false;
    }
    if (max_packets && taken >= max_packets) return true;
  }
}

Status Replayer::close() {
  Status first;
  for (auto& f : writers_->files) {
    if (!f) continue;
    Status s = f->close();
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

uint64_t Replayer::bytes_done() const {
  uint64_t s = 0;
  for (const Input& in : inputs_) s += in.reader->offset();
  return s;
}

uint64_t Replayer::bytes_total() const {
  uint64_t s = 0;
  for (const Input& in : inputs_) s += in.reader->size();
  return s;
}

std::vector<std::pair<std::string, std::string>> Replayer::outputs() const { return writers_->names; }

}  // namespace dpu
