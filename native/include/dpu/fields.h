// fields.h: the match-field registry (the analogue of OVS meta-flow).
//
// Every field a flow can match or an action can write is one FieldDef: where
// it lives in a Flow (byte offset and width of its container), which bits of
// the container it occupies, its byte order, whether it may be masked or
// written, the prerequisites a match needs before it may name the field (nw_src
// needs ip or arp, tp_dst needs tcp/udp/sctp...), and how its values are
// written (decimal, hex, MAC, IPv4, IPv6, port name...).
//
// Readers: the flow parser and formatter (ofparse.cc, offormat.cc), the slow
// path (xlate.cc: subfield load/move, prerequisite checks), the megaflow
// printer. All functions here are pure; the table is immutable after static
// initialisation and safe to read from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "dpu/flow_key.h"
#include "dpu/status.h"

namespace dpu {

using u128 = unsigned __int128;

enum class FieldId : uint8_t {
  IN_PORT, RECIRC_ID, TUN_ID, TUN_SRC, TUN_DST, TUN_IPV6_SRC, TUN_IPV6_DST,
  CT_STATE, CT_ZONE, CT_MARK, CT_LABEL, CT_NW_PROTO, CT_NW_SRC, CT_NW_DST, CT_IPV6_SRC, CT_IPV6_DST,
  CT_TP_SRC, CT_TP_DST,
  DL_DST, DL_SRC, DL_TYPE, VLAN_TCI, DL_VLAN, DL_VLAN_PCP, VLAN_VID, VLAN_PCP,
  NW_SRC, NW_DST, ARP_SPA, ARP_TPA, IPV6_SRC, IPV6_DST,
  TP_SRC, TP_DST, TCP_SRC, TCP_DST, UDP_SRC, UDP_DST, SCTP_SRC, SCTP_DST,
  ICMP_TYPE, ICMP_CODE, ICMPV6_TYPE, ICMPV6_CODE,
  NW_PROTO, ARP_OP, NW_TOS, IP_DSCP, NW_ECN, NW_TTL, NW_FRAG,
  ARP_SHA, ARP_THA, TCP_FLAGS,
  METADATA, REG0, REG1, REG2, REG3, REG4, REG5, REG6, REG7,
  COUNT
};
constexpr int kNumFields = static_cast<int>(FieldId::COUNT);

enum class Fmt : uint8_t { DEC, HEX, MAC, IPV4, IPV6, PORT, FRAG, CT_STATE, TCP_FLAGS, TOS };

// What a match (or, at translation time, a packet) must be for a field to exist.
enum class Prereq : uint8_t {
  NONE, IPV4, IPV6, IP_ANY, ARP, IPV4_OR_ARP, L4, TCP, UDP, SCTP, ICMP, ICMPV6, ICMP_ANY, VLAN,
  CT,  // a valid conntrack state (ct_state +new, +est, +rel, +rpl, +snat or +dnat, or +trk-inv)
};

struct FieldDef {
  FieldId id;
  const char* name;      // canonical name (dumps)
  const char* nxm;       // NXM/OXM name accepted in load/move, or nullptr
  uint16_t offset;       // container byte offset in Flow
  uint8_t n_bytes;       // container width
  uint8_t shift;         // field's lowest bit inside the container value
  uint8_t n_bits;        // field width
  bool host_order;       // container stored host order (metadata, regs, in_port...)
  bool maskable;         // arbitrary masks allowed in matches
  bool writable;         // set_field / load / move destination
  bool datapath;         // lives in the datapath key (else pipeline state)
  Prereq prereq;
  Fmt fmt;
};

const FieldDef& field_def(FieldId id);
// Lookup by ofctl name, alias (ip_src, eth_dst, tcp_dst...) or NXM/OXM name.
const FieldDef* field_by_name(std::string_view name);

// Field values are handled as up-to-128-bit unsigned integers, bit 0 being the
// field's least significant bit (as in NXM subfields `reg0[0..15]`).
u128 field_all_ones(const FieldDef& f);
u128 field_get(const Flow& flow, const FieldDef& f);
void field_set(Flow& flow, const FieldDef& f, u128 value);           // only the field's bits
void field_set_masked(Flow& flow, const FieldDef& f, u128 value, u128 mask);

// Value text <-> integer. `ports` resolves port names for Fmt::PORT (may be
// null: numbers only). parse_field_value accepts "v" or "v/mask" (when the
// field is maskable or mask_ok), CIDR "/n" for address fields, and the named
// forms (nw_frag=later, ct_state=+trk-new, tcp_flags=+syn-ack).
class PortNames;
Status parse_field_value(const FieldDef& f, std::string_view text, const PortNames* ports,
                         u128* value, u128* mask, bool mask_ok);
std::string format_field_value(const FieldDef& f, u128 value, u128 mask, const PortNames* ports);

// Parse a plain number (decimal, 0x hex) of at most `bits` bits.
bool parse_uint(std::string_view s, int bits, u128* out);
std::string hex_u128(u128 v);

// Prerequisites over a match (value+mask) or a concrete flow (mask = nullptr).
bool prereq_met(Prereq p, const Flow& value, const Flow* mask);
// Marks in `mask` the bits that decide the prerequisite (dl_type, nw_proto...).
void prereq_unwildcard(Prereq p, Flow& mask);
const char* prereq_text(Prereq p);

// Port name service implemented by the dataplane.
class PortNames {
 public:
  virtual ~PortNames() = default;
  // Port number for a name or a decimal number; 0 when unknown.
  virtual uint32_t port_number(std::string_view name) const = 0;
  virtual std::string port_name(uint32_t port) const = 0;
};

// Reserved port numbers (OpenFlow style, above any real port).
constexpr uint32_t kPortInPort = 0xfffffff8u;
constexpr uint32_t kPortFlood = 0xfffffffbu;
constexpr uint32_t kPortAll = 0xfffffffcu;
constexpr uint32_t kPortNone = 0xffffffffu;

}  // namespace dpu
