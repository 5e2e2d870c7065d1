// tunnel_term.h: the one rule that decides whether a frame is VXLAN for one
// of our VTEPs (tunnel termination), and the views it is decided on.
//
// A frame is terminated when it arrives on a tunnel port's underlay, on its
// first pass, addressed to our VTEP MAC, untagged, to our VTEP address (IPv4
// or IPv6, as configured), UDP to the VXLAN port, and not a fragment. The
// first tunnel port (in port-number order) whose VTEP matches wins.
//
// Three callers ask the same question and all of them call
// find_tunnel_term() here:
//   * the worker, right after parsing (outer_view(key)), and before parsing
//     when the frame has the usual shape (outer_view_raw), so the outer parse
//     can be skipped;
//   * the slow path (xlate.cc), which also needs the key bits the rule read
//     (tunnel_term_wildcards) for the megaflow of a frame that is not popped.
// Validation of the VXLAN header itself (lengths, checksums, flags) is the
// pop's job (vxlan.h), after termination has been decided.
//
// Uses: a parsed key or the raw frame; the terms (a snapshot of the tunnel
// ports, built by the dataplane at each commit). Pure; any thread.
#pragma once

#include <cstring>
#include <vector>

#include "checksum.h"
#include "dpu/batch.h"
#include "dpu/dp_actions.h"
#include "dpu/flow_key.h"
#include "ports.h"

namespace dpu {

// A VTEP the datapath terminates: one per tunnel port.
struct TunnelTerm {
  uint32_t underlay = 0;  // ofport the VXLAN arrives on
  uint32_t port = 0;      // the tunnel port: in_port after the pop
  TunnelCfg cfg;
  TnlHeader pop;          // what the pop checks (strict, address family)
};

// The outer-header fields the rule reads, wherever they come from.
struct OuterView {
  uint32_t in_port = 0, recirc_id = 0;
  const uint8_t* dl_dst = nullptr;  // 6 bytes
  uint16_t vlan_tci = 0;            // network order; 0 = untagged
  uint16_t dl_type = 0;             // network order
  const uint8_t* ip_dst = nullptr;  // 4 bytes (IPv4) or 16 (IPv6), by dl_type
  uint8_t nw_proto = 0, nw_frag = 0;
  uint16_t tp_dst = 0;              // network order
};

inline OuterView outer_view(const Flow& k) {
  OuterView v;
  v.in_port = k.in_port;
  v.recirc_id = k.recirc_id;
  v.dl_dst = k.dl_dst;
  v.vlan_tci = k.vlan_tci;
  v.dl_type = k.dl_type;
  v.ip_dst = k.dl_type == be16(kEthIpv6) ? k.ipv6_dst : reinterpret_cast<const uint8_t*>(&k.nw_dst);
  v.nw_proto = k.nw_proto;
  v.nw_frag = k.nw_frag;
  v.tp_dst = k.tp_dst;
  return v;
}

// The usual VXLAN arrival, read from the frame bytes without a parse: untagged
// IPv4 with a 20-byte header, a total length that is exactly the frame, not a
// fragment, UDP. For a frame of that shape these bytes are what the parser
// would put in the key. Anything else returns false (parse it instead).
[[gnu::always_inline]] inline bool outer_view_raw(const Packet* p, OuterView* v) {
  const uint8_t* d = p->data();
  const uint32_t n = p->len;
  if (n < 14 + 20 + 8 || load16(d + 12) != be16(kEthIp)) return false;
  const uint8_t* ip = d + 14;
  if (ip[0] != 0x45 || ip[9] != kIpUdp || be16(load16(ip + 2)) != n - 14 || (load16(ip + 6) & be16(0x3fff)))
    return false;
  v->in_port = p->md.in_port;
  v->recirc_id = p->md.recirc_id;
  v->dl_dst = d;
  v->vlan_tci = 0;
  v->dl_type = be16(kEthIp);
  v->ip_dst = ip + 16;
  v->nw_proto = kIpUdp;
  v->nw_frag = 0;
  v->tp_dst = load16(ip + 22);
  return true;
}

// The VTEP address: fixed-size compares, which the compiler turns into loads (a
// memcmp of a variable length is a libc call per packet).
[[gnu::always_inline]] inline bool same_vtep_ip(const uint8_t* a, const uint8_t* b, bool ipv6) {
  if (!ipv6) {
    uint32_t x, y;
    std::memcpy(&x, a, 4);
    std::memcpy(&y, b, 4);
    return x == y;
  }
  return std::memcmp(a, b, 16) == 0;
}

[[gnu::always_inline]] inline const TunnelTerm* find_tunnel_term(const TunnelTerm* terms, size_t n,
                                                                 const OuterView& v) {
  if (v.recirc_id != 0) return nullptr;
  for (size_t i = 0; i < n; i++) {
    const TunnelTerm& t = terms[i];
    if (t.underlay != v.in_port) continue;
    if (std::memcmp(v.dl_dst, t.cfg.local_mac, 6) != 0 || v.vlan_tci != 0) continue;
    if (v.dl_type != be16(t.cfg.ipv6 ? kEthIpv6 : kEthIp)) continue;
    if (!same_vtep_ip(v.ip_dst, t.cfg.local_ip, t.cfg.ipv6)) continue;
    if (v.nw_proto != kIpUdp || v.nw_frag != 0) continue;
    if (v.tp_dst != be16(t.cfg.dst_port)) continue;
    return &t;
  }
  return nullptr;
}

[[gnu::always_inline]] inline const TunnelTerm* find_tunnel_term(const std::vector<TunnelTerm>& terms,
                                                                 const OuterView& v) {
  return find_tunnel_term(terms.data(), terms.size(), v);
}

// Is `port` the underlay of any term?
inline bool is_tunnel_underlay(const std::vector<TunnelTerm>& terms, uint32_t port) {
  for (const TunnelTerm& t : terms)
    if (t.underlay == port) return true;
  return false;
}

// Every key bit the rule reads for a frame on an underlay port: a megaflow
// built for such a frame must match them all.
inline void tunnel_term_wildcards(const std::vector<TunnelTerm>& terms, Flow* wc) {
  std::memset(wc->dl_dst, 0xff, 6);
  wc->vlan_tci = 0xffff;
  wc->dl_type = 0xffff;
  wc->nw_proto = 0xff;
  wc->nw_frag = 0x03;
  wc->tp_dst = 0xffff;
  for (const TunnelTerm& t : terms) {
    if (t.cfg.ipv6) std::memset(wc->ipv6_dst, 0xff, 16);
    else wc->nw_dst = 0xffffffffu;
  }
}

}  // namespace dpu
