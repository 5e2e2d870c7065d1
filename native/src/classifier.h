// classifier.h: one OpenFlow table: priority lookup by tuple-space search,
// versioned, read without locks while the control thread changes it.
//
// Rules are grouped into subtables, one per distinct mask; each subtable is a
// hash of masked values -> rules (highest priority first, then commit order).
// Subtables are kept sorted by the highest priority they hold, so a lookup stops
// as soon as no remaining subtable can beat the best rule found. Every subtable
// probed contributes its mask to the caller's wildcards: a packet that differs
// in any of those bits could have found a different rule, so the megaflow
// derived from the walk must match them exactly (OVS classifier.h's
// un-wildcarding; its prefix tries are not done).
//
// Staged lookup (as OVS's): a subtable's mask falls into up to four stages,
// metadata (datapath metadata, conntrack, pipeline state), L2, L3 (addresses,
// protocol, TOS, TTL, fragment bits, ARP hardware addresses, TCP flags) and L4
// (ports, ICMP type and code). Each stage that has bits, except the last,
// has an index: the hashes of the rules' values under the mask up to and
// including that stage. A lookup checks them in order, and a flow whose
// stage hash no rule has is no match there, having looked at that stage and
// the ones before it only: only their bits join the wildcards. A packet of
// another tenant's tables thus does not pull a gateway's ICMP type into its
// megaflow, which would split one megaflow into 256 by the ports' low byte.
// An index counts every rule stored, whatever its versions: a rule not
// visible at a reader's version can only make a stage pass that could have
// missed (more bits in the megaflow, never fewer), as can a hash collision.
//
// Ties between equal-priority overlapping rules go to the rule committed first
// (lowest Rule::seq); a rule that replaces an identical match+priority keeps the
// seq of the rule it replaced.
//
// Versions (as OVS's classifier, docs/design.md "Changes without stopping the
// world"): a rule is visible from Rule::add_version until Rule::remove_version
// (exclusive). A lookup is made at a version: it sees exactly the rules visible
// in it, so a worker that took version V at the start of its batch sees V's
// rules for the whole batch, whatever is committed meanwhile. The writer adds
// a rule with a version not yet published and deletes one by setting its
// remove_version to the version being made; the rule leaves the structure
// (remove()) only when no reader can still be at an older version (rcu.h).
//
// Concurrency: one writer at a time (the dataplane's control mutex); readers
// on any thread, inside the dataplane's read section (rcu.h) or holding the
// control mutex. Nothing a reader can reach is changed in place: a subtable's
// slot array holds pointers to immutable rule lists that the writer replaces
// (copy on write) and retires; a full array is rebuilt and the old one
// retired; the sorted subtable list likewise.
#pragma once

#include <atomic>
#include <memory>
#include <unordered_map>
#include <vector>

#include "dpu/rule.h"

namespace dpu {

class Rcu;

class Classifier {
 public:
  Classifier();
  ~Classifier();
  Classifier(const Classifier&) = delete;
  Classifier& operator=(const Classifier&) = delete;

  // Readers. The best rule visible at `version` matching `flow`, or nullptr;
  // ORs the masks of the subtables probed into *wc. The pointer stays valid
  // for the rest of the caller's read section.
  const RulePtr* lookup(const Flow& flow, uint64_t version, Flow* wc) const;
  // Every rule visible at `version`.
  template <class F>
  void for_each(uint64_t version, F&& f) const {
    const Order* o = order_.load(std::memory_order_acquire);
    for (const Subtable* st : o->st) {
      const Slots* s = st->slots.load(std::memory_order_acquire);
      for (size_t i = 0; i <= s->mask; i++) {
        const RuleList* l = s->at[i].load(std::memory_order_acquire);
        if (!live(l)) continue;
        for (const RulePtr& r : l->rules)
          if (r->visible_in(version)) f(r);
      }
    }
  }

  // Writer. The rule (its add_version set) goes in; it is visible once its
  // version is published.
  void insert(const RulePtr& r, Rcu& rcu);
  // Takes the rule out of the structure. Only for a rule no reader can still
  // see: its remove_version published and every reader of older versions gone.
  bool remove(const Rule* r, Rcu& rcu);
  // Publishes the subtable order that the inserts and removals since the
  // last call need; before the version that makes their rules visible.
  void publish(Rcu& rcu);
  // The rule with this match and priority visible at `version`, if any.
  RulePtr find_exact(const Match& m, uint16_t priority, uint64_t version) const;
  // Rules visible at `version` (a count, for table stats and dumps).
  size_t size(uint64_t version) const;
  // Rules in the structure, whatever their versions.
  size_t stored() const { return n_rules_; }

 private:
  struct KeyHash {
    size_t operator()(const Flow& f) const;
  };
  struct KeyEq {
    bool operator()(const Flow& a, const Flow& b) const { return std::memcmp(&a, &b, sizeof(Flow)) == 0; }
  };
  // The rules with one masked value, best first. Immutable once published.
  struct RuleList {
    uint32_t hash = 0;
    Flow key{};
    std::vector<RulePtr> rules;
  };
  // Open addressing, linear probing; a slot goes from empty to a list, from
  // a list to its replacement or to a tombstone, never back to empty (a
  // reader stops at an empty slot). Rebuilt without tombstones when
  // more than half is used.
  struct Slots {
    size_t mask = 0;  // size - 1
    size_t used = 0;  // lists + tombstones (writer)
    std::unique_ptr<std::atomic<const RuleList*>[]> at;
    explicit Slots(size_t n);
  };
  // A stage's share of a subtable's mask: the words it has bits in and
  // those bits.
  struct StageWords {
    uint8_t n = 0;
    uint8_t idx[kFlowWords] = {};
    uint64_t bits[kFlowWords] = {};
  };
  // One stage's index: stage hash -> rules stored with it (open addressing,
  // linear probing; an entry keeps its hash once given one, its count may
  // fall to 0). Entry: hash << 32 | count, 0 when empty. Rebuilt larger
  // (and without zero counts) when half the entries have a hash; the old
  // one is retired.
  struct StageIndex {
    size_t mask = 0;  // size - 1
    size_t used = 0;  // entries with a hash (writer)
    std::unique_ptr<std::atomic<uint64_t>[]> at;
    explicit StageIndex(size_t n);
    bool has(uint32_t h) const;
  };
  static constexpr int kStages = 4;
  struct Subtable {
    Flow mask{};
    std::atomic<const Slots*> slots{nullptr};
    // Staged lookup: stage[k] and index[k] for k < n_indices; upto[k] is the
    // mask's bits in stages 0..k, what a miss at index k un-wildcards.
    uint8_t n_indices = 0;
    StageWords stage[kStages - 1];
    Flow upto[kStages - 1]{};
    std::atomic<const StageIndex*> index[kStages - 1] = {};
    // writer
    std::unordered_map<uint16_t, uint32_t> priorities;  // priority -> rules stored
    int max_priority = -1;  // over every stored rule, whatever its versions
    size_t n = 0;
    ~Subtable();
  };
  // The subtables, best max_priority first, with those priorities as they
  // were when the list was published (never below a stored rule's).
  struct Order {
    std::vector<Subtable*> st;
    std::vector<int> max_priority;
  };
  static const RuleList* tombstone() { return reinterpret_cast<const RuleList*>(uintptr_t{1}); }
  static bool live(const RuleList* l) { return l != nullptr && l != tombstone(); }
  static size_t find_slot(const Slots& s, uint32_t h, const Flow& key);  // index of key's list, or ~0
  static uint32_t hash_of(const Flow& masked);
  static void init_stages(Subtable& st);
  // The stage hashes of `f` under st's mask (n_indices of them).
  static void stage_hashes(const Subtable& st, const Flow& f, uint32_t* out);
  // A stored rule's value joins (+1) or leaves (-1) st's stage indexes.
  static void count_stages(Subtable& st, const Flow& value, int delta, Rcu& rcu);
  void set_list(Subtable* st, const Flow& key, uint32_t h, const RuleList* l, Rcu& rcu);
  void publish_order(Rcu& rcu);

  std::atomic<const Order*> order_;
  // writer
  bool order_dirty_ = false;
  std::unordered_map<Flow, std::unique_ptr<Subtable>, KeyHash, KeyEq> by_mask_;
  size_t n_rules_ = 0;
};

}  // namespace dpu
