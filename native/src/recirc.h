// recirc.h: frozen pipeline state, found again by recirc_id (as OVS's
// recirc_id_node and frozen state).
//
// A ct(table=T) ends a pass: the packet goes to the conntrack stage and is
// then looked up again. What the next pass needs beyond the packet and its
// datapath metadata (the table to resume in, metadata and registers) is
// frozen here under a recirc_id, which becomes part of the next pass's key:
// megaflows of the resumed pass match it exactly. Identical states share an
// id, so the number of ids is the number of distinct continuations, not of
// packets.
//
// Ids live until the next table commit, when every cache is flushed and no
// packet is in flight (commits wait for every worker between batches).
// Thread-safety: its own mutex; freeze from upcalls (shared table lock),
// clear from the commit (exclusive lock).
#pragma once

#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "dpu/flow_key.h"

namespace dpu {

struct FrozenState {
  uint8_t table = 0;
  uint32_t in_port = 0;  // as the pipeline saw it (resubmit(port,table) may have changed it)
  uint64_t metadata = 0;
  uint32_t regs[8] = {};
  bool operator==(const FrozenState& o) const {
    return table == o.table && in_port == o.in_port && metadata == o.metadata &&
           std::memcmp(regs, o.regs, sizeof regs) == 0;
  }
};

class RecircTable {
 public:
  static constexpr size_t kMax = 1u << 20;

  // The id of this state (1..), or 0 when the table is full.
  uint32_t freeze(const FrozenState& s) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = ids_.find(s);
    if (it != ids_.end()) return it->second;
    if (states_.size() >= kMax) return 0;
    states_.push_back(s);
    uint32_t id = static_cast<uint32_t>(states_.size());
    ids_.emplace(s, id);
    return id;
  }
  bool thaw(uint32_t id, FrozenState* out) const {
    std::lock_guard<std::mutex> g(mu_);
    if (id == 0 || id > states_.size()) return false;
    *out = states_[id - 1];
    return true;
  }
  void clear() {
    std::lock_guard<std::mutex> g(mu_);
    states_.clear();
    ids_.clear();
  }
  size_t size() const {
    std::lock_guard<std::mutex> g(mu_);
    return states_.size();
  }

 private:
  struct Hash {
    size_t operator()(const FrozenState& s) const {
      uint64_t h = s.table ^ (static_cast<uint64_t>(s.in_port) << 8) ^ (s.metadata * 0x9e3779b97f4a7c15ull);
      for (uint32_t r : s.regs) h = (h ^ r) * 0xc2b2ae3d27d4eb4full;
      return static_cast<size_t>(h ^ (h >> 29));
    }
  };
  mutable std::mutex mu_;
  std::vector<FrozenState> states_;  // id - 1
  std::unordered_map<FrozenState, uint32_t, Hash> ids_;
};

}  // namespace dpu
