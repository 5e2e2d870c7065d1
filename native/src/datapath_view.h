// datapath_view.h: what a worker sees of its dataplane: one published
// configuration version at a time, the slow path, crediting, conntrack and the
// clock. The narrow interface between the fast path (worker.h and its stages)
// and the control plane (dataplane.h), so that neither includes the other's
// state (docs/design.md, "Changes without stopping the world").
//
// Config: everything an upcall reads besides the OpenFlow tables (which are
// versioned in place, classifier.h): the ports, the VTEPs terminated, the
// groups, the tenant map and the fragment mode, as of one version. Immutable
// once published; a commit publishes a new one (copying only what changed)
// and retires the old one through rcu.h, so a worker that loaded it at the
// start of its batch reads it until the batch ends.
//
// ChangeSet: what a version changed, so that each worker drops only the
// cached megaflows a change can affect (dpcls.h, "Revalidation"). Each
// Config carries the changes that led to it, newest first, a bounded chain:
// a worker further behind than the chain reaches flushes its caches.
//
// Thread-safety: config() from a worker inside its read section (rcu.h);
// upcall() and credit() from any worker at any time; everything reached
// through a Config is immutable but for rule and group counters (atomics).
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "dpu/rule.h"
#include "ports.h"
#include "tunnel_term.h"

namespace dpu {

class Conntrack;
class Rcu;
struct XlateOut;
struct TraceEvent;
struct XcacheEntry;

using GroupMap = std::unordered_map<uint32_t, GroupPtr>;
using TenantMap = std::unordered_map<uint64_t, uint16_t>;  // metadata -> tenant counter slot

// One rule that a version added or deleted (a modification is both: the
// old rule deleted, its replacement added).
struct RuleChange {
  RulePtr rule;
  bool added = false;
};

struct ChangeSet {
  bool flush = false;                 // ports, VTEPs, tenants or fragment mode: every cache goes
  std::vector<RuleChange> rules;
  std::vector<uint32_t> groups;       // modified or deleted
  bool empty() const { return !flush && rules.empty() && groups.empty(); }
};

struct ChangeNode {
  uint64_t version = 0;               // the version these changes made
  ChangeSet set;
  mutable std::shared_ptr<const ChangeNode> prev;  // the changes of the version before, or null
  uint32_t depth = 0;                 // nodes reachable through prev
  size_t weight = 0;                  // rule changes reachable, this node's included
  ChangeNode() = default;
  ChangeNode(const ChangeNode&) = delete;
  ChangeNode& operator=(const ChangeNode&) = delete;
  // A chain thousands long goes node by node, not by recursion.
  ~ChangeNode() {
    std::shared_ptr<const ChangeNode> p = std::move(prev);
    while (p && p.use_count() == 1) p = std::move(p->prev);
  }
};

struct Config {
  uint64_t version = 1;
  std::shared_ptr<const PortTable> ports = std::make_shared<PortTable>();
  std::shared_ptr<const std::vector<TunnelTerm>> terms = std::make_shared<std::vector<TunnelTerm>>();
  std::shared_ptr<const GroupMap> groups = std::make_shared<GroupMap>();
  std::shared_ptr<const TenantMap> tenants = std::make_shared<TenantMap>();
  size_t n_tenant_slots = 0;          // counter slots ever given out (a tenant keeps its slot)
  bool frag_nx_match = false;         // ovs-ofctl set-frags nx-match (else normal)
  std::shared_ptr<const ChangeNode> changes;
};

class DatapathView {
 public:
  virtual ~DatapathView() = default;
  // The current configuration. Call inside the read section (rcu()): it
  // stays valid until the caller leaves it.
  virtual const Config* config() const = 0;
  virtual Rcu& rcu() = 0;
  // The slow path at `c`'s version: walks the tables for `key`.
  virtual void upcall(const Config& c, const Flow& key, XlateOut* out, std::vector<TraceEvent>* trace) = 0;
  // Adds megaflow counts to the rules, tables and groups they came from.
  virtual void credit(const std::vector<XcacheEntry>& xc, uint64_t packets, uint64_t bytes) = 0;
  virtual Conntrack& conntrack() = 0;
  // The dataplane's clock (monotonic, plus the test warp), ns.
  virtual int64_t now_ns() const = 0;
};

}  // namespace dpu
