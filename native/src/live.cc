// live.cc: worker threads over port queues (see live.h).
#include "live.h"

#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "core_log.h"

namespace dpu {

namespace {
int64_t mono_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

// A worker's transmit side: a port's frames go out of that worker's queue
// of the port.
class LiveWorkers::Sink : public PortSink {
 public:
  explicit Sink(std::vector<TxQueue*> by_port) : by_port_(std::move(by_port)) {}
  uint32_t send(uint32_t port, Packet* const* pkts, uint32_t n) override {
    if (port >= by_port_.size() || !by_port_[port]) return 0;  // not attached: refused
    return by_port_[port]->tx_burst(pkts, n);
  }

 private:
  std::vector<TxQueue*> by_port_;
};

LiveWorkers::LiveWorkers(Dataplane* dp, LiveConfig cfg) : dp_(dp), cfg_(std::move(cfg)) {}

LiveWorkers::~LiveWorkers() { stop(); }

Status LiveWorkers::start() {
  if (running()) return Status::Error(Err::INVALID, "already running");
  const IoBackend* io = find_io_backend(cfg_.io);
  if (!io) return Status::Error(Err::INVALID, "unknown I/O backend '" + cfg_.io + "' (" + io_backend_names() + ")");
  if (cfg_.first_worker >= dp_->n_workers()) return Status::Error(Err::INVALID, "no worker left for the ports");
  io_ = io;
  const size_t n_workers = dp_->n_workers() - cfg_.first_worker;
  queues_.clear();
  queues_.resize(n_workers);
  queue_port_.assign(n_workers, {});
  queue_spec_.assign(n_workers, {});
  queue_ifindex_.assign(n_workers, {});
  queue_failed_.assign(n_workers, {});
  queue_retry_.assign(n_workers, {});
  const int fanout_base = (getpid() & 0xfff) << 4;
  for (size_t pi = 0; pi < cfg_.ports.size(); pi++) {
    const LivePort& lp = cfg_.ports[pi];
    gro_.turn_off(lp.ifname);
    // Queue i on worker i mod N (AF_XDP: every receive queue of the
    // interface, so no queue's frames are left to the kernel).
    const size_t n = io->queues(lp.ifname, static_cast<uint32_t>(n_workers));
    for (size_t i = 0; i < n; i++) {
      const size_t w = i % n_workers;
      QueueSpec spec;
      spec.ifname = lp.ifname;
      spec.ofport = lp.ofport;
      spec.worker = static_cast<uint32_t>(w);
      spec.n_workers = static_cast<uint32_t>(n_workers);
      spec.queue = static_cast<uint32_t>(i);
      spec.n_queues = static_cast<uint32_t>(n);
      spec.group = static_cast<int>((fanout_base + pi) & 0xffff);
      std::unique_ptr<PortQueue> q;
      const int ifindex = static_cast<int>(if_nametoindex(lp.ifname.c_str()));
      Status st = io->open(spec, &q);
      if (!st.ok()) {
        queues_.clear();
        gro_.restore();
        return st;
      }
      queues_[w].push_back(std::move(q));
      queue_port_[w].push_back(pi);
      queue_spec_[w].push_back(spec);
      queue_ifindex_[w].push_back(ifindex);
      queue_failed_[w].push_back(0);
      queue_retry_[w].push_back(0);
    }
  }
  // The drops file last: a queue that fails to open leaves an earlier file alone.
  if (!cfg_.drops_pcap.empty()) {
    // Each batch's drops written when it ends, as `tcpdump -U` does: the file can be read
    // while dpu runs and keeps what was dropped if dpu is killed.
    drops_ = std::make_unique<PcapngDropWriter>(cfg_.drops_pcap, dp_->ports(), "dpu run --drops-pcap",
                                                PcapngDropWriter::Flush::kEachBatch);
    Status st = drops_->open();
    if (!st.ok()) {
      drops_.reset();
      queues_.clear();
      gro_.restore();
      return st;
    }
    set_drop_sinks(drops_.get());
  }
  stop_.store(false);
  for (size_t w = 0; w < n_workers; w++) threads_.emplace_back([this, w] { loop(w); });
  return Status::Ok();
}

void LiveWorkers::stop() {
  stop_.store(true);
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  for (auto& qs : queues_)
    for (auto& q : qs) q->refresh_counters();
  // Counts made since the last housekeeping reach the rules.
  dp_->sync_stats();
  gro_.restore();
  if (drops_) {
    set_drop_sinks(nullptr);
    Status st = drops_->close();
    if (!st.ok()) drops_status_ = st;
  }
}

void LiveWorkers::set_drop_sinks(DropSink* s) {
  for (size_t w = cfg_.first_worker; w < dp_->n_workers(); w++) {
    dp_->worker(w).set_drop_sink(s);
  }
}

std::vector<LiveQueueStats> LiveWorkers::queue_stats() const {
  std::lock_guard<std::mutex> g(queues_mu_);
  std::vector<LiveQueueStats> out;
  for (size_t pi = 0; pi < cfg_.ports.size(); pi++) {
    LiveQueueStats s;
    s.ofport = cfg_.ports[pi].ofport;
    s.ifname = cfg_.ports[pi].ifname;
    for (size_t w = 0; w < queues_.size(); w++) {
      for (size_t k = 0; k < queues_[w].size(); k++) {
        if (queue_port_[w][k] != pi) continue;
        const QueueCounters& c = queues_[w][k]->counters;
#define DPU_QUEUE_COUNTER(m, help) s.c.m += __atomic_load_n(&c.m, __ATOMIC_RELAXED);
#include "dpu/counters.def"
#undef DPU_QUEUE_COUNTER
        s.c.offload_kinds |= __atomic_load_n(&c.offload_kinds, __ATOMIC_RELAXED);
      }
    }
    out.push_back(s);
  }
  return out;
}

// Each worker replaces only its own queues, so the forwarding loop reads them
// without a lock. A queue is opened again when its interface has a new index
// or its socket lost its binding (the interface was unregistered: deleted,
// or moved to another namespace and back with the same index), as its
// backend's reattach policy says (IoBackend::reopen). A queue that cannot be
// opened keeps its old socket, is reported once for each new interface and
// tried again a second later. Its counters go on from the old queue's.
bool LiveWorkers::reattach(size_t wi, int64_t now_ns) {
  constexpr int64_t kRetryNs = 1000000000;
  bool changed = false;
  for (size_t k = 0; k < queues_[wi].size(); k++) {
    const QueueSpec& spec = queue_spec_[wi][k];
    const int idx = static_cast<int>(if_nametoindex(spec.ifname.c_str()));
    if (!idx) continue;  // gone: what would be sent to it is counted, as for a link that is down
    if (idx == queue_ifindex_[wi][k] && queues_[wi][k]->bound()) continue;
    if (now_ns < queue_retry_[wi][k]) continue;
    gro_.turn_off(spec.ifname);  // frames as on the wire, as at start; back on at stop()
    std::unique_ptr<PortQueue> q;
    const Status st = io_->reopen(spec, idx, &q);
    if (!st.ok()) {
      if (queue_failed_[wi][k] != idx)
        corelog::say(corelog::Level::kWarning, "interface " + spec.ifname + " (queue " + std::to_string(spec.queue) +
                                                   ") was created again; not reattached: " + st.message);
      queue_failed_[wi][k] = idx;
      queue_retry_[wi][k] = now_ns + kRetryNs;
      continue;
    }
    q->counters = queues_[wi][k]->counters;
    {
      std::lock_guard<std::mutex> g(queues_mu_);
      std::swap(queues_[wi][k], q);
      queue_ifindex_[wi][k] = idx;
    }
    queue_failed_[wi][k] = 0;
    if (spec.queue == 0) corelog::say(corelog::Level::kInfo, "interface " + spec.ifname + " was created again: reattached");
    changed = true;
  }
  return changed;
}

void LiveWorkers::loop(size_t wi) {
  Worker& w = dp_->worker(cfg_.first_worker + wi);
  auto& qs = queues_[wi];
  uint32_t max_port = 0;
  for (const LivePort& lp : cfg_.ports) max_port = std::max(max_port, lp.ofport);
  std::vector<pollfd> pfds;
  std::unique_ptr<Sink> sink;
  auto wire = [&] {  // at start, and after a queue was replaced
    std::vector<TxQueue*> by_port(max_port + 1, nullptr);
    pfds.clear();
    for (size_t i = 0; i < qs.size(); i++) {  // a port's frames leave through this worker's first queue of it
      TxQueue*& tx = by_port[cfg_.ports[queue_port_[wi][i]].ofport];
      if (!tx) tx = qs[i].get();
      pfds.push_back(pollfd{qs[i]->fd(), POLLIN, 0});
    }
    sink = std::make_unique<Sink>(std::move(by_port));
  };
  wire();
  size_t rr = 0;
  uint32_t busy_rounds = 0;
  int64_t last_house = mono_ns();
  const int64_t house_ns = static_cast<int64_t>(cfg_.housekeeping_ms) * 1000000;
  while (!stop_.load(std::memory_order_relaxed)) {
    uint32_t got = 0;
    const int64_t t0 = mono_ns();
    for (size_t k = 0; k < qs.size(); k++) {
      PortQueue& q = *qs[(rr + k) % qs.size()];
      got += w.receive(q, cfg_.burst, sink.get());  // under the worker's lock, one burst
    }
    rr++;
    const int64_t t1 = mono_ns();
    if (got) {
      w.add_time(static_cast<uint64_t>(t1 - t0), 0);
      if (++busy_rounds >= cfg_.yield_every) {  // let the kernel's receive work run
        busy_rounds = 0;
        sched_yield();
      }
    } else {
      busy_rounds = 0;
      if (poll(pfds.data(), pfds.size(), static_cast<int>(cfg_.idle_ms)) > 0)
        for (size_t i = 0; i < pfds.size(); i++)
          if (pfds[i].revents & POLLERR) qs[i]->clear_error();
      w.add_time(0, static_cast<uint64_t>(mono_ns() - t1));
    }
    if (t1 - last_house >= house_ns) {
      last_house = t1;
      for (auto& q : qs) q->refresh_counters();
      w.housekeeping();
      if (reattach(wi, t1)) wire();
    }
  }
}

}  // namespace dpu
