// dp_actions.h: datapath actions: the second level of rules, what a megaflow
// executes on every packet it matches.
//
// The slow path (xlate.cc) compiles an OpenFlow walk into a flat list of these;
// the fast path (execute.cc) runs them. They are deliberately few and
// constant: a set action carries the value and mask to write (the slow path
// un-wildcarded whatever the value depended on), so executing one is a masked
// write of a few 16-bit words plus one incremental checksum update per changed
// word. The only per-packet computations are checksums, the VXLAN source port
// (a hash of the inner flow) and the MTU check.
//
//   OUTPUT(port)            send a copy (or, as the last action, the packet)
//   SET_ETH / SET_VLAN / SET_IPV4 / SET_IPV6 / SET_L4 / SET_ARP
//                           masked write of a window of at most 20 bytes of
//                           that header (an IPv6 or ARP rewrite may take two or
//                           three windows); `words` says which 16-bit words of
//                           the window change, `addr_words` which of them are IP
//                           addresses (for the L4 pseudo-header checksum); the
//                           window is narrowed to the bytes that change
//   PUSH_VLAN(tpid,tci) / POP_VLAN
//   TNL_PUSH(header, port)  VXLAN-encapsulate a copy and send it to the underlay
//   TNL_POP(port)           validate+strip VXLAN, set tunnel metadata, in_port =
//                           the tunnel port, and look the packet up again
//   CLONE(n)                run the next n actions on a copy (group buckets)
//   CT(spec)                hand the packet to the conntrack stage (conntrack/):
//                           with a recirc_id, a copy unless it is the last
//                           action, looked up again afterwards; without, the
//                           packet itself, whose remaining actions run after
//                           the stage
//   CT_CLEAR                forget the packet's conntrack state
//   DROP(reason)            record why the packet is dropped
//
// One action is one 64-byte cache line; tunnel header templates live out of
// line (TnlHeader, CtSpec), owned by the megaflow. Built by the slow path,
// read by workers.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace dpu {

enum class Dp : uint8_t {
  OUTPUT, SET_ETH, SET_VLAN, PUSH_VLAN, POP_VLAN, SET_IPV4, SET_IPV6, SET_L4, SET_ARP,
  TNL_PUSH, TNL_POP, CLONE, DROP, CT, CT_CLEAR,
};

struct CtSpec;

constexpr int kSetWindow = 20;  // bytes a set action can write
constexpr int kTnlHdrMax = 72;

// What TNL_PUSH prepends and how; what TNL_POP checks.
struct TnlHeader {
  uint8_t hdr[kTnlHdrMax] = {};  // Ethernet + IPv4/IPv6 + UDP + VXLAN, lengths/csums zero
  uint8_t hdr_len = 0;           // 50 or 70
  bool ipv6 = false;
  bool strict = false;           // TNL_POP: reserved bits must be zero
  uint16_t mtu = 1500;           // underlay IP MTU
  uint16_t sport_min = 49152, sport_max = 65535;
  uint16_t ip_csum_base = 0;     // IPv4: folded raw-order sum of the template header
};

struct alignas(64) DpAction {
  Dp type = Dp::DROP;
  uint8_t proto = 0;       // SET_L4: IP protocol of the header being written
  uint8_t ofs = 0;         // sets: window start within the header
  uint8_t len = 0;         // sets: window length (even, <= kSetWindow)
  uint16_t words = 0;      // sets: bit k = window bytes 2k..2k+1 change
  uint16_t addr_words = 0; // sets: the changing words that are IP addresses
  uint32_t port = 0;       // OUTPUT; TNL_PUSH: underlay port; TNL_POP: tunnel port
  uint32_t n_nested = 0;   // CLONE: the actions that follow and belong to it (any count a list can hold)
  uint16_t reason = 0;     // DROP
  uint16_t tpid = 0, tci = 0;  // PUSH_VLAN (host order)
  uint8_t full = 0;        // sets: every mask byte of the window is 0xff (plain copy)
  union {
    struct {
      uint8_t val[kSetWindow];
      uint8_t msk[kSetWindow];
    } set;
    const TnlHeader* tnl;  // TNL_PUSH / TNL_POP
    const CtSpec* ct;      // CT
  };
  DpAction() { std::memset(&set, 0, sizeof set); }
};
static_assert(sizeof(DpAction) == 64, "one datapath action per cache line");

using DpActions = std::vector<DpAction>;
using TnlHeaders = std::vector<std::unique_ptr<TnlHeader>>;
using CtSpecs = std::vector<std::shared_ptr<const CtSpec>>;

}  // namespace dpu
