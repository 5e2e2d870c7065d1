// ofparse.cc: ovs-ofctl flow/group text -> FlowSpec / Group (see ofparse.h).
//
// The text is split into items at commas and blanks outside parentheses; an
// item is `key`, `key=value`, `key:value` or `key(value)`. Everything after
// `actions=` is the action list, parsed action by action in ofactions.cc.
// Every error carries the offending token and its 0-based character position
// in the line.
//
// Pure functions; any thread.
#include "dpu/ofparse.h"

#include <cctype>
#include <cstring>

#include "ofparse_util.h"

namespace dpu {
namespace ofp {

// Splits `s` (which starts at line offset `base`) into items.
Status split_items(std::string_view s, int base, std::vector<Item>* out) {
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ',' || is_blank(s[i]))) i++;
    if (i >= s.size()) break;
    size_t start = i;
    int depth = 0;
    size_t key_end = std::string_view::npos;
    char kind = 0;
    for (; i < s.size(); i++) {
      char c = s[i];
      if (depth == 0 && (c == ',' || is_blank(c))) break;
      if (key_end == std::string_view::npos && (c == '=' || c == ':' || c == '(')) {
        key_end = i;
        kind = c;
      }
      if (c == '(') depth++;
      if (c == ')') {
        if (depth == 0)
          return Status::At(Err::PARSE, "unbalanced ')'", std::string(s.substr(start, i - start + 1)),
                            base + static_cast<int>(i));
        depth--;
      }
    }
    if (depth != 0)
      return Status::At(Err::PARSE, "unbalanced '('", std::string(s.substr(start, i - start)),
                        base + static_cast<int>(start));
    Item it;
    it.whole = s.substr(start, i - start);
    it.pos = base + static_cast<int>(start);
    if (key_end == std::string_view::npos) {
      it.key = it.whole;
    } else {
      it.key = s.substr(start, key_end - start);
      it.has_value = true;
      size_t vstart = key_end + 1;
      size_t vend = i;
      if (kind == '(') {
        it.parens = true;
        if (s[i - 1] != ')')
          return Status::At(Err::PARSE, "text after ')'", std::string(it.whole), it.pos);
        vend = i - 1;
      }
      it.value = s.substr(vstart, vend - vstart);
      it.value_pos = base + static_cast<int>(vstart);
    }
    out->push_back(it);
  }
  return Status::Ok();
}

Status err_at(Err code, const std::string& msg, std::string_view tok, int pos) {
  return Status::At(code, msg, std::string(tok), pos);
}

// Re-anchors an error from a value parser at the value's position.
Status at_value(Status s, const Item& it) {
  if (s.ok()) return s;
  s.token = std::string(it.value);
  s.position = it.value_pos;
  return s;
}

bool parse_u(std::string_view s, int bits, uint64_t* out) {
  u128 v;
  if (!parse_uint(s, bits, &v)) return false;
  *out = static_cast<uint64_t>(v);
  return true;
}

const SubfieldView* subfield_view(FieldId id) {
  static const SubfieldView kViews[] = {
      {FieldId::NW_TOS, 8, 2}, {FieldId::IN_PORT, 16, 0}, {FieldId::ARP_OP, 16, 0}, {FieldId::CT_STATE, 32, 0}};
  for (const SubfieldView& v : kViews)
    if (v.id == id) return &v;
  return nullptr;
}

bool same_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); i++)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

// NAME[], NAME[n], NAME[a..b]
Status parse_subfield(std::string_view s, int pos, const FieldDef** f, uint16_t* ofs, uint16_t* n,
                      uint16_t* outside) {
  size_t lb = s.find('[');
  if (lb == std::string_view::npos || s.back() != ']')
    return err_at(Err::PARSE, "expected a subfield like NXM_NX_REG0[] or reg0[0..15]", s, pos);
  std::string_view name = s.substr(0, lb);
  std::string_view range = s.substr(lb + 1, s.size() - lb - 2);
  const FieldDef* fd = field_by_name(name);
  if (!fd) return err_at(Err::UNKNOWN_FIELD, "unknown field '" + std::string(name) + "'", name, pos);
  const SubfieldView* view = subfield_view(fd->id);
  const uint64_t width = view ? view->bits : fd->n_bits, lo = view ? view->shift : 0, hi = lo + fd->n_bits - 1;
  uint64_t a = 0, b = width - 1;
  if (!range.empty()) {
    size_t dots = range.find("..");
    if (dots == std::string_view::npos) {
      if (!parse_u(range, 16, &a)) return err_at(Err::PARSE, "bad bit index", range, pos);
      b = a;
    } else if (!parse_u(range.substr(0, dots), 16, &a) || !parse_u(range.substr(dots + 2), 16, &b)) {
      return err_at(Err::PARSE, "bad bit range", range, pos);
    }
  }
  if (a > b || b >= width)
    return err_at(Err::BAD_VALUE,
                  "bits " + std::to_string(a) + ".." + std::to_string(b) + " are outside " + fd->name +
                      " (" + std::to_string(width) + " bits)",
                  s, pos);
  // dpu keeps bits lo..hi of the subfield's (SubfieldView).
  if (b < lo || a > hi || (!outside && (a < lo || b > hi))) {
    const uint64_t x = a < lo ? a : std::max(a, hi + 1), y = a < lo ? std::min(b, lo - 1) : b;
    return err_at(Err::BAD_VALUE,
                  "bits " + std::to_string(x) + ".." + std::to_string(y) + " of " + fd->name +
                      (a < lo ? " read as 0 (and are ignored when written)" : " are beyond what dpu keeps") +
                      "; dpu moves only bits " + std::to_string(lo) + ".." + std::to_string(hi),
                  s, pos);
  }
  const uint64_t below = a < lo ? lo - a : 0, above = b > hi ? b - hi : 0;
  *f = fd;
  *ofs = static_cast<uint16_t>(a + below - lo);
  *n = static_cast<uint16_t>(b - a + 1 - below - above);
  if (outside) {
    outside[0] = static_cast<uint16_t>(below);
    outside[1] = static_cast<uint16_t>(above);
  }
  return Status::Ok();
}

Status parse_port_arg(std::string_view s, int pos, const PortNames* ports, uint32_t* out) {
  if (same_ignoring_case(s, "in_port")) {
    *out = kPortInPort;
    return Status::Ok();
  }
  // OVS's other reserved ports, in any case (no port may take their names).
  for (const char* r : {"all", "flood"})
    if (same_ignoring_case(s, r))
      return err_at(Err::PARSE, "the reserved port " + std::string(s) + " is not an output port here: use the action " + r,
                    s, pos);
  for (const char* r : {"normal", "controller", "local", "table", "any", "none"})
    if (same_ignoring_case(s, r))
      return err_at(Err::PARSE, "OVS's reserved port " + std::string(s) + " is not supported by dpu", s, pos);
  uint64_t n;
  if (parse_u(s, 32, &n) && n > 0) {
    if (ports && ports->port_name(static_cast<uint32_t>(n)).empty())
      return err_at(Err::UNKNOWN_PORT, "unknown port " + std::string(s) + " (no port has that number)", s, pos);
    *out = static_cast<uint32_t>(n);
    return Status::Ok();
  }
  uint32_t p = ports ? ports->port_number(s) : 0;
  if (!p) return err_at(Err::UNKNOWN_PORT, "unknown port '" + std::string(s) + "'", s, pos);
  *out = p;
  return Status::Ok();
}
}  // namespace ofp

using namespace ofp;

namespace {

// Sets a field in a match, refusing contradictions with what is already there.
Status match_set(Match& m, const FieldDef& f, u128 value, u128 mask, const Item& it) {
  u128 old_mask = field_get(m.mask, f);
  u128 old_val = field_get(m.value, f);
  u128 both = old_mask & mask;
  if ((old_val & both) != (value & both))
    return err_at(Err::PARSE, std::string(f.name) + " contradicts an earlier field or protocol in this flow",
                  it.whole, it.pos);
  field_set_masked(m.value, f, value & mask, mask);
  field_set_masked(m.mask, f, mask | old_mask, mask | old_mask);
  return Status::Ok();
}

struct Shorthand {
  const char* name;
  uint16_t dl_type;
  int nw_proto;  // -1: none
};
const Shorthand kShorthands[] = {
    {"ip", kEthIp, -1},        {"ipv6", kEthIpv6, -1},       {"arp", kEthArp, -1},
    {"tcp", kEthIp, kIpTcp},   {"udp", kEthIp, kIpUdp},      {"icmp", kEthIp, kIpIcmp},
    {"sctp", kEthIp, kIpSctp}, {"tcp6", kEthIpv6, kIpTcp},   {"udp6", kEthIpv6, kIpUdp},
    {"icmp6", kEthIpv6, kIpIcmpv6}, {"sctp6", kEthIpv6, kIpSctp},
};

}  // namespace

// Finds "actions=" (or "action=") at an item boundary.
static size_t find_actions(std::string_view s, size_t* value_start) {
  for (const char* kw : {"actions=", "action=", "actions:"}) {
    size_t n = std::strlen(kw);
    for (size_t p = s.find(kw); p != std::string_view::npos; p = s.find(kw, p + 1)) {
      if (p == 0 || s[p - 1] == ',' || is_blank(s[p - 1])) {
        *value_start = p + n;
        return p;
      }
    }
  }
  return std::string_view::npos;
}

struct NamedField {
  const FieldDef* f;
  const Item* it;
};

// A flow's own attributes, not match fields (table, priority, cookie, statistics, timeouts,
// out_port/out_group selectors); *done: the item was one of them.
static Status parse_flow_attr(const Item& it, FlowCmd cmd, const PortNames* ports, FlowSpec* out, bool* done) {
  std::string_view k = it.key;
  Status s = Status::Ok();
  auto num = [&](int bits, uint64_t* v) -> Status {
    if (!it.has_value || !parse_u(it.value, bits, v))
      return err_at(Err::BAD_VALUE, std::string(k) + " needs a number of at most " + std::to_string(bits) + " bits",
                    it.whole, it.pos);
    return Status::Ok();
  };
  *done = true;
  if (k == "table") {
    uint64_t t;
    if (it.value == "all" || it.value == "255") {
      if (cmd == FlowCmd::ADD || cmd == FlowCmd::MODIFY)
        return err_at(Err::UNKNOWN_TABLE, "a flow must name one table (0..254)", it.whole, it.pos);
      return Status::Ok();
    }
    if (!it.has_value || !parse_u(it.value, 32, &t) || t >= kNumTables)
      return err_at(Err::UNKNOWN_TABLE, "table '" + std::string(it.value) + "' out of range (0..254)",
                    it.whole, it.pos);
    out->has_table = true;
    out->table = static_cast<uint8_t>(t);
    return Status::Ok();
  }
  if (k == "priority") {
    uint64_t p;
    s = num(16, &p);
    if (!s.ok()) return s;
    out->has_priority = true;
    out->priority = static_cast<uint16_t>(p);
    return Status::Ok();
  }
  if (k == "cookie") {
    std::string_view v = it.value, mk;
    size_t slash = v.find('/');
    if (slash != std::string_view::npos) {
      mk = v.substr(slash + 1);
      v = v.substr(0, slash);
    }
    // As ovs-ofctl: cookie=V/M selects flows (M -1: exactly V); cookie=V
    // sets the cookie of the flow added or of the flows modified.
    uint64_t c, cm = ~0ull;
    if (!it.has_value || !parse_u(v, 64, &c) || (!mk.empty() && mk != "-1" && !parse_u(mk, 64, &cm)))
      return err_at(Err::BAD_VALUE, "cookie needs a 64-bit number", it.whole, it.pos);
    if (!mk.empty() && cmd == FlowCmd::ADD)
      return err_at(Err::PARSE, "a cookie mask only selects flows (del/mod/dump)", it.whole, it.pos);
    if (mk.empty() && (cmd == FlowCmd::DELETE || cmd == FlowCmd::MATCH_ONLY))
      return err_at(Err::PARSE, "cookie=V without a mask sets a cookie; to select flows give cookie=V/MASK "
                                "(cookie=V/-1: exactly V)", it.whole, it.pos);
    if (mk.empty() && cmd == FlowCmd::MODIFY) {
      out->set_cookie = true;
      out->new_cookie = c;
      return Status::Ok();
    }
    out->cookie = c;
    out->cookie_mask = mk.empty() ? 0 : cm;
    return Status::Ok();
  }
  if (k == "duration" || k == "n_packets" || k == "n_bytes" || k == "idle_age" || k == "hard_age") {
    // Statistics, as dump-flows prints them: ignored (as ovs-ofctl does),
    // so that dump-flows output reads back as a flows file.
    return Status::Ok();
  }
  if (k == "idle_timeout" || k == "hard_timeout") {
    uint64_t t;
    s = num(16, &t);
    if (!s.ok()) return s;
    if (t != 0)
      return err_at(Err::PARSE, std::string(k) + ": flow expiry is not supported (only 0)", it.whole, it.pos);
    return Status::Ok();
  }
  if (k == "out_port") {
    if (cmd == FlowCmd::ADD) return err_at(Err::PARSE, "out_port only selects flows", it.whole, it.pos);
    s = parse_port_arg(it.value, it.value_pos, ports, &out->out_port);
    if (!s.ok()) return s;
    return Status::Ok();
  }
  if (k == "out_group") {
    uint64_t g;
    s = num(32, &g);
    if (!s.ok()) return s;
    out->out_group = static_cast<uint32_t>(g);
    return Status::Ok();
  }
  *done = false;
  return Status::Ok();
}

// A match field (or a shorthand such as tcp) into m; named: the fields given, for the
// prerequisite check.
static Status parse_match_item(const Item& it, const PortNames* ports, Match& m, std::vector<NamedField>* named) {
  std::string_view k = it.key;
  Status s = Status::Ok();
  bool shorthand = false;
  for (const Shorthand& sh : kShorthands) {
    if (k == sh.name && !it.has_value) {
      s = match_set(m, field_def(FieldId::DL_TYPE), sh.dl_type, 0xffff, it);
      if (!s.ok()) return s;
      if (sh.nw_proto >= 0) {
        s = match_set(m, field_def(FieldId::NW_PROTO), static_cast<u128>(sh.nw_proto), 0xff, it);
        if (!s.ok()) return s;
      }
      shorthand = true;
    }
  }
  if (shorthand) return Status::Ok();
  const FieldDef* f = field_by_name(k);
  if (!f) {
    if (k == "recirc_id")
      return err_at(Err::UNKNOWN_FIELD, "recirc_id is datapath-internal and cannot be matched", it.key, it.pos);
    return err_at(Err::UNKNOWN_FIELD, "unknown field '" + std::string(k) + "'", it.key, it.pos);
  }
  if (!it.has_value || it.value.empty())
    return err_at(Err::PARSE, std::string(k) + " needs a value (" + std::string(k) + "=...)", it.whole, it.pos);
  u128 v, mk;
  if (f->id == FieldId::DL_VLAN) {
    uint64_t vid;
    if (!parse_u(it.value, 16, &vid) || (vid > 4095 && vid != 0xffff))
      return err_at(Err::BAD_VALUE, "dl_vlan must be 0..4095, or 0xffff for no VLAN", it.value, it.value_pos);
    const FieldDef& tci = field_def(FieldId::VLAN_TCI);
    if (vid == 0xffff) s = match_set(m, tci, 0, 0xffff, it);
    else s = match_set(m, tci, kVlanPresent | vid, kVlanPresent | 0x0fff, it);
    if (!s.ok()) return s;
    named->push_back({f, &it});
    return Status::Ok();
  }
  if (f->id == FieldId::DL_VLAN_PCP) {
    uint64_t pcp;
    if (!parse_u(it.value, 3, &pcp))
      return err_at(Err::BAD_VALUE, "dl_vlan_pcp must be 0..7", it.value, it.value_pos);
    s = match_set(m, field_def(FieldId::VLAN_TCI), kVlanPresent | (pcp << 13), kVlanPresent | 0xe000, it);
    if (!s.ok()) return s;
    named->push_back({f, &it});
    return Status::Ok();
  }
  s = parse_field_value(*f, it.value, ports, &v, &mk, false);
  if (!s.ok()) return at_value(s, it);
  s = match_set(m, *f, v, mk, it);
  if (!s.ok()) return s;
  named->push_back({f, &it});
  return Status::Ok();
}

// Prerequisites (as ovs-ofctl: a field needs its protocol in the same flow).
static Status check_prereqs(const std::vector<NamedField>& named, Match& m) {
  for (const NamedField& n : named) {
    if (!prereq_met(n.f->prereq, m.value, &m.mask))
      return err_at(Err::PARSE,
                    std::string(n.f->name) + " requires the flow to match " + prereq_text(n.f->prereq) +
                        " first (e.g. add '" +
                        (n.f->prereq == Prereq::ARP ? "arp" : n.f->prereq == Prereq::IPV6 ? "ipv6"
                         : n.f->prereq == Prereq::TCP ? "tcp" : n.f->prereq == Prereq::UDP ? "udp"
                         : n.f->prereq == Prereq::ICMP ? "icmp" : n.f->prereq == Prereq::ICMPV6 ? "icmp6"
                         : n.f->prereq == Prereq::L4 ? "tcp" : n.f->prereq == Prereq::VLAN ? "dl_vlan=..."
                         : n.f->prereq == Prereq::CT ? "ct_state=+trk+est" : "ip") +
                        "')",
                    n.it->whole, n.it->pos);
  }
  return Status::Ok();
}

Status parse_flow(std::string_view text, FlowCmd cmd, const PortNames* ports, FlowSpec* out) {
  *out = FlowSpec();
  size_t act_start = 0;
  size_t act_kw = find_actions(text, &act_start);
  std::string_view match_text = act_kw == std::string_view::npos ? text : text.substr(0, act_kw);
  std::vector<Item> items;
  Status s = split_items(match_text, 0, &items);
  if (!s.ok()) return s;

  std::vector<NamedField> named;
  Match& m = out->match;
  for (const Item& it : items) {
    bool done = false;
    s = parse_flow_attr(it, cmd, ports, out, &done);
    if (!s.ok()) return s;
    if (done) continue;
    s = parse_match_item(it, ports, m, &named);
    if (!s.ok()) return s;
  }
  s = check_prereqs(named, m);
  if (!s.ok()) return s;

  if (act_kw == std::string_view::npos) {
    if (cmd == FlowCmd::ADD || cmd == FlowCmd::MODIFY)
      return Status::At(Err::PARSE, "must specify actions (actions=...; actions=drop to drop)", "", static_cast<int>(text.size()));
    return Status::Ok();
  }
  if (cmd == FlowCmd::DELETE || cmd == FlowCmd::MATCH_ONLY)
    return Status::At(Err::PARSE, "actions are not allowed when selecting flows", "actions", static_cast<int>(act_kw));
  out->has_actions = true;
  s = parse_action_list(text.substr(act_start), static_cast<int>(act_start), ports, out->table, &out->actions,
                         &out->match);
  if (!s.ok()) return s;
  if (cmd == FlowCmd::MODIFY && !out->has_table) {
    // The new actions go to rules in every table: a goto_table must be checked
    // against the table it will run in.
    for (const OfAction& a : out->actions)
      if (a.type == OfAct::GOTO_TABLE)
        return Status::At(Err::PARSE, "goto_table in a modification needs table= (it must go to a later table)",
                          "goto_table:" + std::to_string(a.arg), a.pos);
  }
  return Status::Ok();
}

Status parse_group(std::string_view text, bool need_buckets, const PortNames* ports, Group* g) {
  // Split at "bucket=" boundaries.
  std::vector<std::pair<size_t, size_t>> parts;  // [start, end) of each bucket body
  size_t first = std::string_view::npos;
  for (size_t p = text.find("bucket="); p != std::string_view::npos; p = text.find("bucket=", p + 1)) {
    if (p == 0 || text[p - 1] == ',' || is_blank(text[p - 1])) {
      if (first == std::string_view::npos) first = p;
      if (!parts.empty()) parts.back().second = p;
      parts.push_back({p + 7, text.size()});
    }
  }
  std::string_view head = first == std::string_view::npos ? text : text.substr(0, first);
  std::vector<Item> items;
  Status s = split_items(head, 0, &items);
  if (!s.ok()) return s;
  bool has_id = false, has_type = false;
  for (const Item& it : items) {
    if (it.key == "group_id") {
      uint64_t id;
      if (!parse_u(it.value, 32, &id) || id >= kGroupNone)
        return err_at(Err::BAD_VALUE, "group_id needs a number below 0xffffffff", it.whole, it.pos);
      g->group_id = static_cast<uint32_t>(id);
      has_id = true;
    } else if (it.key == "type") {
      if (it.value == "all") g->type = GroupType::ALL;
      else if (it.value == "select") g->type = GroupType::SELECT;
      else if (it.value == "indirect") g->type = GroupType::INDIRECT;
      else
        return err_at(Err::BAD_VALUE, "group type must be all, select or indirect", it.value, it.value_pos);
      has_type = true;
    } else if (it.key == "selection_method") {
      if (it.value != "hash")
        return err_at(Err::BAD_VALUE, "only selection_method=hash (the 5-tuple hash) is supported", it.value,
                      it.value_pos);
    } else {
      return err_at(Err::PARSE, "unknown group property '" + std::string(it.key) + "'", it.whole, it.pos);
    }
  }
  if (!has_id) return Status::At(Err::PARSE, "group_id= is required", "", 0);
  if (!need_buckets) return Status::Ok();
  if (!has_type) return Status::At(Err::PARSE, "type= is required (all, select, indirect)", "", 0);
  uint32_t next_id = 0;
  for (auto& part : parts) {
    std::string_view body = text.substr(part.first, part.second - part.first);
    int base = static_cast<int>(part.first);
    Bucket b;
    b.bucket_id = next_id++;
    // Leading bucket properties, then the actions (with or without "actions=").
    size_t act_start = 0;
    size_t act_kw = find_actions(body, &act_start);
    std::string_view props = act_kw == std::string_view::npos ? std::string_view() : body.substr(0, act_kw);
    std::string_view acts = act_kw == std::string_view::npos ? body : body.substr(act_start);
    int acts_base = base + static_cast<int>(act_kw == std::string_view::npos ? 0 : act_start);
    if (act_kw == std::string_view::npos) {
      // weight:N / bucket_id:N may lead the list of actions.
      std::vector<Item> its;
      s = split_items(body, base, &its);
      if (!s.ok()) return s;
      size_t skip = 0;
      for (const Item& it : its) {
        if (it.key != "weight" && it.key != "bucket_id" && it.key != "watch_port" && it.key != "watch_group")
          break;
        skip = static_cast<size_t>(it.pos - base) + it.whole.size();
      }
      props = body.substr(0, skip);
      acts = body.substr(skip);
      acts_base = base + static_cast<int>(skip);
    }
    std::vector<Item> its;
    s = split_items(props, base, &its);
    if (!s.ok()) return s;
    for (const Item& it : its) {
      uint64_t n;
      if (it.key == "weight") {
        if (!parse_u(it.value, 16, &n)) return err_at(Err::BAD_VALUE, "weight must be 0..65535", it.whole, it.pos);
        b.weight = static_cast<uint32_t>(n);
      } else if (it.key == "bucket_id") {
        if (!parse_u(it.value, 32, &n)) return err_at(Err::BAD_VALUE, "bad bucket_id", it.whole, it.pos);
        b.bucket_id = static_cast<uint32_t>(n);
        next_id = b.bucket_id + 1;
      } else if (it.key == "watch_port" || it.key == "watch_group") {
        continue;  // liveness is not modelled: every bucket is live
      } else {
        return err_at(Err::PARSE, "unknown bucket property '" + std::string(it.key) + "'", it.whole, it.pos);
      }
    }
    s = parse_action_list(acts, acts_base, ports, 0, &b.actions, nullptr);
    if (!s.ok()) return s;
    for (const OfAction& a : b.actions) {
      if (a.type == OfAct::GOTO_TABLE)
        return Status::At(Err::PARSE, "goto_table is not allowed in a group bucket", "goto_table", acts_base);
    }
    g->buckets.push_back(std::move(b));
  }
  if (g->type == GroupType::INDIRECT && g->buckets.size() != 1)
    return Status::At(Err::PARSE, "an indirect group has exactly one bucket", "", 0);
  g->total_weight = 0;
  for (const Bucket& b : g->buckets) g->total_weight += g->type == GroupType::SELECT ? b.weight : 0;
  if (g->type == GroupType::SELECT && !g->buckets.empty() && g->total_weight == 0)
    return Status::At(Err::BAD_VALUE, "a select group needs a bucket with a non-zero weight", "", 0);
  return Status::Ok();
}

// ---- drop reasons ------------------------------------------------------------
namespace {
struct DropInfo {
  const char* name;
  const char* help;
};
const DropInfo kDrops[] = {
#define DPU_DROP(e, n, h) {n, h},
#include "dpu/drop_reasons.def"
#undef DPU_DROP
};
}  // namespace

int drop_reason_by_name(std::string_view name) {
  for (int i = 0; i < drop_reason_count(); i++)
    if (name == kDrops[i].name) return i;
  return -1;
}
const char* drop_reason_name(int r) { return r >= 0 && r < drop_reason_count() ? kDrops[r].name : "?"; }
const char* drop_reason_help(int r) { return r >= 0 && r < drop_reason_count() ? kDrops[r].help : "?"; }
int drop_reason_count() { return static_cast<int>(sizeof(kDrops) / sizeof(kDrops[0])); }

}  // namespace dpu
