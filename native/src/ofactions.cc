// ofactions.cc: OpenFlow actions, text in and text out, one function per
// action family and job (the families are listed once, in of_actions.def).
//
//   parse_<family>(item, ctx, action)   ovs-ofctl text -> OfAction
//   format_<family>(action, keyword)    OfAction -> canonical text
//
// The dispatchers (parse_one_action, format_action) are generated from the
// table; so is the OfAct enum. Translation into datapath actions lives in
// xlate_actions.cc. Every error names the offending token and its position.
//
// Pure functions; any thread.
#include <cstdio>
#include <cstring>

#include "dpu/ofparse.h"
#include "ofparse_util.h"

namespace dpu {
namespace ofp {
namespace {

// What an action parser needs besides its own text.
struct ActCtx {
  const PortNames* ports;
  uint8_t table;  // table of the flow (goto_table must go further)
};

// Actions Open vSwitch has and dpu does not (yet): a clear error instead of
// "unknown action".
const char* const kUnsupportedActions[] = {
    "normal", "controller", "local", "nat", "meter", "learn", "enqueue", "set_queue",
    "clone", "conjunction", "exit", "multipath", "bundle", "bundle_load", "encap", "decap",
    "check_pkt_larger", "sample", "fin_timeout", "set_tunnel", "set_tunnel64", "pop_queue",
    "output_reg", "push_mpls", "pop_mpls", "dec_mpls_ttl", "set_mpls_label",
    "trunc", "stack_push", "stack_pop", "delete_field", "ct", "ct_clear"};

Status need_value(const Item& it) {
  if (!it.has_value || it.value.empty())
    return err_at(Err::PARSE, "action '" + std::string(it.key) + "' needs an argument", it.whole, it.pos);
  return Status::Ok();
}

Status no_value(const Item& it) {
  if (it.has_value)
    return err_at(Err::PARSE, "action '" + std::string(it.key) + "' takes no argument", it.whole, it.pos);
  return Status::Ok();
}

std::string port_text(uint32_t p, const PortNames* ports) {
  if (p == kPortInPort) return "in_port";
  std::string n = ports ? ports->port_name(p) : std::string();
  return n.empty() ? std::to_string(p) : n;
}

std::string subfield_text(FieldId id, uint16_t ofs, uint16_t n) {
  const FieldDef& f = field_def(id);
  std::string s = f.nxm ? f.nxm : f.name;
  if (ofs == 0 && n == f.n_bits) return s + "[]";
  if (n == 1) return s + "[" + std::to_string(ofs) + "]";
  return s + "[" + std::to_string(ofs) + ".." + std::to_string(ofs + n - 1) + "]";
}

// ---- output, in_port, flood/all, drop -------------------------------------------------

Status parse_output(const Item& it, const ActCtx& c, OfAction* a) {
  Status s = need_value(it);
  if (!s.ok()) return s;
  std::string_view pv = it.value;
  int ppos = it.value_pos;
  if (it.parens) {  // output(port=X[,max_len=N])
    std::vector<Item> sub;
    s = split_items(it.value, it.value_pos, &sub);
    if (!s.ok()) return s;
    pv = {};
    for (const Item& x : sub) {
      if (x.key != "port") return err_at(Err::PARSE, "output(): only port= is supported", x.whole, x.pos);
      pv = x.value;
      ppos = x.value_pos;
    }
    if (pv.empty()) return err_at(Err::PARSE, "output() needs port=", it.whole, it.pos);
  }
  if (pv.find('[') != std::string_view::npos)
    return err_at(Err::PARSE, "output to a field value is not supported", pv, ppos);
  s = parse_port_arg(pv, ppos, c.ports, &a->port);
  if (s.ok() && a->port == kPortInPort) a->type = OfAct::IN_PORT;
  return s;
}
std::string format_output(const OfAction& a, const char*, const PortNames* ports) {
  return "output:" + port_text(a.port, ports);
}

Status parse_in_port(const Item& it, const ActCtx&, OfAction*) { return no_value(it); }
std::string format_in_port(const OfAction&, const char* k, const PortNames*) { return k; }

Status parse_flood(const Item& it, const ActCtx&, OfAction*) { return no_value(it); }
std::string format_flood(const OfAction&, const char* k, const PortNames*) { return k; }

Status parse_drop(const Item& it, const ActCtx&, OfAction* a) {
  a->arg = 0;
  if (!it.has_value) return Status::Ok();
  int r = drop_reason_by_name(it.value);
  if (r <= 0) return err_at(Err::PARSE, "unknown drop reason '" + std::string(it.value) + "'", it.value, it.value_pos);
  a->arg = static_cast<uint32_t>(r);
  return Status::Ok();
}
std::string format_drop(const OfAction& a, const char*, const PortNames*) {
  return std::string("drop(") + drop_reason_name(static_cast<int>(a.arg)) + ")";
}

// ---- field writes -------------------------------------------------------------------

// set_field:V[/M]->F, load:V->F[a..b], move:F[a..b]->G[c..d] share the arrow split.
Status split_arrow(const Item& it, std::string_view* src, std::string_view* dst, int* src_pos, int* dst_pos) {
  Status s = need_value(it);
  if (!s.ok()) return s;
  size_t arrow = it.value.find("->");
  if (arrow == std::string_view::npos)
    return err_at(Err::PARSE, std::string(it.key) + " needs 'source->destination'", it.whole, it.pos);
  *src = it.value.substr(0, arrow);
  *dst = it.value.substr(arrow + 2);
  *src_pos = it.value_pos;
  *dst_pos = it.value_pos + static_cast<int>(arrow) + 2;
  return Status::Ok();
}

Status parse_set_field(const Item& it, const ActCtx& c, OfAction* a) {
  std::string_view src, dst;
  int src_pos, dst_pos;
  Status s = split_arrow(it, &src, &dst, &src_pos, &dst_pos);
  if (!s.ok()) return s;
  const FieldDef* f = field_by_name(dst);
  if (!f) return err_at(Err::UNKNOWN_FIELD, "unknown field '" + std::string(dst) + "'", dst, dst_pos);
  if (!f->writable) return err_at(Err::BAD_VALUE, std::string(f->name) + " cannot be written", dst, dst_pos);
  a->field = f->id;
  s = parse_field_value(*f, src, c.ports, &a->value, &a->mask, true);
  if (!s.ok()) {
    s.token = std::string(src);
    s.position = src_pos;
  }
  return s;
}
std::string format_set_field(const OfAction& a, const char*, const PortNames* ports) {
  const FieldDef& f = field_def(a.field);
  return "set_field:" + format_field_value(f, a.value, a.mask, ports) + "->" + f.name;
}

// load/move: "SRC->DST[a..b]" with a writable destination subfield.
Status parse_to_subfield(const Item& it, OfAction* a, std::string_view* src, int* src_pos) {
  std::string_view dst;
  int dst_pos;
  Status s = split_arrow(it, src, &dst, src_pos, &dst_pos);
  if (!s.ok()) return s;
  const FieldDef* df;
  s = parse_subfield(dst, dst_pos, &df, &a->ofs, &a->n_bits);
  if (!s.ok()) return s;
  if (!df->writable) return err_at(Err::BAD_VALUE, std::string(df->name) + " cannot be written", dst, dst_pos);
  a->field = df->id;
  return Status::Ok();
}

Status parse_load(const Item& it, const ActCtx&, OfAction* a) {
  std::string_view src;
  int src_pos;
  Status s = parse_to_subfield(it, a, &src, &src_pos);
  if (!s.ok()) return s;
  u128 val;
  if (!parse_uint(src, a->n_bits, &val))
    return err_at(Err::BAD_VALUE, "'" + std::string(src) + "' does not fit in " + std::to_string(a->n_bits) + " bits",
                  src, src_pos);
  a->value = val;
  return Status::Ok();
}
std::string format_load(const OfAction& a, const char*, const PortNames*) {
  return "load:" + hex_u128(a.value) + "->" + subfield_text(a.field, a.ofs, a.n_bits);
}

Status parse_move(const Item& it, const ActCtx&, OfAction* a) {
  std::string_view src;
  int src_pos;
  Status s = parse_to_subfield(it, a, &src, &src_pos);
  if (!s.ok()) return s;
  const FieldDef* sf;
  uint16_t sn;
  s = parse_subfield(src, src_pos, &sf, &a->src_ofs, &sn);
  if (!s.ok()) return s;
  if (sn != a->n_bits)
    return err_at(Err::BAD_VALUE,
                  "move source has " + std::to_string(sn) + " bits, destination " + std::to_string(a->n_bits),
                  it.whole, it.pos);
  a->src_field = sf->id;
  return Status::Ok();
}
std::string format_move(const OfAction& a, const char*, const PortNames*) {
  return "move:" + subfield_text(a.src_field, a.src_ofs, a.n_bits) + "->" + subfield_text(a.field, a.ofs, a.n_bits);
}

// mod_dl_src:V and friends: the whole field, no mask.
FieldId mod_target(OfAct t) {
  switch (t) {
    case OfAct::MOD_DL_SRC: return FieldId::DL_SRC;
    case OfAct::MOD_DL_DST: return FieldId::DL_DST;
    case OfAct::MOD_NW_SRC: return FieldId::NW_SRC;
    case OfAct::MOD_NW_DST: return FieldId::NW_DST;
    case OfAct::MOD_NW_TOS: return FieldId::NW_TOS;
    case OfAct::MOD_TP_SRC: return FieldId::TP_SRC;
    default: return FieldId::TP_DST;
  }
}
Status parse_mod_field(const Item& it, const ActCtx& c, OfAction* a) {
  Status s = need_value(it);
  if (!s.ok()) return s;
  a->field = mod_target(a->type);
  const FieldDef& f = field_def(a->field);
  u128 m;
  s = parse_field_value(f, it.value, c.ports, &a->value, &m, false);
  if (!s.ok()) return at_value(s, it);
  a->mask = field_all_ones(f);
  return Status::Ok();
}
std::string format_mod_field(const OfAction& a, const char* k, const PortNames* ports) {
  return std::string(k) + ":" + format_field_value(field_def(a.field), a.value, a.mask, ports);
}

Status parse_write_metadata(const Item& it, const ActCtx& c, OfAction* a) {
  Status s = need_value(it);
  if (!s.ok()) return s;
  a->field = FieldId::METADATA;
  s = parse_field_value(field_def(FieldId::METADATA), it.value, c.ports, &a->value, &a->mask, true);
  return at_value(s, it);
}
std::string format_write_metadata(const OfAction& a, const char*, const PortNames*) {
  std::string s = "write_metadata:" + hex_u128(a.value);
  if (a.mask != field_all_ones(field_def(FieldId::METADATA))) s += "/" + hex_u128(a.mask);
  return s;
}

// ---- VLAN -------------------------------------------------------------------------------

Status parse_mod_vlan(const Item& it, const ActCtx&, OfAction* a) {
  Status s = need_value(it);
  if (!s.ok()) return s;
  bool vid = a->type == OfAct::MOD_VLAN_VID;
  uint64_t n;
  if (!parse_u(it.value, vid ? 12 : 3, &n))
    return err_at(Err::BAD_VALUE, vid ? "VLAN id must be 0..4095" : "VLAN priority must be 0..7", it.value,
                  it.value_pos);
  a->arg = static_cast<uint32_t>(n);
  return Status::Ok();
}
std::string format_mod_vlan(const OfAction& a, const char* k, const PortNames*) {
  return std::string(k) + ":" + std::to_string(a.arg);
}

Status parse_push_vlan(const Item& it, const ActCtx&, OfAction* a) {
  Status s = need_value(it);
  if (!s.ok()) return s;
  uint64_t n;
  if (!parse_u(it.value, 16, &n) || (n != kEthVlan && n != kEthQinQ))
    return err_at(Err::BAD_VALUE, "push_vlan takes 0x8100 or 0x88a8", it.value, it.value_pos);
  a->arg = static_cast<uint32_t>(n);
  return Status::Ok();
}
std::string format_push_vlan(const OfAction& a, const char*, const PortNames*) {
  char b[32];
  std::snprintf(b, sizeof b, "push_vlan:0x%04x", a.arg);
  return b;
}

Status parse_pop_vlan(const Item& it, const ActCtx&, OfAction*) { return no_value(it); }
std::string format_pop_vlan(const OfAction&, const char* k, const PortNames*) { return k; }

// ---- TTL, tables, groups, notes ------------------------------------------------------------

Status parse_dec_ttl(const Item& it, const ActCtx&, OfAction*) {
  if (it.has_value && !it.parens) return no_value(it);
  return Status::Ok();  // dec_ttl(ids) accepted; the controller ids are irrelevant here
}
std::string format_dec_ttl(const OfAction&, const char* k, const PortNames*) { return k; }

Status parse_goto_table(const Item& it, const ActCtx& c, OfAction* a) {
  Status s = need_value(it);
  if (!s.ok()) return s;
  uint64_t n;
  if (!parse_u(it.value, 16, &n) || n >= kNumTables)
    return err_at(Err::UNKNOWN_TABLE, "table " + std::string(it.value) + " out of range (0..254)", it.value,
                  it.value_pos);
  if (n <= c.table)
    return err_at(Err::PARSE,
                  "goto_table must go to a later table than " + std::to_string(c.table) + " (use resubmit to go back)",
                  it.value, it.value_pos);
  a->arg = static_cast<uint32_t>(n);
  return Status::Ok();
}
std::string format_goto_table(const OfAction& a, const char*, const PortNames*) {
  return "goto_table:" + std::to_string(a.arg);
}

Status parse_resubmit(const Item& it, const ActCtx& c, OfAction* a) {
  Status s = need_value(it);
  if (!s.ok()) return s;
  a->port = kPortInPort;
  a->arg = kTableCurrent;
  std::string_view v = it.value, port_s = v, table_s;
  int table_pos = it.value_pos;
  if (it.parens) {
    size_t comma = v.find(',');
    if (comma == std::string_view::npos)
      return err_at(Err::PARSE, "resubmit(port,table) needs a comma", it.whole, it.pos);
    port_s = v.substr(0, comma);
    table_s = v.substr(comma + 1);
    table_pos = it.value_pos + static_cast<int>(comma) + 1;
    if (table_s.find(',') != std::string_view::npos)
      return err_at(Err::PARSE, "resubmit takes (port,table) only", it.whole, it.pos);
  }
  if (!port_s.empty()) {
    s = parse_port_arg(port_s, it.value_pos, c.ports, &a->port);
    if (!s.ok()) return s;
  }
  if (!table_s.empty()) {
    uint64_t n;
    if (!parse_u(table_s, 16, &n) || n >= kNumTables)
      return err_at(Err::UNKNOWN_TABLE, "table " + std::string(table_s) + " out of range (0..254)", table_s,
                    table_pos);
    a->arg = static_cast<uint32_t>(n);
  }
  if (port_s.empty() && table_s.empty())
    return err_at(Err::PARSE, "resubmit needs a port or a table", it.whole, it.pos);
  return Status::Ok();
}
std::string format_resubmit(const OfAction& a, const char*, const PortNames* ports) {
  std::string p = a.port == kPortInPort ? "" : port_text(a.port, ports);
  std::string t = a.arg == kTableCurrent ? "" : std::to_string(a.arg);
  return "resubmit(" + p + "," + t + ")";
}

Status parse_note(const Item& it, const ActCtx&, OfAction* a) {
  std::string hex;
  for (char ch : it.value)
    if (ch != '.') hex += ch;
  if (hex.size() % 2) return err_at(Err::PARSE, "note takes hex bytes (00.11.22)", it.value, it.value_pos);
  for (size_t i = 0; i < hex.size(); i += 2) {
    u128 b;
    if (!parse_uint("0x" + hex.substr(i, 2), 8, &b))
      return err_at(Err::PARSE, "note takes hex bytes (00.11.22)", it.value, it.value_pos);
    a->note.push_back(static_cast<uint8_t>(b));
  }
  return Status::Ok();
}
std::string format_note(const OfAction& a, const char*, const PortNames*) {
  std::string s = "note:";
  char b[4];
  for (size_t i = 0; i < a.note.size(); i++) {
    std::snprintf(b, sizeof b, "%02x", a.note[i]);
    if (i) s += '.';
    s += b;
  }
  return s;
}

Status parse_group(const Item& it, const ActCtx&, OfAction* a) {
  Status s = need_value(it);
  if (!s.ok()) return s;
  uint64_t n;
  if (!parse_u(it.value, 32, &n) || n >= kGroupNone) return err_at(Err::BAD_VALUE, "bad group id", it.value, it.value_pos);
  a->arg = static_cast<uint32_t>(n);
  return Status::Ok();
}
std::string format_group(const OfAction& a, const char*, const PortNames*) { return "group:" + std::to_string(a.arg); }

// ---- dispatch ---------------------------------------------------------------------------------

struct ActionRow {
  OfAct type;
  const char* keyword;
  Status (*parse)(const Item&, const ActCtx&, OfAction*);
  std::string (*format)(const OfAction&, const char*, const PortNames*);
};

const ActionRow kActions[] = {
#define DPU_OFACT(e, k, f) {OfAct::e, k, parse_##f, format_##f},
#include "dpu/of_actions.def"
#undef DPU_OFACT
};

const ActionRow& row_of(OfAct t) { return kActions[static_cast<int>(t)]; }

Status parse_one_action(const Item& it, const ActCtx& c, OfAction* a) {
  for (const ActionRow& r : kActions) {
    if (it.key != r.keyword) continue;
    a->type = r.type;
    return r.parse(it, c, a);
  }
  for (const char* u : kUnsupportedActions) {
    if (it.key == u)
      return err_at(Err::PARSE, "action '" + std::string(it.key) + "' is not supported by dpu", it.whole, it.pos);
  }
  // A bare port name or number is an output.
  if (!it.has_value) {
    a->type = OfAct::OUTPUT;
    Status s = parse_port_arg(it.key, it.pos, c.ports, &a->port);
    if (s.ok()) return s;
  }
  return err_at(Err::PARSE, "unknown action '" + std::string(it.key) + "'", it.whole, it.pos);
}

// Write actions with prerequisites need the match to guarantee them (as OVS's
// ofpacts_check for set_field/load/move); the OF1.0-style mod_* actions are
// instead skipped at translation time for packets that lack the header.
Status check_action_prereqs(const OfAction& a, const Item& it, const Match* m) {
  if (!m) return Status::Ok();
  if (a.type != OfAct::SET_FIELD && a.type != OfAct::LOAD && a.type != OfAct::MOVE) return Status::Ok();
  const FieldDef& f = field_def(a.field);
  if (!prereq_met(f.prereq, m->value, &m->mask))
    return err_at(Err::PARSE, std::string("writing ") + f.name + " needs the flow to match " + prereq_text(f.prereq),
                  it.whole, it.pos);
  if (a.type == OfAct::MOVE) {
    const FieldDef& sf = field_def(a.src_field);
    if (!prereq_met(sf.prereq, m->value, &m->mask))
      return err_at(Err::PARSE, std::string("reading ") + sf.name + " needs the flow to match " + prereq_text(sf.prereq),
                    it.whole, it.pos);
  }
  return Status::Ok();
}

}  // namespace

Status parse_action_list(std::string_view text, int base, const PortNames* ports, uint8_t table,
                         std::vector<OfAction>* out, const Match* match) {
  std::vector<Item> items;
  Status s = split_items(text, base, &items);
  if (!s.ok()) return s;
  const ActCtx ctx{ports, table};
  bool saw_goto = false, saw_drop = false;
  for (const Item& it : items) {
    OfAction a;
    s = parse_one_action(it, ctx, &a);
    if (!s.ok()) return s;
    s = check_action_prereqs(a, it, match);
    if (!s.ok()) return s;
    if (saw_goto) return err_at(Err::PARSE, "goto_table must be the last action", it.whole, it.pos);
    if (a.type == OfAct::GOTO_TABLE) saw_goto = true;
    if (saw_drop) return err_at(Err::PARSE, "drop(reason) must be the last action", it.whole, it.pos);
    if (a.type == OfAct::DROP) {
      if (a.arg == 0) {
        if (items.size() != 1) return err_at(Err::PARSE, "drop must be the only action", it.whole, it.pos);
        return Status::Ok();  // plain drop: empty action list
      }
      saw_drop = true;
    }
    a.pos = it.pos;
    out->push_back(a);
  }
  return Status::Ok();
}

}  // namespace ofp

Status parse_actions(std::string_view text, int base_pos, const PortNames* ports, uint8_t table,
                     std::vector<OfAction>* out) {
  return ofp::parse_action_list(text, base_pos, ports, table, out, nullptr);
}

std::string format_action(const OfAction& a, const PortNames* ports) {
  const ofp::ActionRow& r = ofp::row_of(a.type);
  return r.format(a, r.keyword, ports);
}

std::string format_actions(const std::vector<OfAction>& acts, const PortNames* ports) {
  if (acts.empty()) return "drop";
  std::string out;
  for (const OfAction& a : acts) {
    if (!out.empty()) out += ',';
    out += format_action(a, ports);
  }
  return out;
}

}  // namespace dpu
