// dataplane.cc: ports, tables, groups, tenants; the transaction entry point;
// dumps and counters (see dataplane.h for the locking contract). Trace and its
// text: trace.cc; datapath actions as text: dp_format.cc.
#include "dataplane.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <set>
#include <unordered_set>

#include <arpa/inet.h>

#include "ofparse_util.h"
#include "parse.h"

namespace dpu {

// Port names as a transaction will see them: current ports, minus deletions,
// plus additions, plus (with create_ports) names invented on first use.
class Dataplane::TxnPorts : public PortNames {
 public:
  explicit TxnPorts(const PortTable& base) : base_(base), next_(std::max<uint32_t>(base.max_port(), 1)) {}
  uint32_t port_number(std::string_view name) const override {
    std::string n(name);
    auto it = added_.find(n);
    if (it != added_.end()) return it->second;
    uint32_t p = base_.port_number(name);
    if (p && !deleted_.count(p)) return p;
    if (!create_ || !valid_name(n)) return 0;
    uint32_t np = alloc();
    added_[n] = np;
    names_[np] = n;
    created_.push_back(n);
    return np;
  }
  std::string port_name(uint32_t p) const override {
    auto it = names_.find(p);
    if (it != names_.end()) return it->second;
    if (deleted_.count(p)) return std::string();
    return base_.port_name(p);
  }
  uint32_t alloc() const {
    while (base_.get(next_) || names_.count(next_)) next_++;
    return next_++;
  }
  void add(const std::string& name, uint32_t p) const {
    added_[name] = p;
    names_[p] = name;
  }
  static bool valid_name(const std::string& n) {
    if (n.empty() || n.size() > 64 || std::isdigit(static_cast<unsigned char>(n[0]))) return false;
    for (char c : n)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
    return !reserved_name(n);
  }
  // OVS's reserved port names (and drop), in any case: flows could not name such a port.
  static bool reserved_name(const std::string& n) {
    for (const char* r : {"in_port", "flood", "all", "drop", "local", "normal", "controller", "table", "any", "none"})
      if (ofp::same_ignoring_case(n, r)) return true;
    return false;
  }

  const PortTable& base_;
  bool create_ = false;
  mutable uint32_t next_;
  mutable std::unordered_map<std::string, uint32_t> added_;
  mutable std::unordered_map<uint32_t, std::string> names_;
  mutable std::vector<std::string> created_;
  std::set<uint32_t> deleted_;
};

Dataplane::Dataplane(size_t n_workers) : config_(new Config()) {
  ct_.set_origin(now_ns());
  for (size_t i = 0; i < std::max<size_t>(n_workers, 1); i++) workers_.push_back(std::make_unique<Worker>(this, 8192));
}

Dataplane::~Dataplane() {
  workers_.clear();  // their read slots go first
  rcu_.drain();      // deferred removals, while the tables exist
  delete config_.load(std::memory_order_relaxed);
}

static int64_t monotonic_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t Dataplane::now_ns() const {
  const int64_t stopped = stopped_ns_.load(std::memory_order_relaxed);
  return (stopped ? stopped : monotonic_ns()) + warp_ns_.load();
}

void Dataplane::stop_clock(bool stop) {
  if (stop == (stopped_ns_.load() != 0)) return;
  if (stop) {
    stopped_ns_.store(monotonic_ns());
  } else {  // time goes on from where it stood
    warp_ns_ -= monotonic_ns() - stopped_ns_.load();
    stopped_ns_.store(0);
  }
}

uint64_t Dataplane::version() const {
  std::lock_guard<std::mutex> g(mu_);
  return config_.load(std::memory_order_relaxed)->version;
}

bool Dataplane::frag_nx_match() const {
  std::lock_guard<std::mutex> g(mu_);
  return config_.load(std::memory_order_relaxed)->frag_nx_match;
}

// ---- ports: a PortSpec checked and turned into what the port table keeps ---------------

static bool parse_mac(const std::string& s, uint8_t* out) {
  unsigned v[6];
  char tail;
  if (s.size() != 17 || std::sscanf(s.c_str(), "%2x:%2x:%2x:%2x:%2x:%2x%c", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                                    &tail) != 6)
    return false;
  for (int i = 0; i < 6; i++) out[i] = static_cast<uint8_t>(v[i]);
  return true;
}

// A tunnel port's settings (tunnel_params.def) into its TunnelCfg (the
// underlay is resolved by the caller).
static Status tunnel_cfg(const PortSpec& ps, TunnelCfg* c) {
  const std::string who = "tunnel port '" + ps.name + "': ";
  c->ipv6 = ps.local_ip.find(':') != std::string::npos;
  if (inet_pton(c->ipv6 ? AF_INET6 : AF_INET, ps.local_ip.c_str(), c->local_ip) != 1)
    return Status::Error(Err::INVALID, who + "bad local_ip '" + ps.local_ip + "' (an IPv4 or IPv6 address)");
  if (!parse_mac(ps.local_mac, c->local_mac))
    return Status::Error(Err::INVALID, who + "bad local_mac '" + ps.local_mac + "' (aa:bb:cc:dd:ee:ff)");
  if (!parse_mac(ps.nexthop_mac, c->nexthop_mac))
    return Status::Error(Err::INVALID, who + "bad nexthop_mac '" + ps.nexthop_mac + "' (aa:bb:cc:dd:ee:ff)");
#define DPU_TUNNEL_PARAM(m, type, def, lo, hi, api, help)                                                      \
  if (static_cast<int64_t>(ps.m) < (lo) || static_cast<int64_t>(ps.m) > (hi))                                  \
    return Status::Error(Err::INVALID, who + api " must be " + std::to_string(lo) + ".." + std::to_string(hi) + \
                                           ", got " + std::to_string(static_cast<int64_t>(ps.m)));              \
  c->m = static_cast<type>(ps.m);
#include "dpu/tunnel_params.def"
#undef DPU_TUNNEL_PARAM
  if (c->ipv6 && c->mtu < kTunnelMtuMinIpv6)
    return Status::Error(Err::INVALID, who + "an IPv6 underlay's mtu must be " + std::to_string(kTunnelMtuMinIpv6) +
                                           "..10000, got " + std::to_string(c->mtu));
  if (c->sport_min > c->sport_max) return Status::Error(Err::INVALID, who + "source port range is empty");
  return Status::Ok();
}

Status Dataplane::validate_ports(const Txn& txn, const Config& cur, TxnPorts* tp, std::vector<PortInfo>* add) {
  const PortTable& ports = *cur.ports;
  for (const std::string& name : txn.del_ports) {
    uint32_t p = ports.port_number(name);
    if (!p) return Status::Error(Err::UNKNOWN_PORT, "cannot delete unknown port '" + name + "'");
    tp->deleted_.insert(p);
  }
  for (const PortSpec& ps : txn.add_ports) {
    if (TxnPorts::reserved_name(ps.name))
      return Status::Error(Err::INVALID, "bad port name '" + ps.name +
                                             "': reserved (in_port, all, flood, drop, local, normal, controller, table, "
                                             "any, none, in any case)");
    if (!TxnPorts::valid_name(ps.name))
      return Status::Error(Err::INVALID, "bad port name '" + ps.name +
                                             "': use letters, digits, '_', '-', '.', not starting with a digit");
    if (ps.ofport < 0 || ps.ofport > kMaxOfport)
      return Status::Error(Err::INVALID, "port '" + ps.name + "': ofport must be 0 (the next free) or 1.." +
                                             std::to_string(kMaxOfport) + ", got " + std::to_string(ps.ofport));
    if (tp->port_number(ps.name) && !txn.create_ports)
      return Status::Error(Err::CONFLICT, "port '" + ps.name + "' already exists");
    if (tp->added_.count(ps.name) || (ports.port_number(ps.name) && !tp->deleted_.count(ports.port_number(ps.name))))
      return Status::Error(Err::CONFLICT, "port '" + ps.name + "' already exists");
    PortInfo pi;
    pi.name = ps.name;
    pi.tunnel = ps.tunnel;
    if (ps.ofport) {
      const uint32_t n = static_cast<uint32_t>(ps.ofport);
      if ((ports.get(n) && !tp->deleted_.count(n)) || tp->names_.count(n))
        return Status::Error(Err::CONFLICT, "port number " + std::to_string(n) + " is taken");
      pi.ofport = n;
    } else {
      pi.ofport = tp->alloc();
    }
    if (ps.tunnel) {
      Status st = tunnel_cfg(ps, &pi.tnl);
      if (!st.ok()) return st;
      uint32_t u = tp->port_number(ps.underlay);
      if (!u) return Status::Error(Err::UNKNOWN_PORT, "tunnel port '" + ps.name + "': unknown underlay port '" + ps.underlay + "'");
      const PortInfo* up = ports.get(u);
      bool up_tunnel = up ? up->tunnel : false;
      for (const PortInfo& a : *add)
        if (a.ofport == u) up_tunnel = a.tunnel;
      if (up_tunnel) return Status::Error(Err::INVALID, "tunnel port '" + ps.name + "': underlay cannot be a tunnel port");
      pi.tnl.underlay = u;
    }
    tp->add(ps.name, pi.ofport);
    add->push_back(pi);
  }
  // A tunnel that stays must keep its underlay.
  for (const PortInfo* p : ports.all())
    if (p->tunnel && !tp->deleted_.count(p->ofport) && tp->deleted_.count(p->tnl.underlay))
      return Status::Error(Err::CONFLICT, "cannot delete port '" + ports.port_name(p->tnl.underlay) +
                                              "': tunnel port '" + p->name + "' sends through it (delete both)");
  return Status::Ok();
}

static bool rule_outputs_to(const Rule& r, uint32_t port) {
  for (const OfAction& a : r.actions)
    if (a.type == OfAct::OUTPUT && a.port == port) return true;
  return false;
}

static bool rule_uses_group(const Rule& r, uint32_t g) {
  for (const OfAction& a : r.actions)
    if (a.type == OfAct::GROUP && (g == kGroupNone || a.arg == g)) return true;
  return false;
}

// The rules of tables [lo, hi] visible at `version` that the spec selects
// (ovs-ofctl's strict or non-strict matching, cookie, out_port, out_group).
void Dataplane::collect(const FlowSpec& spec, bool strict, uint64_t version, std::vector<RulePtr>* out) const {
  const int lo = spec.has_table ? spec.table : 0, hi = spec.has_table ? spec.table : kNumTables - 1;
  auto ok = [&](const Rule& r) {
    if ((r.cookie & spec.cookie_mask) != (spec.cookie & spec.cookie_mask)) return false;
    if (spec.out_port != kPortNone && !rule_outputs_to(r, spec.out_port)) return false;
    if (spec.out_group != kGroupNone && !rule_uses_group(r, spec.out_group)) return false;
    return true;
  };
  for (int t = lo; t <= hi; t++) {
    if (strict) {
      RulePtr r = tables_[t].find_exact(spec.match, spec.priority, version);
      if (r && ok(*r)) out->push_back(r);
    } else {
      tables_[t].for_each(version, [&](const RulePtr& r) {
        if (match_covers(spec.match, r->match) && ok(*r)) out->push_back(r);
      });
    }
  }
}

// ---- transactions: validate, then commit --------------------------------------------------

// Which groups the buckets of each group name, to refuse chains that loop
// back (as OpenFlow's OFPGMFC_LOOP), and which group ids exist, as a
// transaction sees them while it is validated op by op.
class Dataplane::GroupGraph {
 public:
  explicit GroupGraph(const std::unordered_map<uint32_t, GroupPtr>& groups) {
    for (const auto& kv : groups) {
      ids_.insert(kv.first);
      refs_[kv.first] = refs_of(*kv.second);
    }
  }
  bool exists(uint32_t id) const { return ids_.count(id) != 0; }
  void set(const Group& g) {
    ids_.insert(g.group_id);
    refs_[g.group_id] = refs_of(g);
  }
  void erase(uint32_t id) {
    ids_.erase(id);
    refs_.erase(id);
  }
  void clear() {
    ids_.clear();
    refs_.clear();
  }
  // Every group action in `acts` names an existing group.
  Status check_refs(const std::vector<OfAction>& acts, int line) const {
    for (const OfAction& a : acts) {
      if (a.type == OfAct::GROUP && !exists(a.arg)) {
        Status s = Status::At(Err::UNKNOWN_GROUP, "group " + std::to_string(a.arg) + " does not exist",
                              "group:" + std::to_string(a.arg), a.pos);
        s.line = line;
        return s;
      }
    }
    return Status::Ok();
  }
  // "1 -> 2 -> 1" when `start` reaches itself through its buckets, else "".
  std::string loop_from(uint32_t start) const {
    std::vector<uint32_t> path{start};
    std::unordered_set<uint32_t> on_path{start};
    std::function<bool(uint32_t)> dfs = [&](uint32_t g) -> bool {
      auto it = refs_.find(g);
      if (it == refs_.end()) return false;
      for (uint32_t n : it->second) {
        path.push_back(n);
        if (n == start) return true;
        if (on_path.insert(n).second && dfs(n)) return true;
        path.pop_back();
      }
      return false;
    };
    if (!dfs(start)) return "";
    std::string s;
    for (uint32_t g : path) s += (s.empty() ? "" : " -> ") + std::to_string(g);
    return s;
  }

 private:
  static std::vector<uint32_t> refs_of(const Group& g) {
    std::vector<uint32_t> r;
    for (const Bucket& b : g.buckets)
      for (const OfAction& a : b.actions)
        if (a.type == OfAct::GROUP) r.push_back(a.arg);
    return r;
  }
  std::unordered_set<uint32_t> ids_;
  std::unordered_map<uint32_t, std::vector<uint32_t>> refs_;
};

Status Dataplane::validate_flow_op(const TxnOp& op, const TxnPorts& tp, const GroupGraph& gg, int line,
                                   ParsedOp* p) const {
  FlowCmd cmd = op.kind == TxnOp::ADD_FLOW                                              ? FlowCmd::ADD
                : (op.kind == TxnOp::MOD_FLOWS || op.kind == TxnOp::MOD_FLOWS_STRICT) ? FlowCmd::MODIFY
                                                                                       : FlowCmd::DELETE;
  Status st = parse_flow(op.text, cmd, &tp, &p->flow);
  if (st.ok() && p->flow.has_actions) st = gg.check_refs(p->flow.actions, line);
  return st;
}

Status Dataplane::validate_group_op(const TxnOp& op, const TxnPorts& tp, GroupGraph* gg, int line,
                                    ParsedOp* p) const {
  if (op.kind == TxnOp::DEL_GROUPS) {
    if (op.text.empty() || op.text == "group_id=all" || op.text == "all") {
      p->all_groups = true;
      gg->clear();
      return Status::Ok();
    }
    p->group = std::make_shared<Group>();
    Status st = parse_group(op.text, false, &tp, p->group.get());
    if (st.ok()) gg->erase(p->group->group_id);
    return st;
  }
  p->group = std::make_shared<Group>();
  Status st = parse_group(op.text, true, &tp, p->group.get());
  if (!st.ok()) return st;
  const uint32_t id = p->group->group_id;
  if (op.kind == TxnOp::ADD_GROUP && gg->exists(id))
    return Status::Error(Err::CONFLICT, "group " + std::to_string(id) + " already exists");
  if (op.kind == TxnOp::MOD_GROUP && !gg->exists(id))
    return Status::Error(Err::UNKNOWN_GROUP, "group " + std::to_string(id) + " does not exist");
  gg->set(*p->group);  // a bucket may name its own group: checked as a loop below
  for (const Bucket& b : p->group->buckets) {
    st = gg->check_refs(b.actions, line);
    if (!st.ok()) return st;
  }
  std::string loop = gg->loop_from(id);
  if (!loop.empty())
    return Status::Error(Err::CONFLICT, "group " + std::to_string(id) + " would loop through its buckets: " + loop);
  return Status::Ok();
}

// Parses every flow and group op as the transaction will see the ports and
// groups; the first error names its op's line (when there are several).
Status Dataplane::validate_ops(const Txn& txn, const Config& cur, const TxnPorts& tp,
                               std::vector<ParsedOp>* parsed) const {
  parsed->resize(txn.ops.size());
  GroupGraph gg(*cur.groups);
  for (size_t i = 0; i < txn.ops.size(); i++) {
    const TxnOp& op = txn.ops[i];
    const int line = static_cast<int>(i) + 1;
    bool group_op = op.kind == TxnOp::ADD_GROUP || op.kind == TxnOp::MOD_GROUP || op.kind == TxnOp::DEL_GROUPS;
    Status st = group_op ? validate_group_op(op, tp, &gg, line, &(*parsed)[i])
                         : validate_flow_op(op, tp, gg, line, &(*parsed)[i]);
    if (!st.ok()) {
      st.line = txn.ops.size() > 1 ? line : -1;
      return st;
    }
  }
  return Status::Ok();
}

Status Dataplane::validate_tenants(const Txn& txn) const {
  if (!txn.set_tenants) return Status::Ok();
  std::unordered_set<uint64_t> seen;
  std::unordered_set<std::string> names;
  size_t slots = tenant_slots_.size();
  for (const TenantSpec& t : txn.tenants) {
    if (!seen.insert(t.metadata).second)
      return Status::Error(Err::CONFLICT, "two tenants share metadata " + std::to_string(t.metadata));
    if (!names.insert(t.name).second) return Status::Error(Err::CONFLICT, "two tenants are named " + t.name);
    bool known = false;
    for (const TenantSlot& ts : tenant_slots_) known |= ts.name == t.name;
    slots += known ? 0 : 1;
  }
  if (slots >= 0xffff)
    return Status::Error(Err::INVALID, "too many tenants (at most 65534 names over the dataplane's life)");
  return Status::Ok();
}

// ---- conntrack: zones, NAT port forwards, timeouts, the connection limit ---------------

static const char* const kCtTimeoutNames[TM_COUNT] = {
#define DPU_CT_TIMEOUT(e, name, seconds, help) #name,
#include "dpu/ct_timeouts.def"
#undef DPU_CT_TIMEOUT
};

static std::string ct_timeout_names() {
  std::string s;
  for (const char* n : kCtTimeoutNames) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

// "NAT mapping 2 (zone 5, tcp 198.51.100.1:8080 -> 10.0.0.1:80)": as given.
static std::string nat_item(size_t i, const NatStaticSpec& m) {
  const std::string proto = m.proto == kIpTcp ? "tcp" : m.proto == kIpUdp ? "udp" : "protocol " + std::to_string(m.proto);
  return "NAT mapping " + std::to_string(i + 1) + " (zone " + std::to_string(m.zone) + ", " + proto + " " +
         m.public_ip + ":" + std::to_string(m.public_port) + " -> " + m.internal_ip + ":" +
         std::to_string(m.internal_port) + ")";
}

// A unicast IPv4 address (network order): not 0.0.0.0, multicast or broadcast.
static bool unicast_v4(const std::string& s, uint32_t* out) {
  if (inet_pton(AF_INET, s.c_str(), out) != 1) return false;
  const uint32_t h = ntohl(*out);
  return h != 0 && (h >> 28) != 0xe && h != 0xffffffffu;
}

Status Dataplane::validate_ct(const Txn& txn, CtParsed* out) const {
  if (txn.set_ct_zones) {
    std::unordered_set<int64_t> seen;
    for (const CtZoneSpec& z : txn.ct_zones) {
      if (z.zone < 0 || z.zone > 65535)
        return Status::Error(Err::INVALID, "conntrack zone " + std::to_string(z.zone) + " is out of range (0..65535)");
      if (!seen.insert(z.zone).second)
        return Status::Error(Err::CONFLICT, "conntrack zone " + std::to_string(z.zone) + " is given twice");
      if (z.limit < 0 || z.limit > kCtMaxConnsMax)
        return Status::Error(Err::INVALID, "conntrack zone " + std::to_string(z.zone) +
                                               ": the connection limit must be 0 (none) or 1.." +
                                               std::to_string(kCtMaxConnsMax) + ", got " + std::to_string(z.limit));
      out->zones.push_back({static_cast<uint16_t>(z.zone), CtZoneCfg{static_cast<uint32_t>(z.limit), z.eif}});
    }
  }
  if (txn.set_nat_static) {
    // The NAT table finds a mapping by its public endpoint whatever the zone,
    // and by its internal endpoint and public address within a zone: each
    // must name one mapping.
    std::unordered_map<std::string, size_t> by_public, by_internal;
    for (size_t i = 0; i < txn.nat_static.size(); i++) {
      const NatStaticSpec& m = txn.nat_static[i];
      auto bad = [&](Err code, const std::string& what) { return Status::Error(code, nat_item(i, m) + ": " + what); };
      if (m.zone < 0 || m.zone > 65535) return bad(Err::INVALID, "zone out of range (0..65535)");
      if (m.proto != kIpTcp && m.proto != kIpUdp) return bad(Err::INVALID, "the protocol must be tcp (6) or udp (17)");
      StaticMapping sm;
      if (!unicast_v4(m.internal_ip, &sm.int_addr))
        return bad(Err::INVALID, "the internal address must be a unicast IPv4 address, not '" + m.internal_ip + "'");
      if (!unicast_v4(m.public_ip, &sm.ext_addr))
        return bad(Err::INVALID, "the public address must be a unicast IPv4 address, not '" + m.public_ip + "'");
      if (m.internal_port < 1 || m.internal_port > 65535) return bad(Err::INVALID, "the internal port must be 1..65535");
      if (m.public_port < 1 || m.public_port > 65535) return bad(Err::INVALID, "the public port must be 1..65535");
      sm.zone = static_cast<uint16_t>(m.zone);
      sm.proto = static_cast<uint8_t>(m.proto);
      sm.int_port = be16(static_cast<uint16_t>(m.internal_port));
      sm.ext_port = be16(static_cast<uint16_t>(m.public_port));
      const std::string pub = std::to_string(m.proto) + " " + m.public_ip + ":" + std::to_string(m.public_port);
      auto p = by_public.emplace(pub, i);
      if (!p.second)
        return bad(Err::CONFLICT, "its public endpoint is already " + nat_item(p.first->second, txn.nat_static[p.first->second]) + "'s");
      const std::string in = std::to_string(m.zone) + " " + std::to_string(m.proto) + " " + m.internal_ip + ":" +
                             std::to_string(m.internal_port) + " " + m.public_ip;
      auto q = by_internal.emplace(in, i);
      if (!q.second)
        return bad(Err::CONFLICT, "its internal endpoint already goes out through " + m.public_ip + " in " +
                                      nat_item(q.first->second, txn.nat_static[q.first->second]));
      out->nat.push_back(sm);
    }
  }
  out->config = ct_.config();
  for (const CtTimeoutSpec& t : txn.ct_timeouts) {
    int i = 0;
    while (i < TM_COUNT && t.name != kCtTimeoutNames[i]) i++;
    if (i == TM_COUNT)
      return Status::Error(Err::INVALID, "unknown conntrack timeout '" + t.name + "' (" + ct_timeout_names() + ")");
    const double ns = t.seconds * 1e9;  // whole nanoseconds, rounded
    if (!(ns >= 0 && ns <= kCtTimeoutMaxNs) || std::llround(ns) < kCtTimeoutMinNs) {
      char got[64];
      std::snprintf(got, sizeof got, "%g", t.seconds);
      return Status::Error(Err::INVALID, "ct timeout '" + t.name + "' must be a number of seconds, above 0 and at most " +
                                             std::to_string(kCtTimeoutMaxNs / 1000000000) + " (" +
                                             std::to_string(kCtTimeoutMaxNs / 86400000000000) + " days), got " + got);
    }
    out->config.timeout_ns[i] = std::llround(ns);
    out->set_config = true;
  }
  if (txn.ct_max_connections) {
    const int64_t m = *txn.ct_max_connections;
    if (m < kCtMaxConnsMin || m > kCtMaxConnsMax)
      return Status::Error(Err::INVALID, "max_connections must be " + std::to_string(kCtMaxConnsMin) + ".." +
                                             std::to_string(kCtMaxConnsMax) + ", got " + std::to_string(m));
    out->config.max_conns = static_cast<uint32_t>(m);
    out->set_config = true;
  }
  return Status::Ok();
}

// ---- commit: the next version ----------------------------------------------------------
//
// The next version in the making. Its Config starts as a copy of the current
// one's pointers; a part is copied when the transaction first changes it.
// Its rules go into the tables now, with add_version = the new version
// (invisible to every reader until publish()); a rule it deletes gets that
// version as its remove_version and leaves the table once no reader can be
// at an older version (rcu.h). What it changed goes to the workers as a
// ChangeSet: net changes only, so a rule deleted and added again unchanged
// (a topology reload) changes nothing and costs no cache its megaflows.
class Dataplane::Commit {
 public:
  Commit(Dataplane& dp, const Config& cur) : next(std::make_unique<Config>(cur)), dp_(dp) {
    next->version = cur.version + 1;
    next->changes = nullptr;
  }
  uint64_t version() const { return next->version; }

  PortTable& ports() {
    if (!ports_) {
      ports_ = std::make_shared<PortTable>(*next->ports);
      next->ports = ports_;
    }
    return *ports_;
  }
  GroupMap& groups() {
    if (!groups_) {
      groups_ = std::make_shared<GroupMap>(*next->groups);
      next->groups = groups_;
    }
    return *groups_;
  }

  void add_rule(const RulePtr& r) {
    r->add_version = version();
    dp_.tables_[r->table].insert(r, dp_.rcu_);
    dp_.table_rules_[r->table]++;
    touched_[r->table] = true;
    added_.push_back(r);
  }
  // `replacing`: deleted by a REPLACE_FLOWS, so that an ADD_FLOW later in
  // the transaction may keep it (revive()).
  void remove_rule(const RulePtr& r, bool replacing = false) {
    dp_.table_rules_[r->table]--;
    touched_[r->table] = true;
    if (r->add_version == version()) {  // added by this transaction: never seen by anyone
      dp_.tables_[r->table].remove(r.get(), dp_.rcu_);
      added_.erase(std::find(added_.begin(), added_.end(), r));
      return;
    }
    r->remove_version.store(version(), std::memory_order_relaxed);
    removed_.push_back(r);
    if (replacing) replaced_.push_back(r);
  }
  // A rule a REPLACE_FLOWS of this transaction deleted that `f` adds again
  // unchanged (same table, match, priority, cookie and actions): it stays.
  RulePtr revive(const FlowSpec& f, const std::string& actions_text) {
    for (auto it = replaced_.begin(); it != replaced_.end(); ++it) {
      const RulePtr& r = *it;
      if (r->table != f.table || r->priority != f.priority || r->cookie != f.cookie || !match_equal(r->match, f.match) ||
          r->remove_version.load(std::memory_order_relaxed) != version())
        continue;
      if (format_actions(r->actions, nullptr) != actions_text) continue;
      RulePtr keep = r;
      keep->remove_version.store(kVersionNever, std::memory_order_relaxed);
      dp_.table_rules_[keep->table]++;
      removed_.erase(std::find(removed_.begin(), removed_.end(), keep));
      replaced_.erase(it);
      return keep;
    }
    return nullptr;
  }

  // Publishes the version (Dataplane::publish) and schedules the deleted
  // rules' removal from their tables.
  void publish() {
    for (int t = 0; t < kNumTables; t++)
      if (touched_[t]) dp_.tables_[t].publish(dp_.rcu_);
    for (const RulePtr& r : removed_) changes.rules.push_back(RuleChange{r, false});
    for (const RulePtr& r : added_) changes.rules.push_back(RuleChange{r, true});
    const uint64_t v = version();
    std::vector<RulePtr> gone = std::move(removed_);
    dp_.publish(std::move(next), std::move(changes));
    if (gone.empty()) return;
    Dataplane* dp = &dp_;
    dp_.rcu_.defer([dp, gone, v] {
      for (const RulePtr& r : gone) {
        if (r->remove_version.load(std::memory_order_relaxed) != v) continue;
        dp->tables_[r->table].remove(r.get(), dp->rcu_);
        dp->tables_[r->table].publish(dp->rcu_);
      }
    });
  }

  ChangeSet changes;
  std::unique_ptr<Config> next;

 private:
  Dataplane& dp_;
  std::shared_ptr<PortTable> ports_;
  std::shared_ptr<GroupMap> groups_;
  std::vector<RulePtr> added_, removed_, replaced_;
  bool touched_[kNumTables] = {};
};

// Keeps the changes of the last kMaxChain versions (and at most kMaxWeight
// rule changes): a worker further behind flushes its caches instead.
static constexpr uint32_t kMaxChain = 4096;
static constexpr size_t kMaxWeight = 65536;

void Dataplane::publish(std::unique_ptr<Config> next, ChangeSet&& changes) {
  const Config* cur = config_.load(std::memory_order_relaxed);
  auto node = std::make_shared<ChangeNode>();
  node->version = next->version;
  node->set = std::move(changes);
  node->weight = node->set.rules.size();
  if (cur->changes && cur->changes->depth + 1 < kMaxChain &&
      cur->changes->weight + node->weight <= kMaxWeight) {
    node->prev = cur->changes;
    node->depth = cur->changes->depth + 1;
    node->weight += cur->changes->weight;
  }
  next->changes = std::move(node);
  config_.store(next.release(), std::memory_order_release);
  rcu_.retire(cur);
  rcu_.reclaim();
}

void Dataplane::commit_ports(const Txn& txn, const TxnPorts& tp, const std::vector<PortInfo>& new_ports, Commit& c,
                             TxnResult* res) {
  if (txn.del_ports.empty() && new_ports.empty() && tp.created_.empty()) return;
  PortTable& ports = c.ports();
  for (const std::string& n : txn.del_ports) ports.remove(ports.port_number(n));
  for (const PortInfo& pi : new_ports) ports.add(pi);
  for (const std::string& n : tp.created_) {
    PortInfo pi;
    pi.ofport = tp.added_.at(n);
    pi.name = n;
    ports.add(pi);
  }
  // The VTEPs the datapath terminates, in port order (the order
  // find_tunnel_term tries them).
  auto terms = std::make_shared<std::vector<TunnelTerm>>();
  for (const PortInfo* p : ports.all()) {
    if (!p->tunnel) continue;
    TunnelTerm t;
    t.underlay = p->tnl.underlay;
    t.port = p->ofport;
    t.cfg = p->tnl;
    t.pop.ipv6 = p->tnl.ipv6;
    t.pop.strict = p->tnl.strict;
    terms->push_back(t);
  }
  c.next->terms = std::move(terms);
  c.changes.flush = true;  // output to flood/all and to numbers, tunnel terminations: every megaflow may differ
  res->ports_added = tp.created_;
  for (const PortInfo& pi : new_ports) res->ports_added.push_back(pi.name);
}

static std::shared_ptr<Rule> make_rule(const FlowSpec& f, int64_t now) {
  auto r = std::make_shared<Rule>();
  r->table = f.table;
  r->priority = f.priority;
  r->cookie = f.cookie;
  r->match = f.match;
  r->actions = f.actions;
  r->created_ns = now;
  return r;
}

// A flow_mod that modifies a rule replaces it with a copy that keeps its
// place (seq), creation time and counters.
void Dataplane::replace_rule(Commit& c, const RulePtr& old, std::vector<OfAction> acts, const uint64_t* cookie) {
  const uint64_t new_cookie = cookie ? *cookie : old->cookie;
  if (new_cookie == old->cookie && format_actions(acts, nullptr) == format_actions(old->actions, nullptr)) return;
  auto r = std::make_shared<Rule>();
  r->table = old->table;
  r->priority = old->priority;
  r->cookie = new_cookie;
  r->match = old->match;
  r->actions = std::move(acts);
  r->seq = old->seq;
  r->created_ns = old->created_ns;
  r->counts = old->counts;
  c.remove_rule(old);
  c.add_rule(r);
}

void Dataplane::commit_add_flow(Commit& c, FlowSpec& f, int64_t now, TxnResult* res) {
  res->flows_added++;
  const std::string text = format_actions(f.actions, nullptr);
  RulePtr old = tables_[f.table].find_exact(f.match, f.priority, c.version());
  if (old && old->cookie == f.cookie && format_actions(old->actions, nullptr) == text) {
    old->created_ns = now;  // the same flow again: only its age starts over
    return;
  }
  if (!old && c.revive(f, text)) return;  // replaced by this transaction with itself: kept as it was
  RulePtr r = make_rule(f, now);
  if (old) {  // same match and priority: replaces it, keeping its place and counters
    r->seq = old->seq;
    r->counts = old->counts;
    c.remove_rule(old);
  } else {
    r->seq = next_seq_++;
  }
  c.add_rule(r);
}

void Dataplane::commit_del_groups(Commit& c, const ParsedOp& p, TxnResult* res) {
  GroupMap& groups = c.groups();
  std::vector<uint32_t> ids;
  if (p.all_groups) {
    for (auto& kv : groups) ids.push_back(kv.first);
  } else if (groups.count(p.group->group_id)) {
    ids.push_back(p.group->group_id);
  }
  for (uint32_t id : ids) {
    groups.erase(id);
    c.changes.groups.push_back(id);
    std::vector<RulePtr> users;  // OpenFlow: deleting a group deletes the flows using it
    for (int t = 0; t < kNumTables; t++)
      tables_[t].for_each(c.version(), [&](const RulePtr& r) {
        if (rule_uses_group(*r, id)) users.push_back(r);
      });
    for (const RulePtr& r : users) c.remove_rule(r);
    res->flows_deleted += users.size();
  }
  res->groups_deleted += ids.size();
}

void Dataplane::commit_ops(const Txn& txn, std::vector<ParsedOp>& parsed, Commit& c, TxnResult* res) {
  const int64_t now = now_ns();
  for (size_t i = 0; i < txn.ops.size(); i++) {
    ParsedOp& p = parsed[i];
    switch (txn.ops[i].kind) {
      case TxnOp::ADD_FLOW:
        commit_add_flow(c, p.flow, now, res);
        break;
      case TxnOp::MOD_FLOWS:
      case TxnOp::MOD_FLOWS_STRICT: {
        std::vector<RulePtr> hit;
        collect(p.flow, txn.ops[i].kind == TxnOp::MOD_FLOWS_STRICT, c.version(), &hit);
        for (const RulePtr& r : hit)
          replace_rule(c, r, p.flow.actions, p.flow.set_cookie ? &p.flow.new_cookie : nullptr);
        res->flows_modified += hit.size();
        break;
      }
      case TxnOp::DEL_FLOWS:
      case TxnOp::DEL_FLOWS_STRICT:
      case TxnOp::REPLACE_FLOWS: {
        std::vector<RulePtr> hit;
        collect(p.flow, txn.ops[i].kind == TxnOp::DEL_FLOWS_STRICT, c.version(), &hit);
        for (const RulePtr& r : hit) c.remove_rule(r, txn.ops[i].kind == TxnOp::REPLACE_FLOWS);
        res->flows_deleted += hit.size();
        break;
      }
      case TxnOp::ADD_GROUP:
        c.groups()[p.group->group_id] = p.group;
        res->groups_added++;
        break;
      case TxnOp::MOD_GROUP: {
        GroupPtr& g = c.groups()[p.group->group_id];
        p.group->counts = g->counts;
        g = p.group;
        c.changes.groups.push_back(p.group->group_id);
        res->groups_modified++;
        break;
      }
      case TxnOp::DEL_GROUPS:
        commit_del_groups(c, p, res);
        break;
    }
  }
}

// A tenant name keeps its counter slot across reloads.
void Dataplane::commit_tenants(Commit& c, const std::vector<TenantSpec>& tenants) {
  auto map = std::make_shared<TenantMap>();
  for (TenantSlot& ts : tenant_slots_) ts.active = false;
  for (const TenantSpec& t : tenants) {
    size_t slot = 0;
    while (slot < tenant_slots_.size() && tenant_slots_[slot].name != t.name) slot++;
    if (slot == tenant_slots_.size()) tenant_slots_.push_back(TenantSlot{t.name, 0, false});
    tenant_slots_[slot].metadata = t.metadata;
    tenant_slots_[slot].active = true;
    (*map)[t.metadata] = static_cast<uint16_t>(slot + 1);
  }
  c.next->n_tenant_slots = tenant_slots_.size();
  if (*map == *c.next->tenants) return;  // a reload with the same tenants changes nothing
  c.next->tenants = std::move(map);
  c.changes.flush = true;  // a megaflow's tenant (its counters) may differ
}

Status Dataplane::apply(const Txn& txn, TxnResult* res) {
  std::lock_guard<std::mutex> guard(mu_);
  *res = TxnResult();
  const Config& cur = *config_.load(std::memory_order_relaxed);
  // Validate: nothing here changes any state.
  TxnPorts tp(*cur.ports);
  std::vector<PortInfo> new_ports;
  Status st = validate_ports(txn, cur, &tp, &new_ports);
  if (!st.ok()) return st;
  tp.create_ = txn.create_ports;
  std::vector<ParsedOp> parsed;
  st = validate_ops(txn, cur, tp, &parsed);
  if (!st.ok()) return st;
  st = validate_tenants(txn);
  if (!st.ok()) return st;
  CtParsed ct;
  st = validate_ct(txn, &ct);
  if (!st.ok()) return st;

  // Commit: the next version, built beside the current one and published
  // at once. No worker is waited for.
  Commit c(*this, cur);
  commit_ports(txn, tp, new_ports, c, res);
  commit_ops(txn, parsed, c, res);
  if (txn.set_tenants) commit_tenants(c, txn.tenants);
  if (txn.set_ct_zones) {
    ct_.set_zones(ct.zones);
    ct_settings_.zones = txn.ct_zones;
  }
  if (txn.set_nat_static) {
    ct_.nat().set_static(ct.nat);
    ct_settings_.nat_static = txn.nat_static;
  }
  if (ct.set_config) ct_.set_config(ct.config);
  res->version = c.version();
  c.publish();
  return Status::Ok();
}

void Dataplane::set_frag_nx_match(bool on) {
  std::lock_guard<std::mutex> guard(mu_);
  const Config& cur = *config_.load(std::memory_order_relaxed);
  if (cur.frag_nx_match == on) return;
  Commit c(*this, cur);
  c.next->frag_nx_match = on;
  c.changes.flush = true;  // every lookup of a fragment may differ
  c.publish();
}

void Dataplane::sync_stats() {
  for (auto& w : workers_) w->push_stats();
}

Status Dataplane::dump_flows(const std::string& selector, bool strict, std::vector<FlowDump>* out) {
  FlowSpec spec;
  {
    std::lock_guard<std::mutex> g(mu_);
    Status st = parse_flow(selector, FlowCmd::MATCH_ONLY, config_.load(std::memory_order_relaxed)->ports.get(), &spec);
    if (!st.ok()) return st;
  }
  sync_stats();
  std::lock_guard<std::mutex> g(mu_);
  const Config& cur = *config_.load(std::memory_order_relaxed);
  std::vector<RulePtr> rules;
  collect(spec, strict, cur.version, &rules);
  std::sort(rules.begin(), rules.end(), [](const RulePtr& a, const RulePtr& b) {
    if (a->table != b->table) return a->table < b->table;
    if (a->priority != b->priority) return a->priority > b->priority;
    return a->seq < b->seq;
  });
  const int64_t now = now_ns();
  for (const RulePtr& r : rules) {
    FlowDump d;
    d.table = r->table;
    d.priority = r->priority;
    d.cookie = r->cookie;
    d.n_packets = r->counts->n_packets.load();
    d.n_bytes = r->counts->n_bytes.load();
    d.duration = static_cast<double>(now - r->created_ns) / 1e9;
    d.match = format_match(r->match, r->priority, true, cur.ports.get());
    d.actions = format_actions(r->actions, cur.ports.get());
    out->push_back(std::move(d));
  }
  return Status::Ok();
}

std::vector<GroupDump> Dataplane::dump_groups() {
  sync_stats();
  std::lock_guard<std::mutex> g(mu_);
  const Config& cur = *config_.load(std::memory_order_relaxed);
  std::vector<GroupDump> out;
  for (const auto& kv : *cur.groups)
    out.push_back({kv.first, format_group(*kv.second, cur.ports.get()), kv.second->counts->n_packets.load(),
                   kv.second->counts->n_bytes.load()});
  std::sort(out.begin(), out.end(), [](const GroupDump& a, const GroupDump& b) { return a.group_id < b.group_id; });
  return out;
}

void Dataplane::table_counters(std::vector<std::array<uint64_t, 3>>* out, bool sync) {
  if (sync) sync_stats();
  std::lock_guard<std::mutex> g(mu_);
  out->clear();
  for (int t = 0; t < kNumTables; t++)
    out->push_back({table_stats_[t].lookups.load(), table_stats_[t].matches.load(), table_rules_[t]});
}

Totals Dataplane::totals() {
  Totals tot;
  std::vector<PortInfo> ps = ports();
  size_t n_tenants;
  {
    std::lock_guard<std::mutex> g(mu_);
    n_tenants = tenant_slots_.size();
  }
  tot.tenants.resize(n_tenants + 1);
  for (const PortInfo& p : ps) tot.ports.push_back({p.ofport, PortCounters()});
  for (auto& w : workers_) {  // no lock: a scrape never waits for a batch; each counter read relaxed
    for (auto& pc : tot.ports)
      if (pc.first < w->ports().size()) pc.second.add(w->ports()[pc.first]);
    for (size_t t = 0; t < tot.tenants.size() && t < w->tenants().size(); t++) tot.tenants[t].add(w->tenants()[t]);
    const WorkerCounters mine = w->counters();
    tot.workers_total.add(mine);
    tot.workers.push_back(mine);
    tot.worker_megaflows.push_back(w->megaflow_count());
    tot.megaflows += w->megaflow_count();
  }
  return tot;
}

std::vector<PortInfo> Dataplane::ports() {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<PortInfo> v;
  for (const PortInfo* p : config_.load(std::memory_order_relaxed)->ports->all()) v.push_back(*p);
  return v;
}

std::vector<Dataplane::TenantInfo> Dataplane::tenants() {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<TenantInfo> v;
  for (size_t i = 0; i < tenant_slots_.size(); i++)
    if (tenant_slots_[i].active)
      v.push_back({tenant_slots_[i].name, tenant_slots_[i].metadata, static_cast<uint16_t>(i + 1)});
  return v;
}

Dataplane::CtSettings Dataplane::ct_settings() const {
  std::lock_guard<std::mutex> g(mu_);
  return ct_settings_;
}

uint32_t Dataplane::port_number(const std::string& name) {
  std::lock_guard<std::mutex> g(mu_);
  return config_.load(std::memory_order_relaxed)->ports->port_number(name);
}

std::string Dataplane::port_name(uint32_t p) {
  std::lock_guard<std::mutex> g(mu_);
  return config_.load(std::memory_order_relaxed)->ports->port_name(p);
}

void Dataplane::upcall(const Config& c, const Flow& key, XlateOut* out, std::vector<TraceEvent>* trace) {
  XlateEnv env;
  env.tables = tables_;
  env.version = c.version;
  env.groups = c.groups.get();
  env.ports = c.ports.get();
  env.terms = c.terms.get();
  env.tenants = c.tenants.get();
  env.recirc = &recirc_;
  env.frag_nx_match = c.frag_nx_match;
  xlate(env, key, out, trace);
}

void Dataplane::credit(const std::vector<XcacheEntry>& xc, uint64_t packets, uint64_t bytes) {
  for (const XcacheEntry& e : xc) {
    switch (e.kind) {
      case XcacheEntry::RULE:
        e.rule->counts->add(packets, bytes);
        break;
      case XcacheEntry::TABLE:
        table_stats_[e.table].lookups.fetch_add(packets, std::memory_order_relaxed);
        if (e.matched) table_stats_[e.table].matches.fetch_add(packets, std::memory_order_relaxed);
        break;
      case XcacheEntry::GROUP:
        e.group->counts->add(packets, bytes);
        break;
    }
  }
}

}  // namespace dpu
