// ports.h: the port table (names <-> OpenFlow port numbers) and tunnel ports.
//
// A port is either a plain port (a pcap file, an in-memory queue, later a Linux
// interface) or a VXLAN tunnel port. A tunnel port is virtual: it is bound to an
// underlay port (the uplink), and owns the VTEP configuration (local address
// and MAC, next-hop MAC, UDP port, source-port range, TTL, underlay MTU). The
// slow path turns output to a tunnel port into TNL_PUSH toward the underlay,
// and traffic arriving on the underlay for the VTEP into TNL_POP, after which
// the packet is looked up again with in_port = the tunnel port, as Open
// vSwitch's native tunnelling does.
//
// Thread-safety: changed only under the dataplane's exclusive lock, read
// under the shared lock (slow path, dumps, trace).
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "dpu/fields.h"

namespace dpu {

struct TunnelCfg {
  uint32_t underlay = 0;     // ofport of the uplink
  bool ipv6 = false;
  uint8_t local_ip[16] = {}; // IPv4 in the first 4 bytes (network order)
  uint8_t local_mac[6] = {};
  uint8_t nexthop_mac[6] = {};
  // dst_port, sport_min, sport_max, ttl, mtu (underlay IP MTU), strict (drop
  // VXLAN with reserved bits set): defaults and bounds in tunnel_params.def
#define DPU_TUNNEL_PARAM(m, type, def, lo, hi, api, help) type m = def;
#include "dpu/tunnel_params.def"
#undef DPU_TUNNEL_PARAM
};
constexpr uint16_t kTunnelMtuMinIpv6 = 1280;  // IPv6's minimum link MTU (RFC 8200)

struct PortInfo {
  uint32_t ofport = 0;
  std::string name;
  bool tunnel = false;
  TunnelCfg tnl;
};

class PortTable : public PortNames {
 public:
  uint32_t port_number(std::string_view name) const override {
    auto it = by_name_.find(std::string(name));
    return it == by_name_.end() ? 0 : it->second;
  }
  std::string port_name(uint32_t p) const override {
    return p < ports_.size() && ports_[p].ofport ? ports_[p].name : std::string();
  }
  const PortInfo* get(uint32_t p) const { return p < ports_.size() && ports_[p].ofport ? &ports_[p] : nullptr; }
  void add(const PortInfo& info) {
    if (ports_.size() <= info.ofport) ports_.resize(info.ofport + 1);
    ports_[info.ofport] = info;
    by_name_[info.name] = info.ofport;
  }
  void remove(uint32_t p) {
    if (!get(p)) return;
    by_name_.erase(ports_[p].name);
    ports_[p] = PortInfo();
  }
  uint32_t max_port() const { return static_cast<uint32_t>(ports_.size()); }
  std::vector<const PortInfo*> all() const {
    std::vector<const PortInfo*> v;
    for (const PortInfo& p : ports_)
      if (p.ofport) v.push_back(&p);
    return v;
  }

 private:
  std::vector<PortInfo> ports_;  // indexed by ofport; [0] unused
  std::unordered_map<std::string, uint32_t> by_name_;
};

}  // namespace dpu
