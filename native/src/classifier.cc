// classifier.cc: OpenFlow table lookup (see classifier.h for the design).
#include "classifier.h"

#include <algorithm>

#include "rcu.h"

namespace dpu {

size_t Classifier::KeyHash::operator()(const Flow& f) const { return hash_of(f); }

uint32_t Classifier::hash_of(const Flow& f) {
  // Key hash of the datapath words, folded with the pipeline words.
  const word_t* w = words(f);
  uint64_t h = hash_key_words(w, 0x2545f4914f6cdd1dull);
  uint64_t p = 0;
  for (size_t i = kKeyWords; i < kFlowWords; i++) p = (p ^ w[i]) * 0x9e3779b97f4a7c15ull;
  const uint64_t m = mix128(h ^ p, 0xc2b2ae3d27d4eb4full);
  return static_cast<uint32_t>(m ^ (m >> 32));
}

static bool rule_before(const RulePtr& a, const RulePtr& b) {
  if (a->priority != b->priority) return a->priority > b->priority;
  return a->seq < b->seq;
}

Classifier::Slots::Slots(size_t n) : mask(n - 1), at(new std::atomic<const RuleList*>[n]) {
  for (size_t i = 0; i < n; i++) at[i].store(nullptr, std::memory_order_relaxed);
}

Classifier::Subtable::~Subtable() {
  const Slots* s = slots.load(std::memory_order_relaxed);
  if (!s) return;
  for (size_t i = 0; i <= s->mask; i++) {
    const RuleList* l = s->at[i].load(std::memory_order_relaxed);
    if (live(l)) delete l;
  }
  delete s;
}

Classifier::Classifier() : order_(new Order()) {}

Classifier::~Classifier() { delete order_.load(std::memory_order_relaxed); }

size_t Classifier::find_slot(const Slots& s, uint32_t h, const Flow& key) {
  for (size_t pos = h & s.mask;; pos = (pos + 1) & s.mask) {
    const RuleList* l = s.at[pos].load(std::memory_order_acquire);
    if (!l) return ~size_t{0};
    if (l != tombstone() && l->hash == h && KeyEq()(l->key, key)) return pos;
  }
}

const RulePtr* Classifier::lookup(const Flow& flow, uint64_t version, Flow* wc) const {
  const RulePtr* best = nullptr;
  Flow key;
  const Order* o = order_.load(std::memory_order_acquire);
  for (size_t i = 0; i < o->st.size(); i++) {
    if (best && o->max_priority[i] < (*best)->priority) break;
    const Subtable& st = *o->st[i];
    if (wc) flow_or_into(*wc, st.mask);
    flow_and(key, flow, st.mask);
    const Slots* s = st.slots.load(std::memory_order_acquire);
    const size_t at = find_slot(*s, hash_of(key), key);
    if (at == ~size_t{0}) continue;
    const RuleList* l = s->at[at].load(std::memory_order_acquire);
    for (const RulePtr& r : l->rules) {
      if (!r->visible_in(version)) continue;
      if (!best || r->priority > (*best)->priority || (r->priority == (*best)->priority && r->seq < (*best)->seq))
        best = &r;
      break;  // the list is best first
    }
  }
  return best;
}

// Puts `l` (null: none) in the slot of `key`, growing or cleaning the array
// when needed; the list it replaces is retired.
void Classifier::set_list(Subtable* st, const Flow& key, uint32_t h, const RuleList* l, Rcu& rcu) {
  const Slots* s = st->slots.load(std::memory_order_relaxed);
  const size_t at = find_slot(*s, h, key);
  if (at != ~size_t{0}) {
    const RuleList* old = s->at[at].load(std::memory_order_relaxed);
    s->at[at].store(l ? l : tombstone(), std::memory_order_release);
    rcu.retire(old);
    return;
  }
  if (!l) return;
  const size_t size = s->mask + 1;
  if ((s->used + 1) * 2 > size) {  // rebuild: twice as large if the lists alone need it
    size_t lists = 1;
    for (size_t i = 0; i < size; i++) lists += live(s->at[i].load(std::memory_order_relaxed)) ? 1 : 0;
    size_t n = 16;
    while (lists * 4 > n) n *= 2;  // at most a quarter full after the rebuild
    auto* ns = new Slots(n);
    for (size_t i = 0; i < size; i++) {
      const RuleList* x = s->at[i].load(std::memory_order_relaxed);
      if (!live(x)) continue;
      size_t pos = x->hash & ns->mask;
      while (ns->at[pos].load(std::memory_order_relaxed)) pos = (pos + 1) & ns->mask;
      ns->at[pos].store(x, std::memory_order_relaxed);
      ns->used++;
    }
    size_t pos = h & ns->mask;
    while (ns->at[pos].load(std::memory_order_relaxed)) pos = (pos + 1) & ns->mask;
    ns->at[pos].store(l, std::memory_order_relaxed);
    ns->used++;
    st->slots.store(ns, std::memory_order_release);
    rcu.retire(s);  // the lists moved; only the array goes
    return;
  }
  size_t pos = h & s->mask;
  for (;; pos = (pos + 1) & s->mask) {
    const RuleList* x = s->at[pos].load(std::memory_order_relaxed);
    if (!x) break;
    if (x == tombstone()) break;  // reused: a reader that passed it finds the key further on or not at all
  }
  if (!s->at[pos].load(std::memory_order_relaxed)) const_cast<Slots*>(s)->used++;
  s->at[pos].store(l, std::memory_order_release);
}

void Classifier::publish_order(Rcu& rcu) {
  auto* o = new Order();
  for (auto& kv : by_mask_) o->st.push_back(kv.second.get());
  std::stable_sort(o->st.begin(), o->st.end(), [](const Subtable* a, const Subtable* b) {
    return a->max_priority > b->max_priority;
  });
  for (const Subtable* st : o->st) o->max_priority.push_back(st->max_priority);
  const Order* old = order_.exchange(o, std::memory_order_acq_rel);
  rcu.retire(old);
}

void Classifier::insert(const RulePtr& r, Rcu& rcu) {
  auto it = by_mask_.find(r->match.mask);
  bool republish = false;
  if (it == by_mask_.end()) {
    auto st = std::make_unique<Subtable>();
    st->mask = r->match.mask;
    st->slots.store(new Slots(16), std::memory_order_relaxed);
    it = by_mask_.emplace(st->mask, std::move(st)).first;
    republish = true;
  }
  Subtable* st = it->second.get();
  const uint32_t h = hash_of(r->match.value);
  const Slots* s = st->slots.load(std::memory_order_relaxed);
  const size_t at = find_slot(*s, h, r->match.value);
  auto* l = new RuleList();
  l->hash = h;
  l->key = r->match.value;
  if (at != ~size_t{0}) l->rules = s->at[at].load(std::memory_order_relaxed)->rules;
  l->rules.insert(std::upper_bound(l->rules.begin(), l->rules.end(), r, rule_before), r);
  st->priorities[r->priority]++;
  st->n++;
  n_rules_++;
  if (r->priority > st->max_priority) {
    st->max_priority = r->priority;
    republish = true;
  }
  // The new order goes out with the transaction (publish()): readers of the
  // versions before it do not need the new subtable or priority.
  order_dirty_ |= republish;
  set_list(st, r->match.value, h, l, rcu);
}

void Classifier::publish(Rcu& rcu) {
  if (!order_dirty_) return;
  order_dirty_ = false;
  publish_order(rcu);
}

bool Classifier::remove(const Rule* r, Rcu& rcu) {
  auto it = by_mask_.find(r->match.mask);
  if (it == by_mask_.end()) return false;
  Subtable* st = it->second.get();
  const uint32_t h = hash_of(r->match.value);
  const Slots* s = st->slots.load(std::memory_order_relaxed);
  const size_t at = find_slot(*s, h, r->match.value);
  if (at == ~size_t{0}) return false;
  const RuleList* cur = s->at[at].load(std::memory_order_relaxed);
  auto pos = std::find_if(cur->rules.begin(), cur->rules.end(), [r](const RulePtr& p) { return p.get() == r; });
  if (pos == cur->rules.end()) return false;
  const uint16_t prio = r->priority;
  RuleList* l = nullptr;
  if (cur->rules.size() > 1) {
    l = new RuleList();
    l->hash = h;
    l->key = cur->key;
    l->rules = cur->rules;
    l->rules.erase(l->rules.begin() + (pos - cur->rules.begin()));
  }
  set_list(st, r->match.value, h, l, rcu);  // retires cur (and with it, perhaps, the rule)
  st->n--;
  n_rules_--;
  if (--st->priorities[prio] == 0) st->priorities.erase(prio);
  if (st->n == 0) {  // unpublished before it is retired
    std::unique_ptr<Subtable> gone = std::move(it->second);
    by_mask_.erase(it);
    order_dirty_ = false;
    publish_order(rcu);
    rcu.retire(gone.release());
    return true;
  }
  if (prio == st->max_priority && !st->priorities.count(prio)) {
    int mx = -1;
    for (auto& kv : st->priorities) mx = std::max(mx, static_cast<int>(kv.first));
    st->max_priority = mx;
    order_dirty_ = true;  // a lower bound may wait: the published one is still an upper bound
  }
  return true;
}

RulePtr Classifier::find_exact(const Match& m, uint16_t priority, uint64_t version) const {
  auto it = by_mask_.find(m.mask);
  if (it == by_mask_.end()) return nullptr;
  const Slots* s = it->second->slots.load(std::memory_order_acquire);
  const size_t at = find_slot(*s, hash_of(m.value), m.value);
  if (at == ~size_t{0}) return nullptr;
  for (const RulePtr& r : s->at[at].load(std::memory_order_acquire)->rules)
    if (r->priority == priority && r->visible_in(version)) return r;
  return nullptr;
}

size_t Classifier::size(uint64_t version) const {
  size_t n = 0;
  for_each(version, [&n](const RulePtr&) { n++; });
  return n;
}

}  // namespace dpu
