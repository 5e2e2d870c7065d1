// classifier.cc: OpenFlow table lookup (see classifier.h for the design).
#include "classifier.h"

#include <algorithm>

namespace dpu {

size_t Classifier::KeyHash::operator()(const Flow& f) const {
  // Key hash of the datapath words, folded with the pipeline words.
  const word_t* w = words(f);
  uint64_t h = hash_key_words(w, 0x2545f4914f6cdd1dull);
  uint64_t p = 0;
  for (size_t i = kKeyWords; i < kFlowWords; i++) p = (p ^ w[i]) * 0x9e3779b97f4a7c15ull;
  return static_cast<size_t>(mix128(h ^ p, 0xc2b2ae3d27d4eb4full));
}

static bool rule_before(const RulePtr& a, const RulePtr& b) {
  if (a->priority != b->priority) return a->priority > b->priority;
  return a->seq < b->seq;
}

const RulePtr* Classifier::lookup(const Flow& flow, Flow* wc) const {
  const RulePtr* best = nullptr;
  Flow key;
  for (const auto& stp : subtables_) {
    const Subtable& st = *stp;
    if (best && st.max_priority < (*best)->priority) break;
    if (wc) flow_or_into(*wc, st.mask);
    flow_and(key, flow, st.mask);
    auto it = st.rules.find(key);
    if (it == st.rules.end()) continue;
    const RulePtr* r = &it->second.front();
    if (!best || (*r)->priority > (*best)->priority ||
        ((*r)->priority == (*best)->priority && (*r)->seq < (*best)->seq))
      best = r;
  }
  return best;
}

Classifier::Subtable* Classifier::find_subtable(const Flow& mask) const {
  auto it = by_mask_.find(mask);
  return it == by_mask_.end() ? nullptr : it->second;
}

void Classifier::resort() {
  std::stable_sort(subtables_.begin(), subtables_.end(),
                   [](const std::unique_ptr<Subtable>& a, const std::unique_ptr<Subtable>& b) {
                     return a->max_priority > b->max_priority;
                   });
}

void Classifier::insert(const RulePtr& r) {
  Subtable* st = find_subtable(r->match.mask);
  if (!st) {
    subtables_.push_back(std::make_unique<Subtable>());
    st = subtables_.back().get();
    st->mask = r->match.mask;
    by_mask_[st->mask] = st;
  }
  auto& bucket = st->rules[r->match.value];
  bucket.insert(std::upper_bound(bucket.begin(), bucket.end(), r, rule_before), r);
  st->priorities[r->priority]++;
  st->n++;
  n_rules_++;
  if (r->priority > st->max_priority) {
    st->max_priority = r->priority;
    resort();
  }
}

bool Classifier::remove(const Rule* r) {
  Subtable* st = find_subtable(r->match.mask);
  if (!st) return false;
  auto it = st->rules.find(r->match.value);
  if (it == st->rules.end()) return false;
  auto& bucket = it->second;
  auto pos = std::find_if(bucket.begin(), bucket.end(), [r](const RulePtr& p) { return p.get() == r; });
  if (pos == bucket.end()) return false;
  uint16_t prio = r->priority;
  bucket.erase(pos);
  if (bucket.empty()) st->rules.erase(it);
  st->n--;
  n_rules_--;
  if (--st->priorities[prio] == 0) st->priorities.erase(prio);
  if (st->n == 0) {
    by_mask_.erase(st->mask);
    subtables_.erase(std::find_if(subtables_.begin(), subtables_.end(),
                                  [st](const std::unique_ptr<Subtable>& p) { return p.get() == st; }));
    return true;
  }
  if (prio == st->max_priority && !st->priorities.count(prio)) {
    int mx = -1;
    for (auto& kv : st->priorities) mx = std::max(mx, static_cast<int>(kv.first));
    st->max_priority = mx;
    resort();
  }
  return true;
}

RulePtr Classifier::find_exact(const Match& m, uint16_t priority) const {
  Subtable* st = find_subtable(m.mask);
  if (!st) return nullptr;
  auto it = st->rules.find(m.value);
  if (it == st->rules.end()) return nullptr;
  for (const RulePtr& r : it->second)
    if (r->priority == priority) return r;
  return nullptr;
}

}  // namespace dpu
