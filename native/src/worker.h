// worker.h: one datapath worker (a PMD thread in OVS terms): a thread state
// and its stages (docs/design.md, "A worker is stages"; stage.h).
//
// "Worker" is the one name for it in code, counters (WorkerCounters,
// stats()["workers"]) and docs; OVS's "pmd" survives only as the old name
// of the summed counters in stats() (README, Counters).
//
// The thread state owns what is not any one stage's: the packet pool and the
// rest of StageEnv (per-arrival bookkeeping, port and tenant counters, the
// batch's PortView), the configuration version its caches follow, the batch
// loop, receive, housekeeping, the counter snapshot, and its lock. A batch:
//
//   receive ─► process: at the batch's Config version (sync_config: the caches
//   revalidated first), passes of sub-batches of kChunk packets:
//     classify (parse, EMC, megaflows) ─► upcall (misses) ─► execute
//       ─► transmit queues / the next pass (TNL_POP) / the conntrack stage,
//           which runs every kCtStageJobs jobs and at the end of the pass
//   ─► drops counted once per arrival (Arrivals) ─► transmit flush to the sinks
//
// at most kMaxPasses passes (recirc_limit beyond). Each batch runs inside the
// worker's read section of the dataplane's RCU (rcu.h): what its Config points
// to stays valid until it ends.
//
// Each batch runs at one configuration version (datapath_view.h), taken at
// its start: every upcall of the batch walks that version's tables. When the
// version has moved, the worker first drops the cached megaflows the changes
// since its last batch can affect (Dpcls::revalidate, crediting their counts
// to the rules first; the EMC entries and hints that name them answer nothing
// from then on), or, for a change of ports, VTEPs, tenants or fragment mode,
// or when it is further behind than the changes kept, flushes both caches: a
// cache never returns a result derived from older tables.
//
// With a DropSink set (--drops-pcap), every arrival that produced
// no output is handed to it as it arrived (a copy taken before the actions
// ran), with its port and reason, once, exactly where the drop is counted;
// the sink hears when each batch (receive, process) ends.
//
// Thread-safety: a batch (receive, process) runs on the worker's own thread
// (or the API caller's) under the worker's private lock; every control-side
// method that touches its caches or knobs takes that lock itself (between
// batches). Counters are written by the worker's thread with plain stores
// and read from any thread, without the lock, with relaxed loads (counters(),
// ports(), tenants()).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "classify.h"
#include "conntrack/conntrack.h"
#include "ct_stage.h"
#include "datapath_view.h"
#include "execute.h"
#include "ports/port_io.h"
#include "rcu.h"
#include "stage.h"
#include "transmit.h"
#include "upcall.h"

namespace dpu {

// One megaflow as dpctl/dump-flows shows it: the masked key and its mask
// (Flow layout, pipeline state zero), its counts, when it was last used (the
// dataplane's clock, 0: never) and its datapath actions.
struct MegaflowDump {
  Flow key{}, mask{};
  uint64_t n_packets = 0, n_bytes = 0;
  int64_t used_ns = 0;
  const DpActions* actions = nullptr;  // valid during dump_megaflows()'s callback
};

// What one worker did (dpif-netdev/pmd-stats-show): counters.def's worker
// groups, every stage's, plus cycles per stage when profiling. A snapshot
// (Worker::counters), or a sum of them.
struct WorkerCounters {
#define DPU_WORKER_COUNTER(m, n, h) uint64_t m = 0;
#include "dpu/counters.def"
#undef DPU_WORKER_COUNTER
  uint64_t cycles[STAGE_COUNT] = {};
  void add(const WorkerCounters& o) {
#define DPU_WORKER_COUNTER(m, n, h) m += o.m;
#include "dpu/counters.def"
#undef DPU_WORKER_COUNTER
    for (int i = 0; i < STAGE_COUNT; i++) cycles[i] += o.cycles[i];
  }
};

class Worker {
 public:
  Worker(DatapathView* dp, uint32_t pool_size);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // One receive burst of at most max frames from q through a batch, the
  // outputs to sink (and, with `drops`, every dropped arrival there too):
  // the step every I/O path (memory, pcap, AF_PACKET, AF_XDP) shares.
  // Frames the queue refused (too long for a buffer, an offload dpu cannot
  // finish) are counted as drops of their port. Returns the frames taken.
  uint32_t receive(RxQueue& q, uint32_t max, PortSink* sink, DropSink* drops = nullptr);
  // One batch of packets from this worker's pool, with md.in_port /
  // timestamp / data set (a trace's); returns them all to the pool.
  void process(Batch& in);
  PacketPool& pool() { return env_.pool; }
  // The configuration version the current (or last) batch ran at.
  uint64_t batch_version() const { return version_; }

  // Knobs (each takes the worker's lock).
  void set_sink(PortSink* s);
  // Every dropped arrival to `s` as well (nullptr: off, the default).
  void set_drop_sink(DropSink* s);
  void set_profile(bool on);
  void set_emc_insert_inv_prob(uint32_t n);
  void set_max_megaflows(size_t n);
  // Terminate VXLAN right after parsing instead of through a megaflow whose
  // only action is TNL_POP (the outcome is the same; tests compare both).
  void set_fast_tunnel(bool on);
  // A trace: every pass walks the tables and is recorded, conntrack changes
  // nothing (dry run), and no rule is credited.
  void set_trace(TraceRecorder* rec);

  // Control side (each takes the worker's lock, between batches).
  void push_stats();  // credit megaflow deltas to rules/tables/groups
  // Between batches of a long-running worker (live mode): counts reach the
  // rules and a slice of conntrack expiry runs even when no packet arrives.
  void housekeeping();
  // The megaflows in this worker's cache, one call each, the lock held;
  // their latest counts pushed first (as dump_flows does), which dates their use.
  template <class F>
  void dump_megaflows(F&& each) {
    std::lock_guard<std::mutex> g(mu_);
    push_stats_locked();
    classify_.for_each_megaflow([&each](Megaflow& mf, Subtable& st) {
      MegaflowDump d;
      std::memcpy(words(d.key), mf.key, kKeyBytes);
      std::memcpy(words(d.mask), st.mask, kKeyBytes);
      d.n_packets = mf.n_packets.load(std::memory_order_relaxed);
      d.n_bytes = mf.n_bytes.load(std::memory_order_relaxed);
      d.used_ns = mf.used_ns;
      d.actions = &mf.actions;
      each(d);
    });
  }
  // Live mode: time the worker's thread spent on rounds that received
  // packets and waiting for them (it calls this itself).
  void add_time(uint64_t busy_ns, uint64_t idle_ns) {
    env_.counters.busy_ns += busy_ns;
    env_.counters.idle_ns += idle_ns;
  }

  // Read from any thread without the lock (relaxed loads).
  WorkerCounters counters() const;
  size_t megaflow_count() const { return __atomic_load_n(&classify_.megaflows_ref(), __ATOMIC_RELAXED); }
  const CounterArray<PortCounters>& ports() const { return env_.ports; }
  const CounterArray<TenantCounters>& tenants() const { return env_.tenants; }
  CtWorker::Counts ct_counts() { return ct_.ct_worker().counts(); }

 private:
  void process_locked(Batch& in);
  // At the start of a batch, in the read section: the current Config, and
  // the caches brought up to it.
  void sync_config();
  void revalidate(const Config& c);
  void push_stats_locked();
  void flush_caches();
  void count_reject(const RxReject& r, DropSink* drops);  // a frame the queue refused
  // One pass over a sub-batch: classify, upcall, execute.
  void pass(Packet** pkts, uint32_t n, std::vector<Packet*>& recirc, bool first);
  // The conntrack stage (out of line: inlined into the pass loop, it slowed
  // the runs without conntrack), its continuations through the execute stage.
  void conntrack_stage(std::vector<Packet*>& next);
  // After the batch: a clock moved by the packets' time expires what it passed.
  void follow_packet_clock();

  mutable std::mutex mu_;
  DatapathView* dp_;
  int rcu_slot_;
  StageEnv env_;
  ClassifyStage classify_;
  UpcallStage upcall_;
  ExecuteStage execute_;
  CtStage ct_;
  TransmitStage tx_;
  DropSink* drop_sink_ = nullptr;
  uint64_t version_ = 0;
  const Config* cfg_ = nullptr;  // during a batch: the version it runs at
  // The parts of the last Config whose derived state (env_.view) is current;
  // held so that a pointer compare means "unchanged".
  std::shared_ptr<const PortTable> seen_ports_;
  std::shared_ptr<const std::vector<TunnelTerm>> seen_terms_;
  uint64_t batch_count_ = 0;
  std::vector<Packet*> cur_, next_;  // packets of the current / next pass
};

}  // namespace dpu
