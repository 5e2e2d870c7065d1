// classify.h: stage "classify": a sub-batch's packets to their megaflows.
//
// Uses:  the packets of a pass (frame, md.in_port, md.ct_state and, after
//        conntrack, Packet::ct.after), the batch's PortView (VTEPs terminated
//        on an underlay port).
// Sets:  SubBatch: each packet's flow key (parse.h) and megaflow, or its place
//        among the misses for the upcall stage; the EMC slot and stamp of an
//        EMC hit (the conntrack stage caches the pass after conntrack there);
//        per-port parse counters (first pass); passes.
// Next:  upcall (upcall.h) for the misses, then execute (execute.h).
//
// In order, each step's memory fetched for the whole sub-batch before any of
// it is read:
//   parse      the datapath key (parse.h); on a port that underlies a VTEP, a
//              frame for one of our VTEPs is popped right here (vxlan_pop) and
//              the inner frame parsed in its place, saving a pass (fast tunnel);
//   hint       a packet back from conntrack tries the megaflow that followed its
//              lone ct(table=T) megaflow last time (Megaflow::after_ct);
//   EMC        16,384 entries, five candidates per key (dpcls.h); bypassed for
//              most sub-batches while it answers fewer than 1/4 of its lookups;
//   megaflows  tuple-space search over the megaflow subtables (Dpcls).
// The stage owns both caches, installs what the upcall stage translates
// (install), and drops what revalidation finds (the worker's caller).
//
// Thread-safety: the worker's thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "dpcls.h"
#include "dpu/mem.h"
#include "parse.h"
#include "stage.h"
#include "vxlan.h"

namespace dpu {

struct ClassifyCounters {
#define DPU_CLASSIFY_COUNTER(m, n, h) uint64_t m = 0;
#include "dpu/counters.def"
#undef DPU_CLASSIFY_COUNTER
};

// One sub-batch of a pass, as the stages hand it on.
struct SubBatch {
  static constexpr uint32_t kNoSlot = ~0u;
  Packet* pkts[kChunk];  // the packets still alive after parsing (a failed pop drops one)
  uint32_t n = 0;
  alignas(64) Flow keys[kChunk];
  Megaflow* mfs[kChunk];
  // The EMC entry of each hit (kNoSlot for a miss) and its stamp then: a miss
  // later in the sub-batch may insert another key into the same entry.
  uint32_t slots[kChunk], stamps[kChunk];
  uint32_t hashes[kChunk];  // EMC hashes (when use_emc)
  bool use_emc = true;
  uint8_t up[kChunk];       // the packets no cache answered, for the upcall stage
  uint32_t n_up = 0;
};

class ClassifyStage {
 public:
  // Parses the n packets of `pkts` and finds each one's megaflow (first: the
  // batch's first pass, whose parse results are counted per port).
  __attribute__((always_inline)) inline void lookup(StageEnv& env, Packet** pkts, uint32_t n, bool first,
                                                    SubBatch& sb);
  // The megaflow cache alone (the upcall stage's second look), counted.
  Megaflow* find(const Flow& key) {
    uint32_t probes = 0;
    Megaflow* mf = dpcls_.lookup(words(key), &probes);
    counters_.subtable_probes += probes;
    counters_.megaflow_hits += mf ? 1 : 0;
    return mf;
  }
  // A translation becomes a megaflow (and an EMC entry); `hash`: the key's
  // EMC hash when the sub-batch computed it (use_emc).
  Megaflow* install(const Flow& key, XlateOut&& xo, bool use_emc, uint32_t hash) {
    Flow wc = xo.wc;
    Megaflow* mf = dpcls_.insert(key, wc, std::move(xo));
    emc_.insert(key, use_emc ? hash : Emc::hash(key), mf, !emc_bypass_);
    return mf;
  }
  // An EMC hit that named a dead megaflow: a miss after all; its entry goes.
  void unhit(uint32_t slot) {
    counters_.emc_hits--;
    emc_.forget(slot);
  }
  size_t megaflows() const { return dpcls_.size(); }
  const size_t& megaflows_ref() const { return dpcls_.size_ref(); }  // for a relaxed read from another thread
  template <class F>
  void for_each_megaflow(F&& f) {
    dpcls_.for_each(std::forward<F>(f));
  }

  // Revalidation (dpcls.h): the megaflows `cs` can affect leave the cache.
  size_t revalidate(const ChangeSet& cs, const std::function<void(Megaflow&)>& dying) {
    return dpcls_.revalidate(cs, dying);
  }
  // Dead megaflows freed once enough have gathered, after one walk of the
  // EMC (and the hints) clears what names them; `side_names_dead` says
  // whether an entry's side data names one.
  template <class F>
  void forget_dead(F&& side_names_dead) {
    if (dpcls_.n_dead() < kFreeDeadAt) return;
    emc_.forget_dead(side_names_dead);
    dpcls_.for_each([](Megaflow& mf, Subtable&) {
      if (mf.after_ct && mf.after_ct->dead) mf.after_ct = nullptr;
    });
    dpcls_.free_dead();
  }
  void flush() {
    emc_.clear();
    dpcls_.clear();
  }
  void every_1024_batches() { dpcls_.resort(); }

  // The EMC's side data, where the conntrack stage caches the pass after an
  // established connection's conntrack (ct_stage.h, CtResume).
  Emc& emc() { return emc_; }

  void set_emc_insert_inv_prob(uint32_t n) { emc_inv_prob_ = n ? n : 1; }
  // Terminate VXLAN right after parsing instead of through a megaflow whose
  // only action is TNL_POP (the outcome is the same; tests compare both).
  void set_fast_tunnel(bool on) { fast_tunnel_ = on; }
  bool fast_tunnel() const { return fast_tunnel_; }
  const ClassifyCounters& counters() const { return counters_; }

 private:
  static constexpr size_t kFreeDeadAt = 1024;
  // EMC bypass (lookup()): while the EMC answers too few lookups (more
  // flows than entries), only one sub-batch in kEmcProbeEvery looks in it;
  // those measure its hit rate, and the rest go to the megaflow cache
  // without fetching its lines. Inserts go on as usual.
  static constexpr uint32_t kEmcProbeEvery = 16, kEmcWindow = 4096;
  template <bool kTerms>
  __attribute__((always_inline)) inline uint32_t parse(StageEnv& env, Packet** pkts, uint32_t n, Flow* keys,
                                                       Packet** live, bool first);
  uint64_t next_random() { return rng_(); }  // EMC insertion and bypass probes

  Emc emc_;
  Dpcls dpcls_;
  bool emc_bypass_ = false;
  uint32_t emc_window_looks_ = 0, emc_window_hits_ = 0;
  uint32_t emc_inv_prob_ = 100;
  bool fast_tunnel_ = true;
  XorShift rng_{0x853c49e6748fea9bull};
  ClassifyCounters counters_;
};

// The clock of the stages' profile (cycles per step, dpu bench --stages).
#if defined(__x86_64__)
inline uint64_t stage_cycles() { return __builtin_ia32_rdtsc(); }
#else
inline uint64_t stage_cycles() {
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}
#endif

// Parse every packet of a sub-batch into keys[]. When the worker terminates
// VXLAN (kTerms), a frame for one of our VTEPs is popped as soon as its outer
// key says so and the inner frame is parsed into the same slot (a pass that
// would only have executed TNL_POP); a pop that fails drops the packet, which
// leaves the sub-batch. Returns the packets left, in live[].
template <bool kTerms>
inline uint32_t ClassifyStage::parse(StageEnv& env, Packet** pkts, uint32_t n, Flow* keys, Packet** live,
                                     bool first) {
  const PortView& v = env.view;
  uint32_t m = 0;
  for (uint32_t i = 0; i < n; i++) {
    Packet* p = pkts[i];
    if (i + 2 < n) {
      dpu::prefetch(pkts[i + 2]->data());
      if (kTerms) dpu::prefetch(pkts[i + 2]->data() + 64);
    }
    const TunnelTerm* t = nullptr;
    OuterView raw;
    if (kTerms && p->md.in_port < v.is_underlay.size() && v.is_underlay[p->md.in_port] && outer_view_raw(p, &raw) &&
        (t = find_tunnel_term(v.terms, raw)) != nullptr) {
      p->l3_ofs = 14;  // what the outer parse would have found
      p->l4_ofs = 14 + 20;
    } else {
      uint8_t f = parse_packet(p, &keys[m]);
      if (__builtin_expect(first && f, 0)) {
        PortCounters& pc = env.ports[env.arrivals.in_port(p->origin)];
        pc.rx_truncated += (f & kParseTruncated) ? 1 : 0;
        pc.rx_malformed += (f & kParseMalformed) ? 1 : 0;
        pc.rx_unknown += (f & kParseUnknown) ? 1 : 0;
      }
      if (kTerms && keys[m].in_port < v.is_underlay.size() && v.is_underlay[keys[m].in_port])
        t = find_tunnel_term(v.terms, outer_view(keys[m]));
    }
    if (kTerms && t) {
      uint16_t r = vxlan_pop(p, t->pop, t->port);
      if (r != DROP_NONE) {
        env.add_passes(1, 0);  // the outer lookup this replaces
        env.drop(p, r);
        continue;
      }
      env.add_passes(1, 1);  // the outer lookup; the inner one follows at once
      counters_.tunnel_pops++;
      env.count_tunnel_rx(t->port, p->len);
      parse_packet(p, &keys[m]);
    }
    live[m++] = p;
  }
  return m;
}

// One sub-batch, in steps so that each step's memory accesses were
// prefetched by the previous one: parse + hash (prefetch the EMC slots), EMC
// (prefetch each hit's megaflow), megaflow cache. What is left goes to the
// upcall stage (sb.up).
inline void ClassifyStage::lookup(StageEnv& env, Packet** pkts, uint32_t n, bool first, SubBatch& sb) {
  bool common[kChunk];  // Emc::common() of each key looked up in the EMC
  uint8_t miss[kChunk];
  uint32_t n_miss = 0;
  uint64_t t0 = env.profile ? stage_cycles() : 0, t1;
  // (sb's arrays named as sb.x, not through local pointers: inlined into the
  // worker's pass, where sb is a local, they are frame-relative addresses, and
  // pointers to them were kept on the stack and reloaded in every loop.)

  if (__builtin_expect(fast_tunnel_ && !env.view.terms.empty(), 0)) n = parse<true>(env, pkts, n, sb.keys, sb.pkts, first);
  else n = parse<false>(env, pkts, n, sb.keys, sb.pkts, first);
  sb.n = n;
  pkts = sb.pkts;
  // A packet back from conntrack tries the megaflow that followed its lone
  // ct(table=T) megaflow last time (Megaflow::after_ct); the others, and
  // those whose key it does not match, are looked up: look[].
  // Hashed in a second loop: reading a key right after parse wrote it in
  // smaller pieces would stall on store-to-load forwarding.
  uint8_t look[kChunk];
  uint32_t n_look = 0, n_hinted = 0;
  // (Probes are picked at random: a fixed period would keep landing on the
  // same kind of sub-batch, e.g. always the pass after conntrack.)
  const bool use_emc = !emc_bypass_ || (next_random() >> 32) % kEmcProbeEvery == 0;
  sb.use_emc = use_emc;
  for (uint32_t i = 0; i < n; i++) {
    sb.slots[i] = SubBatch::kNoSlot;
    sb.mfs[i] = nullptr;
    const Packet* p = pkts[i];
    if (p->md.ct_state && p->ct.after) {
      Megaflow* next = static_cast<const Megaflow*>(p->ct.after)->after_ct;
      if (next && !next->dead && megaflow_matches(*next, words(sb.keys[i]))) {
        sb.mfs[i] = next;
        dpu::prefetch(next);
        n_hinted++;
        continue;
      }
    }
    if (use_emc) {  // (bypassed, the EMC needs a hash only for the rare insert)
      common[i] = Emc::common(words(sb.keys[i]));
      sb.hashes[i] = Emc::hash(sb.keys[i], common[i]);
      emc_.prefetch(sb.hashes[i], common[i]);
    }
    look[n_look++] = static_cast<uint8_t>(i);
  }
  env.add_passes(n, 0);
  counters_.megaflow_hits += n_hinted;
  counters_.ct_hinted += n_hinted;
  if (env.profile) {
    t1 = stage_cycles();
    env.counters.cycles[STAGE_PARSE] += t1 - t0;
    t0 = t1;
  }

  // Each key's first way, then, for those that missed it, the entries of its
  // bucket whose tags match (their lines fetched in between, all at once).
  uint8_t second[kChunk], cands[kChunk];
  uint32_t n_second = 0;
  auto hit = [&](uint32_t i, Megaflow* mf) {
    sb.mfs[i] = mf;
    dpu::prefetch(mf);
    sb.stamps[i] = emc_.stamp(sb.slots[i]);
  };
  if (!use_emc) {
    std::memcpy(miss, look, n_look);
    n_miss = n_look;
    counters_.emc_skipped += n_look;
    n_look = 0;
  }
  for (uint32_t k = 0; k < n_look; k++) {
    const uint32_t i = look[k];
    if (Megaflow* mf = emc_.lookup_first(sb.keys[i], sb.hashes[i], common[i], &sb.slots[i])) {
      hit(i, mf);
    } else {
      cands[n_second] = static_cast<uint8_t>(emc_.second_candidates(sb.hashes[i], common[i]));
      second[n_second++] = static_cast<uint8_t>(i);
    }
  }
  for (uint32_t k = 0; k < n_second; k++) {
    uint32_t i = second[k];
    if (Megaflow* mf = emc_.lookup_second(sb.keys[i], sb.hashes[i], common[i], cands[k], &sb.slots[i])) hit(i, mf);
    else miss[n_miss++] = static_cast<uint8_t>(i);
  }
  if (use_emc) {
    counters_.emc_hits += n_look - n_miss;
    // Bypass below a 1/4 hit rate; back above 1/3 (measured on the
    // sub-batches that still look). The EMC (4 MiB) no longer fits in L2:
    // a miss that fetched its lines only pushed out others.
    emc_window_looks_ += n_look;
    emc_window_hits_ += n_look - n_miss;
    if (emc_window_looks_ >= kEmcWindow) {
      emc_bypass_ = emc_bypass_ ? emc_window_hits_ * 3 < emc_window_looks_ : emc_window_hits_ * 4 < emc_window_looks_;
      emc_window_looks_ = emc_window_hits_ = 0;
    }
  }
  if (env.profile) {
    t1 = stage_cycles();
    env.counters.cycles[STAGE_EMC] += t1 - t0;
    t0 = t1;
  }

  sb.n_up = 0;
  uint32_t probes = 0;
  dpcls_.lookup_batch<kChunk>(sb.keys, miss, n_miss, sb.mfs, &probes);
  counters_.subtable_probes += probes;
  for (uint32_t k = 0; k < n_miss; k++) {
    uint32_t i = miss[k];
    if (Megaflow* mf = sb.mfs[i]) {
      counters_.megaflow_hits++;
      // A packet whose next pass after conntrack will be cached leaves the
      // EMC to the keys that still need it.
      if (next_random() % emc_inv_prob_ == 0 && !(pkts[i]->md.ct_state && pkts[i]->ct.resume))
        emc_.insert(sb.keys[i], use_emc ? sb.hashes[i] : Emc::hash(sb.keys[i]), mf, !emc_bypass_);
    } else {
      sb.up[sb.n_up++] = static_cast<uint8_t>(i);
    }
  }
  if (env.profile) env.counters.cycles[STAGE_MEGAFLOW] += stage_cycles() - t0;
}

}  // namespace dpu
