// dpcls.h: the two flow caches of one worker: the exact-match cache (EMC) and
// the megaflow cache (tuple-space search over megaflow masks).
//
// Uses:  the datapath flow key and its hash (parse.h / flow_key.h).
// Sets:  nothing in the packet; returns the Megaflow to execute.
// Next:  on a megaflow miss, the upcall (xlate.h); else execute.cc.
//
// EMC: 16,384 entries, five candidates per hash (a first way and a bucket of
// four, searched by 16-bit tags kept apart), full-key compare; filled
// with probability 1/emc_insert_inv_prob (100 as OVS's default) so a flood of
// short flows does not thrash it. While it answers too few lookups, the
// worker bypasses it for most sub-batches (Worker::pass, emc_skipped). Megaflow cache: one Subtable per distinct
// mask (an open-addressing hash over only the mask's non-zero key words);
// subtables are re-ordered by hit count every few thousand batches so the
// busiest mask is probed first (as dpif-netdev's dpcls). Megaflows never
// overlap in outcome, so the first hit wins. A worker looks up a sub-batch
// at a time (Emc::lookup_first/second, Dpcls::lookup_batch), fetching each
// step's lines for all its keys before reading any.
//
// Each Megaflow owns its datapath actions and its xlate cache (the rules,
// tables and groups it came from). Packet/byte counts are per megaflow,
// written only by the owning worker and pushed to the rules by the control
// thread (dataplane.cc, "stats push") under the worker's lock.
//
// Revalidation (docs/design.md, "Changes without stopping the world"): a
// megaflow records what its translation depended on: every table lookup
// (the rule found and its priority, or a miss) and whether it used groups.
// When a version adds a rule R to table T, a megaflow can only be wrong if
// one of its lookups in T found nothing or a rule of lower priority than R's,
// and if R can match its packets there: R's match agrees with the megaflow's
// key on every bit both care about, except bits an action wrote before a
// lookup (constants there, not the packet's) and lookups that saw another
// in_port (resubmit) or a fragment's zeroed ports, which are not compared. A
// deleted or modified rule affects exactly the megaflows that found it; a
// modified or deleted group, those that used groups; ports, VTEPs, tenants
// and the fragment mode, everything. Anything else keeps its megaflows: a
// change to rules no packet reaches costs no upcall.
//
// Thread-safety: owned by one worker; the control thread reads it only while
// holding that worker's mutex.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

#include "dpu/mem.h"

#include "datapath_view.h"
#include "revalidate.h"
#include "dpu/dp_actions.h"
#include "dpu/flow_key.h"
#include "xlate.h"

namespace dpu {

struct Subtable;

struct alignas(64) Megaflow {
  // read by every packet: the first cache line
  std::atomic<uint64_t> n_packets{0}, n_bytes{0};
  const DpAction* acts = nullptr;
  uint32_t n_acts = 0;
  uint16_t tenant = 0;
  // One packet of `len` bytes (its worker is the only writer).
  void count(uint32_t len) {
    n_packets.store(n_packets.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    n_bytes.store(n_bytes.load(std::memory_order_relaxed) + len, std::memory_order_relaxed);
  }
  // The actions are one ct(table=T) and nothing else: the pass after it may
  // be answered from the worker's cache of established connections.
  bool ct_resume = false;
  // Some action makes another pass (ct, a tunnel pop), possibly in a clone.
  bool recirculates = false;
  // For a ct_resume megaflow: the megaflow the pass after its conntrack
  // found last time. A hint only: the next packet uses it if its key
  // matches it (matches()), else looks up as usual and updates it.
  Megaflow* after_ct = nullptr;
  // Revalidation took it out of the cache: an EMC entry or a hint that still
  // names it answers nothing (the worker looks the packet up again).
  bool dead = false;
  // What the first action that reads out of line (a tunnel header, a
  // conntrack spec) reads there, or null: the worker prefetches it with the
  // actions (Worker::pass), a line the packet's action would otherwise wait for.
  const void* side = nullptr;
  // the rest: lookup key, ownership, stats push
  uint64_t key[kKeyWords];   // masked
  const Subtable* st = nullptr;
  uint32_t hash = 0;
  uint32_t index = 0;        // in st->flows
  DpActions actions;
  TnlHeaders tnl_hdrs;
  // What a packet reads, in one block of whole lines: a copy of the actions,
  // then of each tunnel header they name (the copies' `tnl` point into it).
  // `acts` is its start. `actions` and `tnl_hdrs` stay the megaflow's own
  // description (formatting, revalidation); the copies are never written.
  struct FreeBlock {
    void operator()(void* b) const { std::free(b); }
  };
  std::unique_ptr<void, FreeBlock> hot;
  CtSpecs ct_specs;
  std::vector<XcacheEntry> xcache;
  uint64_t pushed_packets = 0, pushed_bytes = 0;  // already credited to rules
  // When its counts were last seen to move (a stats push: every API call and
  // housekeeping round), on the dataplane's clock; 0: never. dpctl's "used",
  // kept off the fast path.
  int64_t used_ns = 0;
  // What its translation depended on ("Revalidation" below, revalidate.h):
  // each table lookup; whether some lookup did not see the key as it is
  // (loose); where it stands in the worker's dependency indexes (refs).
  struct Dep {
    uint8_t table;
    bool exact_view;   // the lookup saw the walk's own in_port and L4 ports
    int32_t priority;  // of the rule found, -1 for a miss
    const Rule* found;
  };
  std::vector<Dep> deps;
  std::unique_ptr<uint64_t[]> written;  // key bits written before a lookup (kKeyWords words), or null
  bool uses_groups = false;
  bool loose = false;  // written bits, or a lookup that was not exact_view
  struct Ref {
    std::vector<Megaflow*>* list;
    uint32_t pos;
  };
  std::vector<Ref> refs;
};

struct Subtable {
  uint64_t mask[kKeyWords];
  uint8_t idx[kKeyWords];
  uint8_t n_idx = 0;
  struct Slot {
    uint32_t hash;
    Megaflow* mf;
  };
  std::vector<Slot> slots;  // power of two, at most half full
  size_t n = 0;
  uint64_t hits = 0;
  std::vector<std::unique_ptr<Megaflow>> flows;

  uint32_t hash_of(const word_t* k) const {
    uint64_t h = 0x84222325cbf29ce4ull;
    for (uint8_t i = 0; i < n_idx; i++) {
      uint8_t j = idx[i];
      h = mix128(h ^ (k[j] & mask[j]), 0x9e3779b97f4a7c15ull);
    }
    return static_cast<uint32_t>(h ^ (h >> 32));
  }
  // Key `k` (Flow words) under this mask is megaflow `mf`'s masked key.
  bool matches(const word_t* k, const Megaflow& mf) const {
    uint64_t d = 0;
    for (uint8_t i = 0; i < n_idx; i++) {
      const uint8_t j = idx[i];
      d |= (k[j] & mask[j]) ^ mf.key[j];
    }
    return d == 0;
  }
  Megaflow* find(const word_t* k, uint32_t h) const {
    size_t m = slots.size() - 1;
    for (size_t pos = h & m;; pos = (pos + 1) & m) {
      const Slot& s = slots[pos];
      if (!s.mf) return nullptr;
      if (s.hash == h && matches(k, *s.mf)) return s.mf;
    }
  }
  // find() in steps for a batch: the slot a hash starts at, then the first
  // candidate there (a slot with the same hash: its megaflow's key words are
  // what the compare reads), then find() itself.
  void prefetch_slot(uint32_t h) const { dpu::prefetch(&slots[h & (slots.size() - 1)]); }
  void prefetch_candidate(uint32_t h) const {
    size_t m = slots.size() - 1;
    for (size_t pos = h & m;; pos = (pos + 1) & m) {
      const Slot& s = slots[pos];
      if (!s.mf) return;
      if (s.hash != h) continue;
      dpu::prefetch(&s.mf->key[idx[0]]);
      dpu::prefetch(&s.mf->key[idx[n_idx - 1]]);
      return;
    }
  }
};

// Key `k` (Flow words) is one of the megaflow's: every megaflow a key
// matches gives it the same actions, so a match is as good as a lookup.
inline bool megaflow_matches(const Megaflow& mf, const word_t* k) { return mf.st->matches(k, mf); }

class Dpcls {
 public:
  Megaflow* lookup(const word_t* key, uint32_t* probes) {
    uint32_t n = 0;
    for (Subtable* st : order_) {
      n++;
      uint32_t h = st->hash_of(key);
      Megaflow* mf = st->find(key, h);
      if (mf) {
        st->hits++;
        *probes += n;
        return mf;
      }
    }
    *probes += n;
    return nullptr;
  }
  // lookup() for the keys keys[which[0..n)] at once, subtable by subtable,
  // each step's lines fetched for all of them before any is read: out[i]
  // is key i's megaflow or null. Adds the probes made to *probes.
  template <size_t kMax>
  void lookup_batch(const Flow* keys, const uint8_t* which, uint32_t n, Megaflow** out, uint32_t* probes) {
    uint8_t left[kMax];
    uint32_t h[kMax];
    uint32_t n_left = n;
    for (uint32_t k = 0; k < n; k++) {
      left[k] = which[k];
      out[which[k]] = nullptr;
    }
    for (Subtable* st : order_) {
      if (!n_left) break;
      if (st->n_idx == 0) {  // a catch-all mask: one find() answers for everyone
        for (uint32_t k = 0; k < n_left; k++) h[k] = st->hash_of(words(keys[left[k]]));
      } else {
        for (uint32_t k = 0; k < n_left; k++) {
          h[k] = st->hash_of(words(keys[left[k]]));
          st->prefetch_slot(h[k]);
        }
        for (uint32_t k = 0; k < n_left; k++) st->prefetch_candidate(h[k]);
      }
      *probes += n_left;
      uint32_t still = 0;
      for (uint32_t k = 0; k < n_left; k++) {
        uint8_t i = left[k];
        if (Megaflow* mf = st->find(words(keys[i]), h[k])) {
          st->hits++;
          out[i] = mf;
        } else {
          left[still++] = i;
        }
      }
      n_left = still;
    }
  }
  Megaflow* insert(const Flow& key, const Flow& wc, XlateOut&& x);
  void clear();
  void resort();
  size_t size() const { return n_flows_; }
  const size_t& size_ref() const { return n_flows_; }  // for a relaxed read from another thread
  template <class F>
  void for_each(F&& f) {
    for (auto& st : subtables_)
      for (auto& mf : st->flows) f(*mf, *st);
  }

  // Revalidation: the megaflows a version's changes can affect leave the
  // cache (each handed to `dying` first, to credit its counts). Returns how
  // many left.
  size_t revalidate(const ChangeSet& cs, const std::function<void(Megaflow&)>& dying);
  // Megaflows out of the cache but possibly still named by an EMC entry or
  // a hint of the owner's (Megaflow::dead): freed by free_dead(), after the
  // owner has cleared those.
  size_t n_dead() const { return dead_.size(); }
  void free_dead();

 private:
  void kill(Megaflow* mf);
  void unlink_slot(Subtable* st, const Megaflow* mf);
  std::vector<std::unique_ptr<Subtable>> subtables_;
  std::vector<Subtable*> order_;
  size_t n_flows_ = 0;
  DepIndex deps_;
  std::vector<std::unique_ptr<Megaflow>> dead_;
};

class Emc {
 public:
  // 16,384: a worker's 10,000 established NATed connections keep their
  // entries (and with them the cached pass after conntrack, CtResume), which
  // 8,192 could not: snat-est-10k x1.20 (4 rounds A/B), the rest unchanged.
  static constexpr uint32_t kBits = 14, kEntries = 1u << kBits;
  // A key has five candidate entries: its first way, one entry (hash's low
  // bits), and its bucket, four entries side by side (the next bits). Each
  // entry's tag (16 bits of its key's hash, 0 when empty) is kept apart in
  // tags_ (32 KiB, one 8-byte word per bucket), so that the bucket is
  // searched by its tags and only an entry whose tag matches is read.
  // 10,000 keys in 16,384 entries (snat-est-10k) all keep one; with two
  // candidates, cuckoo moves kept 96%, a miss for every 25th packet.
  static constexpr uint32_t kBucket = 4;
  Emc() : e_(kEntries), tags_(kEntries) { clear(); }
  // The megaflow of `key` in one of its candidates, or null; *slot is the
  // entry that answered. A batch checks every key's first way (whose lines
  // prefetch() fetched), then for each that missed it reads its bucket's
  // tags (second_candidates(), which prefetches the first match), and
  // checks the candidates it names (lookup_second).
  // `common` is common(words(key)), worked out once per key by the caller.
  Megaflow* lookup_first(const Flow& key, uint32_t hash, bool common, uint32_t* slot) const {
    return probe(key, hash, way(hash), common, slot);
  }
  // The entries of hash's bucket whose tag is hash's (bit k: entry k of the
  // bucket); the first one's lines prefetched.
  uint32_t second_candidates(uint32_t hash, bool common) const {
    const uint32_t b = bucket(hash);
    uint64_t t;
    std::memcpy(&t, &tags_[b], 8);
    const uint64_t x = t ^ (uint64_t{tag_of(hash)} * 0x0001000100010001ull);  // a matching tag's lane: 0
    uint32_t m = 0;
    for (uint32_t k = 0; k < kBucket; k++) m |= ((x >> (16 * k)) & 0xffff) == 0 ? 1u << k : 0u;
    if (m) prefetch_entry(b + static_cast<uint32_t>(__builtin_ctz(m)), common);
    return m;
  }
  Megaflow* lookup_second(const Flow& key, uint32_t hash, bool common, uint32_t cands, uint32_t* slot) const {
    const uint32_t b = bucket(hash);
    for (; cands; cands &= cands - 1)
      if (Megaflow* mf = probe(key, hash, b + static_cast<uint32_t>(__builtin_ctz(cands)), common, slot)) return mf;
    return nullptr;
  }
  // The lines the compare of `key` reads: the first for a common key, the
  // first three for another untracked one.
  void prefetch(uint32_t hash, bool common) const { prefetch_entry(way(hash), common); }
  // A key goes into its first way if that is free (or holds its hash), else
  // into a free entry of its bucket. When all five are taken, a key in one
  // of them moves to a free candidate of its own (found by the tags), or a
  // key in one of those moves on first (cuckoo hashing's first steps); only
  // when neither frees one is one of the five, chosen by the hash, evicted.
  // Inserts are rare (one miss in emc_inv_prob_), but a move reads a cold
  // entry: with `move_keys` false (the worker bypasses the EMC: far more
  // keys than entries, where moving only reshuffles) the insert evicts at
  // once.
  void insert(const Flow& key, uint32_t hash, Megaflow* mf, bool move_keys) {
    const uint32_t a = way(hash), b = bucket(hash);
    const uint16_t tag = tag_of(hash);
    // (An entry is read only when its tag matches: in bypass the key may
    // already have one, as the EMC was not looked up; other entries are cold.)
    auto usable = [&](uint32_t i) { return !tags_[i] || (tags_[i] == tag && e_[i].hash == hash); };
    uint32_t t = kNone;
    if (usable(a)) t = a;
    for (uint32_t k = 0; t == kNone && k < kBucket; k++)
      if (usable(b + k)) t = b + k;
    if (t == kNone && (!move_keys || !make_room(a, b, &t))) {
      const uint32_t pick = (hash >> 28) % (kBucket + 1);
      t = pick == kBucket ? a : b + pick;
    }
    Entry& e = e_[t];
    const word_t* w = words(key);
    const bool c = common(w);
    for (size_t k = 0; k < kCommonWords; k++) e.common[k] = w[kCommon[k]];
    if (!c)
      for (size_t k = 0; k < kRestWords; k++) e.rest[k] = w[kRest[k]];
    e.hash = hash;
    e.mf = mf;
    e.stamp = static_cast<uint16_t>(((e.stamp + 2u) & ~1u) | (c ? 0u : 1u));
    e.side_tag = 0;
    tags_[t] = tag;
  }
  // Each insert into a slot changes its stamp: a slot with the stamp seen
  // earlier (within one batch: 15 bits of count) still holds the same key.
  uint32_t stamp(uint32_t slot) const { return e_[slot].stamp; }

  // Side data: kSideBytes that the owner keeps with an entry, and a nonzero
  // 16-bit tag saying they are set, until the next insert into the slot or
  // flush. The worker keeps the cached pass after conntrack there (CtResume,
  // ct_stage.cc). They fill the entry's last line, on the page a hit has just
  // read, which prefetch_side() fetches.
  static constexpr size_t kSideBytes = 32;
  uint16_t side_tag(uint32_t slot, uint32_t stamp) const {
    return e_[slot].stamp == static_cast<uint16_t>(stamp) ? e_[slot].side_tag : 0;
  }
  template <class T>
  const T& side(uint32_t slot) const {
    static_assert(sizeof(T) == kSideBytes && std::is_trivially_copyable<T>::value, "side data is raw bytes");
    return *reinterpret_cast<const T*>(side_of(e_[slot]));
  }
  template <class T>
  void set_side(uint32_t slot, uint16_t tag, const T& v) {
    static_assert(sizeof(T) == kSideBytes && std::is_trivially_copyable<T>::value, "side data is raw bytes");
    std::memcpy(side_of(e_[slot]), &v, kSideBytes);
    e_[slot].side_tag = tag;
  }
  void prefetch_side(uint32_t slot) const { dpu::prefetch(side_of(e_[slot])); }
  // Revalidation (Megaflow::dead): an entry that named a dead megaflow
  // answers nothing more. forget() empties one entry; forget_dead() every
  // entry whose megaflow is dead, and the side data `names_dead` says names
  // one (before the dead megaflows are freed).
  void forget(uint32_t slot) {
    e_[slot].mf = nullptr;
    e_[slot].side_tag = 0;
    tags_[slot] = 0;
  }
  template <class F>
  void forget_dead(F&& names_dead) {
    for (uint32_t i = 0; i < kEntries; i++) {
      if (!tags_[i]) continue;
      Entry& e = e_[i];
      if (!e.mf || e.mf->dead) forget(i);
      else if (e.side_tag && names_dead(static_cast<const unsigned char*>(side_of(e)))) e.side_tag = 0;
    }
  }
  void clear() {
    for (uint32_t i = 0; i < kEntries; i++) {
      e_[i].mf = nullptr;
      e_[i].side_tag = 0;
      tags_[i] = 0;
    }
  }

  // Whole-key compare (the conntrack words only when the keys are tracked:
  // equal ct_state bytes, and zero words otherwise): what a lookup must
  // answer, the reference selftest() checks the split entries against.
  static bool same_plain(const word_t* a, const word_t* b) {
    uint64_t d = 0;
    size_t n = key_tracked(a) ? kKeyWords : kKeyHotWords;
    for (size_t i = 0; i < n; i++) d |= a[i] ^ b[i];
    return d == 0;
  }

  // A common key: an untracked one whose words outside kCommon (tunnel,
  // conntrack, IPv6 and ARP words) are zero, as those of IPv4 TCP, UDP and
  // ICMP without a tunnel are. Its entry's compare reads one line.
  static constexpr size_t kCommonWords = 6, kRestWords = kKeyWords - kCommonWords;
  static constexpr uint8_t kCommon[kCommonWords] = {0, 9, 10, 11, 16, 18};
  static constexpr uint8_t kRest[kRestWords] = {1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 14, 15, 17,
                                                19, 20, 21, 22, 23, 24, 25};
  static constexpr size_t kRestHot = kKeyHotWords - kCommonWords;  // kRest's first 13: the hot words
  static_assert(kRest[7] == 8 && kRest[8] == 12 && kRest[12] == 17 && kRest[13] == 19 && kRestWords == 20,
                "kRest's runs, as holds() compares them");
  static bool common(const word_t* w) {
    static_assert(kCtStateWord == 7 && kKeyHotWords == 19, "the rest's hot words are 1-8, 12-15 and 17");
#if defined(__AVX2__)
    auto at = [](const word_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); };
    const __m256i x = _mm256_or_si256(_mm256_or_si256(at(w + 1), at(w + 5)), at(w + 12));  // words 1-8, 12-15
    return _mm256_testz_si256(x, x) && w[17] == 0;
#else
    return common_plain(w);
#endif
  }
  // The hash the EMC files `key` under (c: common(words(key))): a common
  // key's over its six words only (the others are zero), in two CRC32C
  // chains; another's, hash_key(). A key's kind is a function of the key,
  // so it always gets the same one.
  static uint32_t hash(const Flow& key, bool c) {
#if defined(__SSE4_2__)
    if (c) {
      static_assert(kCommon[0] == 0 && kCommon[1] == 9 && kCommon[2] == 10 && kCommon[3] == 11 && kCommon[4] == 16 &&
                        kCommon[5] == 18,
                    "the six words, spelled out");
      const word_t* w = words(key);
      uint64_t a = __builtin_ia32_crc32di(0x5bd1e995u, w[0]), b = __builtin_ia32_crc32di(0x9e3779b9u, w[9]);
      a = __builtin_ia32_crc32di(a, w[10]);
      b = __builtin_ia32_crc32di(b, w[11]);
      a = __builtin_ia32_crc32di(a, w[16]);
      b = __builtin_ia32_crc32di(b, w[18]);
      const uint64_t h = mix128(a ^ (b << 32), b ^ 0x165667b19e3779f9ull);
      return static_cast<uint32_t>(h ^ (h >> 32));
    }
#endif
    (void)c;
    return hash_key(key);
  }
  static uint32_t hash(const Flow& key) { return hash(key, common(words(key))); }
  static bool common_plain(const word_t* w) {
    uint64_t d = 0;
    for (size_t k = 0; k < kRestHot; k++) d |= w[kRest[k]];
    return d == 0;
  }
  // Entry layout and lookups against same_plain() on random keys of every
  // kind (common, other untracked, tracked), and common() against
  // common_plain(): the number of disagreements (tests/test_selftest.py).
  // With it, placement: selftest_placement().
  static uint64_t selftest(uint64_t iterations, uint64_t seed);
  static uint64_t selftest_placement(uint64_t seed);

 private:
  // Four lines, sixteen to a page. The first holds the hash, the megaflow
  // and the key's kCommon words: all a common key's compare reads. The rest
  // of the key follows (kRest: another untracked key's compare reads the
  // first three lines), then that key's side data, in the fourth line. A
  // common key's side data is in the second line (side_of()), so a resumed
  // packet (CtResume) reads its entry's first 128-byte pair of lines and
  // nothing else: 10,000 connections' entries and connections fit L2 better.
  struct alignas(64) Entry {
    uint32_t hash;
    uint16_t stamp;  // +2 at every insert; bit 0: not a common key
    uint16_t side_tag;
    Megaflow* mf;
    uint64_t common[kCommonWords];
    uint64_t rest[kRestWords];
    alignas(8) unsigned char side[kSideBytes];
  };
  static_assert(sizeof(Entry) == 256 && offsetof(Entry, side) == 224 && offsetof(Entry, rest) == 64,
                "an entry is four lines: header and common words, the rest, side data last");
  HugeArray<Entry> e_;
  HugeArray<uint16_t> tags_;  // per entry: tag_of() its key's hash, 0 when empty
  static constexpr uint32_t kNone = ~0u;

  static uint32_t way(uint32_t hash) { return hash & (kEntries - 1); }
  static uint32_t bucket(uint32_t hash) { return (hash >> kBits) & (kEntries - kBucket); }
  // Bits of the hash that neither index uses much (a bucket's keys share
  // the bucket's bits), never 0.
  static uint16_t tag_of(uint32_t hash) { return static_cast<uint16_t>((hash >> 16) ^ hash) | 1u; }
  // The lines the compare of a key in entry i reads: the first for a common
  // key, the first three for another untracked one.
  void prefetch_entry(uint32_t i, bool common) const {
    const char* a = reinterpret_cast<const char*>(&e_[i]);
    dpu::prefetch(a);
    if (!common) {
      dpu::prefetch(a + 64);
      dpu::prefetch(a + 128);
    }
  }

  // Where an entry's side data is: a common key's in its second line, where
  // the rest of a key would be (a common key's rest is zero and is not
  // kept), so that a resumed packet reads the entry's first two lines, one
  // 128-byte pair; another key's in the fourth.
  static unsigned char* side_of(Entry& e) {
    return (e.stamp & 1u) ? e.side : reinterpret_cast<unsigned char*>(e.rest);
  }
  static const unsigned char* side_of(const Entry& e) { return side_of(const_cast<Entry&>(e)); }

  // A moved key keeps its megaflow, not its side data; both slots' stamps change.
  void move(uint32_t from, uint32_t to) {
    Entry& d = e_[to];
    const Entry& s = e_[from];
    std::memcpy(d.common, s.common, sizeof d.common);
    if (s.stamp & 1u) std::memcpy(d.rest, s.rest, sizeof d.rest);
    d.hash = s.hash;
    d.mf = s.mf;
    d.stamp = static_cast<uint16_t>(((d.stamp + 2u) & ~1u) | (s.stamp & 1u));
    d.side_tag = 0;
    tags_[to] = tags_[from];
  }
  // A free candidate of the key in entry `i`, or kNone.
  uint32_t free_candidate(uint32_t i) const {
    const uint32_t h = e_[i].hash, a = way(h), b = bucket(h);
    if (!tags_[a]) return a;
    for (uint32_t k = 0; k < kBucket; k++)
      if (!tags_[b + k]) return b + k;
    return kNone;
  }
  // The candidates of a key whose first way is a and bucket b.
  static uint32_t candidate(uint32_t a, uint32_t b, uint32_t k) { return k == 0 ? a : b + k - 1; }
  // Frees a candidate of a new key (first way a, bucket b) by moving what
  // holds it to a free candidate of its own, or else what holds one of
  // those on first (two moves at most; see insert()).
  bool make_room(uint32_t a, uint32_t b, uint32_t* freed) {
    for (uint32_t k = 0; k <= kBucket; k++) {
      const uint32_t i = candidate(a, b, k), to = free_candidate(i);
      if (to != kNone) {
        move(i, to);
        *freed = i;
        return true;
      }
    }
    for (uint32_t k = 0; k <= kBucket; k++) {
      const uint32_t i = candidate(a, b, k), h = e_[i].hash;
      for (uint32_t q = 0; q <= kBucket; q++) {
        const uint32_t j = candidate(way(h), bucket(h), q);
        if (j == i || j == a || (j >= b && j < b + kBucket)) continue;
        const uint32_t to = free_candidate(j);
        if (to != kNone) {
          move(j, to);
          move(i, j);
          *freed = i;
          return true;
        }
      }
    }
    return false;
  }
  // Whether entry e holds key w (its common words compared first; the rest
  // only when neither is a common key; c: common(w)).
  static bool holds(const Entry& e, const word_t* w, bool c) {
    const uint64_t d = (e.common[0] ^ w[0]) | (e.common[1] ^ w[9]) | (e.common[2] ^ w[10]) | (e.common[3] ^ w[11]) |
                       (e.common[4] ^ w[16]) | (e.common[5] ^ w[18]);
    static_assert(kCommon[1] == 9 && kCommon[5] == 18, "kCommon spelled out above");
    const bool wide = e.stamp & 1u;
    if (d != 0 || c == wide) return false;
    if (c) return true;
#if defined(__AVX2__)
    // kRest's runs: words 1-8, 12-15, 17 (hot), 19-25 (tracked).
    auto at = [](const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); };
    const __m256i x = _mm256_or_si256(_mm256_or_si256(_mm256_xor_si256(at(e.rest), at(w + 1)),
                                                      _mm256_xor_si256(at(e.rest + 4), at(w + 5))),
                                      _mm256_xor_si256(at(e.rest + 8), at(w + 12)));
    if (!_mm256_testz_si256(x, x) || e.rest[12] != w[17]) return false;
    if (__builtin_expect(!key_tracked(w), 1)) return true;
    const __m256i t = _mm256_xor_si256(at(e.rest + 13), at(w + 19));
    return _mm256_testz_si256(t, t) && ((e.rest[17] ^ w[23]) | (e.rest[18] ^ w[24]) | (e.rest[19] ^ w[25])) == 0;
#else
    uint64_t r = 0;
    for (size_t k = 0; k < kRestHot; k++) r |= e.rest[k] ^ w[kRest[k]];
    if (r != 0) return false;
    if (__builtin_expect(!key_tracked(w), 1)) return true;
    for (size_t k = kRestHot; k < kRestWords; k++) r |= e.rest[k] ^ w[kRest[k]];
    return r == 0;
#endif
  }
  Megaflow* probe(const Flow& key, uint32_t hash, uint32_t i, bool common, uint32_t* slot) const {
    const Entry& e = e_[i];
    if (e.hash == hash && e.mf && holds(e, words(key), common)) {
      *slot = i;
      return e.mf;
    }
    return nullptr;
  }
};

}  // namespace dpu
