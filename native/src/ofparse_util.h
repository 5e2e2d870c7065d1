// ofparse_util.h: the pieces of ovs-ofctl text parsing that the flow/group
// parser (ofparse.cc) and the per-action parsers (ofactions.cc) share.
//
// An Item is one comma/blank-separated element of a flow: `key`,
// `key=value`, `key:value` or `key(value)`, with its character positions in
// the line, so that every error can point at what is wrong.
//
// Pure functions; any thread. Internal to the core (not a public header).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "dpu/rule.h"
#include "dpu/status.h"

namespace dpu {
namespace ofp {

inline bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

struct Item {
  std::string_view key, value;
  int pos = 0, value_pos = 0;  // positions in the line
  bool has_value = false;
  bool parens = false;         // key(value)
  std::string_view whole;
};

// Splits `s` (which starts at line offset `base`) into items.
Status split_items(std::string_view s, int base, std::vector<Item>* out);
// An error pointing at token `tok` at `pos`.
Status err_at(Err code, const std::string& msg, std::string_view tok, int pos);
// Re-anchors an error from a value parser at the item's value.
Status at_value(Status s, const Item& it);
// A plain number (decimal or 0x hex) of at most `bits` bits.
bool parse_u(std::string_view s, int bits, uint64_t* out);
// NAME[], NAME[n], NAME[a..b]: *ofs and *n in the field's own bits. A few
// fields are wider or narrower in OVS's subfield notation than dpu keeps
// them (SubfieldView); their bits that dpu does not keep are refused, but
// for a load's destination (`outside` given): bits below the field (the TOS
// byte's ECN bits under nw_tos, which OVS ignores) and above it (which the
// value must leave 0) are cut off, outside[0] and outside[1] say how many.
Status parse_subfield(std::string_view s, int pos, const FieldDef** f, uint16_t* ofs, uint16_t* n,
                      uint16_t* outside = nullptr);
// OVS's width of a field in subfields: bit b of the subfield is bit b - shift
// of dpu's field. nw_tos (NXM_OF_IP_TOS) is the whole TOS byte, dpu keeps its
// six DSCP bits; in_port (NXM_OF_IN_PORT) is 16 bits, arp_op 16, ct_state 32.
struct SubfieldView {
  FieldId id;
  uint16_t bits, shift;
};
const SubfieldView* subfield_view(FieldId id);
// ASCII letters compared without case.
bool same_ignoring_case(std::string_view a, std::string_view b);
// A port name, number, or in_port (kPortInPort); OVS's other reserved port
// names (all, flood, normal, controller, local, table, any, none: in any case)
// are refused.
Status parse_port_arg(std::string_view s, int pos, const PortNames* ports, uint32_t* out);

// Parses an action list (the text after "actions="); `match`, when given, is
// the flow's match, against which write prerequisites are checked.
Status parse_action_list(std::string_view text, int base, const PortNames* ports, uint8_t table,
                         std::vector<OfAction>* out, const Match* match);

}  // namespace ofp
}  // namespace dpu
