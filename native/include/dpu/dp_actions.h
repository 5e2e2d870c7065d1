// dp_actions.h: datapath actions: the second level of rules, what a megaflow
// executes on every packet it matches.
//
// The slow path (xlate.cc) compiles an OpenFlow walk into a flat list of these;
// the fast path (execute.cc) runs them. They are deliberately few and
// constant: a set action carries the value and mask to write (the slow path
// un-wildcarded whatever the value depended on), so executing one is a masked
// copy plus incremental checksum updates. The only per-packet computations are
// checksums, the VXLAN source port (a hash of the inner flow) and the MTU check.
//
//   OUTPUT(port)            send a copy (or, as the last action, the packet)
//   SET_ETH / SET_IPV4 / SET_IPV6 / SET_L4 / SET_ARP / SET_VLAN
//                           masked write of a header image at its offset
//   PUSH_VLAN(tpid,tci) / POP_VLAN
//   TNL_PUSH(header, port)  VXLAN-encapsulate a copy and send it to the underlay
//   TNL_POP(port)           validate+strip VXLAN, set tunnel metadata, in_port =
//                           the tunnel port, and look the packet up again
//   CLONE(n)                run the next n actions on a copy (group buckets)
//   DROP(reason)            record why the packet is dropped
//
// Plain data; built by the slow path, read by workers.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace dpu {

enum class Dp : uint8_t {
  OUTPUT, SET_ETH, SET_VLAN, PUSH_VLAN, POP_VLAN, SET_IPV4, SET_IPV6, SET_L4, SET_ARP,
  TNL_PUSH, TNL_POP, CLONE, DROP,
};

// Header images for set actions, in wire layout starting at the header.
constexpr int kSetEthLen = 12;   // dst, src
constexpr int kSetVlanLen = 2;   // TCI (after the TPID)
constexpr int kSetIpv4Len = 20;
constexpr int kSetIpv6Len = 40;
constexpr int kSetL4Len = 4;     // ports
constexpr int kSetArpLen = 28;
constexpr int kSetMax = 40;

constexpr int kTnlHdrMax = 72;

struct DpAction {
  Dp type = Dp::DROP;
  uint8_t proto = 0;       // SET_L4: IP protocol of the header being written
  uint16_t n_nested = 0;   // CLONE
  uint32_t port = 0;       // OUTPUT; TNL_PUSH: underlay port; TNL_POP: tunnel port
  uint16_t reason = 0;     // DROP
  uint16_t tpid = 0, tci = 0;  // PUSH_VLAN (host order)
  union {
    struct {
      uint8_t val[kSetMax];
      uint8_t msk[kSetMax];
    } set;
    struct {
      uint8_t hdr[kTnlHdrMax];  // Ethernet + IPv4/IPv6 + UDP + VXLAN, lengths/csums zero
      uint8_t hdr_len;          // 50 or 70
      uint8_t ipv6;
      uint8_t strict;           // TNL_POP: reserved bits must be zero
      uint16_t mtu;             // underlay IP MTU
      uint16_t sport_min, sport_max;
      uint16_t ip_csum_base;    // IPv4: raw-order sum of the template header (length excluded)
    } tnl;
  };
  DpAction() { std::memset(&set, 0, sizeof(tnl) > sizeof(set) ? sizeof(tnl) : sizeof(set)); }
};

using DpActions = std::vector<DpAction>;

}  // namespace dpu
