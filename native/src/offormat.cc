// offormat.cc: canonical ovs-ofctl text for matches, actions and groups.
//
// The output parses back (ofparse.cc) to the same rule. Field order follows
// ovs-ofctl dump-flows: priority, conntrack and tunnel metadata, pipeline
// registers, the protocol shorthand (ip, tcp6, arp...), in_port, VLAN,
// Ethernet, L3, L4. Pure functions; any thread.
#include <cstdio>

#include "dpu/ofparse.h"

namespace dpu {
namespace {

void add(std::string& out, const std::string& s) {
  if (!out.empty()) out += ',';
  out += s;
}

void add_field(std::string& out, const Match& m, FieldId id, const PortNames* ports, const char* name = nullptr) {
  const FieldDef& f = field_def(id);
  u128 mk = field_get(m.mask, f);
  if (!mk) return;
  add(out, std::string(name ? name : f.name) + "=" + format_field_value(f, field_get(m.value, f), mk, ports));
}

}  // namespace

std::string format_match(const Match& m, uint16_t priority, bool with_priority, const PortNames* ports) {
  std::string out;
  if (with_priority && priority != kDefaultPriority) add(out, "priority=" + std::to_string(priority));
  add_field(out, m, FieldId::RECIRC_ID, ports);
  add_field(out, m, FieldId::CT_STATE, ports);
  add_field(out, m, FieldId::CT_ZONE, ports);
  add_field(out, m, FieldId::CT_MARK, ports);
  for (FieldId id : {FieldId::CT_LABEL, FieldId::CT_NW_SRC, FieldId::CT_NW_DST, FieldId::CT_IPV6_SRC,
                     FieldId::CT_IPV6_DST, FieldId::CT_NW_PROTO, FieldId::CT_TP_SRC, FieldId::CT_TP_DST})
    add_field(out, m, id, ports);
  for (FieldId id : {FieldId::TUN_ID, FieldId::TUN_SRC, FieldId::TUN_DST, FieldId::TUN_IPV6_SRC,
                     FieldId::TUN_IPV6_DST, FieldId::METADATA, FieldId::REG0, FieldId::REG1, FieldId::REG2,
                     FieldId::REG3, FieldId::REG4, FieldId::REG5, FieldId::REG6, FieldId::REG7})
    add_field(out, m, id, ports);

  // Protocol shorthand.
  bool type_exact = m.mask.dl_type == 0xffff;
  uint16_t type = be16(m.value.dl_type);
  bool proto_exact = m.mask.nw_proto == 0xff;
  uint8_t proto = m.value.nw_proto;
  bool proto_implied = false;
  bool is_ip = type_exact && (type == kEthIp || type == kEthIpv6);
  bool is_arp = type_exact && type == kEthArp;
  if (is_ip) {
    bool v6 = type == kEthIpv6;
    const char* sh = v6 ? "ipv6" : "ip";
    if (proto_exact) {
      proto_implied = true;
      if (proto == kIpTcp) sh = v6 ? "tcp6" : "tcp";
      else if (proto == kIpUdp) sh = v6 ? "udp6" : "udp";
      else if (proto == kIpSctp) sh = v6 ? "sctp6" : "sctp";
      else if (proto == kIpIcmp && !v6) sh = "icmp";
      else if (proto == kIpIcmpv6 && v6) sh = "icmp6";
      else proto_implied = false;
    }
    add(out, sh);
  } else if (is_arp) {
    add(out, "arp");
  }
  add_field(out, m, FieldId::IN_PORT, ports);

  // VLAN.
  uint16_t tci_m = be16(m.mask.vlan_tci), tci_v = be16(m.value.vlan_tci);
  if (tci_m) {
    if (tci_m == 0xffff && tci_v == 0) add(out, "vlan_tci=0x0000");
    else if (tci_m == (kVlanPresent | 0x0fff) && (tci_v & kVlanPresent)) add(out, "dl_vlan=" + std::to_string(tci_v & 0xfff));
    else if (tci_m == (kVlanPresent | 0xe000) && (tci_v & kVlanPresent)) add(out, "dl_vlan_pcp=" + std::to_string(tci_v >> 13));
    else if (tci_m == 0xffff && (tci_v & kVlanPresent))
      add(out, "dl_vlan=" + std::to_string(tci_v & 0xfff) + ",dl_vlan_pcp=" + std::to_string(tci_v >> 13));
    else add_field(out, m, FieldId::VLAN_TCI, ports);
  }
  add_field(out, m, FieldId::DL_SRC, ports);
  add_field(out, m, FieldId::DL_DST, ports);
  if (type_exact && !is_ip && !is_arp) add_field(out, m, FieldId::DL_TYPE, ports);
  if (is_arp) {
    add_field(out, m, FieldId::ARP_SPA, ports);
    add_field(out, m, FieldId::ARP_TPA, ports);
    add_field(out, m, FieldId::ARP_OP, ports);
    add_field(out, m, FieldId::ARP_SHA, ports);
    add_field(out, m, FieldId::ARP_THA, ports);
    return out;
  }
  if (!is_ip) return out;
  add_field(out, m, FieldId::NW_SRC, ports);
  add_field(out, m, FieldId::NW_DST, ports);
  add_field(out, m, FieldId::IPV6_SRC, ports);
  add_field(out, m, FieldId::IPV6_DST, ports);
  if (!proto_implied) add_field(out, m, FieldId::NW_PROTO, ports);
  // TOS byte: DSCP and ECN halves.
  uint8_t tos_m = m.mask.nw_tos;
  if (tos_m & 0xfc) add_field(out, m, FieldId::NW_TOS, ports);
  if (tos_m & 0x03) add_field(out, m, FieldId::NW_ECN, ports);
  add_field(out, m, FieldId::NW_TTL, ports);
  add_field(out, m, FieldId::NW_FRAG, ports);
  if (proto_exact && (proto == kIpIcmp || proto == kIpIcmpv6)) {
    bool v6 = proto == kIpIcmpv6;
    add_field(out, m, v6 ? FieldId::ICMPV6_TYPE : FieldId::ICMP_TYPE, ports, v6 ? "icmp_type" : nullptr);
    add_field(out, m, v6 ? FieldId::ICMPV6_CODE : FieldId::ICMP_CODE, ports, v6 ? "icmp_code" : nullptr);
  } else {
    add_field(out, m, FieldId::TP_SRC, ports);
    add_field(out, m, FieldId::TP_DST, ports);
  }
  add_field(out, m, FieldId::TCP_FLAGS, ports);
  return out;
}

std::string format_group(const Group& g, const PortNames* ports) {
  std::string s = "group_id=" + std::to_string(g.group_id) + ",type=";
  s += g.type == GroupType::ALL ? "all" : g.type == GroupType::SELECT ? "select" : "indirect";
  for (const Bucket& b : g.buckets) {
    s += ",bucket=bucket_id:" + std::to_string(b.bucket_id);
    if (g.type == GroupType::SELECT) s += ",weight:" + std::to_string(b.weight);
    s += ",actions=" + format_actions(b.actions, ports);
  }
  return s;
}

}  // namespace dpu
