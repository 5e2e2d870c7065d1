// stage.h: what the stages of one worker share (docs/design.md, "A worker is
// stages").
//
// A worker (worker.h) is a thread state and five stage modules, each a file
// pair with its own state, counters and contract:
//
//   classify.h   parse (+ the VXLAN termination fused into it), EMC, megaflow cache
//   upcall.h     a lookup the caches could not answer: the slow path, a megaflow installed
//   execute.h    the datapath actions, VXLAN push and pop included (vxlan.cc)
//   ct_stage.h   the conntrack stage between passes, and its cache of resumed passes
//   transmit.h   the per-port transmit queues and the sinks they drain to
//
// The stages do not know the worker, and reach the dataplane only through
// DatapathView (datapath_view.h). What they share during a batch is here, in
// one StageEnv the worker owns and hands to each stage call: the packet pool,
// the per-arrival bookkeeping (Arrivals), the port and tenant counters, the
// port facts of the batch's Config (PortView), the pass count, the trace.
// Stages that need each other take each other as arguments (execute: transmit
// and conntrack; conntrack: classify, and the worker's continuation), so
// the dependencies point one way.
//
// Counters: each stage's are its own (counters.def's groups); the port and
// tenant counters are here. All are written by the worker's thread only, with
// plain stores, and read from any thread with relaxed loads.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "dpu/batch.h"
#include "dpu/drops.h"
#include "dpu/flow_key.h"
#include "tunnel_term.h"

namespace dpu {

struct XlateOut;
struct TraceEvent;
struct CtSpec;
struct CtResult;

constexpr int kMaxPasses = 8;
constexpr uint32_t kChunk = 32;          // a pass works on sub-batches of this many packets
constexpr size_t kCtStageJobs = 128;     // a pass runs the conntrack stage once this many jobs wait
constexpr uint32_t kMaxOfport = 0xfeff;  // OpenFlow's last physical port number (OFPP_MAX - 1)
constexpr uint32_t kMaxTenantSlots = 0x10000;  // a packet's tenant index is 16 bits

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
// (drop_writer.h writes them to a pcapng file with the reason as a comment).
class DropSink {
 public:
  virtual ~DropSink() = default;
  // One dropped arrival: `data` holds `len` bytes of the frame as received
  // (nullptr and 0 when no buffer ever held it: oversize), `wire_len` its size.
  virtual void dropped(uint32_t port, uint64_t ts_ns, const uint8_t* data, uint32_t len, uint32_t wire_len,
                       uint16_t reason) = 0;
  // The batch's drops have all been given (called once a batch, by the worker's thread,
  // whether it dropped anything or not): a sink that buffers may write them out now.
  virtual void end_batch() {}
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

// A worker's counters by port or tenant, readable from any thread without
// the worker's lock: the whole capacity is reserved up front (address space
// only: pages appear when first written), so growing never moves an element,
// and the size is published after the new elements are constructed. The
// owner writes plain stores; readers load each field relaxed (add() above).
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

// The port facts a batch's stages read, derived from its Config when the
// Config's ports or VTEPs change (Worker::sync_config).
struct PortView {
  std::vector<uint8_t> is_tunnel;     // by ofport
  std::vector<uint8_t> is_underlay;   // by ofport: some VTEP sends and receives through it
  std::vector<TunnelTerm> terms;      // the VTEPs terminated (tunnel_term.h)
  // Tunnel ports by underlay and family (the TNL_PUSH action names only the
  // underlay): whose tx an encapsulation counts.
  struct TunnelTx {
    uint32_t underlay, port;
    bool ipv6;
  };
  std::vector<TunnelTx> tnl_tx;
};

// The per-arrival bookkeeping of a batch: whatever happens to a packet or its
// copies is recorded under its arrival slot (Packet::origin), and when the
// batch ends every arrival that produced no output is counted once as a drop,
// under the last reason recorded, on its port and tenant (and handed to the
// drop capture, as it arrived).
class Arrivals {
 public:
  // The batch's arrivals: slots, input ports (rx counted per port), the
  // newest timestamp, and with a drop capture each frame as it arrived.
  void begin(Packet* const* pkts, uint32_t n, CounterArray<PortCounters>& ports, bool capture) {
    static_assert(DROP_NONE == 0, "reason_ is cleared with zeros");
    std::memset(out_count_, 0, n * sizeof out_count_[0]);
    std::memset(lost_, 0, n * sizeof lost_[0]);
    std::memset(reason_, 0, n * sizeof reason_[0]);
    std::memset(tenant_, 0, n * sizeof tenant_[0]);
    std::memset(icmp_sent_, 0, n * sizeof icmp_sent_[0]);
    max_ts_ = 0;
    // A burst's frames mostly share a port: its rx counts are added once per
    // run of them (a counter incremented per packet is a store-to-load chain).
    uint32_t run_port = 0;
    uint64_t run_packets = 0, run_bytes = 0;
    for (uint32_t i = 0; i < n; i++) {
      Packet* p = pkts[i];
      p->origin = static_cast<uint16_t>(i);
      p->md.tenant = 0;
      max_ts_ = std::max(max_ts_, p->md.timestamp_ns);
      const uint32_t port = p->md.in_port < ports.size() ? p->md.in_port : 0;
      in_port_[i] = port;
      if (port != run_port && run_packets) {
        ports[run_port].rx_packets += run_packets;
        ports[run_port].rx_bytes += run_bytes;
        run_packets = run_bytes = 0;
      }
      run_port = port;
      run_packets++;
      run_bytes += p->len;
    }
    if (run_packets) {
      ports[run_port].rx_packets += run_packets;
      ports[run_port].rx_bytes += run_bytes;
    }
    if (__builtin_expect(capture, 0)) keep(pkts, n);
  }
  // A copy went out (counts_as_output) for this arrival.
  void sent(const Packet* p) { out_count_[p->origin]++; }
  void set_reason(const Packet* p, uint16_t reason) { reason_[p->origin] = reason; }
  void lost_copy(const Packet* p) { lost_[p->origin]++; }
  void set_tenant(const Packet* p, uint16_t tenant) { tenant_[p->origin] = tenant; }
  // An ICMP error about this arrival was sent (one at most: vxlan.cc).
  bool icmp_sent(const Packet* p) const { return icmp_sent_[p->origin] != 0; }
  void mark_icmp_sent(const Packet* p) { icmp_sent_[p->origin] = 1; }
  uint64_t max_ts() const { return max_ts_; }
  uint32_t in_port(uint32_t origin) const { return in_port_[origin]; }
  // The drops of the batch's n arrivals, counted (and captured).
  void finish(uint32_t n, CounterArray<PortCounters>& ports, CounterArray<TenantCounters>& tenants,
              DropSink* capture) {
    for (uint32_t i = 0; i < n; i++) {
      // Copies the pool could not make are drops too (no_buffer), even when
      // other copies of the packet went out; a packet that died of it counts once.
      uint32_t lost = lost_[i];
      if (!out_count_[i]) {
        const uint16_t r = reason_of(i);
        count_drop(i, r, ports, tenants);
        ports[in_port_[i]].dropped++;
        if (tenant_[i] && tenant_[i] < tenants.size()) tenants[tenant_[i]].dropped++;
        if (r == DROP_NO_BUFFER && lost) lost--;
      }
      for (; lost; lost--) count_drop(i, DROP_NO_BUFFER, ports, tenants);
    }
    if (__builtin_expect(capture != nullptr, 0))
      for (uint32_t i = 0; i < n; i++)
        if (!out_count_[i])
          capture->dropped(in_port_[i], arrival_ts_[i], copies_.data() + arrival_ofs_[i], arrival_len_[i],
                           arrival_len_[i], reason_of(i));
  }

 private:
  uint16_t reason_of(uint32_t i) const {
    return reason_[i] == DROP_NONE ? static_cast<uint16_t>(DROP_NO_OUTPUT) : reason_[i];
  }
  void count_drop(uint32_t i, uint16_t reason, CounterArray<PortCounters>& ports,
                  CounterArray<TenantCounters>& tenants) {
    ports[in_port_[i]].drops[reason]++;
    if (tenant_[i] && tenant_[i] < tenants.size()) tenants[tenant_[i]].drops[reason]++;
  }
  __attribute__((noinline)) void keep(Packet* const* pkts, uint32_t n) {  // each arrival as received
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++) total += pkts[i]->len;
    if (copies_.size() < total) copies_.resize(total);
    uint32_t ofs = 0;
    for (uint32_t i = 0; i < n; i++) {
      const Packet* p = pkts[i];
      std::memcpy(copies_.data() + ofs, p->data(), p->len);
      arrival_ofs_[i] = ofs;
      arrival_len_[i] = p->len;
      arrival_ts_[i] = p->md.timestamp_ns;
      ofs += p->len;
    }
  }
  uint16_t out_count_[kBatchMax];
  uint32_t lost_[kBatchMax];  // copies of each arrival the pool could not make
  uint16_t reason_[kBatchMax];
  uint16_t tenant_[kBatchMax];
  uint8_t icmp_sent_[kBatchMax];
  uint32_t in_port_[kBatchMax];
  uint64_t max_ts_ = 0;  // newest timestamp of the batch (the conntrack clock in a replay)
  // Drop capture: each arrival's frame as received.
  std::vector<uint8_t> copies_;
  uint32_t arrival_ofs_[kBatchMax];
  uint32_t arrival_len_[kBatchMax];
  uint64_t arrival_ts_[kBatchMax];
};

enum Stage : uint8_t {
  STAGE_PARSE, STAGE_EMC, STAGE_MEGAFLOW, STAGE_UPCALL, STAGE_EXECUTE, STAGE_TX, STAGE_CONNTRACK, STAGE_COUNT
};
constexpr const char* kStageNames[STAGE_COUNT] = {"parse", "emc", "megaflow", "upcall", "execute", "tx", "conntrack"};

// The worker thread's own counters (counters.def, DPU_THREAD_COUNTER): the
// passes every stage makes go through one function, add_passes().
struct ThreadCounters {
#define DPU_THREAD_COUNTER(m, n, h) uint64_t m = 0;
#include "dpu/counters.def"
#undef DPU_THREAD_COUNTER
  uint64_t cycles[STAGE_COUNT] = {};
};

// Everything a worker's stages share during a batch (the worker owns it and
// passes it to every stage call).
struct StageEnv {
  explicit StageEnv(uint32_t pool_size) : pool(pool_size) {}
  PacketPool pool;
  Arrivals arrivals;
  CounterArray<PortCounters> ports{kMaxOfport + 1};      // by ofport
  CounterArray<TenantCounters> tenants{kMaxTenantSlots};  // by tenant index
  PortView view;
  ThreadCounters counters;
  TraceRecorder* trace = nullptr;  // a trace: every pass walks the tables and is recorded
  bool profile = false;            // cycles per stage
  bool recirculated = false;       // this batch: some output may be out of arrival order (transmit merges runs)
  uint32_t emit_seq = 0;           // this batch: the order outputs were emitted in

  // The one place passes are counted: `n` passes, and `recirculated_n`
  // recirculations (passes after a packet's first: a tunnel pop, a
  // conntrack stage; counted when the packet goes on to one).
  void add_passes(uint64_t n, uint64_t recirculated_n) {
    counters.passes += n;
    counters.recirculations += recirculated_n;
  }
  // A packet dies here (its reason recorded unless DROP_NONE: the arrival's
  // copies may still have gone out).
  void drop(Packet* p, uint16_t reason) {
    if (reason != DROP_NONE) arrivals.set_reason(p, reason);
    pool.put(p);
  }
  // A copy of p from the pool, or null (counted as a lost copy).
  Packet* copy(Packet* p) {
    Packet* c = pool.clone(p);
    if (__builtin_expect(c == nullptr, 0)) arrivals.lost_copy(p);
    return c;
  }
  // The packet enters `tenant` (its megaflow's) unless it already belongs to one: rx counts.
  void enter_tenant(Packet* p, uint16_t tenant) {
    if (!tenant || p->md.tenant || tenant >= tenants.size()) return;
    p->md.tenant = tenant;
    arrivals.set_tenant(p, tenant);
    tenants[tenant].rx_packets++;
    tenants[tenant].rx_bytes += p->len;
  }
  // A decapsulated frame: rx of its tunnel port.
  void count_tunnel_rx(uint32_t tunnel_port, uint32_t len) {
    if (tunnel_port < ports.size()) {
      ports[tunnel_port].rx_packets++;
      ports[tunnel_port].rx_bytes += len;
    }
  }
};

}  // namespace dpu
