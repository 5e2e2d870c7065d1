// xlate_ctx.h: the state of one slow-path walk (see xlate.h for the contract).
//
// The walk keeps four flows, as OVS's xlate does:
//   flow     the packet as the pipeline currently sees it (plus regs/metadata);
//   base     the packet as the datapath will have it after the actions emitted
//            so far: before every output, commit() emits set/push/pop actions
//            for the header bits written since the last commit (`pending`);
//   pending  header bits written and not yet emitted;
//   written  every key bit an action has set: such bits are constants for all
//            packets of the megaflow, so reading or matching them does not
//            un-wildcard the original packet's bits.
// wc (in XlateOut) collects the key bits that decided the outcome
// (un-wildcarding): probed subtable masks, prerequisites checked, fields read
// by move, hash inputs.
//
// The walk itself (tables, commit, output, tunnels, finish) is in xlate.cc;
// each OpenFlow action family of of_actions.def has its translator
// xlate_<family>() in xlate_actions.cc. Internal to the core; one walk per
// object, on the calling thread.
#pragma once

#include <string>
#include <vector>

#include "xlate.h"

namespace dpu {

class XlateCtx {
 public:
  XlateCtx(const XlateEnv& env, XlateOut* out, std::vector<TraceEvent>* trace) : env_(env), out_(*out), trace_(trace) {}
  void run(const Flow& key);

 private:
  // ---- xlate.cc: the walk -------------------------------------------------------------
  void uw(const Flow& m);
  void uw_field(FieldId id);
  void uw_prereq(Prereq p);
  void mark_written(const FieldDef& f, u128 bits);
  void event(TraceEvent::Kind k, std::string text, int table = -1, const Rule* r = nullptr);
  bool try_tunnel_pop();
  void resume();
  void do_table(uint8_t t, uint32_t in_port, bool counted);
  const RulePtr* lookup(uint8_t t, uint32_t in_port, Flow* mask, bool* exact_view);
  void do_actions(const std::vector<OfAction>& acts);
  void do_action(const OfAction& a);
  void write_field(const FieldDef& f, u128 value, u128 mask);
  bool check_prereq(const FieldDef& f);
  void do_group(uint32_t id);
  void do_bucket(const Bucket& b);
  void output_to(uint32_t port);
  void tunnel_output(const PortInfo& p);
  void emit_set(Dp type, const uint8_t* v, const uint8_t* m, int lo, int hi, int alo = 0, int ahi = 0,
                uint8_t proto = 0);
  void commit();
  void finish();
  bool limit_reached(const char* what);

  // ---- xlate_actions.cc: one translator per action family (of_actions.def) ---------------
  void xlate_output(const OfAction& a);
  void xlate_in_port(const OfAction& a);
  void xlate_flood(const OfAction& a);
  void xlate_drop(const OfAction& a);
  void xlate_set_field(const OfAction& a);
  void xlate_load(const OfAction& a);
  void xlate_move(const OfAction& a);
  void xlate_mod_field(const OfAction& a);
  void xlate_mod_vlan(const OfAction& a);
  void xlate_push_vlan(const OfAction& a);
  void xlate_pop_vlan(const OfAction& a);
  void xlate_dec_ttl(const OfAction& a);
  void xlate_goto_table(const OfAction& a);
  void xlate_resubmit(const OfAction& a);
  void xlate_write_metadata(const OfAction& a);
  void xlate_note(const OfAction& a);
  void xlate_group(const OfAction& a);
  void xlate_ct(const OfAction& a);
  void xlate_ct_clear(const OfAction& a);
  void clear_ct_fields();
  // helpers of the VLAN translators
  void push_second_tag(uint16_t tpid);
  void set_tag(OfAct type, uint32_t arg);

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
  bool end_list_ = false;  // dec_ttl failed: the current action list ends (as OVS)
  uint16_t reason_ = DROP_NONE;
};

// Small helpers shared by xlate.cc and xlate_actions.cc.
Flow field_mask(const FieldDef& f, u128 bits);
bool bytes_nonzero(const void* p, size_t n);
inline Flow vlan_present_mask() {
  Flow m{};
  m.vlan_tci = be16(kVlanPresent);
  return m;
}

}  // namespace dpu
