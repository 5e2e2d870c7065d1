// xlate_actions.cc: one translator per OpenFlow action family (the families
// are listed once, in of_actions.def; see xlate_ctx.h for the walk's state).
//
// A translator reads and writes the walk's flow, un-wildcards every key bit
// its outcome depends on, and leaves datapath actions to commit() and
// output_to() in xlate.cc: header writes are collected in `pending` and
// emitted, as few set actions as possible, just before the packet is sent
// (or handed to a stage that needs its bytes).
#include "conntrack/conntrack.h"
#include "dpu/ofparse.h"
#include "recirc.h"
#include "xlate_ctx.h"

namespace dpu {

// ---- output, in_port, flood/all, drop -----------------------------------------------

void XlateCtx::xlate_output(const OfAction& a) {
  if (a.port == flow_.in_port) {
    event(TraceEvent::NOTE, "skipping output to input port");
    return;
  }
  output_to(a.port);
}

void XlateCtx::xlate_in_port(const OfAction&) { output_to(flow_.in_port); }

void XlateCtx::xlate_flood(const OfAction&) {
  for (const PortInfo* p : env_.ports->all())
    if (!p->tunnel && p->ofport != flow_.in_port) output_to(p->ofport);
}

void XlateCtx::xlate_drop(const OfAction& a) {
  reason_ = static_cast<uint16_t>(a.arg);
  exit_ = true;
}

// ---- field writes -------------------------------------------------------------------

// The field an action writes or reads: as such nw_src/nw_dst are IPv4's
// addresses only (OVS's MFF_IPV4_SRC/DST), where a match reads them as ARP's
// too (ovs-ofctl's arp,nw_src=...).
static const FieldDef& action_field(FieldId id) {
  static const FieldDef ipv4[2] = {
      [] { FieldDef f = field_def(FieldId::NW_SRC); f.prereq = Prereq::IPV4; return f; }(),
      [] { FieldDef f = field_def(FieldId::NW_DST); f.prereq = Prereq::IPV4; return f; }()};
  return id == FieldId::NW_SRC ? ipv4[0] : id == FieldId::NW_DST ? ipv4[1] : field_def(id);
}

void XlateCtx::xlate_set_field(const OfAction& a) {
  const FieldDef& f = action_field(a.field);
  if (!check_prereq(f)) return;
  write_field(f, a.value, a.mask);
}

void XlateCtx::xlate_write_metadata(const OfAction& a) { xlate_set_field(a); }

void XlateCtx::xlate_mod_field(const OfAction& a) {
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
}

static u128 low_bits(uint16_t n) { return n >= 128 ? ~static_cast<u128>(0) : ((static_cast<u128>(1) << n) - 1); }

void XlateCtx::xlate_load(const OfAction& a) {
  const FieldDef& f = action_field(a.field);
  if (!check_prereq(f)) return;
  write_field(f, a.value << a.ofs, low_bits(a.n_bits) << a.ofs);
}

void XlateCtx::xlate_move(const OfAction& a) {
  const FieldDef& sf = action_field(a.src_field);
  const FieldDef& df = action_field(a.field);
  if (!check_prereq(sf) || !check_prereq(df)) return;
  u128 ones = low_bits(a.n_bits);
  if (sf.datapath) uw(field_mask(sf, ones << a.src_ofs));
  u128 v = (field_get(flow_, sf) >> a.src_ofs) & ones;
  write_field(df, v << a.ofs, ones << a.ofs);
}

// ---- VLAN ----------------------------------------------------------------------------

// push_vlan on a tagged packet: a second tag goes on the packet now, VID 0 and
// PCP 0 as in OVS (flow_push_vlan_uninit); the key describes the outer tag and
// the inner one waits on tags_ for a pop to bring it back.
void XlateCtx::push_second_tag(uint16_t tpid) {
  commit();
  DpAction d;
  d.type = Dp::PUSH_VLAN;
  d.tpid = tpid;
  d.tci = 0;
  out_.actions.push_back(d);
  tags_.push_back({flow_.vlan_tpid, flow_.vlan_tci, written_.vlan_tpid, written_.vlan_tci});
  flow_.vlan_tpid = base_.vlan_tpid = be16(tpid);
  flow_.vlan_tci = base_.vlan_tci = be16(kVlanPresent);
  written_.vlan_tpid = written_.vlan_tci = 0xffff;
}

// mod_vlan_vid / mod_vlan_pcp / push_vlan on an untagged packet (a new tag,
// vid 0 pcp 0, then the field), or mod_vlan_* on a tagged one.
void XlateCtx::set_tag(OfAct type, uint32_t arg) {
  uint16_t tci = be16(flow_.vlan_tci);
  uint16_t bits = 0xffff;  // a new tag: every bit of it is written
  if (!(tci & kVlanPresent)) {
    tci = kVlanPresent;
    flow_.vlan_tpid = be16(type == OfAct::PUSH_VLAN ? static_cast<uint16_t>(arg) : kEthVlan);
    written_.vlan_tpid = 0xffff;
    pending_.vlan_tpid = 0xffff;
  } else {
    bits = type == OfAct::MOD_VLAN_VID ? 0x0fff : type == OfAct::MOD_VLAN_PCP ? 0xe000 : 0;
  }
  if (type == OfAct::MOD_VLAN_VID) tci = static_cast<uint16_t>((tci & ~0x0fff) | arg);
  if (type == OfAct::MOD_VLAN_PCP) tci = static_cast<uint16_t>((tci & ~0xe000) | (arg << 13));
  if (bits) write_field(field_def(FieldId::VLAN_TCI), tci, bits);
}

void XlateCtx::xlate_mod_vlan(const OfAction& a) {
  uw(vlan_present_mask());
  set_tag(a.type, a.arg);
}

void XlateCtx::xlate_push_vlan(const OfAction& a) {
  uw(vlan_present_mask());
  if (flow_.vlan_tci & be16(kVlanPresent)) push_second_tag(static_cast<uint16_t>(a.arg));
  else set_tag(a.type, a.arg);
}

void XlateCtx::xlate_pop_vlan(const OfAction&) {
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
}

// ---- TTL, tables, groups, notes ------------------------------------------------------------

// dec_ttl on TTL 0 or 1 ends the current action list only (OVS's
// compose_dec_ttl "stop processing for current table"): what was sent before
// stays sent, and a caller that resubmitted here goes on with its own actions.
void XlateCtx::xlate_dec_ttl(const OfAction&) {
  uw_field(FieldId::DL_TYPE);
  if (flow_.dl_type != be16(kEthIp) && flow_.dl_type != be16(kEthIpv6)) {
    event(TraceEvent::NOTE, "dec_ttl: not IP, nothing to do");
    return;
  }
  uw_field(FieldId::NW_TTL);
  if (flow_.nw_ttl <= 1) {
    event(TraceEvent::NOTE, "dec_ttl: TTL " + std::to_string(flow_.nw_ttl) + " expired, the action list ends");
    reason_ = DROP_TTL_EXCEEDED;
    end_list_ = true;
    return;
  }
  write_field(field_def(FieldId::NW_TTL), flow_.nw_ttl - 1, 0xff);
}

void XlateCtx::xlate_goto_table(const OfAction&) {}  // do_table follows it (always a rule's last action)

// resubmit(port,table): the port is the input port of the lookup only (the
// matched rule's actions see the packet's own, as OVS); a resubmit to the same
// or an earlier table nests one level deeper (xlate_recursively's "deepens").
void XlateCtx::xlate_resubmit(const OfAction& a) {
  if (limit_reached("resubmit")) return;
  const uint32_t in_port = a.port != kPortInPort ? a.port : flow_.in_port;
  const uint8_t t = a.arg == kTableCurrent ? table_ : static_cast<uint8_t>(a.arg);
  const int deepens = t <= table_ ? 1 : 0;
  depth_ += deepens;
  do_table(t, in_port, true);
  depth_ -= deepens;
}

void XlateCtx::xlate_note(const OfAction&) {}

void XlateCtx::xlate_group(const OfAction& a) { do_group(static_cast<uint32_t>(a.arg)); }

// ---- conntrack -----------------------------------------------------------------------------

// After a ct action the pipeline goes on with the packet untracked (the
// tracked copy resumes elsewhere): the conntrack fields read as zero, a
// constant of the megaflow.
void XlateCtx::clear_ct_fields() {
  static const FieldId kCtFields[] = {FieldId::CT_STATE,    FieldId::CT_ZONE,     FieldId::CT_MARK,
                                      FieldId::CT_LABEL,    FieldId::CT_NW_PROTO, FieldId::CT_NW_SRC,
                                      FieldId::CT_NW_DST,   FieldId::CT_IPV6_SRC, FieldId::CT_IPV6_DST,
                                      FieldId::CT_TP_SRC,   FieldId::CT_TP_DST};
  for (FieldId id : kCtFields) {
    const FieldDef& f = field_def(id);
    field_set(flow_, f, 0);
    Flow m = field_mask(f, field_all_ones(f));
    flow_or_into(written_, m);
  }
}

void XlateCtx::xlate_ct(const OfAction& a) {
  const CtAction& ct = *a.ct;
  auto spec = std::make_shared<CtSpec>();
  spec->zone = ct.zone;
  if (ct.zone_from_field) {
    const FieldDef& f = field_def(ct.zone_field);
    if (f.datapath) uw(field_mask(f, ((static_cast<u128>(1) << ct.zone_bits) - 1) << ct.zone_ofs));
    spec->zone = static_cast<uint16_t>((field_get(flow_, f) >> ct.zone_ofs) & ((1u << ct.zone_bits) - 1));
  }
  spec->commit = ct.commit;
  spec->force = ct.force;
  spec->nat = ct.nat;
  spec->range = ct.range;
  for (const OfAction& e : ct.exec) {
    u128 v = e.value, m = e.mask;
    if (e.type == OfAct::LOAD) {
      m = (e.n_bits >= 128 ? ~static_cast<u128>(0) : ((static_cast<u128>(1) << e.n_bits) - 1)) << e.ofs;
      v = e.value << e.ofs;
    }
    if (e.field == FieldId::CT_MARK) {
      spec->set_mark = true;
      spec->mark = static_cast<uint32_t>((spec->mark & ~m) | (v & m));
      spec->mark_mask |= static_cast<uint32_t>(m);
    } else {
      spec->set_label = true;
      spec->label = (spec->label & ~m) | (v & m);
      spec->label_mask |= m;
    }
  }
  if (ct.table >= 0) {
    FrozenState fs;
    fs.table = static_cast<uint8_t>(ct.table);
    fs.in_port = flow_.in_port;
    fs.metadata = flow_.metadata;
    std::memcpy(fs.regs, flow_.regs, sizeof fs.regs);
    spec->recirc_id = env_.recirc ? env_.recirc->freeze(fs) : 0;
    if (!spec->recirc_id) {
      event(TraceEvent::NOTE, "too many recirculation states: packet dropped");
      reason_ = DROP_RECIRC_LIMIT;
      exit_ = true;
      return;
    }
  }
  commit();  // the header writes so far reach the packet before conntrack reads it
  DpAction d;
  d.type = Dp::CT;
  d.ct = spec.get();
  out_.actions.push_back(d);
  out_.ct_specs.push_back(std::move(spec));
  out_.has_ct = true;
  if (ct.table >= 0)
    event(TraceEvent::NOTE, "conntrack, then resume in table " + std::to_string(ct.table) + " (recirc_id=" +
                                std::to_string(out_.actions.back().ct->recirc_id) + ")");
  clear_ct_fields();
}

void XlateCtx::xlate_ct_clear(const OfAction&) {
  commit();
  DpAction d;
  d.type = Dp::CT_CLEAR;
  out_.actions.push_back(d);
  clear_ct_fields();
}

// ---- dispatch --------------------------------------------------------------------------------

void XlateCtx::do_action(const OfAction& a) {
  switch (a.type) {
#define DPU_OFACT(e, k, f) \
  case OfAct::e:           \
    xlate_##f(a);          \
    return;
#include "dpu/of_actions.def"
#undef DPU_OFACT
  }
}

}  // namespace dpu
