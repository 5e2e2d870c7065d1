// dataplane.h: the shared state of one dataplane and its control entry points.
//
// Holds the ports, the 255 OpenFlow tables, the groups, the tenant map
// (metadata value -> tenant, for per-tenant counters) and the workers.
//
// Control (any thread, one commit at a time):
//   apply(Txn)   the single validate-then-commit entry point for ports, flows,
//                groups and tenants. Everything in a Txn is parsed and checked
//                first; only then, holding every worker's mutex (so no batch is
//                in flight) and the exclusive table lock, is it applied, and the
//                table version bumped. Workers see the new version at their next
//                batch and flush their caches: a change is visible to the very
//                next batch, and no packet sees half of it.
//   dump_flows / dump_groups / stats / trace   readers (shared lock).
// Fast path (workers): upcall() runs xlate under the shared lock; credit()
// adds megaflow counts to rules, tables and groups (atomics).
//
// Lock order: worker mutexes (ascending) -> table lock. Readers that need
// fresh rule counters first push worker stats (worker mutexes only), then take
// the shared table lock, never both at once.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "classifier.h"
#include "conntrack/conntrack.h"
#include "dpu/ofparse.h"
#include "dpu/status.h"
#include "ports.h"
#include "recirc.h"
#include "worker.h"
#include "xlate.h"

namespace dpu {

struct PortSpec {
  std::string name;
  bool tunnel = false;
  std::string underlay;  // tunnel ports: name of the uplink port
  TunnelCfg cfg;
  uint32_t ofport = 0;   // 0 = next free number
};

struct TenantSpec {
  std::string name;
  uint64_t metadata = 0;
};

struct TxnOp {
  enum Kind : uint8_t {
    ADD_FLOW, MOD_FLOWS, MOD_FLOWS_STRICT, DEL_FLOWS, DEL_FLOWS_STRICT, ADD_GROUP, MOD_GROUP, DEL_GROUPS
  } kind = ADD_FLOW;
  std::string text;
};

struct Txn {
  std::vector<PortSpec> add_ports;
  // conntrack: zone settings (tenant quotas, filtering) and NAT port forwards,
  // replaced as a whole when set
  bool set_ct_zones = false;
  std::vector<std::pair<uint16_t, CtZoneCfg>> ct_zones;
  bool set_nat_static = false;
  std::vector<StaticMapping> nat_static;
  std::vector<std::string> del_ports;
  std::vector<TxnOp> ops;
  bool set_tenants = false;
  std::vector<TenantSpec> tenants;
  bool create_ports = false;  // unknown port names in flows become new plain ports
};

struct TxnResult {
  uint64_t flows_added = 0, flows_modified = 0, flows_deleted = 0;
  uint64_t groups_added = 0, groups_modified = 0, groups_deleted = 0;
  std::vector<std::string> ports_added;
  uint64_t version = 0;
};

struct FlowDump {
  uint8_t table;
  uint16_t priority;
  uint64_t cookie;
  uint64_t n_packets, n_bytes;
  double duration;
  std::string match, actions;
};

struct GroupDump {
  uint32_t group_id;
  std::string text;
  uint64_t n_packets, n_bytes;
};

struct TracePass {
  uint32_t in_port = 0;
  uint32_t recirc_id = 0;
  std::string flow;
  std::vector<TraceEvent> events;
  std::string final_flow, megaflow, actions;
  std::vector<std::string> conntrack;  // what the conntrack stage did after this pass
  uint16_t drop_reason = DROP_NONE;
};

struct TraceResult {
  std::vector<TracePass> passes;
  std::vector<std::pair<uint32_t, std::vector<uint8_t>>> outputs;
  uint16_t drop_reason = DROP_NONE;
};

struct Totals {
  std::vector<std::pair<uint32_t, PortCounters>> ports;
  std::vector<TenantCounters> tenants;
  WorkerCounters workers_total;        // the sum of workers
  std::vector<WorkerCounters> workers;  // each worker's own
  std::vector<uint64_t> worker_megaflows;
  uint64_t megaflows = 0;
};

class Dataplane {
 public:
  explicit Dataplane(size_t n_workers = 1);
  ~Dataplane();

  Status apply(const Txn& txn, TxnResult* res);

  Status dump_flows(const std::string& selector, bool strict, std::vector<FlowDump>* out);
  std::vector<GroupDump> dump_groups();
  Totals totals();  // summed over workers
  // lookups, matches, rules; sync: first credit what the workers' caches
  // counted (takes each worker's lock between batches); without it, the counts
  // as of each worker's last housekeeping (a scrape never waits for a worker).
  void table_counters(std::vector<std::array<uint64_t, 3>>* out, bool sync = true);
  Status trace(const uint8_t* pkt, size_t len, uint32_t in_port, TraceResult* out);

  std::vector<PortInfo> ports();
  struct TenantInfo {
    std::string name;
    uint64_t metadata;
    uint16_t slot;  // index of its counters; stays with the name across reloads
  };
  std::vector<TenantInfo> tenants();
  uint32_t port_number(const std::string& name);
  std::string port_name(uint32_t p);

  // Workers. Worker 0 serves API calls (process, replay, bench); any worker
  // can be given a batch (process_buffers), each on its own thread.
  Worker& worker(size_t i) { return *workers_[i]; }
  size_t n_workers() const { return workers_.size(); }
  void sync_stats();  // push every worker's megaflow counts to the rules

  // Fast path hooks.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }
  void upcall(const Flow& key, XlateOut* out, std::vector<TraceEvent>* trace);
  void credit(const std::vector<XcacheEntry>& xc, uint64_t packets, uint64_t bytes);
  void port_flags(std::vector<uint8_t>* is_tunnel, size_t* n_tenants);
  void tunnel_terms(std::vector<TunnelTerm>* out);

  // Connection tracking (shared by the workers).
  Conntrack& conntrack() { return ct_; }
  RecircTable& recirc() { return recirc_; }

  // ovs-ofctl set-frags: "normal" (the default, as OVS: an IP fragment's L4
  // ports read as 0 in table lookups) or "nx-match" (a first fragment's ports
  // are matched). A change flushes every cache, as a commit does.
  void set_frag_nx_match(bool on);
  bool frag_nx_match() const { return frag_nx_match_.load(std::memory_order_relaxed); }

  // Time (injectable, as OVS's time/warp): monotonic ns plus a test offset.
  int64_t now_ns() const;
  void warp(int64_t ns) { warp_ns_ += ns; }
  // Stops the clock where it stands (OVS's time/stop): it then moves only
  // with warp() and, for conntrack, with packet timestamps. Tests that
  // compare expiries with a model of packet time use it.
  void stop_clock(bool stop);

 private:
  class TxnPorts;
  class GroupGraph;
  struct ParsedOp {
    FlowSpec flow;
    GroupPtr group;
    bool all_groups = false;
  };
  // apply(): the validate steps change nothing; the commit steps run with
  // every worker stopped between batches and the table lock held.
  Status validate_ports(const Txn& txn, TxnPorts* tp, std::vector<PortInfo>* add);
  Status validate_ops(const Txn& txn, const TxnPorts& tp, std::vector<ParsedOp>* parsed) const;
  Status validate_flow_op(const TxnOp& op, const TxnPorts& tp, const GroupGraph& gg, int line, ParsedOp* p) const;
  Status validate_group_op(const TxnOp& op, const TxnPorts& tp, GroupGraph* gg, int line, ParsedOp* p) const;
  Status validate_tenants(const Txn& txn) const;
  void commit_ports(const Txn& txn, const TxnPorts& tp, const std::vector<PortInfo>& new_ports, TxnResult* res);
  void commit_ops(const Txn& txn, std::vector<ParsedOp>& parsed, TxnResult* res);
  void commit_add_flow(FlowSpec& f, int64_t now, TxnResult* res);
  void commit_del_groups(const ParsedOp& p, TxnResult* res);
  void commit_tenants(const std::vector<TenantSpec>& tenants);
  void replace_rule(const RulePtr& old, std::vector<OfAction> acts, const uint64_t* cookie = nullptr);
  void collect(const FlowSpec& spec, bool strict, bool any_table, std::vector<RulePtr>* out) const;
  std::string flow_text(const Flow& f, bool with_pipeline) const;
  void rebuild_terms();

  mutable std::shared_mutex lock_;
  std::mutex commit_mu_;
  std::atomic<uint64_t> version_{1};
  std::atomic<bool> frag_nx_match_{false};
  PortTable ports_;
  std::vector<TunnelTerm> terms_;  // tunnel ports as the datapath terminates them
  Classifier tables_[kNumTables];
  TableStats table_stats_[kNumTables];
  std::unordered_map<uint32_t, GroupPtr> groups_;
  // Tenants by counter slot (slot - 1): a name keeps its slot, and so its
  // counters, across reloads that reorder or drop other tenants.
  struct TenantSlot {
    std::string name;
    uint64_t metadata = 0;
    bool active = false;
  };
  std::vector<TenantSlot> tenant_slots_;
  std::unordered_map<uint64_t, uint16_t> tenant_index_;  // metadata -> slot, active tenants
  Conntrack ct_;        // before the workers: they detach from it when they go
  RecircTable recirc_;
  std::vector<std::unique_ptr<Worker>> workers_;
  uint64_t next_seq_ = 1;
  std::atomic<int64_t> warp_ns_{0};
  std::atomic<int64_t> stopped_ns_{0};  // the stopped clock's monotonic reading, 0: running
};

}  // namespace dpu
