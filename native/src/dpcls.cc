// dpcls.cc: megaflow cache insertion and maintenance (see dpcls.h).
#include "dpcls.h"

#include "conntrack/conntrack.h"

#include <algorithm>
#include <new>
#include <type_traits>

namespace dpu {

// A megaflow's actions and the tunnel headers they name, copied into one
// block of whole lines (Megaflow::hot): a packet's actions and its header are
// adjacent lines, not wherever the translation's allocations fell (with the
// header on its own, vxlan-encap-1k missed L1 on it for every packet).
static_assert(std::is_trivially_copyable<DpAction>::value && std::is_trivially_copyable<TnlHeader>::value,
              "the hot block is filled with memcpy");
template <class T>
struct Span {
  T* p;
  size_t n;
  T* begin() const { return p; }
  T* end() const { return p + n; }
};

static const DpAction* pack_hot(Megaflow& mf) {
  const size_t n = mf.actions.size(), k = mf.tnl_hdrs.size();
  if (!n) return mf.actions.data();
  const size_t bytes = (n * sizeof(DpAction) + k * sizeof(TnlHeader) + 63) & ~size_t{63};
  void* block = std::aligned_alloc(64, bytes);
  if (!block) throw std::bad_alloc();
  mf.hot.reset(block);
  DpAction* acts = static_cast<DpAction*>(block);
  TnlHeader* hdrs = reinterpret_cast<TnlHeader*>(acts + n);
  std::memcpy(static_cast<void*>(acts), mf.actions.data(), n * sizeof(DpAction));
  for (size_t j = 0; j < k; j++) std::memcpy(static_cast<void*>(&hdrs[j]), mf.tnl_hdrs[j].get(), sizeof(TnlHeader));
  for (size_t i = 0; i < n; i++) {
    if (acts[i].type != Dp::TNL_PUSH && acts[i].type != Dp::TNL_POP) continue;
    for (size_t j = 0; j < k; j++)
      if (acts[i].tnl == mf.tnl_hdrs[j].get()) acts[i].tnl = &hdrs[j];
  }
  return acts;
}

Megaflow* Dpcls::insert(const Flow& key, const Flow& wc, XlateOut&& x) {
  const word_t* m = words(wc);
  Subtable* st = nullptr;
  for (auto& s : subtables_) {
    if (std::memcmp(s->mask, m, kKeyBytes) == 0) {
      st = s.get();
      break;
    }
  }
  if (!st) {
    subtables_.push_back(std::make_unique<Subtable>());
    st = subtables_.back().get();
    std::memcpy(st->mask, m, kKeyBytes);
    for (uint8_t i = 0; i < kKeyWords; i++)
      if (m[i]) st->idx[st->n_idx++] = i;
    st->slots.assign(64, Subtable::Slot{0, nullptr});
    order_.push_back(st);
  }
  if ((st->n + 1) * 2 > st->slots.size()) {
    std::vector<Subtable::Slot> bigger(st->slots.size() * 2, Subtable::Slot{0, nullptr});
    size_t bm = bigger.size() - 1;
    for (const auto& s : st->slots) {
      if (!s.mf) continue;
      size_t pos = s.hash & bm;
      while (bigger[pos].mf) pos = (pos + 1) & bm;
      bigger[pos] = s;
    }
    st->slots.swap(bigger);
  }
  auto mf = std::make_unique<Megaflow>();
  const word_t* k = words(key);
  for (size_t i = 0; i < kKeyWords; i++) mf->key[i] = k[i] & m[i];
  mf->st = st;
  mf->hash = st->hash_of(mf->key);
  mf->tenant = x.tenant;
  mf->actions = std::move(x.actions);
  mf->tnl_hdrs = std::move(x.tnl_hdrs);
  mf->ct_specs = std::move(x.ct_specs);
  mf->xcache = std::move(x.xcache);
  mf->acts = pack_hot(*mf);
  mf->n_acts = static_cast<uint32_t>(mf->actions.size());
  mf->ct_resume = mf->n_acts == 1 && mf->acts[0].type == Dp::CT && mf->acts[0].ct->recirc_id != 0;
  for (const DpAction& a : Span<const DpAction>{mf->acts, mf->n_acts}) {  // nested lists (clone) lie inline
    mf->recirculates |= a.type == Dp::CT || a.type == Dp::TNL_POP;
    if (!mf->side && (a.type == Dp::TNL_PUSH || a.type == Dp::TNL_POP)) mf->side = a.tnl;
    if (!mf->side && a.type == Dp::CT) mf->side = a.ct;
  }
  Megaflow* raw = mf.get();
  for (const XcacheEntry& e : raw->xcache) {
    if (e.kind == XcacheEntry::GROUP) raw->uses_groups = true;
    if (e.kind != XcacheEntry::TABLE) continue;
    raw->deps.push_back(Megaflow::Dep{e.table, e.exact_view, e.priority, e.found});
    raw->loose |= !e.exact_view;
  }
  const word_t* w = words(x.written_before_lookup);
  uint64_t any = 0;
  for (size_t i = 0; i < kKeyWords; i++) any |= w[i];
  if (any) {
    raw->written.reset(new uint64_t[kKeyWords]);
    std::memcpy(raw->written.get(), w, kKeyBytes);
    raw->loose = true;
  }
  size_t bm = st->slots.size() - 1;
  size_t pos = mf->hash & bm;
  while (st->slots[pos].mf) pos = (pos + 1) & bm;
  st->slots[pos] = Subtable::Slot{mf->hash, raw};
  st->n++;
  raw->index = static_cast<uint32_t>(st->flows.size());
  st->flows.push_back(std::move(mf));
  n_flows_++;
  deps_.add(raw);
  return raw;
}

void Dpcls::clear() {
  subtables_.clear();
  order_.clear();
  n_flows_ = 0;
  deps_.clear();
  dead_.clear();
}

// Linear probing's deletion: the slot is emptied and every later entry of
// its run that would no longer be reached is moved back into the gap.
void Dpcls::unlink_slot(Subtable* st, const Megaflow* mf) {
  const size_t m = st->slots.size() - 1;
  size_t i = mf->hash & m;
  while (st->slots[i].mf != mf) i = (i + 1) & m;
  for (size_t j = (i + 1) & m;; j = (j + 1) & m) {
    const Subtable::Slot s = st->slots[j];
    if (!s.mf) break;
    const size_t home = s.hash & m;
    // s may move to i if its home is not in the cyclic range (i, j]
    const bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (stays) continue;
    st->slots[i] = s;
    i = j;
  }
  st->slots[i] = Subtable::Slot{0, nullptr};
}

void Dpcls::kill(Megaflow* mf) {
  mf->dead = true;
  deps_.remove(mf);
  Subtable* st = const_cast<Subtable*>(mf->st);
  unlink_slot(st, mf);
  st->n--;
  n_flows_--;
  std::unique_ptr<Megaflow> own = std::move(st->flows[mf->index]);
  if (mf->index + 1 != st->flows.size()) {
    st->flows[mf->index] = std::move(st->flows.back());
    st->flows[mf->index]->index = mf->index;
  }
  st->flows.pop_back();
  dead_.push_back(std::move(own));
}

size_t Dpcls::revalidate(const ChangeSet& cs, const std::function<void(Megaflow&)>& dying) {
  std::vector<Megaflow*> victims;
  for (const RuleChange& rc : cs.rules) deps_.affected(rc, order_, &victims);
  if (!cs.groups.empty()) {
    for (auto& st : subtables_)
      for (auto& mf : st->flows) {
        if (!mf->uses_groups) continue;
        for (const XcacheEntry& e : mf->xcache)
          if (e.kind == XcacheEntry::GROUP &&
              std::find(cs.groups.begin(), cs.groups.end(), e.group->group_id) != cs.groups.end()) {
            victims.push_back(mf.get());
            break;
          }
      }
  }
  size_t n = 0;
  for (Megaflow* mf : victims) {
    if (mf->dead) continue;  // named twice
    dying(*mf);
    kill(mf);
    n++;
  }
  return n;
}

void Dpcls::free_dead() {
  dead_.clear();
  // Subtables left empty go with them (no dead megaflow names them now).
  for (size_t i = 0; i < subtables_.size();) {
    if (subtables_[i]->n) {
      i++;
      continue;
    }
    order_.erase(std::find(order_.begin(), order_.end(), subtables_[i].get()));
    deps_.forget(subtables_[i].get());
    subtables_[i] = std::move(subtables_.back());
    subtables_.pop_back();
  }
}

void Dpcls::resort() {
  std::stable_sort(order_.begin(), order_.end(), [](const Subtable* a, const Subtable* b) { return a->hits > b->hits; });
  for (Subtable* st : order_) st->hits /= 2;  // decay so the order follows current traffic
}

uint64_t Emc::selftest(uint64_t iterations, uint64_t seed) {
  XorShift rnd{seed | 1};
  uint64_t bad = 0;
  auto emc = std::make_unique<Emc>();
  auto mf = std::make_unique<Megaflow>();
  for (uint64_t it = 0; it < iterations; it++) {
    Flow a{}, b{};
    word_t* wa = words(a);
    const int kind = static_cast<int>(rnd() % 3);  // common, another untracked key, tracked
    for (size_t k = 0; k < kCommonWords; k++) wa[kCommon[k]] = rnd() & 3 ? rnd() : 0;
    if (kind > 0)
      for (size_t k = 0; k < kRestHot; k++) wa[kRest[k]] = rnd() & 1 ? rnd() : 0;
    wa[kCtStateWord] &= ~uint64_t{0xff};
    if (kind == 2) {
      wa[kCtStateWord] |= 1 + rnd() % 255;
      for (size_t k = kRestHot; k < kRestWords; k++) wa[kRest[k]] = rnd() & 1 ? rnd() : 0;
    }
    if (common(wa) != common_plain(wa)) bad++;
    b = a;
    if (rnd() & 1) {  // one bit apart, anywhere the key's kind compares
      word_t* wb = words(b);
      const size_t n = key_tracked(wa) ? kKeyWords : kKeyHotWords;
      wb[rnd() % n] ^= uint64_t{1} << (rnd() % 64);
    }
    const uint32_t h = hash(a);
    emc->insert(a, h, mf.get(), false);
    uint32_t slot = 0;
    const bool ca = common(wa);
    if (!emc->lookup_first(a, h, ca, &slot) &&
        !emc->lookup_second(a, h, ca, emc->second_candidates(h, ca), &slot)) {
      bad++;
      continue;
    }
    // Side data set on a's entry (which, for a common key, shares a line
    // with where the rest of a key would be) neither changes what the entry
    // answers nor is changed by the lookups.
    struct Side {
      uint64_t w[kSideBytes / 8];
    } side;
    for (auto& x : side.w) x = rnd();
    emc->set_side(slot, 0x8000, side);
    const bool cb = common(words(b));
    const bool hit =
        emc->lookup_first(b, h, cb, &slot) || emc->lookup_second(b, h, cb, emc->second_candidates(h, cb), &slot);
    if (hit != same_plain(words(a), words(b))) bad++;
    if (std::memcmp(&emc->side<Side>(slot), &side, sizeof side) != 0 || emc->side_tag(slot, emc->stamp(slot)) != 0x8000)
      bad++;
  }
  bad += selftest_placement(seed);
  return bad;
}

// Placement: 10,000 common keys inserted into an empty EMC, with moves, all
// keep an entry (the five candidates and the moves make room for every one;
// snat-est-10k relies on it) and each answers with its own megaflow; then
// 30,000 more without moves (evicting), after which every key answers with
// its own megaflow or not at all. The megaflows are never dereferenced.
uint64_t Emc::selftest_placement(uint64_t seed) {
  XorShift rnd{seed ^ 0x5bd1e995u};
  uint64_t bad = 0;
  auto emc = std::make_unique<Emc>();
  constexpr uint32_t kKept = 10000, kAll = 40000;
  std::vector<Flow> keys(kAll);
  std::vector<uint32_t> hashes(kAll);
  auto mf_of = [](uint32_t i) { return reinterpret_cast<Megaflow*>(uintptr_t{i + 1} * 64); };
  auto find = [&](uint32_t i) -> Megaflow* {
    uint32_t slot = 0;
    const bool c = common(words(keys[i]));
    Megaflow* m = emc->lookup_first(keys[i], hashes[i], c, &slot);
    return m ? m : emc->lookup_second(keys[i], hashes[i], c, emc->second_candidates(hashes[i], c), &slot);
  };
  for (uint32_t i = 0; i < kAll; i++) {
    word_t* w = words(keys[i]);
    w[0] = 1 + rnd() % 4;  // the in_port
    w[16] = rnd();         // the addresses
    w[18] = i;             // the ports: every key distinct
    hashes[i] = hash(keys[i]);
  }
  for (uint32_t i = 0; i < kKept; i++) emc->insert(keys[i], hashes[i], mf_of(i), true);
  for (uint32_t i = 0; i < kKept; i++) bad += find(i) != mf_of(i);
  for (uint32_t i = kKept; i < kAll; i++) emc->insert(keys[i], hashes[i], mf_of(i), false);
  for (uint32_t i = 0; i < kAll; i++) {
    Megaflow* m = find(i);
    bad += m != nullptr && m != mf_of(i);
  }
  return bad;
}

}  // namespace dpu
