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
#include <algorithm>
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
  uint8_t table;         // table of the flow (goto_table must go further)
  bool ct_exec = false;  // inside ct(exec(...)): ct_mark and ct_label may be written
};

// OfAction::arg of a SET_FIELD written as mod_nw_ttl:V or mod_nw_ecn:V.
constexpr uint32_t kWrittenAsMod = 1;

// ct_mark and ct_label are written only by ct(commit, exec(...)).
bool ct_writable(const FieldDef& f, const ActCtx& c) {
  return c.ct_exec && (f.id == FieldId::CT_MARK || f.id == FieldId::CT_LABEL);
}
Status not_writable(const FieldDef& f, std::string_view tok, int pos) {
  if (f.id == FieldId::CT_MARK || f.id == FieldId::CT_LABEL)
    return err_at(Err::BAD_VALUE, std::string(f.name) + " is written only by ct(commit,exec(set_field:V->" + f.name + "))",
                  tok, pos);
  return err_at(Err::BAD_VALUE, std::string(f.name) + " cannot be written", tok, pos);
}

// Actions Open vSwitch has and dpu does not (yet): a clear error instead of
// "unknown action".
const char* const kUnsupportedActions[] = {
    "normal", "controller", "local", "nat", "meter", "learn", "enqueue", "set_queue",
    "clone", "conjunction", "exit", "multipath", "bundle", "bundle_load", "encap", "decap",
    "check_pkt_larger", "sample", "fin_timeout", "set_tunnel", "set_tunnel64", "pop_queue",
    "output_reg", "push_mpls", "pop_mpls", "dec_mpls_ttl", "set_mpls_label",
    "trunc", "stack_push", "stack_pop", "delete_field"};

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
  const SubfieldView* view = subfield_view(id);
  if (view) ofs = static_cast<uint16_t>(ofs + view->shift);  // in OVS's bits of the field
  if (ofs == 0 && n == (view ? view->bits : f.n_bits)) return s + "[]";
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
  if (!f->writable && !ct_writable(*f, c)) return not_writable(*f, dst, dst_pos);
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
  // Written as mod_nw_ttl/mod_nw_ecn, which need no ip in the match (the
  // set_field spelling would): dumped the same way, so that it reads back.
  if (a.arg == kWrittenAsMod) return std::string(a.field == FieldId::NW_TTL ? "mod_nw_ttl:" : "mod_nw_ecn:") +
                                     format_field_value(f, a.value, a.mask, ports);
  return "set_field:" + format_field_value(f, a.value, a.mask, ports) + "->" + f.name;
}

// load/move: "SRC->DST[a..b]" with a writable destination subfield.
Status parse_to_subfield(const Item& it, const ActCtx& c, OfAction* a, std::string_view* src, int* src_pos,
                         uint16_t* outside = nullptr) {
  std::string_view dst;
  int dst_pos;
  Status s = split_arrow(it, src, &dst, src_pos, &dst_pos);
  if (!s.ok()) return s;
  const FieldDef* df;
  s = parse_subfield(dst, dst_pos, &df, &a->ofs, &a->n_bits, outside);
  if (!s.ok()) return s;
  if (!df->writable && !ct_writable(*df, c)) return not_writable(*df, dst, dst_pos);
  a->field = df->id;
  return Status::Ok();
}

Status parse_load(const Item& it, const ActCtx& c, OfAction* a) {
  std::string_view src;
  int src_pos;
  // The subfield's bits dpu does not keep (parse_subfield): those below are
  // ignored, as OVS ignores nw_tos's ECN bits; those above must be 0.
  uint16_t outside[2] = {0, 0};
  Status s = parse_to_subfield(it, c, a, &src, &src_pos, outside);
  if (!s.ok()) return s;
  u128 val;
  const int width = a->n_bits + outside[0] + outside[1];
  if (!parse_uint(src, width, &val) || (outside[1] && (val >> (outside[0] + a->n_bits)) != 0))
    return err_at(Err::BAD_VALUE, "'" + std::string(src) + "' does not fit in " +
                                      std::to_string(outside[1] ? a->n_bits + outside[0] : width) + " bits",
                  src, src_pos);
  a->value = val >> outside[0];
  return Status::Ok();
}
std::string format_load(const OfAction& a, const char*, const PortNames*) {
  // A load of the whole field is written as OVS writes it: NAME[] and the
  // value in the subfield's bits (nw_tos: the TOS byte, DSCP << 2).
  const FieldDef& f = field_def(a.field);
  const SubfieldView* view = subfield_view(a.field);
  if (view && a.ofs == 0 && a.n_bits == f.n_bits)
    return "load:" + hex_u128(a.value << view->shift) + "->" + (f.nxm ? f.nxm : f.name) + "[]";
  return "load:" + hex_u128(a.value) + "->" + subfield_text(a.field, a.ofs, a.n_bits);
}

Status parse_move(const Item& it, const ActCtx& c, OfAction* a) {
  std::string_view src;
  int src_pos;
  Status s = parse_to_subfield(it, c, a, &src, &src_pos);
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

// ---- conntrack ------------------------------------------------------------------------------

Status parse_action_list_ctx(std::string_view text, int base, const ActCtx& ctx, std::vector<OfAction>* out,
                             const Match* match);

// A=B[-C] range of IPv4 addresses or ports.
bool parse_ipv4_text(std::string_view s, uint32_t* out) {
  u128 v, m;
  if (!parse_field_value(field_def(FieldId::NW_SRC), s, nullptr, &v, &m, false).ok() || s.find('/') != s.npos)
    return false;
  *out = static_cast<uint32_t>(v);
  return true;
}

// nat(src|dst[=A[-B][:P[-Q]]][,persistent][,hash][,random])
Status parse_nat(const Item& it, NatRange* r) {
  if (!it.parens) {
    if (it.has_value) return err_at(Err::PARSE, "nat takes nat or nat(src=...)/nat(dst=...)", it.whole, it.pos);
    return Status::Ok();
  }
  std::vector<Item> sub;
  Status s = split_items(it.value, it.value_pos, &sub);
  if (!s.ok()) return s;
  for (const Item& x : sub) {
    if (x.key == "src" || x.key == "dst") {
      if (r->type) return err_at(Err::PARSE, "nat takes one of src or dst", x.whole, x.pos);
      r->type = x.key == "src" ? 1 : 2;
      if (!x.has_value) continue;
      std::string_view v = x.value;
      if (v.find('[') != v.npos || std::count(v.begin(), v.end(), ':') > 1)
        return err_at(Err::BAD_VALUE, "NAT of IPv6 addresses is not supported (no NAT66)", v, x.value_pos);
      std::string_view addrs = v, ports;
      size_t colon = v.find(':');
      if (colon != v.npos) {
        addrs = v.substr(0, colon);
        ports = v.substr(colon + 1);
      }
      size_t dash = addrs.find('-');
      std::string_view a1 = addrs.substr(0, dash), a2 = dash == addrs.npos ? a1 : addrs.substr(dash + 1);
      if (!parse_ipv4_text(a1, &r->addr_min) || !parse_ipv4_text(a2, &r->addr_max))
        return err_at(Err::BAD_VALUE, "nat: '" + std::string(addrs) + "' is not an IPv4 address or range A-B", addrs,
                      x.value_pos);
      if (r->addr_min > r->addr_max)
        return err_at(Err::BAD_VALUE, "nat: address range " + std::string(addrs) + " is reversed", addrs, x.value_pos);
      if (colon != v.npos) {
        size_t pd = ports.find('-');
        uint64_t p1, p2;
        if (!parse_u(ports.substr(0, pd), 16, &p1) || !parse_u(pd == ports.npos ? ports.substr(0) : ports.substr(pd + 1), 16, &p2) ||
            p1 == 0 || p2 == 0)
          return err_at(Err::BAD_VALUE, "nat: '" + std::string(ports) + "' is not a port or range P-Q (1..65535)", ports,
                        x.value_pos + static_cast<int>(colon) + 1);
        if (p1 > p2)
          return err_at(Err::BAD_VALUE, "nat: port range " + std::string(ports) + " is reversed", ports,
                        x.value_pos + static_cast<int>(colon) + 1);
        r->port_min = static_cast<uint16_t>(p1);
        r->port_max = static_cast<uint16_t>(p2);
      }
    } else if (x.key == "persistent" && !x.has_value) {
      r->persistent = true;
    } else if (x.key == "hash" && !x.has_value) {
      r->hash = true;
    } else if (x.key == "random" && !x.has_value) {
      r->random = true;
    } else {
      return err_at(Err::PARSE, "nat(): unknown argument '" + std::string(x.key) + "'", x.whole, x.pos);
    }
  }
  if (r->hash && r->random) return err_at(Err::PARSE, "nat(): hash and random exclude each other", it.whole, it.pos);
  if (!r->type && (r->persistent || r->hash || r->random))
    return err_at(Err::PARSE, "nat(): flags need src or dst", it.whole, it.pos);
  return Status::Ok();
}

Status parse_ct(const Item& it, const ActCtx& c, OfAction* a) {
  auto ct = std::make_shared<CtAction>();
  std::vector<Item> sub;
  if (it.has_value && !it.parens) return err_at(Err::PARSE, "ct takes ct(...) or ct", it.whole, it.pos);
  Status s = split_items(it.value, it.value_pos, &sub);
  if (!s.ok()) return s;
  bool seen_zone = false, seen_table = false, seen_exec = false;
  for (const Item& x : sub) {
    if (x.key == "commit" && !x.has_value) {
      ct->commit = true;
    } else if (x.key == "force" && !x.has_value) {
      ct->force = true;
    } else if (x.key == "zone" && x.has_value && !x.parens && !seen_zone) {
      seen_zone = true;
      uint64_t z;
      if (parse_u(x.value, 16, &z)) {
        ct->zone = static_cast<uint16_t>(z);
        continue;
      }
      const FieldDef* f;
      s = parse_subfield(x.value, x.value_pos, &f, &ct->zone_ofs, &ct->zone_bits);
      if (!s.ok()) {
        s.message = "ct zone must be a number 0..65535 or a subfield like NXM_NX_REG0[0..15]: " + s.message;
        return s;
      }
      if (ct->zone_bits > 16)
        return err_at(Err::BAD_VALUE, "ct zone subfield is " + std::to_string(ct->zone_bits) + " bits, at most 16",
                      x.value, x.value_pos);
      ct->zone_from_field = true;
      ct->zone_field = f->id;
    } else if (x.key == "table" && x.has_value && !seen_table) {
      seen_table = true;
      uint64_t t;
      if (!parse_u(x.value, 16, &t) || t >= kNumTables)
        return err_at(Err::UNKNOWN_TABLE, "table " + std::string(x.value) + " out of range (0..254)", x.value,
                      x.value_pos);
      ct->table = static_cast<int>(t);
    } else if (x.key == "nat" && !ct->nat) {
      ct->nat = true;
      s = parse_nat(x, &ct->range);
      if (!s.ok()) return s;
    } else if (x.key == "exec" && x.parens && !seen_exec) {
      seen_exec = true;
      ActCtx inner = c;
      inner.ct_exec = true;
      s = parse_action_list_ctx(x.value, x.value_pos, inner, &ct->exec, nullptr);
      if (!s.ok()) return s;
      std::vector<Item> exec_items;
      split_items(x.value, x.value_pos, &exec_items);
      for (const OfAction& e : ct->exec) {
        bool ok = (e.type == OfAct::SET_FIELD || e.type == OfAct::LOAD) &&
                  (e.field == FieldId::CT_MARK || e.field == FieldId::CT_LABEL);
        if (ok) continue;
        std::string_view tok = x.whole;
        for (const Item& ei : exec_items)
          if (ei.pos == e.pos) tok = ei.whole;
        return err_at(Err::PARSE, "ct exec() takes only set_field or load to ct_mark or ct_label", tok, e.pos);
      }
    } else if (x.key == "alg") {
      return err_at(Err::PARSE, "ct alg= (FTP/TFTP helpers) is not supported by dpu", x.whole, x.pos);
    } else {
      return err_at(Err::PARSE, "ct(): unknown or repeated argument '" + std::string(x.key) + "'", x.whole, x.pos);
    }
  }
  if ((ct->force || !ct->exec.empty()) && !ct->commit)
    return err_at(Err::PARSE, std::string(ct->force ? "force" : "exec") + " needs commit (ct(commit,...))", it.whole,
                  it.pos);
  a->ct = ct;
  return Status::Ok();
}

std::string format_nat(const NatRange& r) {
  std::string s = "nat";
  if (!r.type) return s;
  s += r.type == 1 ? "(src" : "(dst";
  if (r.addr_min) {
    const FieldDef& f = field_def(FieldId::NW_SRC);
    s += "=" + format_field_value(f, r.addr_min, ~static_cast<u128>(0), nullptr);
    if (r.addr_max != r.addr_min) s += "-" + format_field_value(f, r.addr_max, ~static_cast<u128>(0), nullptr);
    if (r.port_min) {
      s += ":" + std::to_string(r.port_min);
      if (r.port_max != r.port_min) s += "-" + std::to_string(r.port_max);
    }
  }
  if (r.persistent) s += ",persistent";
  if (r.hash) s += ",hash";
  if (r.random) s += ",random";
  return s + ")";
}

std::string format_ct(const OfAction& a, const char*, const PortNames* ports) {
  const CtAction& c = *a.ct;
  std::vector<std::string> parts;
  if (c.commit) parts.push_back("commit");
  if (c.force) parts.push_back("force");
  if (c.table >= 0) parts.push_back("table=" + std::to_string(c.table));
  if (c.zone_from_field) parts.push_back("zone=" + subfield_text(c.zone_field, c.zone_ofs, c.zone_bits));
  else if (c.zone) parts.push_back("zone=" + std::to_string(c.zone));
  if (c.nat) parts.push_back(format_nat(c.range));
  if (!c.exec.empty()) {
    std::string e;
    for (const OfAction& x : c.exec) e += (e.empty() ? "" : ",") + format_action(x, ports);
    parts.push_back("exec(" + e + ")");
  }
  std::string s = "ct(";
  for (size_t i = 0; i < parts.size(); i++) s += (i ? "," : "") + parts[i];
  return s + ")";
}

Status parse_ct_clear(const Item& it, const ActCtx&, OfAction*) { return no_value(it); }
std::string format_ct_clear(const OfAction&, const char* k, const PortNames*) { return k; }

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

// ovs-ofctl's mod_nw_ttl:N and mod_nw_ecn:N, read as the set_field they are
// (skipped at translation time for packets that are not IP, as mod_nw_tos).
Status parse_mod_nw_alias(const Item& it, FieldId id, OfAction* a) {
  Status s = need_value(it);
  if (!s.ok()) return s;
  a->type = OfAct::SET_FIELD;
  a->field = id;
  const FieldDef& f = field_def(id);
  u128 m;
  s = parse_field_value(f, it.value, nullptr, &a->value, &m, false);
  if (!s.ok()) return at_value(s, it);
  a->mask = field_all_ones(f);
  a->arg = kWrittenAsMod;
  return Status::Ok();
}

Status parse_one_action(const Item& it, const ActCtx& c, OfAction* a) {
  // Refused here, before its own list is parsed: a ct nested in exec() would
  // recurse once per level of the text (a stack overflow at a few thousand).
  if (c.ct_exec && it.key == "ct")
    return err_at(Err::PARSE, "ct exec() takes only set_field or load to ct_mark or ct_label", it.whole, it.pos);
  for (const ActionRow& r : kActions) {
    if (it.key != r.keyword) continue;
    a->type = r.type;
    return r.parse(it, c, a);
  }
  if (it.key == "mod_nw_ttl") return parse_mod_nw_alias(it, FieldId::NW_TTL, a);
  if (it.key == "mod_nw_ecn") return parse_mod_nw_alias(it, FieldId::NW_ECN, a);
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
// ofpacts_check for set_field/load/move), as the actions before them left it:
// after push_vlan (or mod_vlan_*) there is a tag, after pop_vlan none is
// known. The OF1.0-style mod_* actions are instead skipped at translation time
// for packets that lack the header.
void track_match(const OfAction& a, Match* m) {
  if (a.type == OfAct::PUSH_VLAN || a.type == OfAct::MOD_VLAN_VID || a.type == OfAct::MOD_VLAN_PCP) {
    m->value.vlan_tci |= be16(kVlanPresent);
    m->mask.vlan_tci |= be16(kVlanPresent);
  } else if (a.type == OfAct::POP_VLAN || a.type == OfAct::STRIP_VLAN) {
    m->value.vlan_tci = 0;
  }
}

// (In an action nw_src/nw_dst are IPv4's addresses, OVS's MFF_IPV4_SRC/DST; a
// match also reads them as ARP's.)
Prereq action_prereq(FieldId id) {
  return id == FieldId::NW_SRC || id == FieldId::NW_DST ? Prereq::IPV4 : field_def(id).prereq;
}

Status check_action_prereqs(const OfAction& a, const Item& it, const Match* m) {
  if (!m) return Status::Ok();
  if (a.type != OfAct::SET_FIELD && a.type != OfAct::LOAD && a.type != OfAct::MOVE) return Status::Ok();
  const Prereq p = action_prereq(a.field);
  if (!prereq_met(p, m->value, &m->mask))
    return err_at(Err::PARSE,
                  std::string("writing ") + field_def(a.field).name + " needs the flow to match " + prereq_text(p),
                  it.whole, it.pos);
  if (a.type == OfAct::MOVE) {
    const Prereq sp = action_prereq(a.src_field);
    if (!prereq_met(sp, m->value, &m->mask))
      return err_at(Err::PARSE,
                    std::string("reading ") + field_def(a.src_field).name + " needs the flow to match " +
                        prereq_text(sp),
                    it.whole, it.pos);
  }
  return Status::Ok();
}

Status parse_action_list_ctx(std::string_view text, int base, const ActCtx& ctx, std::vector<OfAction>* out,
                             const Match* match) {
  std::vector<Item> items;
  Status s = split_items(text, base, &items);
  if (!s.ok()) return s;
  bool saw_goto = false, saw_drop = false;
  Match cur;
  if (match) cur = *match;
  for (const Item& it : items) {
    OfAction a;
    s = parse_one_action(it, ctx, &a);
    if (!s.ok()) return s;
    if (it.key != "mod_nw_ttl" && it.key != "mod_nw_ecn") s = check_action_prereqs(a, it, match ? &cur : nullptr);
    if (!s.ok()) return s;
    if (match) track_match(a, &cur);
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

}  // namespace

Status parse_action_list(std::string_view text, int base, const PortNames* ports, uint8_t table,
                         std::vector<OfAction>* out, const Match* match) {
  return parse_action_list_ctx(text, base, ActCtx{ports, table}, out, match);
}

}  // namespace ofp

Status parse_actions(std::string_view text, int base_pos, const PortNames* ports, uint8_t table,
                     std::vector<OfAction>* out) {
  return ofp::parse_action_list(text, base_pos, ports, table, out, nullptr);
}

std::string format_nat_range(const NatRange& r) { return ofp::format_nat(r); }

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
