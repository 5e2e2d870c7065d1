// dp_format.h: datapath actions as text, in Open vSwitch's words:
// "set(eth(src=..,dst=..)),set(ipv4(ttl=63)),tnl_push(vxlan(vni=100,..),..),p0".
//
// What `dpu trace` prints as "Datapath actions:" and dump-megaflows shows for
// each megaflow. Reads a translation's DpActions (xlate.h) and the port names;
// pure, any thread. The slow path itself (xlate.cc) formats nothing.
#pragma once

#include <string>

#include "dpu/dp_actions.h"
#include "dpu/fields.h"

namespace dpu {

// OVS-style datapath action text: "set(ipv4(ttl=63)),vm2", "tnl_pop(vxlan0)".
std::string format_dp_actions(const DpActions& acts, const PortNames* ports);

}  // namespace dpu
