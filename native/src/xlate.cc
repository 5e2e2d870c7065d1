// xlate.cc: OpenFlow walk -> datapath actions + megaflow mask (see xlate.h).
//
// The walk keeps three flows, as OVS's xlate does:
//   flow     the packet as the pipeline currently sees it (plus regs/metadata);
//   base     the packet as the datapath will have it after the actions emitted
//            so far: before every output, commit() emits set/push/pop actions
//            for the header bits written since the last commit (`pending`);
//   written  every key bit an action has set: such bits are constants for all
//            packets of the megaflow, so reading or matching them does not
//            un-wildcard the original packet's bits.
// wc collects the key bits that decided the outcome (un-wildcarding): probed
// subtable masks, prerequisites checked, fields read by move, hash inputs.
#include "xlate.h"

#include <cstdio>

#include "checksum.h"
#include "dpu/ofparse.h"

namespace dpu {
namespace {

constexpr int kMaxDepth = 64;
constexpr int kMaxResubmits = 4096;

Flow field_mask(const FieldDef& f, u128 bits) {
  Flow m{};
  field_set_masked(m, f, bits, bits);
  return m;
}

bool any_bits(const Flow& m, size_t from_word, size_t to_word) {
  const word_t* w = words(m);
  for (size_t i = from_word; i < to_word; i++)
    if (w[i]) return true;
  return false;
}

bool bytes_nonzero(const void* p, size_t n) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; i++)
    if (b[i]) return true;
  return false;
}

class Ctx {
 public:
  Ctx(const XlateEnv& env, XlateOut* out, std::vector<TraceEvent>* trace) : env_(env), out_(*out), trace_(trace) {}

  void run(const Flow& key) {
    std::memcpy(&flow_, &key, kKeyBytes);  // pipeline state (metadata, regs) starts at zero
    std::memset(reinterpret_cast<uint8_t*>(&flow_) + kKeyBytes, 0, sizeof(Flow) - kKeyBytes);
    base_ = flow_;
    std::memset(&pending_, 0, sizeof pending_);
    std::memset(&written_, 0, sizeof written_);
    out_.wc = Flow{};
    out_.wc.in_port = 0xffffffffu;
    out_.wc.recirc_id = 0xffffffffu;
    if (!try_tunnel_pop()) do_table(0);
    finish();
  }

 private:
  // ---- wildcards ---------------------------------------------------------------
  void uw(const Flow& m) {
    word_t* wc = words(out_.wc);
    const word_t*x = words(m), *wr = words(written_);
    for (size_t i = 0; i < kKeyWords; i++) wc[i] |= x[i] & ~wr[i];
  }
  void uw_field(FieldId id) {
    const FieldDef& f = field_def(id);
    if (f.datapath) uw(field_mask(f, field_all_ones(f)));
  }
  void uw_prereq(Prereq p) {
    Flow m{};
    prereq_unwildcard(p, m);
    uw(m);
  }
  void mark_written(const FieldDef& f, u128 bits) {
    Flow m = field_mask(f, bits);
    flow_or_into(written_, m);
    if (f.datapath) flow_or_into(pending_, m);
  }

  void event(TraceEvent::Kind k, std::string text, int table = -1, const Rule* r = nullptr) {
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

  // ---- tunnel receive ------------------------------------------------------------
  bool try_tunnel_pop() {
    if (flow_.recirc_id != 0 || !env_.ports) return false;
    bool popped = false;
    for (const PortInfo* p : env_.ports->all()) {
      if (!p->tunnel || p->tnl.underlay != flow_.in_port) continue;
      const TunnelCfg& t = p->tnl;
      // Terminated only when addressed to our VTEP MAC, untagged (as we send).
      uw_field(FieldId::DL_DST);
      if (std::memcmp(flow_.dl_dst, t.local_mac, 6) != 0) continue;
      uw_field(FieldId::VLAN_TCI);
      if (flow_.vlan_tci != 0) continue;
      uw_field(FieldId::DL_TYPE);
      if (flow_.dl_type != be16(t.ipv6 ? kEthIpv6 : kEthIp)) continue;
      if (t.ipv6) {
        uw_field(FieldId::IPV6_DST);
        if (std::memcmp(flow_.ipv6_dst, t.local_ip, 16) != 0) continue;
      } else {
        uw_field(FieldId::NW_DST);
        if (std::memcmp(&flow_.nw_dst, t.local_ip, 4) != 0) continue;
      }
      uw_field(FieldId::NW_PROTO);
      uw_field(FieldId::NW_FRAG);
      if (flow_.nw_proto != kIpUdp || flow_.nw_frag != 0) continue;
      uw_field(FieldId::TP_DST);
      if (flow_.tp_dst != be16(t.dst_port)) continue;
      auto th = std::make_unique<TnlHeader>();
      th->strict = t.strict;
      th->ipv6 = t.ipv6;
      DpAction a;
      a.type = Dp::TNL_POP;
      a.port = p->ofport;
      a.tnl = th.get();
      out_.tnl_hdrs.push_back(std::move(th));
      out_.actions.push_back(a);
      event(TraceEvent::NOTE, "native tunnel: packet for VTEP " + p->name + ", tnl_pop and look up again");
      popped = true;
      break;
    }
    return popped;
  }

  // ---- tables --------------------------------------------------------------------
  // Looks the packet up in table t and runs the rule's actions; a goto_table
  // (always a rule's last action, always to a later table) continues here in
  // a loop rather than by recursion, so a chain through every table costs no
  // stack.
  void do_table(uint8_t t) {
    uint8_t saved = table_;
    for (;;) {
      if (exit_) break;
      table_ = t;
      Flow m{};
      const RulePtr* rp = env_.tables[t].lookup(flow_, &m);
      const Rule* r = rp ? rp->get() : nullptr;
      uw(m);
      XcacheEntry te;
      te.kind = XcacheEntry::TABLE;
      te.table = t;
      te.matched = r != nullptr;
      out_.xcache.push_back(te);
      if (!r) {
        event(TraceEvent::MISS, "No match.", t);
        reason_ = DROP_TABLE_MISS;
        break;
      }
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
        if (exit_) break;
        if (trace_) event(TraceEvent::ACTION, format_actions({acts[i]}, env_.ports));
        do_action(acts[i]);
      }
      if (!go || exit_) break;
      if (trace_) event(TraceEvent::ACTION, format_actions({acts.back()}, env_.ports));
      uint8_t next = static_cast<uint8_t>(acts.back().arg);
      if (next <= t) {  // never committed (ofparse/dataplane refuse it); refuse to loop anyway
        event(TraceEvent::NOTE, "goto_table to an earlier table: packet dropped");
        reason_ = DROP_RESUBMIT_LIMIT;
        error_ = exit_ = true;
        break;
      }
      t = next;
    }
    table_ = saved;
  }

  // ---- actions -------------------------------------------------------------------
  void do_actions(const std::vector<OfAction>& acts) {
    for (const OfAction& a : acts) {
      if (exit_) return;
      if (trace_) event(TraceEvent::ACTION, format_actions({a}, env_.ports));
      do_action(a);
    }
  }

  void write_field(const FieldDef& f, u128 value, u128 mask) {
    field_set_masked(flow_, f, value, mask);
    mark_written(f, mask);
    if (f.offset == offsetof(Flow, vlan_tci)) uw(vlan_present_mask());
  }

  static Flow vlan_present_mask() {
    Flow m{};
    m.vlan_tci = be16(kVlanPresent);
    return m;
  }

  bool check_prereq(const FieldDef& f) {
    if (f.prereq == Prereq::NONE) return true;
    uw_prereq(f.prereq);
    if (prereq_met(f.prereq, flow_, nullptr)) return true;
    event(TraceEvent::NOTE, std::string("skipped: the packet has no ") + f.name);
    return false;
  }

  void do_action(const OfAction& a) {
    switch (a.type) {
      case OfAct::OUTPUT:
        if (a.port == flow_.in_port) {
          event(TraceEvent::NOTE, "skipping output to input port");
          return;
        }
        output_to(a.port);
        return;
      case OfAct::IN_PORT:
        output_to(flow_.in_port);
        return;
      case OfAct::FLOOD:
      case OfAct::ALL:
        for (const PortInfo* p : env_.ports->all())
          if (!p->tunnel && p->ofport != flow_.in_port) output_to(p->ofport);
        return;
      case OfAct::DROP:
        reason_ = static_cast<uint16_t>(a.arg);
        exit_ = true;
        return;
      case OfAct::SET_FIELD:
      case OfAct::MOD_DL_SRC:
      case OfAct::MOD_DL_DST:
      case OfAct::MOD_NW_SRC:
      case OfAct::MOD_NW_DST:
      case OfAct::MOD_NW_TOS:
      case OfAct::MOD_TP_SRC:
      case OfAct::MOD_TP_DST:
      case OfAct::WRITE_METADATA: {
        const FieldDef& f = field_def(a.field);
        if (a.type == OfAct::MOD_NW_SRC || a.type == OfAct::MOD_NW_DST) {
          // OF1.0 semantics: IPv4 only, never the ARP fields sharing storage.
          uw_field(FieldId::DL_TYPE);
          if (flow_.dl_type != be16(kEthIp)) {
            event(TraceEvent::NOTE, "skipped: not an IPv4 packet");
            return;
          }
        } else if (!check_prereq(f)) {
          return;
        }
        if (a.type == OfAct::MOD_TP_SRC || a.type == OfAct::MOD_TP_DST) {
          uw_field(FieldId::NW_FRAG);
          if (flow_.nw_frag & kFragLater) {
            event(TraceEvent::NOTE, "skipped: later fragment has no L4 header");
            return;
          }
        }
        write_field(f, a.value, a.mask);
        return;
      }
      case OfAct::LOAD: {
        const FieldDef& f = field_def(a.field);
        if (!check_prereq(f)) return;
        u128 m = (a.n_bits >= 128 ? ~static_cast<u128>(0) : ((static_cast<u128>(1) << a.n_bits) - 1)) << a.ofs;
        write_field(f, a.value << a.ofs, m);
        return;
      }
      case OfAct::MOVE: {
        const FieldDef& sf = field_def(a.src_field);
        const FieldDef& df = field_def(a.field);
        if (!check_prereq(sf) || !check_prereq(df)) return;
        u128 ones = a.n_bits >= 128 ? ~static_cast<u128>(0) : ((static_cast<u128>(1) << a.n_bits) - 1);
        if (sf.datapath) uw(field_mask(sf, ones << a.src_ofs));
        u128 v = (field_get(flow_, sf) >> a.src_ofs) & ones;
        write_field(df, v << a.ofs, ones << a.ofs);
        return;
      }
      case OfAct::MOD_VLAN_VID:
      case OfAct::MOD_VLAN_PCP:
      case OfAct::PUSH_VLAN: {
        uw(vlan_present_mask());
        uint16_t tci = be16(flow_.vlan_tci);
        bool tagged = tci & kVlanPresent;
        if (a.type == OfAct::PUSH_VLAN && tagged) {
          // A second tag goes on the packet now; the key describes the outer
          // tag (a copy of the inner one's TCI, as OpenFlow, so that TCI is now
          // a constant of the megaflow) and the inner one waits on tags_ for a
          // pop to bring it back.
          commit();
          uw_field(FieldId::VLAN_TCI);
          DpAction d;
          d.type = Dp::PUSH_VLAN;
          d.tpid = static_cast<uint16_t>(a.arg);
          d.tci = static_cast<uint16_t>(tci & ~kVlanPresent);
          out_.actions.push_back(d);
          tags_.push_back({flow_.vlan_tpid, flow_.vlan_tci, written_.vlan_tpid, written_.vlan_tci});
          flow_.vlan_tpid = be16(static_cast<uint16_t>(a.arg));
          base_.vlan_tpid = flow_.vlan_tpid;
          written_.vlan_tpid = 0xffff;
          return;
        }
        uint16_t bits = 0xffff;  // a new tag: every bit of it is written
        if (!tagged) {
          tci = kVlanPresent;
          flow_.vlan_tpid = be16(a.type == OfAct::PUSH_VLAN ? static_cast<uint16_t>(a.arg) : kEthVlan);
          written_.vlan_tpid = 0xffff;
          pending_.vlan_tpid = 0xffff;
        } else {
          bits = a.type == OfAct::MOD_VLAN_VID ? 0x0fff : a.type == OfAct::MOD_VLAN_PCP ? 0xe000 : 0;
        }
        if (a.type == OfAct::MOD_VLAN_VID) tci = static_cast<uint16_t>((tci & ~0x0fff) | a.arg);
        if (a.type == OfAct::MOD_VLAN_PCP) tci = static_cast<uint16_t>((tci & ~0xe000) | (a.arg << 13));
        if (bits) write_field(field_def(FieldId::VLAN_TCI), tci, bits);
        return;
      }
      case OfAct::POP_VLAN:
      case OfAct::STRIP_VLAN:
        uw(vlan_present_mask());
        if (!(flow_.vlan_tci & be16(kVlanPresent))) return;
        if (!tags_.empty()) {
          // Popping a tag this walk pushed: the one below shows again, with
          // whatever of it was written (or not) before the push.
          commit();
          DpAction d;
          d.type = Dp::POP_VLAN;
          out_.actions.push_back(d);
          const VlanSave& v = tags_.back();
          flow_.vlan_tpid = base_.vlan_tpid = v.tpid;
          flow_.vlan_tci = base_.vlan_tci = v.tci;
          written_.vlan_tpid = v.written_tpid;
          written_.vlan_tci = v.written_tci;
          tags_.pop_back();
          return;
        }
        write_field(field_def(FieldId::VLAN_TCI), 0, 0xffff);
        flow_.vlan_tpid = 0;
        return;
      case OfAct::DEC_TTL: {
        uw_field(FieldId::DL_TYPE);
        if (flow_.dl_type != be16(kEthIp) && flow_.dl_type != be16(kEthIpv6)) {
          event(TraceEvent::NOTE, "dec_ttl: not IP, nothing to do");
          return;
        }
        uw_field(FieldId::NW_TTL);
        if (flow_.nw_ttl <= 1) {
          event(TraceEvent::NOTE, "dec_ttl: TTL " + std::to_string(flow_.nw_ttl) + " expired, packet dropped");
          reason_ = DROP_TTL_EXCEEDED;
          exit_ = true;
          return;
        }
        write_field(field_def(FieldId::NW_TTL), flow_.nw_ttl - 1, 0xff);
        return;
      }
      case OfAct::GOTO_TABLE:  // handled by do_table (a group bucket cannot hold one)
        return;
      case OfAct::RESUBMIT: {
        if (depth_ >= kMaxDepth || ++resubmits_ > kMaxResubmits) {
          event(TraceEvent::NOTE, "resubmit limit reached: packet dropped");
          error_ = true;
          reason_ = DROP_RESUBMIT_LIMIT;
          exit_ = true;
          return;
        }
        uint32_t old_in = flow_.in_port;
        if (a.port != kPortInPort) flow_.in_port = a.port;
        uint8_t t = a.arg == kTableCurrent ? table_ : static_cast<uint8_t>(a.arg);
        depth_++;
        do_table(t);
        depth_--;
        flow_.in_port = old_in;
        return;
      }
      case OfAct::NOTE:
        return;
      case OfAct::GROUP:
        do_group(static_cast<uint32_t>(a.arg));
        return;
    }
  }

  void do_group(uint32_t id) {
    // A group is one nesting level and one unit of work, like a resubmit (as
    // OVS): chains are bounded even if a loop slipped past validation.
    if (depth_ >= kMaxDepth || ++resubmits_ > kMaxResubmits) {
      event(TraceEvent::NOTE, "group nesting limit reached: packet dropped");
      error_ = true;
      reason_ = DROP_RESUBMIT_LIMIT;
      exit_ = true;
      return;
    }
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
  void do_bucket(const Bucket& b) {
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
    else out_.actions[at].n_nested = static_cast<uint16_t>(n);
    flow_ = sf;
    base_ = sb;
    written_ = sw;
    tags_ = stags;
    std::memset(&pending_, 0, sizeof pending_);
    exit_ = sexit || error_;  // drop(reason)/dec_ttl end the bucket; a limit error ends everything
  }

  // ---- output --------------------------------------------------------------------
  void output_to(uint32_t port) {
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

  void tunnel_output(const PortInfo& p) {
    const TunnelCfg& t = p.tnl;
    commit();
    uw_field(FieldId::TUN_ID);
    uw_field(t.ipv6 ? FieldId::TUN_IPV6_DST : FieldId::TUN_DST);
    bool have_dst = t.ipv6 ? bytes_nonzero(flow_.tun_ipv6_dst, 16) : flow_.tun_dst != 0;
    if (!have_dst) {
      event(TraceEvent::NOTE, "output to " + p.name + " without a tunnel destination (tun_dst): ignored");
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
  void emit_set(Dp type, const uint8_t* v, const uint8_t* m, int lo, int hi, int alo = 0, int ahi = 0,
                uint8_t proto = 0) {
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
  void commit() {
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
    } else if (type == kEthArp) {
      if (p.nw_proto) {
        v[7] = f.nw_proto;
        m[6] = m[7] = 0xff;
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
    }
    std::memcpy(&base_, &flow_, kKeyBytes);
    std::memset(&pending_, 0, sizeof pending_);
  }

  void finish() {
    if (error_) {
      out_.actions.clear();
      out_.has_output = false;
      reason_ = DROP_RESUBMIT_LIMIT;
    }
    bool pop = !out_.actions.empty() && out_.actions.back().type == Dp::TNL_POP;
    if (!out_.has_output && !pop) {
      out_.actions.clear();
      DpAction d;
      d.type = Dp::DROP;
      d.reason = reason_ == DROP_NONE ? static_cast<uint16_t>(DROP_NO_OUTPUT) : reason_;
      out_.actions.push_back(d);
      out_.drop_reason = d.reason;
    }
    if (env_.tenants) {
      auto it = env_.tenants->find(flow_.metadata);
      out_.tenant = it == env_.tenants->end() ? 0 : it->second;
    }
    out_.final_flow = flow_;
  }

  const XlateEnv& env_;
  XlateOut& out_;
  std::vector<TraceEvent>* trace_;
  Flow flow_{}, base_{}, pending_{}, written_{};
  struct VlanSave {
    uint16_t tpid, tci, written_tpid, written_tci;
  };
  std::vector<VlanSave> tags_;  // tags under the ones pushed this walk
  int depth_ = 0, resubmits_ = 0;
  uint8_t table_ = 0;
  bool exit_ = false, error_ = false;
  uint16_t reason_ = DROP_NONE;
};

std::string mac_text(const uint8_t* m) {
  char b[24];
  std::snprintf(b, sizeof b, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
  return b;
}

std::string ip4_text(const uint8_t* p) {
  char b[20];
  std::snprintf(b, sizeof b, "%u.%u.%u.%u", p[0], p[1], p[2], p[3]);
  return b;
}

std::string ip6_text(const uint8_t* p) {
  u128 v = 0;
  for (int i = 0; i < 16; i++) v = (v << 8) | p[i];
  return format_field_value(field_def(FieldId::IPV6_SRC), v, ~static_cast<u128>(0), nullptr);
}

// "name=value" for a masked run of bytes, "" when the mask is zero.
std::string set_item(const char* name, const uint8_t* v, const uint8_t* m, int n,
                     std::string (*fmt)(const uint8_t*)) {
  if (!bytes_nonzero(m, static_cast<size_t>(n))) return "";
  bool full = true;
  for (int i = 0; i < n; i++) full &= m[i] == 0xff;
  std::string s = std::string(name) + "=" + fmt(v);
  if (!full) s += "/" + fmt(m);
  return s;
}

std::string dec_text(const uint8_t* p) { return std::to_string(p[0]); }
std::string port16_text(const uint8_t* p) { return std::to_string((p[0] << 8) | p[1]); }

std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (const std::string& i : items) {
    if (i.empty()) continue;
    if (!s.empty()) s += ',';
    s += i;
  }
  return s;
}

}  // namespace

void xlate(const XlateEnv& env, const Flow& key, XlateOut* out, std::vector<TraceEvent>* trace) {
  Ctx ctx(env, out, trace);
  ctx.run(key);
}

// "name=value[/mask]" for bytes [lo, hi) of a set action's header image, ""
// when that part is not written.
std::string win_item(const DpAction& a, const char* name, int lo, int hi, std::string (*fmt)(const uint8_t*)) {
  if (lo < a.ofs || hi > a.ofs + a.len) return "";
  const uint8_t* v = a.set.val + (lo - a.ofs);
  const uint8_t* m = a.set.msk + (lo - a.ofs);
  return set_item(name, v, m, hi - lo, fmt);
}

std::string format_dp_actions(const DpActions& acts, const PortNames* ports) {
  std::vector<std::string> items;
  for (size_t i = 0; i < acts.size(); i++) {
    const DpAction& a = acts[i];
    std::string s;
    switch (a.type) {
      case Dp::OUTPUT: {
        std::string n = ports ? ports->port_name(a.port) : "";
        s = n.empty() ? std::to_string(a.port) : n;
        break;
      }
      case Dp::SET_ETH:
        s = "set(eth(" + join({win_item(a, "src", 6, 12, mac_text), win_item(a, "dst", 0, 6, mac_text)}) + "))";
        break;
      case Dp::SET_VLAN: {
        char b[40];
        const uint8_t *v = a.set.val, *m = a.set.msk;
        std::snprintf(b, sizeof b, "set(vlan(tci=0x%04x/0x%04x))", (v[0] << 8) | v[1], (m[0] << 8) | m[1]);
        s = b;
        break;
      }
      case Dp::PUSH_VLAN: {
        char b[64];
        std::snprintf(b, sizeof b, "push_vlan(tpid=0x%04x,vid=%u,pcp=%u)", a.tpid, a.tci & 0xfffu, a.tci >> 13);
        s = b;
        break;
      }
      case Dp::POP_VLAN: s = "pop_vlan"; break;
      case Dp::SET_IPV4:
        s = "set(ipv4(" + join({win_item(a, "src", 12, 16, ip4_text), win_item(a, "dst", 16, 20, ip4_text),
                                win_item(a, "tos", 1, 2, dec_text), win_item(a, "ttl", 8, 9, dec_text)}) +
            "))";
        break;
      case Dp::SET_IPV6: {
        std::string tc;
        if (a.ofs == 0 && (a.set.msk[0] & 0x0f || a.set.msk[1] & 0xf0)) {
          uint8_t t = static_cast<uint8_t>((a.set.val[0] << 4) | (a.set.val[1] >> 4));
          uint8_t tm = static_cast<uint8_t>((a.set.msk[0] << 4) | (a.set.msk[1] >> 4));
          tc = set_item("tclass", &t, &tm, 1, dec_text);
        }
        s = "set(ipv6(" + join({win_item(a, "src", 8, 24, ip6_text), win_item(a, "dst", 24, 40, ip6_text), tc,
                                win_item(a, "hlimit", 7, 8, dec_text)}) +
            "))";
        break;
      }
      case Dp::SET_L4: {
        const char* n = a.proto == kIpTcp ? "tcp" : a.proto == kIpUdp ? "udp" : "sctp";
        s = std::string("set(") + n + "(" +
            join({win_item(a, "src", 0, 2, port16_text), win_item(a, "dst", 2, 4, port16_text)}) + "))";
        break;
      }
      case Dp::SET_ARP:
        s = "set(arp(" + join({win_item(a, "op", 7, 8, dec_text), win_item(a, "sha", 8, 14, mac_text),
                               win_item(a, "sip", 14, 18, ip4_text), win_item(a, "tha", 18, 24, mac_text),
                               win_item(a, "tip", 24, 28, ip4_text)}) +
            "))";
        break;
      case Dp::TNL_PUSH: {
        const uint8_t* h = a.tnl->hdr;
        size_t l4 = a.tnl->ipv6 ? 54 : 34;
        const uint8_t* vx = h + l4 + 8;
        uint32_t vni = (static_cast<uint32_t>(vx[4]) << 16) | (vx[5] << 8) | vx[6];
        std::string src = a.tnl->ipv6 ? ip6_text(h + 22) : ip4_text(h + 26);
        std::string dst = a.tnl->ipv6 ? ip6_text(h + 38) : ip4_text(h + 30);
        std::string out = ports ? ports->port_name(a.port) : "";
        s = "tnl_push(vxlan(vni=" + std::to_string(vni) + ",src=" + src + ",dst=" + dst +
            ",dport=" + std::to_string((h[l4 + 2] << 8) | h[l4 + 3]) + "),eth(src=" + mac_text(h + 6) +
            ",dst=" + mac_text(h) + "),out_port=" + (out.empty() ? std::to_string(a.port) : out) + ")";
        break;
      }
      case Dp::TNL_POP: {
        std::string n = ports ? ports->port_name(a.port) : "";
        s = "tnl_pop(" + (n.empty() ? std::to_string(a.port) : n) + ")";
        break;
      }
      case Dp::CLONE: {
        DpActions inner(acts.begin() + static_cast<long>(i) + 1,
                        acts.begin() + static_cast<long>(i) + 1 + a.n_nested);
        s = "clone(" + format_dp_actions(inner, ports) + ")";
        i += a.n_nested;
        break;
      }
      case Dp::DROP: s = std::string("drop(") + drop_reason_name(a.reason) + ")"; break;
    }
    items.push_back(s);
  }
  return join(items);
}

}  // namespace dpu
