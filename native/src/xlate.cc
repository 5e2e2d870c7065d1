// xlate.cc: the slow path's walk: tables, groups, tunnels, output, and the
// emission of datapath actions (see xlate.h for the contract, xlate_ctx.h for
// the state; the per-action translators are in xlate_actions.cc; the emitted
// actions as text: dp_format.cc).
#include "xlate.h"

#include <cstdio>

#include "checksum.h"
#include "conntrack/conntrack.h"
#include "dpu/ofparse.h"
#include "recirc.h"
#include "tunnel_term.h"
#include "xlate_ctx.h"

namespace dpu {

constexpr int kMaxDepth = 64;
constexpr int kMaxResubmits = 4096;

Flow field_mask(const FieldDef& f, u128 bits) {
  Flow m{};
  field_set_masked(m, f, bits, bits);
  return m;
}

bool bytes_nonzero(const void* p, size_t n) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; i++)
    if (b[i]) return true;
  return false;
}

namespace {
bool arp_written(const Flow& p) { return p.nw_proto || p.nw_src || p.nw_dst || bytes_nonzero(p.arp_sha, 12); }
bool any_bits(const Flow& m, size_t from_word, size_t to_word) {
  const word_t* w = words(m);
  for (size_t i = from_word; i < to_word; i++)
    if (w[i]) return true;
  return false;
}
}  // namespace

void XlateCtx::run(const Flow& key) {
  std::memcpy(&flow_, &key, kKeyBytes);  // pipeline state (metadata, regs) starts at zero
  std::memset(reinterpret_cast<uint8_t*>(&flow_) + kKeyBytes, 0, sizeof(Flow) - kKeyBytes);
  base_ = flow_;
  std::memset(&pending_, 0, sizeof pending_);
  std::memset(&written_, 0, sizeof written_);
  out_.wc = Flow{};
  out_.wc.in_port = 0xffffffffu;
  out_.wc.recirc_id = 0xffffffffu;
  if (flow_.recirc_id) {
    resume();
  } else if (!try_tunnel_pop()) {
    do_table(0, flow_.in_port, false);
  }
  finish();
}

// A pass after conntrack: the frozen table, metadata and registers.
void XlateCtx::resume() {
  FrozenState fs;
  if (!env_.recirc || !env_.recirc->thaw(flow_.recirc_id, &fs)) {
    event(TraceEvent::NOTE, "recirc_id " + std::to_string(flow_.recirc_id) + " is unknown (tables changed): dropped");
    reason_ = DROP_RECIRC_LIMIT;
    return;
  }
  flow_.metadata = fs.metadata;
  std::memcpy(flow_.regs, fs.regs, sizeof fs.regs);
  flow_.in_port = fs.in_port;  // as the pipeline saw it at the ct action (as OVS freezes it)
  event(TraceEvent::NOTE, "resume after conntrack in table " + std::to_string(fs.table) + " (recirc_id=" +
                              std::to_string(flow_.recirc_id) + ")");
  do_table(fs.table, flow_.in_port, false);
}

// Checked before every resubmit, goto_table and group, as OVS's
// xlate_resubmit_resource_check: depth_ counts resubmits to the same or an
// earlier table and group buckets, resubmits_ the rules that resubmit and
// goto_table found; past 64 or 4096 the packet is dropped, whatever it did.
bool XlateCtx::limit_reached(const char* what) {
  if (depth_ < kMaxDepth && resubmits_ < kMaxResubmits) return false;
  event(TraceEvent::NOTE, std::string(what) + " limit reached: packet dropped");
  error_ = true;
  reason_ = DROP_RESUBMIT_LIMIT;
  exit_ = true;
  return true;
}

// ---- tunnel receive ------------------------------------------------------------
// VXLAN for one of our VTEPs is popped and looked up again from the tunnel
// port (tunnel_term.h decides, for the workers too). On an underlay port the
// megaflow matches every field the decision read, popped or not.
bool XlateCtx::try_tunnel_pop() {
  if (flow_.recirc_id != 0 || !env_.terms || !is_tunnel_underlay(*env_.terms, flow_.in_port)) return false;
  Flow m{};
  tunnel_term_wildcards(*env_.terms, &m);
  uw(m);
  const TunnelTerm* t = find_tunnel_term(*env_.terms, outer_view(flow_));
  if (!t) return false;
  auto th = std::make_unique<TnlHeader>(t->pop);
  DpAction a;
  a.type = Dp::TNL_POP;
  a.port = t->port;
  a.tnl = th.get();
  out_.tnl_hdrs.push_back(std::move(th));
  out_.actions.push_back(a);
  event(TraceEvent::NOTE, "native tunnel: packet for VTEP " + env_.ports->port_name(t->port) +
                              ", tnl_pop and look up again");
  return true;
}

void XlateCtx::uw(const Flow& m) {
  word_t* wc = words(out_.wc);
  const word_t*x = words(m), *wr = words(written_);
  for (size_t i = 0; i < kKeyWords; i++) wc[i] |= x[i] & ~wr[i];
}
void XlateCtx::uw_field(FieldId id) {
  const FieldDef& f = field_def(id);
  if (f.datapath) uw(field_mask(f, field_all_ones(f)));
}
void XlateCtx::uw_prereq(Prereq p) {
  Flow m{};
  prereq_unwildcard(p, m);
  uw(m);
}
void XlateCtx::mark_written(const FieldDef& f, u128 bits) {
  Flow m = field_mask(f, bits);
  flow_or_into(written_, m);
  if (f.datapath) flow_or_into(pending_, m);
}

void XlateCtx::event(TraceEvent::Kind k, std::string text, int table, const Rule* r) {
  if (!trace_) return;
  TraceEvent e;
  e.kind = k;
  e.depth = depth_;
  e.table = table;
  e.text = std::move(text);
  if (r) {
    e.priority = r->priority;
    e.cookie = r->cookie;
  }
  trace_->push_back(std::move(e));
}


// ---- tables --------------------------------------------------------------------
// One table lookup, as OVS's rule_dpif_lookup_from_table: with `in_port` as
// the input port, and for an IP fragment (frag mode "normal", the default;
// not "nx-match") with tp_src and tp_dst (ICMP type and code) read as 0. The megaflow then holds nw_frag
// instead of the ports; for other packets nw_frag joins it when the ports do.
const RulePtr* XlateCtx::lookup(uint8_t t, uint32_t in_port, Flow* m, bool* exact_view) {
  const bool frag = (flow_.nw_frag & kFragAny) && !env_.frag_nx_match;
  const RulePtr* r;
  flow_or_into(out_.written_before_lookup, written_);
  *exact_view = !frag && in_port == flow_.in_port;
  if (*exact_view) {
    r = env_.tables[t].lookup(flow_, env_.version, m);
  } else {
    Flow f = flow_;
    f.in_port = in_port;
    if (frag) f.tp_src = f.tp_dst = 0;
    r = env_.tables[t].lookup(f, env_.version, m);
  }
  if (frag) m->tp_src = m->tp_dst = 0;
  if (frag || m->tp_src || m->tp_dst) uw_field(FieldId::NW_FRAG);
  return r;
}

// Looks the packet up in table t and runs the rule's actions; a goto_table
// (always a rule's last action, always to a later table) continues here in
// a loop rather than by recursion, so a chain through every table costs no
// stack. `in_port` is the port the first lookup sees (a resubmit's); the
// actions see the packet's own. `counted`: the first lookup is a resubmit's
// (a rule found counts toward the limit; goto_table's always do).
void XlateCtx::do_table(uint8_t t, uint32_t in_port, bool counted) {
  uint8_t saved = table_;
  for (bool first = true;; first = false) {
    if (exit_) break;
    table_ = t;
    Flow m{};
    bool exact_view;
    const RulePtr* rp = lookup(t, first ? in_port : flow_.in_port, &m, &exact_view);
    const Rule* r = rp ? rp->get() : nullptr;
    uw(m);
    XcacheEntry te;
    te.kind = XcacheEntry::TABLE;
    te.table = t;
    te.matched = r != nullptr;
    te.exact_view = exact_view;
    te.priority = r ? r->priority : -1;
    te.found = r;
    out_.xcache.push_back(te);
    if (!r) {
      event(TraceEvent::MISS, "No match.", t);
      reason_ = DROP_TABLE_MISS;
      break;
    }
    if (counted || !first) resubmits_++;
    XcacheEntry re;
    re.kind = XcacheEntry::RULE;
    re.table = t;
    re.rule = *rp;  // keeps the rule alive for crediting even after it is deleted
    out_.xcache.push_back(re);
    if (trace_) event(TraceEvent::TABLE, format_match(r->match, r->priority, false, env_.ports), t, r);
    if (r->actions.empty()) {
      reason_ = DROP_ACTION_DROP;
      event(TraceEvent::ACTION, "drop");
    }
    const std::vector<OfAction>& acts = r->actions;
    bool go = !acts.empty() && acts.back().type == OfAct::GOTO_TABLE;
    for (size_t i = 0; i + (go ? 1 : 0) < acts.size(); i++) {
      if (exit_ || end_list_) break;
      if (trace_) event(TraceEvent::ACTION, format_action(acts[i], env_.ports));
      do_action(acts[i]);
    }
    if (end_list_) {  // dec_ttl ended this rule's actions, goto_table included
      end_list_ = false;
      break;
    }
    if (!go || exit_) break;
    if (trace_) event(TraceEvent::ACTION, format_action(acts.back(), env_.ports));
    uint8_t next = static_cast<uint8_t>(acts.back().arg);
    if (next <= t) {  // never committed (ofparse/dataplane refuse it); refuse to loop anyway
      event(TraceEvent::NOTE, "goto_table to an earlier table: packet dropped");
      reason_ = DROP_RESUBMIT_LIMIT;
      error_ = exit_ = true;
      break;
    }
    if (limit_reached("goto_table")) break;
    t = next;
  }
  table_ = saved;
}


// ---- actions -------------------------------------------------------------------
void XlateCtx::do_actions(const std::vector<OfAction>& acts) {
  for (const OfAction& a : acts) {
    if (exit_ || end_list_) break;
    if (trace_) event(TraceEvent::ACTION, format_action(a, env_.ports));
    do_action(a);
  }
  end_list_ = false;  // dec_ttl ended this list (a group bucket's), not the caller's
}

void XlateCtx::write_field(const FieldDef& f, u128 value, u128 mask) {
  field_set_masked(flow_, f, value, mask);
  mark_written(f, mask);
  if (f.offset == offsetof(Flow, vlan_tci)) uw(vlan_present_mask());
}

bool XlateCtx::check_prereq(const FieldDef& f) {
  if (f.prereq == Prereq::NONE) return true;
  uw_prereq(f.prereq);
  if (prereq_met(f.prereq, flow_, nullptr)) return true;
  event(TraceEvent::NOTE, std::string("skipped: the packet has no ") + f.name);
  return false;
}


void XlateCtx::do_group(uint32_t id) {
  // A group is one nesting level and one unit of work, like a resubmit (as
  // OVS): chains are bounded even if a loop slipped past validation.
  if (limit_reached("group nesting")) return;
  auto it = env_.groups->find(id);
  if (it == env_.groups->end()) {
    event(TraceEvent::NOTE, "group " + std::to_string(id) + " does not exist");
    return;
  }
  const GroupPtr& g = it->second;
  XcacheEntry e;
  e.kind = XcacheEntry::GROUP;
  e.group = g;
  out_.xcache.push_back(e);
  if (g->type == GroupType::ALL) {
    for (const Bucket& b : g->buckets) do_bucket(b);
    return;
  }
  if (g->buckets.empty()) {
    reason_ = DROP_GROUP_EMPTY;
    return;
  }
  if (g->type == GroupType::INDIRECT) {
    do_bucket(g->buckets[0]);
    return;
  }
  // select: the documented 5-tuple hash (flow_key.h), weights as ranges.
  uw_field(FieldId::DL_TYPE);
  uint16_t t = be16(flow_.dl_type);
  if (t == kEthIp || t == kEthIpv6) {
    uw_field(t == kEthIp ? FieldId::NW_SRC : FieldId::IPV6_SRC);
    uw_field(t == kEthIp ? FieldId::NW_DST : FieldId::IPV6_DST);
    uw_field(FieldId::NW_PROTO);
    uw_field(FieldId::NW_FRAG);
    if (l4_has_ports(flow_)) {
      uw_field(FieldId::TP_SRC);
      uw_field(FieldId::TP_DST);
    }
  } else {
    uw_field(FieldId::DL_SRC);
    uw_field(FieldId::DL_DST);
  }
  uint32_t point = hash_5tuple(flow_) % g->total_weight;
  for (const Bucket& b : g->buckets) {
    if (point < b.weight) {
      if (trace_) event(TraceEvent::NOTE, "select group " + std::to_string(id) + ": bucket " + std::to_string(b.bucket_id));
      do_bucket(b);
      return;
    }
    point -= b.weight;
  }
}

// A bucket runs on a clone: whatever it changes is gone afterwards.
void XlateCtx::do_bucket(const Bucket& b) {
  commit();
  Flow sf = flow_, sb = base_, sw = written_;
  auto stags = tags_;
  bool sexit = exit_;
  size_t at = out_.actions.size();
  DpAction c;
  c.type = Dp::CLONE;
  out_.actions.push_back(c);
  depth_++;
  do_actions(b.actions);
  depth_--;
  size_t n = out_.actions.size() - at - 1;
  if (n == 0) out_.actions.pop_back();
  else out_.actions[at].n_nested = static_cast<uint32_t>(n);
  flow_ = sf;
  base_ = sb;
  written_ = sw;
  tags_ = stags;
  std::memset(&pending_, 0, sizeof pending_);
  exit_ = sexit || error_;  // drop(reason)/dec_ttl end the bucket; a limit error ends everything
}

// ---- output --------------------------------------------------------------------
void XlateCtx::output_to(uint32_t port) {
  const PortInfo* p = env_.ports->get(port);
  if (!p) {
    event(TraceEvent::NOTE, "output to unknown port " + std::to_string(port) + " ignored");
    return;
  }
  if (p->tunnel) {
    tunnel_output(*p);
    return;
  }
  commit();
  DpAction a;
  a.type = Dp::OUTPUT;
  a.port = port;
  out_.actions.push_back(a);
  out_.has_output = true;
}

void XlateCtx::tunnel_output(const PortInfo& p) {
  const TunnelCfg& t = p.tnl;
  commit();
  uw_field(FieldId::TUN_ID);
  uw_field(t.ipv6 ? FieldId::TUN_IPV6_DST : FieldId::TUN_DST);
  bool have_dst = t.ipv6 ? bytes_nonzero(flow_.tun_ipv6_dst, 16) : flow_.tun_dst != 0;
  if (!have_dst) {
    event(TraceEvent::NOTE, "output to " + p.name + " without a tunnel destination (tun_dst): ignored");
    return;
  }
  if (!bytes_nonzero(t.nexthop_mac, 6)) {  // live mode: ARP has not answered yet
    event(TraceEvent::NOTE, "output to " + p.name + ": the underlay next hop is not resolved yet");
    reason_ = DROP_NEXTHOP_UNRESOLVED;
    return;
  }
  auto th = std::make_unique<TnlHeader>();
  th->ipv6 = t.ipv6;
  th->mtu = t.mtu;
  th->sport_min = t.sport_min;
  th->sport_max = t.sport_max;
  uint8_t* h = th->hdr;
  std::memcpy(h, t.nexthop_mac, 6);
  std::memcpy(h + 6, t.local_mac, 6);
  uint16_t et = be16(t.ipv6 ? kEthIpv6 : kEthIp);
  std::memcpy(h + 12, &et, 2);
  uint8_t* ip = h + 14;
  size_t l4;
  if (t.ipv6) {
    ip[0] = 0x60;
    ip[6] = kIpUdp;
    ip[7] = t.ttl;
    std::memcpy(ip + 8, t.local_ip, 16);
    std::memcpy(ip + 24, flow_.tun_ipv6_dst, 16);
    l4 = 14 + 40;
  } else {
    ip[0] = 0x45;
    ip[6] = 0x40;  // DF
    ip[8] = t.ttl;
    ip[9] = kIpUdp;
    std::memcpy(ip + 12, t.local_ip, 4);
    std::memcpy(ip + 16, &flow_.tun_dst, 4);
    th->ip_csum_base = csum_fold(csum_partial(ip, 20));
    l4 = 14 + 20;
  }
  uint16_t dp = be16(t.dst_port);
  std::memcpy(h + l4 + 2, &dp, 2);
  uint8_t* vx = h + l4 + 8;
  vx[0] = 0x08;
  uint32_t vni = static_cast<uint32_t>(be64(flow_.tun_id) & 0xffffff);
  vx[4] = static_cast<uint8_t>(vni >> 16);
  vx[5] = static_cast<uint8_t>(vni >> 8);
  vx[6] = static_cast<uint8_t>(vni);
  th->hdr_len = static_cast<uint8_t>(l4 + 16);
  DpAction a;
  a.type = Dp::TNL_PUSH;
  a.port = t.underlay;
  a.tnl = th.get();
  out_.tnl_hdrs.push_back(std::move(th));
  out_.actions.push_back(a);
  out_.has_output = true;
}

// One set action per window [lo, hi) of a header image that has mask bits;
// image bytes [alo, ahi) are IP addresses (pseudo-header checksum).
void XlateCtx::emit_set(Dp type, const uint8_t* v, const uint8_t* m, int lo, int hi, int alo, int ahi, uint8_t proto) {
  // Narrow [lo, hi) to the bytes that change, keeping 16-bit word alignment
  // relative to the header (checksums are sums of its 16-bit words).
  while (lo < hi && !m[lo] && !(lo + 1 < hi && m[lo + 1])) lo += 2;
  while (hi > lo && !m[hi - 1] && !m[hi - 2]) hi -= 2;
  if (lo >= hi) return;
  DpAction a;
  a.full = 1;
  for (int b = lo; b < hi; b++) a.full &= m[b] == 0xff;
  a.type = type;
  a.proto = proto;
  a.ofs = static_cast<uint8_t>(lo);
  a.len = static_cast<uint8_t>(hi - lo);
  for (int k = 0; lo + 2 * k < hi; k++) {
    int b = lo + 2 * k;
    if (m[b] || (b + 1 < hi && m[b + 1])) {
      a.words |= static_cast<uint16_t>(1u << k);
      if (b >= alo && b < ahi) a.addr_words |= static_cast<uint16_t>(1u << k);
    }
  }
  if (!a.words) return;
  std::memcpy(a.set.val, v + lo, static_cast<size_t>(hi - lo));
  std::memcpy(a.set.msk, m + lo, static_cast<size_t>(hi - lo));
  out_.actions.push_back(a);
}

// Emits datapath actions for the header bits written since the last commit.
void XlateCtx::commit() {
  const Flow& f = flow_;
  const Flow& p = pending_;
  if (!any_bits(p, 0, kKeyWords)) return;
  // VLAN
  if (p.vlan_tci || p.vlan_tpid) {
    bool bt = base_.vlan_tci & be16(kVlanPresent), ft = f.vlan_tci & be16(kVlanPresent);
    DpAction a;
    if (!bt && ft) {
      a.type = Dp::PUSH_VLAN;
      a.tpid = f.vlan_tpid ? be16(f.vlan_tpid) : kEthVlan;
      a.tci = static_cast<uint16_t>(be16(f.vlan_tci) & ~kVlanPresent);
      out_.actions.push_back(a);
    } else if (bt && !ft) {
      a.type = Dp::POP_VLAN;
      out_.actions.push_back(a);
    } else if (bt && ft && (out_.wc.vlan_tpid = 0xffff, f.vlan_tpid != base_.vlan_tpid)) {
      // (base_ holds the packet's own TPID: it is read even if the flow's was written)
      // Same tag position, other TPID: replace the tag.
      a.type = Dp::POP_VLAN;
      out_.actions.push_back(a);
      DpAction b;
      b.type = Dp::PUSH_VLAN;
      b.tpid = f.vlan_tpid ? be16(f.vlan_tpid) : kEthVlan;
      b.tci = static_cast<uint16_t>(be16(f.vlan_tci) & ~kVlanPresent);
      out_.actions.push_back(b);
    } else if (bt && ft) {
      uint16_t v = static_cast<uint16_t>(f.vlan_tci & be16(static_cast<uint16_t>(~kVlanPresent)));
      uint16_t m = static_cast<uint16_t>(p.vlan_tci & be16(static_cast<uint16_t>(~kVlanPresent)));
      emit_set(Dp::SET_VLAN, reinterpret_cast<const uint8_t*>(&v), reinterpret_cast<const uint8_t*>(&m), 0, 2);
    }
  }
  // Ethernet: image = dst, src (as on the wire).
  emit_set(Dp::SET_ETH, f.dl_dst, p.dl_dst, 0, 12);
  uint16_t type = be16(f.dl_type);
  uint8_t v[40] = {}, m[40] = {};
  if (type == kEthIp) {
    v[1] = f.nw_tos;
    m[1] = p.nw_tos;
    v[8] = f.nw_ttl;
    m[8] = p.nw_ttl;
    std::memcpy(v + 12, &f.nw_src, 8);
    std::memcpy(m + 12, &p.nw_src, 8);
    emit_set(Dp::SET_IPV4, v, m, 0, 20, 12, 20);
  } else if (type == kEthIpv6) {
    v[0] = f.nw_tos >> 4;
    m[0] = p.nw_tos >> 4;
    v[1] = static_cast<uint8_t>(f.nw_tos << 4);
    m[1] = static_cast<uint8_t>(p.nw_tos << 4);
    v[7] = f.nw_ttl;
    m[7] = p.nw_ttl;
    std::memcpy(v + 8, f.ipv6_src, 32);
    std::memcpy(m + 8, p.ipv6_src, 32);
    // Which L4 checksum an address change touches depends on the protocol.
    if (bytes_nonzero(p.ipv6_src, 32)) uw_field(FieldId::NW_PROTO);
    emit_set(Dp::SET_IPV6, v, m, 0, 8);
    emit_set(Dp::SET_IPV6, v, m, 8, 24, 8, 40, f.nw_proto);
    emit_set(Dp::SET_IPV6, v, m, 24, 40, 8, 40, f.nw_proto);
  } else if (type == kEthArp && arp_written(p) && (uw_field(FieldId::NW_PROTO), f.nw_proto)) {
    // (as OVS: no ARP write while the opcode the flow holds is 0; the opcode
    // field is its low byte)
    if (p.nw_proto) {
      v[7] = f.nw_proto;
      m[7] = 0xff;
    }
    std::memcpy(v + 8, f.arp_sha, 6);
    std::memcpy(m + 8, p.arp_sha, 6);
    std::memcpy(v + 14, &f.nw_src, 4);
    std::memcpy(m + 14, &p.nw_src, 4);
    std::memcpy(v + 18, f.arp_tha, 6);
    std::memcpy(m + 18, p.arp_tha, 6);
    std::memcpy(v + 24, &f.nw_dst, 4);
    std::memcpy(m + 24, &p.nw_dst, 4);
    emit_set(Dp::SET_ARP, v, m, 6, 24);
    emit_set(Dp::SET_ARP, v, m, 24, 28);
  }
  if ((type == kEthIp || type == kEthIpv6) && (p.tp_src || p.tp_dst) &&
      (f.nw_proto == kIpTcp || f.nw_proto == kIpUdp || f.nw_proto == kIpSctp)) {
    emit_set(Dp::SET_L4, reinterpret_cast<const uint8_t*>(&f.tp_src), reinterpret_cast<const uint8_t*>(&p.tp_src),
             0, 4, 0, 0, f.nw_proto);
  } else if ((type == kEthIp || type == kEthIpv6) && (p.tp_src || p.tp_dst) &&
             f.nw_proto == (type == kEthIp ? kIpIcmp : kIpIcmpv6)) {
    // ICMP type and code: the low bytes of tp_src and tp_dst, the first two
    // bytes of the header on the wire.
    const uint8_t v2[2] = {reinterpret_cast<const uint8_t*>(&f.tp_src)[1], reinterpret_cast<const uint8_t*>(&f.tp_dst)[1]};
    const uint8_t m2[2] = {reinterpret_cast<const uint8_t*>(&p.tp_src)[1], reinterpret_cast<const uint8_t*>(&p.tp_dst)[1]};
    emit_set(Dp::SET_L4, v2, m2, 0, 2, 0, 0, f.nw_proto);
  }
  std::memcpy(&base_, &flow_, kKeyBytes);
  std::memset(&pending_, 0, sizeof pending_);
}

void XlateCtx::finish() {
  if (error_) {
    out_.actions.clear();
    out_.has_output = false;
    out_.has_ct = false;
    reason_ = DROP_RESUBMIT_LIMIT;
  }
  bool pop = !out_.actions.empty() && out_.actions.back().type == Dp::TNL_POP;
  if (!out_.has_output && !pop && !out_.has_ct) {
    out_.actions.clear();
    DpAction d;
    d.type = Dp::DROP;
    d.reason = reason_ == DROP_NONE ? static_cast<uint16_t>(DROP_NO_OUTPUT) : reason_;
    out_.actions.push_back(d);
    out_.drop_reason = d.reason;
  } else if (!out_.has_output && out_.has_ct && reason_ != DROP_NONE) {
    // No output of its own, but a ct: the reason recorded on the way (a
    // drop(reason), a miss) is what this instance of the packet dies of. The
    // trailing DROP carries it; a tracked instance that outputs later still
    // makes the packet count as sent.
    const DpAction& tail = out_.actions.back();
    if (!(tail.type == Dp::CT && tail.ct->recirc_id)) {
      DpAction d;
      d.type = Dp::DROP;
      d.reason = reason_;
      out_.actions.push_back(d);
    }
  }
  if (env_.tenants) {
    auto it = env_.tenants->find(flow_.metadata);
    out_.tenant = it == env_.tenants->end() ? 0 : it->second;
  }
  out_.final_flow = flow_;
}

void xlate(const XlateEnv& env, const Flow& key, XlateOut* out, std::vector<TraceEvent>* trace) {
  XlateCtx ctx(env, out, trace);
  ctx.run(key);
}

}  // namespace dpu
