// dataplane.h: the shared state of one dataplane and its control entry points.
//
// Holds the ports, the 255 OpenFlow tables, the groups, the tenant map
// (metadata value -> tenant, for per-tenant counters) and the workers.
//
// Control (any thread, one at a time: the control mutex mu_):
//   apply(Txn)   the single validate-then-commit entry point for ports, flows,
//                groups, tenants, conntrack zones, NAT port forwards and
//                conntrack's timeouts and connection limit.
//                Everything in a Txn is parsed and checked first; then its
//                rules go into the tables with the next version (invisible to
//                every reader until that version is published), the rest into
//                a new Config (datapath_view.h), and one atomic store publishes
//                both with the list of what changed. No worker is stopped or
//                waited for: a worker takes the version current at the start of
//                its batch, so a change is in force for every batch that starts
//                after apply() returns and no packet sees half of it, and each
//                worker then drops only the cached megaflows the change can
//                affect (dpcls.h, "Revalidation").
//   dump_flows / dump_groups / stats / trace   readers (the control mutex).
// Fast path (workers, DatapathView): config() inside the read section (rcu.h),
// upcall() at that config's version, credit() (atomics). Workers never take
// the control mutex.
//
// Lock order: the control mutex, then a worker's mutex (sync_stats); a worker
// holding its own mutex takes no other.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "classifier.h"
#include "conntrack/conntrack.h"
#include "datapath_view.h"
#include "dpu/ofparse.h"
#include "dpu/status.h"
#include "ports.h"
#include "rcu.h"
#include "recirc.h"
#include "worker.h"
#include "xlate.h"

namespace dpu {

// ---- the transaction: what a writer asks for, typed --------------------------------------
// Numbers a user gives are wide (int64_t) so that apply(), not a narrowing
// cast on the way in, refuses one out of range, naming the item it belongs to.

// A port to add: plain, or a VXLAN tunnel port bound to an underlay port.
struct PortSpec {
  std::string name;
  int64_t ofport = 0;        // 0: the next free number; else 1..kMaxOfport
  bool tunnel = false;
  // tunnel ports only
  std::string underlay;      // name of the uplink port
  std::string local_ip;      // IPv4 or IPv6: the VTEP's address
  std::string local_mac, nexthop_mac;  // aa:bb:cc:dd:ee:ff
  // dst_port, sport_min, sport_max, ttl, mtu, strict: tunnel_params.def
#define DPU_TUNNEL_PARAM(m, type, def, lo, hi, api, help) \
  std::conditional_t<std::is_same_v<type, bool>, bool, int64_t> m = def;
#include "dpu/tunnel_params.def"
#undef DPU_TUNNEL_PARAM
};

struct TenantSpec {
  std::string name;
  uint64_t metadata = 0;
};

// Conntrack zone settings: connection limit (0: none; the global limit
// still applies) and endpoint-independent filtering (RFC 4787 REQ-8).
struct CtZoneSpec {
  int64_t zone = 0;          // 0..65535
  int64_t limit = 0;         // 0..kCtMaxConnsMax
  bool eif = false;
};

// A static NAT mapping (a port forward): connections to the public endpoint
// go to the internal one, and the internal one's connections leave from the
// public one. IPv4, TCP or UDP.
struct NatStaticSpec {
  int64_t zone = 0;          // 0..65535
  int64_t proto = 0;         // 6 (tcp) or 17 (udp)
  std::string internal_ip;
  int64_t internal_port = 0;  // 1..65535
  std::string public_ip;
  int64_t public_port = 0;    // 1..65535
};

// A conntrack timeout by its name (ct_timeouts.def), in seconds.
struct CtTimeoutSpec {
  std::string name;
  double seconds = 0;
};

struct TxnOp {
  // REPLACE_FLOWS: the flows the selector (a del_flows match) selects are
  // deleted, except those that an ADD_FLOW later in the transaction adds
  // again unchanged (same table, match, priority, cookie and actions): those
  // stay as they are, counters, age and cached megaflows included, as
  // ovs-ofctl replace-flows sends only the differences. A topology reload.
  enum Kind : uint8_t {
    ADD_FLOW, MOD_FLOWS, MOD_FLOWS_STRICT, DEL_FLOWS, DEL_FLOWS_STRICT, ADD_GROUP, MOD_GROUP, DEL_GROUPS, REPLACE_FLOWS
  } kind = ADD_FLOW;
  std::string text;
};

// Everything one apply() validates and then commits together, or not at all.
struct Txn {
  std::vector<PortSpec> add_ports;
  std::vector<std::string> del_ports;
  std::vector<TxnOp> ops;        // flows and groups, in order (an error names its op's line)
  bool set_tenants = false;      // replace the tenant map with `tenants`
  std::vector<TenantSpec> tenants;
  bool create_ports = false;     // unknown port names in flows become new plain ports
  // conntrack: zone settings and NAT port forwards, each replaced as a whole when set
  bool set_ct_zones = false;
  std::vector<CtZoneSpec> ct_zones;
  bool set_nat_static = false;
  std::vector<NatStaticSpec> nat_static;
  // conntrack: the timeouts named here change, the others stay; the
  // connection limit changes when given
  std::vector<CtTimeoutSpec> ct_timeouts;
  std::optional<int64_t> ct_max_connections;
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

// The one spelling of an input port the dataplane does not have (UNKNOWN_PORT), with the
// packet's index when a batch is checked (runner.h check_input_ports, Dataplane::trace).
inline Status unknown_input_port(uint32_t port, long index = -1) {
  return Status::Error(Err::UNKNOWN_PORT, (index >= 0 ? "packet " + std::to_string(index) + ": " : std::string()) +
                                              "unknown input port " + std::to_string(port));
}

struct Totals {
  std::vector<std::pair<uint32_t, PortCounters>> ports;
  std::vector<TenantCounters> tenants;
  WorkerCounters workers_total;        // the sum of workers
  std::vector<WorkerCounters> workers;  // each worker's own
  std::vector<uint64_t> worker_megaflows;
  uint64_t megaflows = 0;
};

class Dataplane : public DatapathView {
 public:
  explicit Dataplane(size_t n_workers = 1);
  ~Dataplane() override;

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
  // The conntrack zone settings and NAT port forwards as the last
  // transaction that set them committed them.
  struct CtSettings {
    std::vector<CtZoneSpec> zones;
    std::vector<NatStaticSpec> nat_static;
  };
  CtSettings ct_settings() const;
  uint32_t port_number(const std::string& name);
  std::string port_name(uint32_t p);

  // Workers. Worker 0 serves API calls (process, replay, bench); any worker
  // can be given a batch (process_buffers), each on its own thread.
  Worker& worker(size_t i) { return *workers_[i]; }
  size_t n_workers() const { return workers_.size(); }
  void sync_stats();  // push every worker's megaflow counts to the rules

  // The version published last (each apply() that changes anything makes one).
  uint64_t version() const;

  // DatapathView: what the workers see.
  const Config* config() const override { return config_.load(std::memory_order_acquire); }
  Rcu& rcu() override { return rcu_; }
  void upcall(const Config& c, const Flow& key, XlateOut* out, std::vector<TraceEvent>* trace) override;
  void credit(const std::vector<XcacheEntry>& xc, uint64_t packets, uint64_t bytes) override;
  Conntrack& conntrack() override { return ct_; }
  // Time (injectable, as OVS's time/warp): monotonic ns plus a test offset.
  int64_t now_ns() const override;

  RecircTable& recirc() { return recirc_; }

  // ovs-ofctl set-frags: "normal" (the default, as OVS: an IP fragment's L4
  // ports read as 0 in table lookups) or "nx-match" (a first fragment's ports
  // are matched). A change flushes every cache, as a change of ports does.
  void set_frag_nx_match(bool on);
  bool frag_nx_match() const;

  void warp(int64_t ns) { warp_ns_ += ns; }
  // Stops the clock where it stands (OVS's time/stop): it then moves only
  // with warp() and, for conntrack, with packet timestamps. Tests that
  // compare expiries with a model of packet time use it.
  void stop_clock(bool stop);

 private:
  class TxnPorts;
  class GroupGraph;
  class Commit;
  struct ParsedOp {
    FlowSpec flow;
    GroupPtr group;
    bool all_groups = false;
  };
  // apply(): the validate steps change nothing; the commit steps (Commit)
  // build the next version.
  Status validate_ports(const Txn& txn, const Config& cur, TxnPorts* tp, std::vector<PortInfo>* add);
  Status validate_ops(const Txn& txn, const Config& cur, const TxnPorts& tp, std::vector<ParsedOp>* parsed) const;
  Status validate_flow_op(const TxnOp& op, const TxnPorts& tp, const GroupGraph& gg, int line, ParsedOp* p) const;
  Status validate_group_op(const TxnOp& op, const TxnPorts& tp, GroupGraph* gg, int line, ParsedOp* p) const;
  Status validate_tenants(const Txn& txn) const;
  // Conntrack's part: zones, NAT mappings, timeouts and limit, checked and
  // converted (the commit step only stores them).
  struct CtParsed {
    std::vector<std::pair<uint16_t, CtZoneCfg>> zones;
    std::vector<StaticMapping> nat;
    CtConfig config;
    bool set_config = false;
  };
  Status validate_ct(const Txn& txn, CtParsed* out) const;
  void commit_ports(const Txn& txn, const TxnPorts& tp, const std::vector<PortInfo>& new_ports, Commit& c,
                    TxnResult* res);
  void commit_ops(const Txn& txn, std::vector<ParsedOp>& parsed, Commit& c, TxnResult* res);
  void commit_add_flow(Commit& c, FlowSpec& f, int64_t now, TxnResult* res);
  void commit_del_groups(Commit& c, const ParsedOp& p, TxnResult* res);
  void commit_tenants(Commit& c, const std::vector<TenantSpec>& tenants);
  void replace_rule(Commit& c, const RulePtr& old, std::vector<OfAction> acts, const uint64_t* cookie);
  void collect(const FlowSpec& spec, bool strict, uint64_t version, std::vector<RulePtr>* out) const;
  std::string flow_text(const Flow& f, bool with_pipeline, const PortNames* ports) const;
  // Publishes `next` (its version is the current one plus one) with the
  // changes that made it, and retires the current config.
  void publish(std::unique_ptr<Config> next, ChangeSet&& changes);

  mutable std::mutex mu_;  // control: apply, set_frag_nx_match and every control-side reader
  std::atomic<const Config*> config_;
  Classifier tables_[kNumTables];
  TableStats table_stats_[kNumTables];
  size_t table_rules_[kNumTables] = {};  // rules visible at the current version
  // Tenants by counter slot (slot - 1): a name keeps its slot, and so its
  // counters, across reloads that reorder or drop other tenants.
  struct TenantSlot {
    std::string name;
    uint64_t metadata = 0;
    bool active = false;
  };
  std::vector<TenantSlot> tenant_slots_;
  CtSettings ct_settings_;  // as committed (the control mutex)
  Conntrack ct_;        // before the workers: they detach from it when they go
  RecircTable recirc_;
  // After the tables (destroyed before them: its deferred removals run while
  // they exist), before the workers (which hold read slots).
  Rcu rcu_;
  std::vector<std::unique_ptr<Worker>> workers_;
  uint64_t next_seq_ = 1;
  std::atomic<int64_t> warp_ns_{0};
  std::atomic<int64_t> stopped_ns_{0};  // the stopped clock's monotonic reading, 0: running
};

}  // namespace dpu
