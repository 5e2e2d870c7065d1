// worker.h: one datapath worker (a PMD thread in OVS terms): the fast path.
// "Worker" is the one name for it in code, counters (WorkerCounters,
// stats()["workers"]) and docs; OVS's "pmd" survives only as the old name
// of the summed counters in stats() (README, Counters).
//
// A worker owns a packet pool, an exact-match cache, a megaflow cache, per-port
// transmit queues and its counters. process() takes one received batch through
//
//   parse (parse.h) -> EMC -> megaflow cache -> [upcall: xlate under the shared
//   table lock, install a megaflow] -> execute (execute.cc) -> per-port tx
//
// in sub-batches of 32 packets. TNL_POP re-queues a packet for another pass in
// the same call (at most kMaxPasses). At the end the tx queues go to the port
// sinks in arrival order, and every arrival that produced no output is counted
// once as a drop, under the last reason recorded for it.
//
// Each batch runs at one configuration version (datapath_view.h), taken at
// its start inside the worker's read section (rcu.h): every upcall of the
// batch walks that version's tables. When the version has moved, the worker
// first drops the cached megaflows the changes since its last batch can
// affect (Dpcls::revalidate, crediting their counts to the rules first; the
// EMC entries and hints that name them answer nothing from then on), or, for
// a change of ports, VTEPs, tenants or fragment mode, or when it is further
// behind than the changes kept, flushes both caches: a cache never returns a
// result derived from older tables.
//
// Tunnel ports count what they carry: a successful VXLAN push counts the inner
// frame as tx of its tunnel port, a successful pop as rx (vxlan.cc).
//
// With a DropSink set (a replay's --drops-pcap), every arrival that produced
// no output is handed to it as it arrived (a copy taken before the actions
// ran), with its port and reason, once, exactly where the drop is counted.
//
// Thread-safety: process() runs on the worker's own thread (or the API caller)
// with `mu` held; the control thread takes `mu` to read counters and caches.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "conntrack/conntrack.h"
#include "datapath_view.h"
#include "dpcls.h"
#include "ports.h"
#include "rcu.h"
#include "dpu/batch.h"
#include "dpu/drops.h"
#include "ports/port_io.h"
#include "tunnel_term.h"

namespace dpu {

// What a trace wants to know of the passes a packet makes (dataplane.cc):
// every slow-path walk and every conntrack result, in order.
class TraceRecorder {
 public:
  virtual ~TraceRecorder() = default;
  virtual void walk(const Flow& key, const XlateOut& xo, std::vector<TraceEvent>&& events) = 0;
  virtual void conntrack(const CtSpec& spec, const CtResult& r) = 0;
};

// Where a port's transmitted packets go (pcap writer, capture list, counter).
class PortSink {
 public:
  virtual ~PortSink() = default;
  // Copies out what it needs and returns how many of the n went out (the
  // rest count as tx_dropped); the packets return to the pool afterwards.
  virtual uint32_t send(uint32_t port, Packet* const* pkts, uint32_t n) = 0;
};

// Where the arrivals that produced no output go when a drop capture is on
// (runner.cc writes them to a pcapng file with the reason as a comment).
class DropSink {
 public:
  virtual ~DropSink() = default;
  // One dropped arrival: `data` holds `len` bytes of the frame as received
  // (nullptr and 0 when no buffer ever held it: oversize), `wire_len` its size.
  virtual void dropped(uint32_t port, uint64_t ts_ns, const uint8_t* data, uint32_t len, uint32_t wire_len,
                       uint16_t reason) = 0;
};

// One megaflow as dpctl/dump-flows shows it: the masked key and its mask
// (Flow layout, pipeline state zero), its counts and its datapath actions.
struct MegaflowDump {
  Flow key{}, mask{};
  uint64_t n_packets = 0, n_bytes = 0;
  const DpActions* actions = nullptr;  // valid while the caller holds the worker's mu
};

// A counter as another thread sees it (its owner writes it with plain stores).
inline uint64_t relaxed(const uint64_t& c) { return __atomic_load_n(&c, __ATOMIC_RELAXED); }

// Packets and bytes in and out, and drops by reason: per tenant, and (with the
// parse counters) per port. The members come from counters.def.
struct TrafficCounters {
#define DPU_TRAFFIC_COUNTER(m, h) uint64_t m = 0;
#include "dpu/counters.def"
#undef DPU_TRAFFIC_COUNTER
  uint64_t drops[DROP_COUNT] = {};
  void add(const TrafficCounters& o) {
#define DPU_TRAFFIC_COUNTER(m, h) m += relaxed(o.m);
#include "dpu/counters.def"
#undef DPU_TRAFFIC_COUNTER
    for (int r = 0; r < DROP_COUNT; r++) drops[r] += relaxed(o.drops[r]);
  }
};

struct PortCounters : TrafficCounters {
#define DPU_PORT_COUNTER(m, h) uint64_t m = 0;
#include "dpu/counters.def"
#undef DPU_PORT_COUNTER
  void add(const PortCounters& o) {
    TrafficCounters::add(o);
#define DPU_PORT_COUNTER(m, h) m += relaxed(o.m);
#include "dpu/counters.def"
#undef DPU_PORT_COUNTER
  }
};

using TenantCounters = TrafficCounters;

constexpr uint32_t kMaxOfport = 0xfeff;   // OpenFlow's last physical port number (OFPP_MAX - 1)
constexpr uint32_t kMaxTenantSlots = 0x10000;  // a packet's tenant index is 16 bits

// A worker's counters by port or tenant, readable from any thread without
// the worker's lock: the whole capacity is reserved up front (address space
// only: pages appear when first written), so growing never moves an element,
// and the size is published after the new elements are constructed. The
// owner writes plain stores; readers load each field relaxed (add() below).
template <class T>
class CounterArray {
 public:
  explicit CounterArray(size_t cap) : cap_(cap) {
    void* m = mmap(nullptr, cap * sizeof(T), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    v_ = static_cast<T*>(m);
  }
  ~CounterArray() { munmap(v_, cap_ * sizeof(T)); }
  CounterArray(const CounterArray&) = delete;
  CounterArray& operator=(const CounterArray&) = delete;
  // Owner only.
  void grow(size_t n) {
    n = std::min(n, cap_);
    size_t cur = n_.load(std::memory_order_relaxed);
    for (size_t i = cur; i < n; i++) new (&v_[i]) T();
    if (n > cur) n_.store(n, std::memory_order_release);
  }
  T& operator[](size_t i) { return v_[i]; }
  const T& operator[](size_t i) const { return v_[i]; }
  size_t size() const { return n_.load(std::memory_order_acquire); }

 private:
  T* v_;
  size_t cap_;
  std::atomic<size_t> n_{0};
};

enum Stage : uint8_t {
  STAGE_PARSE, STAGE_EMC, STAGE_MEGAFLOW, STAGE_UPCALL, STAGE_EXECUTE, STAGE_TX, STAGE_CONNTRACK, STAGE_COUNT
};
constexpr const char* kStageNames[STAGE_COUNT] = {"parse", "emc", "megaflow", "upcall", "execute", "tx", "conntrack"};

// What one worker did (dpif-netdev/pmd-stats-show): counters.def's worker
// group, plus cycles per stage when profiling.
struct WorkerCounters {
#define DPU_WORKER_COUNTER(m, n, h) uint64_t m = 0;
#include "dpu/counters.def"
#undef DPU_WORKER_COUNTER
  uint64_t cycles[STAGE_COUNT] = {};
  void add(const WorkerCounters& o) {
#define DPU_WORKER_COUNTER(m, n, h) m += relaxed(o.m);
#include "dpu/counters.def"
#undef DPU_WORKER_COUNTER
    for (int i = 0; i < STAGE_COUNT; i++) cycles[i] += relaxed(o.cycles[i]);
  }
};

// The worker's list of conntrack jobs (std::vector's interface, the part
// the stage uses). push() is a bump with its growth out of line, so that
// the pass's call that queues a job saves no registers (std::vector's
// inline reallocation made that leaf function save six). Elements are
// not initialised: every field of a job is written when it is queued.
template <class T>
class JobList {
 public:
  static_assert(std::is_trivially_copyable<T>::value, "jobs are copied as bytes when the list grows");
  T& push() {
    if (__builtin_expect(n_ == cap_, 0)) grow();
    return data_[n_++];
  }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  void clear() { n_ = 0; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
#if defined(__SANITIZE_ADDRESS__)
  static constexpr size_t kFirst = 2;  // under the sanitizers every stage grows it
#else
  static constexpr size_t kFirst = 256;
#endif
  __attribute__((noinline)) void grow() {
    const size_t cap = cap_ ? 2 * cap_ : kFirst;
    std::unique_ptr<T[]> d(new T[cap]);
    if (n_) std::memcpy(static_cast<void*>(d.get()), data_.get(), n_ * sizeof(T));
    data_ = std::move(d);
    cap_ = cap;
  }
  std::unique_ptr<T[]> data_;
  size_t n_ = 0, cap_ = 0;
};

// The pass after conntrack of an established connection, cached (ct_stage.cc,
// "Resuming after conntrack"). One per EMC slot whose key's megaflow is a
// lone ct(table=T) (Megaflow::ct_resume): the connection that key's packets
// belonged to, the state they got, and the megaflow and key the next pass
// found. The next pass's key is a function of the first pass's key, the
// connection's translation (its keys) and its state, mark and label, so a
// packet with the same key whose conntrack result is the same skips that
// pass's parse and lookups.
// What every resumed packet reads is kept in the EMC entry itself (its side
// data, on the page the hit has just read), its state and whether it has a
// label in the entry's side tag; the label and the next pass's key, which
// few packets read, in an array by slot. The connection's life count (conn.h)
// stands for its mark and label: unchanged, so are they.
struct CtResume {
  Conn* conn;
  Megaflow* mf;
  uint32_t life;
  CtXlat other;  // the connection's other key (the translation)
  // The side tag: set, the state, and whether the result had a label.
  static uint16_t tag(uint8_t state, bool labelled) {
    return static_cast<uint16_t>(0x8000u | (labelled ? 0x100u : 0u) | state);
  }
  static uint8_t dir_of(uint16_t tag) { return (tag & kCsReplyDir) ? 1 : 0; }
  // Whether conntrack gave the packet the cached result (the direction is in
  // the state); `label` (of the cold part) is read only if the cached result
  // had one.
  bool same(const CtResult& r, uint16_t tag, const u128& label) const {
    return r.conn == conn && r.state == static_cast<uint8_t>(tag) && r.life == life &&
           ((tag & 0x100u) ? r.label == label : r.label == 0);
  }
};
static_assert(sizeof(CtResume) == Emc::kSideBytes, "kept in an EMC entry");
struct CtResumeCold {
  u128 label = 0;
  Flow key{};
};

constexpr int kMaxPasses = 8;
constexpr uint32_t kChunk = 32;
constexpr size_t kCtStageJobs = 128;  // a pass runs the conntrack stage once this many jobs wait (ct_stage.cc)

class Worker {
 public:
  Worker(DatapathView* dp, uint32_t pool_size);
  ~Worker();

  // Processes one batch; packets must come from this worker's pool and have
  // md.in_port / timestamp / data set. Returns them all to the pool.
  void process(Batch& in);
  // One receive burst of at most max frames from q through process(), the
  // outputs to sink: the step every I/O path (memory, pcap, AF_PACKET,
  // AF_XDP) shares. Frames too long for a buffer are counted as oversize
  // drops of their port. Returns the frames taken. Caller holds mu.
  uint32_t receive(RxQueue& q, uint32_t max, PortSink* sink);

  PacketPool& pool() { return pool_; }
  // The configuration version the current (or last) batch ran at.
  uint64_t batch_version() const { return version_; }
  CtWorker& ct_worker() { return *ctw_; }
  void set_sink(PortSink* s) { sink_ = s; }
  // Every dropped arrival to `s` as well (nullptr: off, the default). Caller holds mu.
  void set_drop_sink(DropSink* s) { drop_sink_ = s; }
  void set_profile(bool on) { profile_ = on; }
  void set_emc_insert_inv_prob(uint32_t n) { emc_inv_prob_ = n ? n : 1; }
  void set_max_megaflows(size_t n) { max_megaflows_ = n; }
  // Terminate VXLAN right after parsing instead of through a megaflow whose
  // only action is TNL_POP (the outcome is the same; tests compare both).
  void set_fast_tunnel(bool on) { fast_tunnel_ = on; }
  // A trace: every pass walks the tables and is recorded, conntrack changes
  // nothing (dry run), and no rule is credited.
  void set_trace(TraceRecorder* rec);

  // Control side (caller holds mu).
  void push_stats();               // credit megaflow deltas to rules/tables/groups
  // Between batches of a long-running worker (live mode): counts reach the
  // rules and a slice of conntrack expiry runs even when no packet arrives.
  void housekeeping();
  void flush_caches();
  size_t megaflow_count() const { return __atomic_load_n(&dpcls_.size_ref(), __ATOMIC_RELAXED); }
  Dpcls& dpcls() { return dpcls_; }
  // The megaflows in this worker's cache (caller holds mu while using them).
  void dump_megaflows(std::vector<MegaflowDump>* out);

  std::mutex mu;
  // Counters: written by this worker only, read from any thread without mu.
  CounterArray<PortCounters> ports{kMaxOfport + 1};      // by ofport
  CounterArray<TenantCounters> tenants{kMaxTenantSlots};  // by tenant index
  WorkerCounters counters;

 private:
  // At the start of a batch, in the read section: the current Config, and
  // the caches brought up to it.
  void sync_config();
  void revalidate(const Config& c);
  void forget_dead();  // EMC entries and hints naming dead megaflows cleared, then those freed
  // A packet whose EMC entry named a dead megaflow: looked up again (megaflow
  // cache, then upcall), as pass() does for a miss.
  Megaflow* resolve(Packet* p, const Flow& key, uint32_t slot, bool use_emc, uint32_t hash, uint32_t* direct);
  void pass(Packet** pkts, uint32_t n, std::vector<Packet*>& recirc, bool first);
  template <bool kTerms>
  uint32_t parse_stage(Packet** pkts, uint32_t n, Flow* keys, Packet** live, bool first);
  // execute.h: inlined into the batch loop; clones recurse through the
  // out-of-line run_actions_nested (execute.cc).
  __attribute__((always_inline)) inline void run_actions(Packet* p, const Flow& key, const DpAction* a, size_t n,
                                                         std::vector<Packet*>& recirc);
  void run_actions_nested(Packet* p, const Flow& key, const DpAction* a, size_t n, std::vector<Packet*>& recirc);
  // The packet enters `tenant` (its megaflow's) unless it already belongs to one: rx counts.
  void enter_tenant(Packet* p, uint16_t tenant);
  void emit(uint32_t port, Packet* p, bool counts_as_output);
  // conntrack (ct_stage.cc)
  void ct_enqueue(Packet* p, const DpAction& a, const Flow& key, const DpAction* rest, size_t n_rest);
  // A packet whose megaflow `mf` is a lone ct(table=T); slot: 1 + its key's EMC slot, or 0.
  void ct_enqueue_resumable(Packet* p, Megaflow* mf, uint32_t slot, uint32_t stamp);
  void conntrack_stage(std::vector<Packet*>& next);
  void ct_note_resume(Packet* p, uint32_t slot, uint32_t stamp, const CtResult& r);
  void ct_fill_resume(Packet* p, Megaflow* mf, const Flow& key);
  bool ct_continue(Packet* p, const Megaflow* from, std::vector<Packet*>& next);
  void timed_conntrack_stage(std::vector<Packet*>& next);  // conntrack_stage() under the profile's clock
  void ct_next_pass(Packet* p, Megaflow* mf, const Flow& key, std::vector<Packet*>& next);
  void ct_run_pass(Packet* p, Megaflow* mf, const Flow& key, std::vector<Packet*>& next);  // its counts and actions
  void ct_run_actions(Packet* p, Megaflow* mf, const Flow& key, std::vector<Packet*>& next);  // the actions alone
  void drop(Packet* p, uint16_t reason);
  void count_reject(const RxReject& r);  // a frame the queue refused (oversize, offload_unsupported)
  Packet* copy(Packet* p);
  void count_drop(uint32_t origin, uint16_t reason);  // per port and tenant, by arrival slot
  void flush_tx(bool sort);
  // vxlan.cc
  bool tnl_push(Packet* p, const Flow& key, const DpAction& a);
  // Validates and strips VXLAN (the TNL_POP action); DROP_NONE on success.
  uint16_t tnl_pop(Packet* p, const DpAction& a);
  // A decapsulated frame: rx of its tunnel port.
  void count_tunnel_rx(uint32_t tunnel_port, uint32_t len) {
    if (tunnel_port < ports.size()) {
      ports[tunnel_port].rx_packets++;
      ports[tunnel_port].rx_bytes += len;
    }
  }
  void report_drops(uint32_t n);
  void send_too_big(Packet* p, const Flow& key, const TnlHeader& a);

  DatapathView* dp_;
  int rcu_slot_;
  PacketPool pool_;
  Emc emc_;
  Dpcls dpcls_;
  uint64_t version_ = 0;
  const Config* cfg_ = nullptr;  // during a batch: the version it runs at
  // The parts of the last Config whose derived state (is_tunnel_, tnl_terms_,
  // ...) is current; held so that a pointer compare means "unchanged".
  std::shared_ptr<const PortTable> seen_ports_;
  std::shared_ptr<const std::vector<TunnelTerm>> seen_terms_;
  PortSink* sink_ = nullptr;
  bool profile_ = false;
  uint32_t emc_inv_prob_ = 100;
  // EMC bypass (worker.cc, pass()): while the EMC answers too few lookups
  // (more flows than entries), only one sub-batch in kEmcProbeEvery looks
  // in it; those measure its hit rate, and the rest go to the megaflow
  // cache without fetching its lines. Inserts go on as usual.
  static constexpr uint32_t kEmcProbeEvery = 16, kEmcWindow = 4096;
  bool emc_bypass_ = false;
  uint32_t emc_window_looks_ = 0, emc_window_hits_ = 0;
  XorShift rng_{0x853c49e6748fea9bull};
  uint64_t next_random() { return rng_(); }  // EMC insertion and bypass probes
  size_t max_megaflows_ = 1u << 20;
  uint64_t batch_count_ = 0;

  // Per-call state.
  std::vector<std::vector<Packet*>> tx_;  // by ofport
  std::vector<uint32_t> tx_ports_;        // ports with queued packets
  std::vector<Packet*> tx_scratch_;       // flush_tx's merge_runs() buffers
  std::vector<uint32_t> tx_runs_;
  std::vector<uint8_t> is_tunnel_;        // by ofport
  std::vector<Packet*> cur_, next_;       // packets of the current / next pass
  std::vector<TunnelTerm> tnl_terms_;     // the VTEPs the Config terminates
  std::vector<XlateOut> uninstalled_;     // walks run without a megaflow (cache full, trace): this call
  // conntrack: packets waiting for the stage, and the keys of those whose
  // remaining actions run after it (ct without table)
  struct CtJob {
    Packet* p;
    const CtSpec* spec;
    const DpAction* rest;
    uint32_t n_rest;
    uint32_t key;    // index in ct_keys_
    uint32_t slot;   // 1 + the EMC slot of the pass's key when its megaflow is a lone ct(table=T), else 0
    uint32_t stamp;  // that slot's stamp then
    Megaflow* from;  // that megaflow (with or without a slot), else null
  };
  JobList<CtJob> ct_jobs_;
  std::vector<uint8_t> ct_kind_;             // by job: looked up, its slot's cached connection tried first, or opening a SNAT connection
  // By EMC slot; allocated by the first fill (a worker that never resumes,
  // such as a trace's, never pays for its 4.25 MiB).
  std::unique_ptr<HugeArray<CtResumeCold>> ct_resume_;
  // Packets recirculated after conntrack whose next pass will be cached
  // (Packet::ct.resume indexes this; cleared with every batch).
  struct ResumeNote {
    Packet* p;
    uint32_t slot, stamp;
    Conn* conn;
    uint32_t life;
    uint8_t state;
    CtXlat other;
    u128 label;
  };
  std::vector<ResumeNote> resume_notes_;
  std::vector<Flow> ct_keys_;
  std::vector<CtPrep> ct_prep_;
  std::unique_ptr<CtWorker> ctw_;
  TraceRecorder* trace_ = nullptr;
  uint64_t max_ts_ = 0;                   // newest timestamp of the batch (the conntrack clock in a replay)
  std::vector<uint8_t> is_underlay_;      // by ofport
  // Tunnel ports by underlay and family (the TNL_PUSH action names only the
  // underlay): whose tx an encapsulation counts. From tnl_terms_.
  struct TunnelTx {
    uint32_t underlay, port;
    bool ipv6;
  };
  std::vector<TunnelTx> tnl_tx_;
  // Drop capture (drop_sink_ set): each arrival's frame as received.
  DropSink* drop_sink_ = nullptr;
  std::vector<uint8_t> arrival_copy_;
  uint32_t arrival_ofs_[kBatchMax];
  uint32_t arrival_len_[kBatchMax];
  uint64_t arrival_ts_[kBatchMax];
  bool fast_tunnel_ = true;
  uint16_t out_count_[kBatchMax];
  uint32_t lost_[kBatchMax];              // copies of each arrival the pool could not make
  uint16_t reason_[kBatchMax];
  uint16_t tenant_[kBatchMax];
  uint8_t icmp_sent_[kBatchMax];
  uint32_t in_port_[kBatchMax];
  bool recirculated_ = false;
  uint32_t emit_seq_ = 0;
};

}  // namespace dpu
