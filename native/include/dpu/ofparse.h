// ofparse.h: ovs-ofctl flow and group syntax, both ways.
//
// parse_flow() turns one line such as
//   table=0,priority=100,in_port=vm1,ip,nw_dst=10.0.0.0/24,actions=mod_dl_dst:02:00:00:00:00:02,output:vm2
// into a FlowSpec; errors name the token and its character position, like
// ovs-ofctl. format_*() write the canonical text back (dump-flows style), so
// format(parse(x)) parses to the same rule.
//
// Parsing only needs port names (PortNames); it never touches tables or
// groups, so a whole list can be validated before anything is committed.
// Group existence and goto/resubmit targets are checked at commit time by the
// dataplane (dataplane.cc). Pure functions; any thread.
#pragma once

#include <string>
#include <string_view>

#include "dpu/rule.h"
#include "dpu/status.h"

namespace dpu {

enum class FlowCmd : uint8_t { ADD, MODIFY, DELETE, MATCH_ONLY };

Status parse_flow(std::string_view text, FlowCmd cmd, const PortNames* ports, FlowSpec* out);
Status parse_group(std::string_view text, bool need_buckets, const PortNames* ports, Group* out);
// Parses just an action list (as after "actions=").
Status parse_actions(std::string_view text, int base_pos, const PortNames* ports, uint8_t table,
                     std::vector<OfAction>* out);

std::string format_match(const Match& m, uint16_t priority, bool with_priority,
                         const PortNames* ports);
std::string format_actions(const std::vector<OfAction>& acts, const PortNames* ports);
std::string format_action(const OfAction& a, const PortNames* ports);
std::string format_nat_range(const NatRange& r);  // nat, nat(src=A-B:P-Q,flags)
std::string format_group(const Group& g, const PortNames* ports);

// Drop reasons by wire name (drop_reasons.def).
int drop_reason_by_name(std::string_view name);
const char* drop_reason_name(int reason);
const char* drop_reason_help(int reason);
int drop_reason_count();

}  // namespace dpu
