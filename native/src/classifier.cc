// classifier.cc: OpenFlow table lookup (see classifier.h for the design).
#include "classifier.h"

#include <algorithm>
#include <cstddef>

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

// ---- staged lookup ------------------------------------------------------------------------------
// The stage of each byte of a Flow (classifier.h, "Staged lookup"): OVS's
// segments, with its metadata (tunnel, conntrack, registers) first.
namespace {
enum : uint8_t { kStMeta, kStL2, kStL3, kStL4 };
struct StageRange {
  size_t begin, end;
  uint8_t stage;
};
constexpr StageRange kStageRanges[] = {
    {0, offsetof(Flow, dl_dst), kStMeta},
    {offsetof(Flow, dl_dst), offsetof(Flow, nw_src), kStL2},
    {offsetof(Flow, nw_src), offsetof(Flow, tp_src), kStL3},
    {offsetof(Flow, tp_src), offsetof(Flow, nw_proto), kStL4},
    {offsetof(Flow, nw_proto), offsetof(Flow, ct_label), kStL3},
    {offsetof(Flow, ct_label), sizeof(Flow), kStMeta},
};
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "stage_bits: byte k of a word is its bits 8k..8k+7");
static_assert(offsetof(Flow, tp_dst) + 2 == offsetof(Flow, nw_proto) && offsetof(Flow, tcp_flags) < offsetof(Flow, ct_label),
              "the L4 stage is tp_src and tp_dst, and L3 runs on to the conntrack words");

// The bits of word i that belong to `stage`.
uint64_t stage_bits(uint8_t stage, size_t i) {
  uint64_t b = 0;
  for (const StageRange& r : kStageRanges)
    for (size_t byte = std::max(r.begin, i * 8); byte < std::min(r.end, i * 8 + 8); byte++)
      if (r.stage == stage) b |= uint64_t{0xff} << (8 * (byte - i * 8));
  return b;
}

constexpr uint64_t kStageBasis = 0x6a09e667f3bcc909ull;
uint64_t chain(uint64_t h, const word_t* w, uint8_t n, const uint8_t* idx, const uint64_t* bits) {
  for (uint8_t i = 0; i < n; i++) h = mix128(h ^ (w[idx[i]] & bits[i]), 0x9e3779b97f4a7c15ull + idx[i]);
  return h;
}
// Never 0, so that an entry with a hash is never 0 (empty) whatever its count.
uint32_t fold(uint64_t h) { return static_cast<uint32_t>(h ^ (h >> 32)) | 1u; }
// A folded hash's first slot: its bits above the one fold() sets.
size_t home(uint32_t h, size_t mask) { return (h >> 1) & mask; }
}  // namespace

Classifier::StageIndex::StageIndex(size_t n) : mask(n - 1), at(new std::atomic<uint64_t>[n]) {
  for (size_t i = 0; i < n; i++) at[i].store(0, std::memory_order_relaxed);
}

bool Classifier::StageIndex::has(uint32_t h) const {
  for (size_t pos = home(h, mask);; pos = (pos + 1) & mask) {
    const uint64_t e = at[pos].load(std::memory_order_acquire);
    if (!e) return false;
    if (static_cast<uint32_t>(e >> 32) == h) return static_cast<uint32_t>(e) != 0;
  }
}

void Classifier::init_stages(Subtable& st) {
  const word_t* m = words(st.mask);
  StageWords by_stage[kStages];
  for (uint8_t s = 0; s < kStages; s++)
    for (size_t i = 0; i < kFlowWords; i++)
      if (const uint64_t b = m[i] & stage_bits(s, i)) {
        StageWords& w = by_stage[s];
        w.idx[w.n] = static_cast<uint8_t>(i);
        w.bits[w.n++] = b;
      }
  // The stages that have bits; all but the last get an index.
  int used[kStages], n_used = 0;
  for (int s = 0; s < kStages; s++)
    if (by_stage[s].n) used[n_used++] = s;
  st.n_indices = static_cast<uint8_t>(n_used > 0 ? n_used - 1 : 0);
  Flow upto{};
  for (uint8_t k = 0; k < st.n_indices; k++) {
    const StageWords& w = by_stage[used[k]];
    st.stage[k] = w;
    for (uint8_t i = 0; i < w.n; i++) words(upto)[w.idx[i]] |= w.bits[i];
    st.upto[k] = upto;
    st.index[k].store(new StageIndex(16), std::memory_order_relaxed);
  }
}

void Classifier::stage_hashes(const Subtable& st, const Flow& f, uint32_t* out) {
  uint64_t h = kStageBasis;
  for (uint8_t k = 0; k < st.n_indices; k++) {
    h = chain(h, words(f), st.stage[k].n, st.stage[k].idx, st.stage[k].bits);
    out[k] = fold(h);
  }
}

void Classifier::count_stages(Subtable& st, const Flow& value, int delta, Rcu& rcu) {
  uint32_t hs[kStages - 1];
  stage_hashes(st, value, hs);
  for (uint8_t k = 0; k < st.n_indices; k++) {
    const uint32_t h = hs[k];
    const StageIndex* x = st.index[k].load(std::memory_order_relaxed);
    size_t pos = home(h, x->mask);
    uint64_t e;
    for (; (e = x->at[pos].load(std::memory_order_relaxed)) != 0; pos = (pos + 1) & x->mask)
      if (static_cast<uint32_t>(e >> 32) == h) break;
    if (e) {  // the count is never below the rules stored with this hash
      x->at[pos].store((e & ~uint64_t{0xffffffff}) | (static_cast<uint32_t>(e) + static_cast<uint32_t>(delta)),
                       std::memory_order_release);
      continue;
    }
    if (delta < 0) continue;  // (cannot happen: the rule was counted when stored)
    if ((x->used + 1) * 2 > x->mask + 1) {  // rebuild: at most a quarter full, zero counts dropped
      size_t live = 1;
      for (size_t i = 0; i <= x->mask; i++) live += static_cast<uint32_t>(x->at[i].load(std::memory_order_relaxed)) ? 1 : 0;
      size_t n = 16;
      while (live * 4 > n) n *= 2;
      auto* nx = new StageIndex(n);
      for (size_t i = 0; i <= x->mask; i++) {
        const uint64_t v = x->at[i].load(std::memory_order_relaxed);
        if (!static_cast<uint32_t>(v)) continue;
        size_t p = home(static_cast<uint32_t>(v >> 32), nx->mask);
        while (nx->at[p].load(std::memory_order_relaxed)) p = (p + 1) & nx->mask;
        nx->at[p].store(v, std::memory_order_relaxed);
        nx->used++;
      }
      st.index[k].store(nx, std::memory_order_release);
      rcu.retire(x);
      x = nx;
      pos = home(h, x->mask);
      while (x->at[pos].load(std::memory_order_relaxed)) pos = (pos + 1) & x->mask;
    }
    const_cast<StageIndex*>(x)->used++;
    x->at[pos].store(uint64_t{h} << 32 | 1u, std::memory_order_release);
  }
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
  for (uint8_t k = 0; k < n_indices; k++) delete index[k].load(std::memory_order_relaxed);
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
    if (st.n_indices) {  // staged: a stage no rule has ends it, with only the stages so far looked at
      uint64_t h = kStageBasis;
      uint8_t k = 0;
      for (; k < st.n_indices; k++) {
        const StageWords& w = st.stage[k];
        h = chain(h, words(flow), w.n, w.idx, w.bits);
        if (!st.index[k].load(std::memory_order_acquire)->has(fold(h))) break;
      }
      if (k < st.n_indices) {
        if (wc) flow_or_into(*wc, st.upto[k]);
        continue;
      }
    }
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
    init_stages(*st);
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
  count_stages(*st, r->match.value, +1, rcu);  // before its list: a reader that finds the rule passes its stages
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
  count_stages(*st, r->match.value, -1, rcu);
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
