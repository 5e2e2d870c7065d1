// revalidate.cc: the indexes of a worker's megaflow dependencies (see
// revalidate.h).
#include "revalidate.h"

#include <algorithm>
#include <cstring>

#include "dpcls.h"

namespace dpu {

uint64_t DepIndex::care_hash(const uint64_t* key, const uint64_t* care) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < kKeyWords; i++) h = mix128(h ^ (key[i] & care[i]), 0xc2b2ae3d27d4eb4full + i);
  return h;
}

void DepIndex::put(List* l, Megaflow* mf) {
  mf->refs.push_back(Megaflow::Ref{l, static_cast<uint32_t>(l->size())});
  l->push_back(mf);
}

// Takes mf out of l, where its ref says it stands; the megaflow moved into
// its place gets its ref updated.
void DepIndex::take(List* l, Megaflow* mf) {
  auto r = std::find_if(mf->refs.begin(), mf->refs.end(), [l](const Megaflow::Ref& x) { return x.list == l; });
  const uint32_t pos = r->pos;
  Megaflow* last = l->back();
  (*l)[pos] = last;
  l->pop_back();
  if (last != mf)
    for (Megaflow::Ref& lr : last->refs)
      if (lr.list == l && lr.pos == l->size()) {
        lr.pos = pos;
        break;
      }
  mf->refs.erase(r);
}

void DepIndex::index_into(Care* c, Megaflow* mf) { put(&c->buckets[care_hash(mf->key, c->care)], mf); }

// The index of `st` for this care mask, built from the subtable's megaflows
// if it is not there (evicting the least recently used beyond kMaxCare).
DepIndex::Care* DepIndex::care_index(const Subtable* st, const uint64_t* care) {
  auto& v = care_[st];
  for (auto& c : v)
    if (std::memcmp(c->care, care, sizeof c->care) == 0) {
      c->used = ++clock_;
      return c.get();
    }
  if (v.size() >= kMaxCare) {
    auto lru = std::min_element(v.begin(), v.end(), [](const auto& a, const auto& b) { return a->used < b->used; });
    for (auto& b : (*lru)->buckets)
      for (Megaflow* mf : b.second)
        mf->refs.erase(std::find_if(mf->refs.begin(), mf->refs.end(),
                                    [&b](const Megaflow::Ref& x) { return x.list == &b.second; }));
    v.erase(lru);
  }
  auto c = std::make_unique<Care>();
  std::memcpy(c->care, care, sizeof c->care);
  c->used = ++clock_;
  for (const auto& mf : st->flows)
    if (!mf->loose) index_into(c.get(), mf.get());
  v.push_back(std::move(c));
  return v.back().get();
}

void DepIndex::add(Megaflow* mf) {
  for (const Megaflow::Dep& d : mf->deps) {
    if (d.found) put(&by_rule_[d.found], mf);
    if (mf->loose) put(&loose_[d.table], mf);
  }
  if (mf->loose) return;
  auto it = care_.find(mf->st);
  if (it == care_.end()) return;
  for (auto& c : it->second) index_into(c.get(), mf);
}

void DepIndex::remove(Megaflow* mf) {
  while (!mf->refs.empty()) {
    List* l = mf->refs.back().list;
    take(l, mf);
    if (!l->empty()) continue;
    // An empty list goes: a rule's (found by no megaflow now), or a bucket's.
    for (const Megaflow::Dep& d : mf->deps)
      if (d.found) {
        auto br = by_rule_.find(d.found);
        if (br != by_rule_.end() && &br->second == l) {
          by_rule_.erase(br);
          l = nullptr;
          break;
        }
      }
    if (!l) continue;
    auto it = care_.find(mf->st);
    if (it == care_.end()) continue;
    for (auto& c : it->second) {
      auto b = c->buckets.find(care_hash(mf->key, c->care));
      if (b != c->buckets.end() && &b->second == l) {
        c->buckets.erase(b);
        break;
      }
    }
  }
}

void DepIndex::forget(const Subtable* st) { care_.erase(st); }

void DepIndex::clear() {
  by_rule_.clear();
  for (auto& l : loose_) l.clear();
  care_.clear();
}

// Whether an added rule could be found for some packet of `mf` by a lookup of
// its table: its match agrees with the megaflow's key wherever both care,
// except bits an action wrote before a lookup; a lookup that saw another
// in_port or a fragment's zeroed ports is not compared at all.
static bool loose_hit(const Megaflow& mf, const Rule& r) {
  bool lookup = false, exact = true;
  for (const Megaflow::Dep& d : mf.deps)
    if (d.table == r.table && d.priority <= r.priority) {
      lookup = true;
      exact &= d.exact_view;
    }
  if (!lookup) return false;
  if (!exact) return true;
  const word_t* rv = words(r.match.value);
  const word_t* rm = words(r.match.mask);
  for (size_t i = 0; i < kKeyWords; i++) {
    uint64_t care = rm[i] & mf.st->mask[i];
    if (mf.written) care &= ~mf.written[i];
    if ((rv[i] ^ mf.key[i]) & care) return false;
  }
  return true;
}

void DepIndex::affected(const RuleChange& rc, const std::vector<Subtable*>& subtables, std::vector<Megaflow*>* out) {
  const Rule& r = *rc.rule;
  if (!rc.added) {
    auto it = by_rule_.find(&r);
    if (it != by_rule_.end()) out->insert(out->end(), it->second.begin(), it->second.end());
    return;
  }
  for (Megaflow* mf : loose_[r.table])
    if (loose_hit(*mf, r)) out->push_back(mf);
  const word_t* rv = words(r.match.value);
  const word_t* rm = words(r.match.mask);
  for (const Subtable* st : subtables) {
    if (!st->n) continue;
    uint64_t care[kKeyWords], val[kKeyWords];
    for (size_t i = 0; i < kKeyWords; i++) {
      care[i] = rm[i] & st->mask[i];
      val[i] = rv[i] & care[i];
    }
    Care* c = care_index(st, care);
    auto b = c->buckets.find(care_hash(val, care));
    if (b == c->buckets.end()) continue;
    for (Megaflow* mf : b->second) {
      bool agree = true;  // the bucket is a hash's: compare
      for (size_t i = 0; i < kKeyWords && agree; i++) agree = ((mf->key[i] ^ val[i]) & care[i]) == 0;
      if (!agree) continue;
      for (const Megaflow::Dep& d : mf->deps)
        if (d.table == r.table && d.priority <= r.priority) {
          out->push_back(mf);
          break;
        }
    }
  }
}

}  // namespace dpu
