// xlate.h: the slow path: walk the OpenFlow tables for one flow key and
// compile the outcome into datapath actions plus the megaflow mask.
//
// Uses:  a datapath flow key (from parse.h), the tables at one version, and the
//        groups, ports and tenant map of that version (XlateEnv, from a
//        published Config: datapath_view.h), read without locks.
// A pass that resumes after conntrack (key.recirc_id != 0) starts in the
// frozen table with the frozen metadata and registers (recirc.h).
//
// Sets:  XlateOut: the datapath actions, the wildcards (every key bit the walk
//        depended on), the xlate cache (rules/tables/groups to credit with the
//        megaflow's packet counts), the tenant for per-tenant counters, and,
//        when asked, a trace of every table, rule and action (dpu trace).
// Next:  the worker installs a megaflow (dpcls.h) and executes the actions.
//
// Semantics follow Open vSwitch's ofproto-dpif-xlate where we implement the
// same feature; the README lists where dpu differs (group buckets are action
// lists run on a clone; drop(reason); one VLAN tag in the key).
//
// Thread-safety: xlate() is reentrant; callers are inside the dataplane's read
// section (rcu.h) or hold its control mutex.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "classifier.h"
#include "dpu/dp_actions.h"
#include "dpu/drops.h"
#include "dpu/rule.h"
#include "ports.h"

namespace dpu {

struct TableStats {
  std::atomic<uint64_t> lookups{0}, matches{0};
};

// What a walk looked at (OVS's xlate cache): the rules and groups to credit
// with the megaflow's counts, and each table lookup as a dependency of the
// megaflow (dpcls.h, "Revalidation"): the rule found (or none) and its
// priority, and whether the lookup saw the packet's own in_port and ports.
struct XcacheEntry {
  enum Kind : uint8_t { RULE, TABLE, GROUP } kind = RULE;
  uint8_t table = 0;
  bool matched = false;
  bool exact_view = true;       // TABLE: looked up with the walk's own flow (no resubmit port, no fragment rule)
  int32_t priority = -1;        // TABLE: of the rule found; -1: a miss
  const Rule* found = nullptr;  // TABLE: that rule (kept alive by the RULE entry after it)
  RulePtr rule;
  GroupPtr group;
};

struct TraceEvent {
  enum Kind : uint8_t { TABLE, MISS, ACTION, NOTE } kind = NOTE;
  int depth = 0;
  int table = -1;
  uint16_t priority = 0;
  uint64_t cookie = 0;
  std::string text;  // match (TABLE), action text (ACTION), or a note
};

struct TunnelTerm;
class RecircTable;

struct XlateEnv {
  const Classifier* tables = nullptr;                           // [kNumTables]
  uint64_t version = 0;                                         // the tables' version to look up at
  const std::vector<TunnelTerm>* terms = nullptr;               // VTEPs terminated (tunnel_term.h)
  const std::unordered_map<uint32_t, GroupPtr>* groups = nullptr;
  const PortTable* ports = nullptr;
  const std::unordered_map<uint64_t, uint16_t>* tenants = nullptr;  // metadata -> tenant index
  RecircTable* recirc = nullptr;                                // frozen state of ct(table=T)
  bool frag_nx_match = false;  // frag mode "nx-match": fragments' L4 ports are matched (else "normal")
};

struct XlateOut {
  DpActions actions;
  TnlHeaders tnl_hdrs;               // owned by the megaflow once installed
  CtSpecs ct_specs;                  // likewise
  Flow wc{};                         // datapath words only are meaningful
  std::vector<XcacheEntry> xcache;
  uint16_t tenant = 0;
  uint16_t drop_reason = DROP_NONE;  // when no output at all
  bool has_output = false;
  bool has_ct = false;               // the packet (or a copy) goes to the conntrack stage
  Flow final_flow{};
  // Datapath key bits that some action wrote before some table lookup: at
  // those lookups they were the action's constants, not the packet's (a
  // dependency's match is not compared on them, dpcls.h).
  Flow written_before_lookup{};
};

void xlate(const XlateEnv& env, const Flow& key, XlateOut* out, std::vector<TraceEvent>* trace);

}  // namespace dpu
