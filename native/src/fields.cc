// fields.cc: the match-field table and value parsing/formatting (see fields.h).
//
// Pure functions over an immutable table; callable from any thread.
#include "dpu/fields.h"

#include <arpa/inet.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <unordered_map>

namespace dpu {
namespace {

#define OFF(m) static_cast<uint16_t>(offsetof(Flow, m))
#define SZ(m) static_cast<uint8_t>(sizeof(Flow::m))

// id, name, nxm, offset, bytes, shift, bits, host, maskable, writable, datapath, prereq, fmt
const FieldDef kFields[kNumFields] = {
    {FieldId::IN_PORT, "in_port", "NXM_OF_IN_PORT", OFF(in_port), 4, 0, 32, true, false, false, true, Prereq::NONE, Fmt::PORT},
    {FieldId::RECIRC_ID, "recirc_id", nullptr, OFF(recirc_id), 4, 0, 32, true, false, false, true, Prereq::NONE, Fmt::DEC},
    {FieldId::TUN_ID, "tun_id", "NXM_NX_TUN_ID", OFF(tun_id), 8, 0, 64, false, true, true, true, Prereq::NONE, Fmt::HEX},
    {FieldId::TUN_SRC, "tun_src", "NXM_NX_TUN_IPV4_SRC", OFF(tun_src), 4, 0, 32, false, true, true, true, Prereq::NONE, Fmt::IPV4},
    {FieldId::TUN_DST, "tun_dst", "NXM_NX_TUN_IPV4_DST", OFF(tun_dst), 4, 0, 32, false, true, true, true, Prereq::NONE, Fmt::IPV4},
    {FieldId::TUN_IPV6_SRC, "tun_ipv6_src", "NXM_NX_TUN_IPV6_SRC", OFF(tun_ipv6_src), 16, 0, 128, false, true, true, true, Prereq::NONE, Fmt::IPV6},
    {FieldId::TUN_IPV6_DST, "tun_ipv6_dst", "NXM_NX_TUN_IPV6_DST", OFF(tun_ipv6_dst), 16, 0, 128, false, true, true, true, Prereq::NONE, Fmt::IPV6},
    {FieldId::CT_STATE, "ct_state", "NXM_NX_CT_STATE", OFF(ct_state), 1, 0, 8, true, true, false, true, Prereq::NONE, Fmt::CT_STATE},
    {FieldId::CT_ZONE, "ct_zone", "NXM_NX_CT_ZONE", OFF(ct_zone), 2, 0, 16, true, false, false, true, Prereq::NONE, Fmt::DEC},
    {FieldId::CT_MARK, "ct_mark", "NXM_NX_CT_MARK", OFF(ct_mark), 4, 0, 32, true, true, false, true, Prereq::NONE, Fmt::HEX},
    {FieldId::CT_LABEL, "ct_label", "NXM_NX_CT_LABEL", OFF(ct_label), 16, 0, 128, false, true, false, true, Prereq::NONE, Fmt::HEX},
    {FieldId::CT_NW_PROTO, "ct_nw_proto", "NXM_NX_CT_NW_PROTO", OFF(ct_nw_proto), 1, 0, 8, false, false, false, true, Prereq::CT, Fmt::DEC},
    {FieldId::CT_NW_SRC, "ct_nw_src", "NXM_NX_CT_NW_SRC", OFF(ct_nw_src), 4, 0, 32, false, true, false, true, Prereq::CT, Fmt::IPV4},
    {FieldId::CT_NW_DST, "ct_nw_dst", "NXM_NX_CT_NW_DST", OFF(ct_nw_dst), 4, 0, 32, false, true, false, true, Prereq::CT, Fmt::IPV4},
    {FieldId::CT_IPV6_SRC, "ct_ipv6_src", "NXM_NX_CT_IPV6_SRC", OFF(ct_ipv6_src), 16, 0, 128, false, true, false, true, Prereq::CT, Fmt::IPV6},
    {FieldId::CT_IPV6_DST, "ct_ipv6_dst", "NXM_NX_CT_IPV6_DST", OFF(ct_ipv6_dst), 16, 0, 128, false, true, false, true, Prereq::CT, Fmt::IPV6},
    {FieldId::CT_TP_SRC, "ct_tp_src", "NXM_NX_CT_TP_SRC", OFF(ct_tp_src), 2, 0, 16, false, true, false, true, Prereq::CT, Fmt::DEC},
    {FieldId::CT_TP_DST, "ct_tp_dst", "NXM_NX_CT_TP_DST", OFF(ct_tp_dst), 2, 0, 16, false, true, false, true, Prereq::CT, Fmt::DEC},
    {FieldId::DL_DST, "dl_dst", "NXM_OF_ETH_DST", OFF(dl_dst), 6, 0, 48, false, true, true, true, Prereq::NONE, Fmt::MAC},
    {FieldId::DL_SRC, "dl_src", "NXM_OF_ETH_SRC", OFF(dl_src), 6, 0, 48, false, true, true, true, Prereq::NONE, Fmt::MAC},
    {FieldId::DL_TYPE, "dl_type", "NXM_OF_ETH_TYPE", OFF(dl_type), 2, 0, 16, false, false, false, true, Prereq::NONE, Fmt::HEX},
    {FieldId::VLAN_TCI, "vlan_tci", "NXM_OF_VLAN_TCI", OFF(vlan_tci), 2, 0, 16, false, true, true, true, Prereq::NONE, Fmt::HEX},
    {FieldId::DL_VLAN, "dl_vlan", nullptr, OFF(vlan_tci), 2, 0, 12, false, false, true, true, Prereq::NONE, Fmt::DEC},
    {FieldId::DL_VLAN_PCP, "dl_vlan_pcp", nullptr, OFF(vlan_tci), 2, 13, 3, false, false, true, true, Prereq::NONE, Fmt::DEC},
    {FieldId::VLAN_VID, "vlan_vid", "OXM_OF_VLAN_VID", OFF(vlan_tci), 2, 0, 13, false, true, true, true, Prereq::NONE, Fmt::DEC},
    {FieldId::VLAN_PCP, "vlan_pcp", "OXM_OF_VLAN_PCP", OFF(vlan_tci), 2, 13, 3, false, false, true, true, Prereq::VLAN, Fmt::DEC},
    {FieldId::NW_SRC, "nw_src", "NXM_OF_IP_SRC", OFF(nw_src), 4, 0, 32, false, true, true, true, Prereq::IPV4_OR_ARP, Fmt::IPV4},
    {FieldId::NW_DST, "nw_dst", "NXM_OF_IP_DST", OFF(nw_dst), 4, 0, 32, false, true, true, true, Prereq::IPV4_OR_ARP, Fmt::IPV4},
    {FieldId::ARP_SPA, "arp_spa", "NXM_OF_ARP_SPA", OFF(nw_src), 4, 0, 32, false, true, true, true, Prereq::ARP, Fmt::IPV4},
    {FieldId::ARP_TPA, "arp_tpa", "NXM_OF_ARP_TPA", OFF(nw_dst), 4, 0, 32, false, true, true, true, Prereq::ARP, Fmt::IPV4},
    {FieldId::IPV6_SRC, "ipv6_src", "NXM_NX_IPV6_SRC", OFF(ipv6_src), 16, 0, 128, false, true, true, true, Prereq::IPV6, Fmt::IPV6},
    {FieldId::IPV6_DST, "ipv6_dst", "NXM_NX_IPV6_DST", OFF(ipv6_dst), 16, 0, 128, false, true, true, true, Prereq::IPV6, Fmt::IPV6},
    {FieldId::TP_SRC, "tp_src", nullptr, OFF(tp_src), 2, 0, 16, false, true, true, true, Prereq::L4, Fmt::DEC},
    {FieldId::TP_DST, "tp_dst", nullptr, OFF(tp_dst), 2, 0, 16, false, true, true, true, Prereq::L4, Fmt::DEC},
    {FieldId::TCP_SRC, "tcp_src", "NXM_OF_TCP_SRC", OFF(tp_src), 2, 0, 16, false, true, true, true, Prereq::TCP, Fmt::DEC},
    {FieldId::TCP_DST, "tcp_dst", "NXM_OF_TCP_DST", OFF(tp_dst), 2, 0, 16, false, true, true, true, Prereq::TCP, Fmt::DEC},
    {FieldId::UDP_SRC, "udp_src", "NXM_OF_UDP_SRC", OFF(tp_src), 2, 0, 16, false, true, true, true, Prereq::UDP, Fmt::DEC},
    {FieldId::UDP_DST, "udp_dst", "NXM_OF_UDP_DST", OFF(tp_dst), 2, 0, 16, false, true, true, true, Prereq::UDP, Fmt::DEC},
    {FieldId::SCTP_SRC, "sctp_src", "OXM_OF_SCTP_SRC", OFF(tp_src), 2, 0, 16, false, true, true, true, Prereq::SCTP, Fmt::DEC},
    {FieldId::SCTP_DST, "sctp_dst", "OXM_OF_SCTP_DST", OFF(tp_dst), 2, 0, 16, false, true, true, true, Prereq::SCTP, Fmt::DEC},
    {FieldId::ICMP_TYPE, "icmp_type", "NXM_OF_ICMP_TYPE", static_cast<uint16_t>(OFF(tp_src) + 1), 1, 0, 8, false, false, true, true, Prereq::ICMP_ANY, Fmt::DEC},
    {FieldId::ICMP_CODE, "icmp_code", "NXM_OF_ICMP_CODE", static_cast<uint16_t>(OFF(tp_dst) + 1), 1, 0, 8, false, false, true, true, Prereq::ICMP_ANY, Fmt::DEC},
    {FieldId::ICMPV6_TYPE, "icmpv6_type", "NXM_NX_ICMPV6_TYPE", static_cast<uint16_t>(OFF(tp_src) + 1), 1, 0, 8, false, false, true, true, Prereq::ICMPV6, Fmt::DEC},
    {FieldId::ICMPV6_CODE, "icmpv6_code", "NXM_NX_ICMPV6_CODE", static_cast<uint16_t>(OFF(tp_dst) + 1), 1, 0, 8, false, false, true, true, Prereq::ICMPV6, Fmt::DEC},
    {FieldId::NW_PROTO, "nw_proto", "NXM_OF_IP_PROTO", OFF(nw_proto), 1, 0, 8, false, false, false, true, Prereq::IP_ANY, Fmt::DEC},
    {FieldId::ARP_OP, "arp_op", "NXM_OF_ARP_OP", OFF(nw_proto), 1, 0, 8, false, false, true, true, Prereq::ARP, Fmt::DEC},
    {FieldId::NW_TOS, "nw_tos", "NXM_OF_IP_TOS", OFF(nw_tos), 1, 2, 6, false, false, true, true, Prereq::IP_ANY, Fmt::TOS},
    {FieldId::IP_DSCP, "ip_dscp", "OXM_OF_IP_DSCP", OFF(nw_tos), 1, 2, 6, false, false, true, true, Prereq::IP_ANY, Fmt::DEC},
    {FieldId::NW_ECN, "nw_ecn", "NXM_NX_IP_ECN", OFF(nw_tos), 1, 0, 2, false, false, true, true, Prereq::IP_ANY, Fmt::DEC},
    {FieldId::NW_TTL, "nw_ttl", "NXM_NX_IP_TTL", OFF(nw_ttl), 1, 0, 8, false, false, true, true, Prereq::IP_ANY, Fmt::DEC},
    {FieldId::NW_FRAG, "nw_frag", "NXM_NX_IP_FRAG", OFF(nw_frag), 1, 0, 2, false, true, false, true, Prereq::IP_ANY, Fmt::FRAG},
    {FieldId::ARP_SHA, "arp_sha", "NXM_NX_ARP_SHA", OFF(arp_sha), 6, 0, 48, false, true, true, true, Prereq::ARP, Fmt::MAC},
    {FieldId::ARP_THA, "arp_tha", "NXM_NX_ARP_THA", OFF(arp_tha), 6, 0, 48, false, true, true, true, Prereq::ARP, Fmt::MAC},
    {FieldId::TCP_FLAGS, "tcp_flags", "NXM_NX_TCP_FLAGS", OFF(tcp_flags), 2, 0, 12, false, true, false, true, Prereq::TCP, Fmt::TCP_FLAGS},
    {FieldId::METADATA, "metadata", "OXM_OF_METADATA", OFF(metadata), 8, 0, 64, true, true, true, false, Prereq::NONE, Fmt::HEX},
    {FieldId::REG0, "reg0", "NXM_NX_REG0", OFF(regs[0]), 4, 0, 32, true, true, true, false, Prereq::NONE, Fmt::HEX},
    {FieldId::REG1, "reg1", "NXM_NX_REG1", OFF(regs[1]), 4, 0, 32, true, true, true, false, Prereq::NONE, Fmt::HEX},
    {FieldId::REG2, "reg2", "NXM_NX_REG2", OFF(regs[2]), 4, 0, 32, true, true, true, false, Prereq::NONE, Fmt::HEX},
    {FieldId::REG3, "reg3", "NXM_NX_REG3", OFF(regs[3]), 4, 0, 32, true, true, true, false, Prereq::NONE, Fmt::HEX},
    {FieldId::REG4, "reg4", "NXM_NX_REG4", OFF(regs[4]), 4, 0, 32, true, true, true, false, Prereq::NONE, Fmt::HEX},
    {FieldId::REG5, "reg5", "NXM_NX_REG5", OFF(regs[5]), 4, 0, 32, true, true, true, false, Prereq::NONE, Fmt::HEX},
    {FieldId::REG6, "reg6", "NXM_NX_REG6", OFF(regs[6]), 4, 0, 32, true, true, true, false, Prereq::NONE, Fmt::HEX},
    {FieldId::REG7, "reg7", "NXM_NX_REG7", OFF(regs[7]), 4, 0, 32, true, true, true, false, Prereq::NONE, Fmt::HEX},
};

const std::unordered_map<std::string_view, FieldId>& name_index() {
  static const std::unordered_map<std::string_view, FieldId> idx = [] {
    std::unordered_map<std::string_view, FieldId> m;
    for (const FieldDef& f : kFields) {
      if (f.id == FieldId::RECIRC_ID) continue;  // datapath-internal, not an OpenFlow field
      m.emplace(f.name, f.id);
      if (f.nxm) m.emplace(f.nxm, f.id);
    }
    const std::pair<const char*, FieldId> aliases[] = {
        {"eth_dst", FieldId::DL_DST},   {"eth_src", FieldId::DL_SRC},
        {"eth_type", FieldId::DL_TYPE}, {"ip_src", FieldId::NW_SRC},
        {"ip_dst", FieldId::NW_DST},    {"ip_proto", FieldId::NW_PROTO},
        {"ip_ecn", FieldId::NW_ECN},    {"ip_frag", FieldId::NW_FRAG},
        {"tunnel_id", FieldId::TUN_ID}, {"icmpv4_type", FieldId::ICMP_TYPE},
        {"icmpv4_code", FieldId::ICMP_CODE}, {"ip_ttl", FieldId::NW_TTL},
        {"OXM_OF_ETH_DST", FieldId::DL_DST}, {"OXM_OF_ETH_SRC", FieldId::DL_SRC},
        {"OXM_OF_IPV4_SRC", FieldId::NW_SRC}, {"OXM_OF_IPV4_DST", FieldId::NW_DST},
        {"OXM_OF_TCP_SRC", FieldId::TCP_SRC}, {"OXM_OF_TCP_DST", FieldId::TCP_DST},
        {"OXM_OF_UDP_SRC", FieldId::UDP_SRC}, {"OXM_OF_UDP_DST", FieldId::UDP_DST},
        {"OXM_OF_IPV6_SRC", FieldId::IPV6_SRC}, {"OXM_OF_IPV6_DST", FieldId::IPV6_DST},
        {"OXM_OF_ARP_OP", FieldId::ARP_OP}, {"OXM_OF_ARP_SPA", FieldId::ARP_SPA},
        {"OXM_OF_ARP_TPA", FieldId::ARP_TPA}, {"OXM_OF_ARP_SHA", FieldId::ARP_SHA},
        {"OXM_OF_ARP_THA", FieldId::ARP_THA},
    };
    for (auto& a : aliases) m.emplace(a.first, a.second);
    return m;
  }();
  return idx;
}

u128 read_container(const Flow& flow, const FieldDef& f) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(&flow) + f.offset;
  u128 v = 0;
  if (f.host_order) {
    for (int i = f.n_bytes - 1; i >= 0; i--) v = (v << 8) | p[i];
  } else {
    for (int i = 0; i < f.n_bytes; i++) v = (v << 8) | p[i];
  }
  return v;
}

void write_container(Flow& flow, const FieldDef& f, u128 v) {
  uint8_t* p = reinterpret_cast<uint8_t*>(&flow) + f.offset;
  if (f.host_order) {
    for (int i = 0; i < f.n_bytes; i++, v >>= 8) p[i] = static_cast<uint8_t>(v);
  } else {
    for (int i = f.n_bytes - 1; i >= 0; i--, v >>= 8) p[i] = static_cast<uint8_t>(v);
  }
}

u128 ones(int bits) { return bits >= 128 ? ~static_cast<u128>(0) : ((static_cast<u128>(1) << bits) - 1); }

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool parse_mac(std::string_view s, u128* out) {
  if (s.size() != 17) return false;
  u128 v = 0;
  for (int i = 0; i < 6; i++) {
    if (i > 0 && s[i * 3 - 1] != ':' && s[i * 3 - 1] != '-') return false;
    int hi = hex_digit(s[i * 3]), lo = hex_digit(s[i * 3 + 1]);
    if (hi < 0 || lo < 0) return false;
    v = (v << 8) | static_cast<unsigned>(hi << 4 | lo);
  }
  *out = v;
  return true;
}

// Strict dotted quad (as inet_pton): four decimal octets, no leading zeros.
bool parse_ipv4(std::string_view s, u128* out) {
  uint32_t v = 0;
  size_t i = 0;
  for (int part = 0; part < 4; part++) {
    if (part > 0) {
      if (i >= s.size() || s[i] != '.') return false;
      i++;
    }
    size_t start = i;
    uint32_t octet = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9' && i - start < 3) octet = octet * 10 + static_cast<uint32_t>(s[i++] - '0');
    if (i == start || octet > 255 || (i - start > 1 && s[start] == '0')) return false;
    v = v << 8 | octet;
  }
  if (i != s.size()) return false;
  *out = v;
  return true;
}

bool parse_ipv6(std::string_view s, u128* out) {
  std::string z(s);
  uint8_t a[16];
  if (inet_pton(AF_INET6, z.c_str(), a) != 1) return false;
  u128 v = 0;
  for (uint8_t b : a) v = (v << 8) | b;
  *out = v;
  return true;
}

std::string fmt_mac(u128 v) {
  char b[24];
  std::snprintf(b, sizeof b, "%02x:%02x:%02x:%02x:%02x:%02x", unsigned(v >> 40) & 255,
                unsigned(v >> 32) & 255, unsigned(v >> 24) & 255, unsigned(v >> 16) & 255,
                unsigned(v >> 8) & 255, unsigned(v) & 255);
  return b;
}

std::string fmt_ipv4(u128 v) {
  char b[20];
  uint32_t x = static_cast<uint32_t>(v);
  std::snprintf(b, sizeof b, "%u.%u.%u.%u", x >> 24, (x >> 16) & 255, (x >> 8) & 255, x & 255);
  return b;
}

std::string fmt_ipv6(u128 v) {
  uint8_t a[16];
  for (int i = 15; i >= 0; i--, v >>= 8) a[i] = static_cast<uint8_t>(v);
  char b[INET6_ADDRSTRLEN];
  inet_ntop(AF_INET6, a, b, sizeof b);
  return b;
}

// Prefix length of a mask, or -1 if it is not a prefix.
int prefix_len(u128 mask, int bits) {
  int n = 0;
  while (n < bits && ((mask >> (bits - 1 - n)) & 1)) n++;
  u128 expect = n == 0 ? 0 : (ones(n) << (bits - n));
  return (mask & ones(bits)) == expect ? n : -1;
}

struct FlagName {
  const char* name;
  uint32_t bit;
};
const FlagName kCtFlags[] = {{"new", kCsNew},   {"est", kCsEstablished}, {"rel", kCsRelated},
                             {"rpl", kCsReplyDir}, {"inv", kCsInvalid}, {"trk", kCsTracked},
                             {"snat", kCsSrcNat}, {"dnat", kCsDstNat}};
const FlagName kTcpFlags[] = {{"fin", 0x001}, {"syn", 0x002}, {"rst", 0x004},
                              {"psh", 0x008}, {"ack", 0x010}, {"urg", 0x020},
                              {"ece", 0x040}, {"cwr", 0x080}, {"ns", 0x100}};

template <size_t N>
Status parse_flags(std::string_view s, const FlagName (&names)[N], u128* value, u128* mask) {
  u128 v = 0, m = 0;
  size_t i = 0;
  while (i < s.size()) {
    char sign = s[i];
    if (sign != '+' && sign != '-')
      return Status::Error(Err::BAD_VALUE, "flags must be written as +flag or -flag");
    size_t j = i + 1;
    while (j < s.size() && s[j] != '+' && s[j] != '-') j++;
    std::string_view name = s.substr(i + 1, j - i - 1);
    bool found = false;
    for (const FlagName& f : names) {
      if (name == f.name) {
        found = true;
        if (m & f.bit)  // as OVS: +trk-trk is a contradiction, +trk+trk a slip
          return Status::Error(Err::BAD_VALUE, "flag '" + std::string(name) + "' is given more than once");
        m |= f.bit;
        if (sign == '+') v |= f.bit; else v &= ~static_cast<u128>(f.bit);
      }
    }
    if (!found) return Status::Error(Err::BAD_VALUE, "unknown flag '" + std::string(name) + "'");
    i = j;
  }
  *value = v;
  *mask = m;
  return Status::Ok();
}

template <size_t N>
std::string format_flags(u128 v, u128 m, const FlagName (&names)[N]) {
  std::string out;
  for (const FlagName& f : names) {
    if (m & f.bit) out += ((v & f.bit) ? "+" : "-") + std::string(f.name);
  }
  return out;
}

}  // namespace

const FieldDef& field_def(FieldId id) { return kFields[static_cast<int>(id)]; }

const FieldDef* field_by_name(std::string_view name) {
  auto& idx = name_index();
  auto it = idx.find(name);
  return it == idx.end() ? nullptr : &kFields[static_cast<int>(it->second)];
}

u128 field_all_ones(const FieldDef& f) { return ones(f.n_bits); }

u128 field_get(const Flow& flow, const FieldDef& f) {
  return (read_container(flow, f) >> f.shift) & ones(f.n_bits);
}

void field_set_masked(Flow& flow, const FieldDef& f, u128 value, u128 mask) {
  u128 c = read_container(flow, f);
  u128 m = (mask & ones(f.n_bits)) << f.shift;
  c = (c & ~m) | ((value << f.shift) & m);
  write_container(flow, f, c);
}

void field_set(Flow& flow, const FieldDef& f, u128 value) {
  field_set_masked(flow, f, value, ones(f.n_bits));
}

bool parse_uint(std::string_view s, int bits, u128* out) {
  if (s.empty()) return false;
  u128 v = 0;
  bool hex = s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
  size_t i = hex ? 2 : 0;
  if (i == s.size()) return false;
  for (; i < s.size(); i++) {
    char c = s[i];
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (hex && c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (hex && c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return false;
    // v * base + d must not exceed the largest `bits`-bit value (a 128-bit
    // product may wrap to a larger number: compare before multiplying).
    const u128 max = bits < 128 ? ones(bits) : ~u128{0};
    const unsigned base = hex ? 16 : 10;
    if (static_cast<u128>(d) > max || v > (max - static_cast<unsigned>(d)) / base) return false;
    v = v * base + static_cast<unsigned>(d);
  }
  *out = v;
  return true;
}

std::string hex_u128(u128 v) {
  static const char* digits = "0123456789abcdef";
  if (v == 0) return "0x0";
  std::string s;
  while (v) {
    s.insert(s.begin(), digits[static_cast<int>(v & 15)]);
    v >>= 4;
  }
  return "0x" + s;
}

static std::string dec_u128(u128 v) {
  if (v == 0) return "0";
  std::string s;
  while (v) {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  }
  return s;
}

Status parse_field_value(const FieldDef& f, std::string_view text, const PortNames* ports,
                         u128* value, u128* mask, bool mask_ok) {
  const u128 all = ones(f.n_bits);
  *mask = all;
  std::string_view v = text, m;
  size_t slash = text.find('/');
  if (slash != std::string_view::npos) {
    v = text.substr(0, slash);
    m = text.substr(slash + 1);
  }
  auto bad = [&](const std::string& why) {
    return Status::Error(Err::BAD_VALUE, std::string(f.name) + ": " + why);
  };
  switch (f.fmt) {
    case Fmt::FRAG: {
      static const struct { const char* n; uint8_t v, m; } kFrag[] = {
          {"no", 0, 3}, {"yes", 1, 1}, {"first", 1, 3}, {"later", 3, 3}, {"not_later", 0, 2}};
      for (auto& e : kFrag) {
        if (text == e.n) {
          *value = e.v;
          *mask = e.m;
          return Status::Ok();
        }
      }
      return bad("expected no, yes, first, later or not_later, got '" + std::string(text) + "'");
    }
    case Fmt::CT_STATE:
      if (!text.empty() && (text[0] == '+' || text[0] == '-')) {
        Status s = parse_flags(text, kCtFlags, value, mask);
        return s.ok() ? s : bad(s.message);
      }
      break;
    case Fmt::TCP_FLAGS:
      if (!text.empty() && (text[0] == '+' || text[0] == '-')) {
        Status s = parse_flags(text, kTcpFlags, value, mask);
        return s.ok() ? s : bad(s.message);
      }
      break;
    case Fmt::PORT: {
      if (!m.empty()) return bad("in_port cannot be masked");
      u128 n;
      if (parse_uint(v, 32, &n)) {
        // An OpenFlow port number (`dpu show` lists them): one that names no
        // port is a mistake, not a match that never hits. Reserved numbers
        // (0xff00 and up) pass.
        if (ports && n >= 1 && n < 0xff00 && ports->port_name(static_cast<uint32_t>(n)).empty())
          return Status::Error(Err::UNKNOWN_PORT, "unknown port " + std::string(v) + " (no port has that number)");
        *value = n;
        return Status::Ok();
      }
      uint32_t p = ports ? ports->port_number(v) : 0;
      if (!p) return Status::Error(Err::UNKNOWN_PORT, "unknown port '" + std::string(v) + "'");
      *value = p;
      return Status::Ok();
    }
    default:
      break;
  }
  // Value.
  u128 val = 0;
  bool ok = false;
  switch (f.fmt) {
    case Fmt::MAC: ok = parse_mac(v, &val); break;
    case Fmt::IPV4: ok = parse_ipv4(v, &val); break;
    case Fmt::IPV6: ok = parse_ipv6(v, &val); break;
    case Fmt::TOS:
      ok = parse_uint(v, 8, &val);
      if (ok && (val & 3)) return bad("nw_tos takes the DSCP bits of the TOS byte: a multiple of 4");
      val >>= 2;
      break;
    default: ok = parse_uint(v, f.n_bits, &val); break;
  }
  if (!ok) {
    const char* what = f.fmt == Fmt::MAC ? "a MAC address (xx:xx:xx:xx:xx:xx)"
                     : f.fmt == Fmt::IPV4 ? "an IPv4 address"
                     : f.fmt == Fmt::IPV6 ? "an IPv6 address"
                                          : nullptr;
    if (what) return bad("'" + std::string(v) + "' is not " + what);
    return bad("'" + std::string(v) + "' is not a number of at most " + std::to_string(f.n_bits) + " bits");
  }
  *value = val;
  if (slash == std::string_view::npos) return Status::Ok();
  if (!f.maskable && !mask_ok) return bad("this field cannot be masked");
  // Mask: CIDR length for addresses, else a value of the same format.
  u128 mk = 0;
  u128 plen;
  if ((f.fmt == Fmt::IPV4 || f.fmt == Fmt::IPV6) && m.find_first_of(".:") == std::string_view::npos) {
    if (!parse_uint(m, 16, &plen) || plen > f.n_bits) return bad("bad prefix length '/" + std::string(m) + "'");
    mk = plen == 0 ? 0 : (ones(static_cast<int>(plen)) << (f.n_bits - static_cast<int>(plen)));
  } else {
    switch (f.fmt) {
      case Fmt::MAC: ok = parse_mac(m, &mk); break;
      case Fmt::IPV4: ok = parse_ipv4(m, &mk); break;
      case Fmt::IPV6: ok = parse_ipv6(m, &mk); break;
      default: ok = parse_uint(m, f.n_bits, &mk); break;
    }
    if (!ok) return bad("bad mask '" + std::string(m) + "'");
  }
  *value = val & mk;  // bits outside the mask are dropped, as ovs-ofctl does (nw_src=10.0.0.1/24)
  *mask = mk;
  return Status::Ok();
}

std::string format_field_value(const FieldDef& f, u128 value, u128 mask, const PortNames* ports) {
  const u128 all = ones(f.n_bits);
  bool full = (mask & all) == all;
  switch (f.fmt) {
    case Fmt::FRAG: {
      uint8_t v = static_cast<uint8_t>(value), m = static_cast<uint8_t>(mask);
      if (m == 3) return v == 0 ? "no" : v == 1 ? "first" : v == 3 ? "later" : "yes";
      if (m == 1) return v ? "yes" : "no";
      if (m == 2) return v ? "later" : "not_later";
      return "no";
    }
    case Fmt::CT_STATE:
      return format_flags(value, mask, kCtFlags);
    case Fmt::TCP_FLAGS:
      return format_flags(value, mask, kTcpFlags);
    case Fmt::PORT: {
      uint32_t p = static_cast<uint32_t>(value);
      std::string n = ports ? ports->port_name(p) : std::string();
      return n.empty() ? std::to_string(p) : n;
    }
    default:
      break;
  }
  auto one = [&](u128 v) -> std::string {
    switch (f.fmt) {
      case Fmt::MAC: return fmt_mac(v);
      case Fmt::IPV4: return fmt_ipv4(v);
      case Fmt::IPV6: return fmt_ipv6(v);
      case Fmt::HEX: return hex_u128(v);
      case Fmt::TOS: return dec_u128(v << 2);
      default: return dec_u128(v);
    }
  };
  if (full) return one(value);
  if (f.fmt == Fmt::IPV4 || f.fmt == Fmt::IPV6) {
    int n = prefix_len(mask, f.n_bits);
    if (n >= 0) return one(value) + "/" + std::to_string(n);
  }
  if (f.fmt == Fmt::DEC) return hex_u128(value) + "/" + hex_u128(mask);
  return one(value) + "/" + one(mask);
}

namespace {
bool type_is(const Flow& v, const Flow* m, uint16_t t) {
  return (!m || m->dl_type == 0xffff) && v.dl_type == be16(t);
}
bool proto_is(const Flow& v, const Flow* m, uint8_t p) {
  return (!m || m->nw_proto == 0xff) && v.nw_proto == p;
}
bool ip_any(const Flow& v, const Flow* m) { return type_is(v, m, kEthIp) || type_is(v, m, kEthIpv6); }
bool arp_any(const Flow& v, const Flow* m) { return type_is(v, m, kEthArp) || type_is(v, m, 0x8035); }
// Ports need a first fragment or none (as OVS's MFP_TCP/UDP/SCTP; for a match
// the nw_frag value is checked, not its mask).
bool not_later(const Flow& v) { return !(v.nw_frag & kFragLater); }
}  // namespace

bool prereq_met(Prereq p, const Flow& v, const Flow* m) {
  switch (p) {
    case Prereq::NONE: return true;
    case Prereq::IPV4: return type_is(v, m, kEthIp);
    case Prereq::IPV6: return type_is(v, m, kEthIpv6);
    case Prereq::IP_ANY: return ip_any(v, m);
    case Prereq::ARP: return arp_any(v, m);
    case Prereq::IPV4_OR_ARP: return type_is(v, m, kEthIp) || arp_any(v, m);
    case Prereq::L4:
      return ip_any(v, m) && (proto_is(v, m, kIpTcp) || proto_is(v, m, kIpUdp) || proto_is(v, m, kIpSctp)) &&
             not_later(v);
    case Prereq::TCP: return ip_any(v, m) && proto_is(v, m, kIpTcp) && not_later(v);
    case Prereq::UDP: return ip_any(v, m) && proto_is(v, m, kIpUdp) && not_later(v);
    case Prereq::SCTP: return ip_any(v, m) && proto_is(v, m, kIpSctp) && not_later(v);
    case Prereq::ICMP: return type_is(v, m, kEthIp) && proto_is(v, m, kIpIcmp);
    case Prereq::ICMPV6: return type_is(v, m, kEthIpv6) && proto_is(v, m, kIpIcmpv6);
    case Prereq::ICMP_ANY:
      return (type_is(v, m, kEthIp) && proto_is(v, m, kIpIcmp)) || (type_is(v, m, kEthIpv6) && proto_is(v, m, kIpIcmpv6));
    case Prereq::VLAN:
      return (!m || (m->vlan_tci & be16(kVlanPresent))) && (v.vlan_tci & be16(kVlanPresent));
    case Prereq::CT:
      if (!m) return v.ct_state & (kCsNew | kCsEstablished | kCsReplyDir);  // a packet: as OVS's CS_VALID_MASK
      // A match: one of the bits that imply a connection, or an explicit +trk-inv (as OVS).
      return (v.ct_state & m->ct_state & (kCsNew | kCsEstablished | kCsRelated | kCsReplyDir | kCsSrcNat | kCsDstNat)) ||
             ((v.ct_state & m->ct_state & kCsTracked) && (m->ct_state & kCsInvalid) && !(v.ct_state & kCsInvalid));
  }
  return false;
}

void prereq_unwildcard(Prereq p, Flow& m) {
  switch (p) {
    case Prereq::NONE: return;
    case Prereq::VLAN: m.vlan_tci |= be16(kVlanPresent); return;
    case Prereq::CT: m.ct_state |= kCsNew | kCsEstablished | kCsReplyDir; return;
    case Prereq::IPV4: case Prereq::IPV6: case Prereq::IP_ANY: case Prereq::ARP:
    case Prereq::IPV4_OR_ARP:
      m.dl_type = 0xffff;
      return;
    case Prereq::L4: case Prereq::TCP: case Prereq::UDP: case Prereq::SCTP:
      m.dl_type = 0xffff;
      m.nw_proto = 0xff;
      m.nw_frag |= kFragLater;
      return;
    default:
      m.dl_type = 0xffff;
      m.nw_proto = 0xff;
      return;
  }
}

const char* prereq_text(Prereq p) {
  switch (p) {
    case Prereq::NONE: return "nothing";
    case Prereq::IPV4: return "ip (dl_type=0x0800)";
    case Prereq::IPV6: return "ipv6 (dl_type=0x86dd)";
    case Prereq::IP_ANY: return "ip or ipv6";
    case Prereq::ARP: return "arp (dl_type=0x0806) or rarp (dl_type=0x8035)";
    case Prereq::IPV4_OR_ARP: return "ip or arp";
    case Prereq::L4: return "tcp, udp or sctp (with ip or ipv6), not a later fragment";
    case Prereq::TCP: return "tcp or tcp6, not a later fragment";
    case Prereq::UDP: return "udp or udp6, not a later fragment";
    case Prereq::SCTP: return "sctp or sctp6, not a later fragment";
    case Prereq::ICMP: return "icmp";
    case Prereq::ICMPV6: return "icmp6";
    case Prereq::ICMP_ANY: return "icmp or icmp6";
    case Prereq::VLAN: return "a VLAN tag (vlan_tci=0x1000/0x1000)";
    case Prereq::CT: return "a tracked connection (ct_state=+trk+est, +trk+new, ... or +trk-inv)";
  }
  return "?";
}

std::string Status::describe() const {
  std::string s;
  if (!file.empty()) s += file + ": ";
  if (record >= 0) s += "record " + std::to_string(record) + ": ";
  if (line >= 0) s += "line " + std::to_string(line) + ": ";
  if (position >= 0) {
    s += "column " + std::to_string(position + 1);
    if (!token.empty()) s += " ('" + token + "')";
    s += ": ";
  }
  return s + message;
}

}  // namespace dpu
