// dpcls.cc: megaflow cache insertion and maintenance (see dpcls.h).
#include "dpcls.h"

#include "conntrack/conntrack.h"

#include <algorithm>

namespace dpu {

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
  mf->acts = mf->actions.data();
  mf->n_acts = static_cast<uint32_t>(mf->actions.size());
  mf->ct_resume = mf->n_acts == 1 && mf->acts[0].type == Dp::CT && mf->acts[0].ct->recirc_id != 0;
  for (const DpAction& a : mf->actions)  // nested lists (clone) lie inline
    mf->recirculates |= a.type == Dp::CT || a.type == Dp::TNL_POP;
  size_t bm = st->slots.size() - 1;
  size_t pos = mf->hash & bm;
  while (st->slots[pos].mf) pos = (pos + 1) & bm;
  st->slots[pos] = Subtable::Slot{mf->hash, mf.get()};
  st->n++;
  Megaflow* raw = mf.get();
  st->flows.push_back(std::move(mf));
  n_flows_++;
  return raw;
}

void Dpcls::clear() {
  subtables_.clear();
  order_.clear();
  n_flows_ = 0;
}

void Dpcls::resort() {
  std::stable_sort(order_.begin(), order_.end(), [](const Subtable* a, const Subtable* b) { return a->hits > b->hits; });
  for (Subtable* st : order_) st->hits /= 2;  // decay so the order follows current traffic
}

}  // namespace dpu
