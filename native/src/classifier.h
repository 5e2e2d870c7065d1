// classifier.h: one OpenFlow table: priority lookup by tuple-space search.
//
// Rules are grouped into subtables, one per distinct mask; each subtable is a
// hash of masked values -> rules (highest priority first, then commit order).
// Subtables are kept sorted by the highest priority they hold, so a lookup stops
// as soon as no remaining subtable can beat the best rule found. Every subtable
// probed contributes its mask to the caller's wildcards: a packet that differs
// in any of those bits could have found a different rule, so the megaflow
// derived from the walk must match them exactly (OVS classifier.h's
// un-wildcarding, without staged lookup or prefix tries).
//
// Ties between equal-priority overlapping rules go to the rule committed first
// (lowest Rule::seq); a rule that replaces an identical match+priority keeps the
// seq of the rule it replaced.
//
// Thread-safety: lookups are const and may run concurrently with each other;
// insert/remove only under the dataplane's exclusive table lock.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "dpu/rule.h"

namespace dpu {

class Classifier {
 public:
  // Best matching rule or nullptr; ORs the masks of probed subtables into *wc.
  // The pointer stays valid until the table is next modified.
  const RulePtr* lookup(const Flow& flow, Flow* wc) const;
  void insert(const RulePtr& r);
  bool remove(const Rule* r);
  RulePtr find_exact(const Match& m, uint16_t priority) const;
  size_t size() const { return n_rules_; }
  size_t n_subtables() const { return subtables_.size(); }
  template <class F>
  void for_each(F&& f) const {
    for (const auto& st : subtables_)
      for (const auto& kv : st->rules)
        for (const RulePtr& r : kv.second) f(r);
  }

 private:
  struct KeyHash {
    size_t operator()(const Flow& f) const;
  };
  struct KeyEq {
    bool operator()(const Flow& a, const Flow& b) const { return std::memcmp(&a, &b, sizeof(Flow)) == 0; }
  };
  struct Subtable {
    Flow mask{};
    std::unordered_map<Flow, std::vector<RulePtr>, KeyHash, KeyEq> rules;
    std::unordered_map<uint16_t, uint32_t> priorities;  // priority -> rule count
    int max_priority = -1;
    size_t n = 0;
  };
  Subtable* find_subtable(const Flow& mask) const;
  void resort();

  std::vector<std::unique_ptr<Subtable>> subtables_;  // sorted by max_priority, descending
  std::unordered_map<Flow, Subtable*, KeyHash, KeyEq> by_mask_;
  size_t n_rules_ = 0;
};

}  // namespace dpu
