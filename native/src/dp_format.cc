// dp_format.cc: datapath actions as text (dp_format.h).
#include "dp_format.h"

#include <cstdio>
#include <vector>

#include "dpu/ofparse.h"
#include "conntrack/conntrack.h"
#include "xlate_ctx.h"

namespace dpu {

namespace {

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


// "name=value[/mask]" for bytes [lo, hi) of a set action's header image, ""
// when that part is not written.
std::string win_item(const DpAction& a, const char* name, int lo, int hi, std::string (*fmt)(const uint8_t*)) {
  if (lo < a.ofs || hi > a.ofs + a.len) return "";
  const uint8_t* v = a.set.val + (lo - a.ofs);
  const uint8_t* m = a.set.msk + (lo - a.ofs);
  return set_item(name, v, m, hi - lo, fmt);
}

}  // namespace

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
        if (a.proto == kIpIcmp || a.proto == kIpIcmpv6) {  // as OVS: set(icmp(type=0,code=0))
          s = std::string("set(") + (a.proto == kIpIcmp ? "icmp" : "icmpv6") + "(" +
              join({win_item(a, "type", 0, 1, dec_text), win_item(a, "code", 1, 2, dec_text)}) + "))";
          break;
        }
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
      case Dp::CT: {
        const CtSpec& c = *a.ct;
        std::vector<std::string> p;
        if (c.commit) p.push_back("commit");
        if (c.force) p.push_back("force");
        if (c.zone) p.push_back("zone=" + std::to_string(c.zone));
        if (c.set_mark) p.push_back("mark=" + hex_u128(c.mark) + "/" + hex_u128(c.mark_mask));
        if (c.set_label) p.push_back("label=" + hex_u128(c.label) + "/" + hex_u128(c.label_mask));
        if (c.nat) p.push_back(format_nat_range(c.range));
        s = "ct(" + join(p) + ")";
        if (c.recirc_id) {
          char b[32];
          std::snprintf(b, sizeof b, ",recirc(%#x)", c.recirc_id);
          s += b;
        }
        break;
      }
      case Dp::CT_CLEAR: s = "ct_clear"; break;
    }
    items.push_back(s);
  }
  return join(items);
}

}  // namespace dpu
