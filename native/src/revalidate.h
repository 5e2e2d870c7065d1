// revalidate.h: which of a worker's cached megaflows a table change can
// affect (docs/design.md, "Changes without stopping the world"; dpcls.h,
// "Revalidation"), found through indexes rather than by looking at every
// megaflow, so that a change costs in proportion to what it touches.
//
// A megaflow records each table lookup of its walk (Megaflow::deps): the
// rule found, or none, and its priority. Then:
//   - a deleted or modified rule affects the megaflows that found it:
//     by_rule_, the megaflows of each rule found;
//   - an added rule R in table T affects a megaflow one of whose lookups in T
//     found nothing or a rule of lower priority, and whose packets R can
//     match: R's value agrees with the megaflow's key on C = R's mask & the
//     megaflow's mask. Megaflows of one megaflow subtable share their mask,
//     so for each subtable S the candidates are one hash lookup in a
//     CareIndex of S for C = R's mask & S's mask (built on first use, kept
//     up to date, at most kMaxCare per subtable, the least recently used
//     going first). A megaflow whose key is not what a lookup saw (an action
//     wrote a bit first, a resubmit gave another in_port, a fragment's ports
//     read as 0) is "loose": loose_[T] holds it for every table it looked
//     up, and an added rule tests it in full.
// Each megaflow keeps where it stands in each list (Megaflow::refs), so that
// dropping it costs the number of lists it is in.
//
// Thread-safety: owned by one worker, as the megaflow cache.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "datapath_view.h"
#include "dpu/flow_key.h"

namespace dpu {

struct Megaflow;
struct Subtable;

class DepIndex {
 public:
  static constexpr size_t kMaxCare = 4;

  // A megaflow just installed in subtable `st` (its deps recorded).
  void add(Megaflow* mf);
  // A megaflow leaving the cache.
  void remove(Megaflow* mf);
  void clear();
  // The megaflows `rc` can affect, appended to *out (possibly named twice).
  void affected(const RuleChange& rc, const std::vector<Subtable*>& subtables, std::vector<Megaflow*>* out);
  // A subtable's indexes go with it (it is empty).
  void forget(const Subtable* st);

 private:
  using List = std::vector<Megaflow*>;
  struct Care {
    uint64_t care[kKeyWords];
    std::unordered_map<uint64_t, List> buckets;  // by hash of (key & care)
    uint64_t used = 0;                           // last use, for eviction
  };
  static uint64_t care_hash(const uint64_t* key, const uint64_t* care);
  void put(List* l, Megaflow* mf);
  void take(List* l, Megaflow* mf);
  Care* care_index(const Subtable* st, const uint64_t* care);
  void index_into(Care* c, Megaflow* mf);

  std::unordered_map<const Rule*, List> by_rule_;
  List loose_[kNumTables];
  std::unordered_map<const Subtable*, std::vector<std::unique_ptr<Care>>> care_;
  uint64_t clock_ = 0;
};

}  // namespace dpu
