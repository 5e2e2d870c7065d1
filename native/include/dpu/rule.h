// rule.h: what the control plane writes: matches, OpenFlow-level actions,
// rules (flows in tables) and groups.
//
// These are the *first level* of rules (docs/design.md, "Two levels of rules"): the
// slow path (xlate.cc) walks them; the fast path never sees them. Rules are
// immutable once committed except for their statistics, which the slow path's
// xlate cache credits from megaflow counters (see dataplane.h, "stats push").
//
// Thread-safety: a Rule is shared (shared_ptr) between the table that owns it
// and the megaflows derived from it; only the atomic counters and the
// remove_version (set once by the writer, before the version that deletes
// it is published) change.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dpu/fields.h"
#include "dpu/flow_key.h"

namespace dpu {

constexpr int kNumTables = 255;           // tables 0..254, as OpenFlow
constexpr uint16_t kDefaultPriority = 32768;
constexpr uint32_t kGroupNone = 0xffffffffu;
constexpr uint8_t kTableCurrent = 255;    // resubmit(port,) keeps the current table

struct Match {
  Flow value{};  // always pre-masked: value & mask == value
  Flow mask{};
};

// One value per line of of_actions.def.
enum class OfAct : uint8_t {
#define DPU_OFACT(e, k, f) e,
#include "dpu/of_actions.def"
#undef DPU_OFACT
};

struct CtAction;

struct OfAction {
  OfAct type = OfAct::DROP;
  FieldId field = FieldId::IN_PORT;      // destination field (writes)
  FieldId src_field = FieldId::IN_PORT;  // MOVE source
  uint16_t ofs = 0, n_bits = 0;          // destination subfield (LOAD/MOVE)
  uint16_t src_ofs = 0;                  // MOVE source offset
  u128 value = 0, mask = 0;              // SET_FIELD/LOAD/MOD_*/WRITE_METADATA (field bits)
  uint32_t port = 0;                     // OUTPUT, RESUBMIT (kPortInPort = packet's in_port)
  uint32_t arg = 0;                      // table, group id, TPID, VLAN vid/pcp, drop reason
  std::vector<uint8_t> note;             // NOTE bytes
  std::shared_ptr<const CtAction> ct;    // CT
  int32_t pos = -1;                      // character position in the source text (errors)
};

// nat(src|dst=A[-B][:P[-Q]][,flags]) inside a ct action (IPv4 only).
struct NatRange {
  uint8_t type = 0;                      // 1 src, 2 dst, 0 a bare `nat`
  uint32_t addr_min = 0, addr_max = 0;   // host order; 0/0: no address given
  uint16_t port_min = 0, port_max = 0;   // 0: no port range given
  bool random = false, persistent = false, hash = false;
};

// ct(commit, force, zone=N|FIELD[a..b], table=T, nat..., exec(...)).
struct CtAction {
  bool commit = false, force = false;
  int table = -1;                        // ct(table=T); -1: the packet is not reinjected
  uint16_t zone = 0;                     // zone=N
  bool zone_from_field = false;          // zone=FIELD[a..b]
  FieldId zone_field = FieldId::REG0;
  uint16_t zone_ofs = 0, zone_bits = 16;
  bool nat = false;                      // any nat keyword
  NatRange range;
  std::vector<OfAction> exec;            // set_field/load to ct_mark and ct_label
};

// A rule's or group's packet counts. A rule that replaces another (same match
// and priority, or a mod-flows) takes over its counters: both share this, so
// counts still credited to the old one by a worker's megaflows land here too.
struct OfCounters {
  std::atomic<uint64_t> n_packets{0}, n_bytes{0};
  void add(uint64_t packets, uint64_t bytes) {
    n_packets.fetch_add(packets, std::memory_order_relaxed);
    n_bytes.fetch_add(bytes, std::memory_order_relaxed);
  }
};

constexpr uint64_t kVersionNever = ~0ull;

struct Rule {
  uint8_t table = 0;
  uint16_t priority = kDefaultPriority;
  uint64_t cookie = 0;
  Match match;
  std::vector<OfAction> actions;
  uint64_t seq = 0;          // commit order; the earlier rule wins a priority tie
  int64_t created_ns = 0;    // for duration= in dumps
  std::shared_ptr<OfCounters> counts = std::make_shared<OfCounters>();
  // Versions (classifier.h): visible in [add_version, remove_version).
  uint64_t add_version = 0;
  std::atomic<uint64_t> remove_version{kVersionNever};
  bool visible_in(uint64_t v) const {
    return add_version <= v && v < remove_version.load(std::memory_order_relaxed);
  }
};
using RulePtr = std::shared_ptr<Rule>;

enum class GroupType : uint8_t { ALL, SELECT, INDIRECT };

struct Bucket {
  uint32_t bucket_id = 0;
  uint32_t weight = 1;
  std::vector<OfAction> actions;
};

struct Group {
  uint32_t group_id = 0;
  GroupType type = GroupType::ALL;
  std::vector<Bucket> buckets;
  uint32_t total_weight = 0;
  std::shared_ptr<OfCounters> counts = std::make_shared<OfCounters>();  // kept by a mod-group
};
using GroupPtr = std::shared_ptr<Group>;

// A parsed flow_mod (add/modify/delete/dump selector).
struct FlowSpec {
  bool has_table = false;
  uint8_t table = 0;
  bool has_priority = false;
  uint16_t priority = kDefaultPriority;
  uint64_t cookie = 0, cookie_mask = 0;  // add: the cookie; else the flows selected (cookie=V/M)
  bool set_cookie = false;                // mod: cookie=V without a mask gives the flows cookie V
  uint64_t new_cookie = 0;
  Match match;
  bool has_actions = false;
  std::vector<OfAction> actions;
  uint32_t out_port = kPortNone;
  uint32_t out_group = kGroupNone;
};

// Is every flow matched by `narrow` also matched by `wide` (ofctl non-strict)?
inline bool match_covers(const Match& wide, const Match& narrow) {
  const word_t*wv = words(wide.value), *wm = words(wide.mask), *nv = words(narrow.value),
                 *nm = words(narrow.mask);
  for (size_t i = 0; i < kFlowWords; i++) {
    if ((wm[i] & ~nm[i]) != 0) return false;     // wide looks at bits narrow leaves free
    if ((nv[i] & wm[i]) != wv[i]) return false;
  }
  return true;
}

inline bool match_equal(const Match& a, const Match& b) {
  return std::memcmp(&a.value, &b.value, sizeof(Flow)) == 0 &&
         std::memcmp(&a.mask, &b.mask, sizeof(Flow)) == 0;
}

}  // namespace dpu
