// worker.cc: the per-batch fast-path loop, cache maintenance and counters
// (see worker.h for the contract). Actions are executed in execute.cc and
// vxlan.cc.
#include "worker.h"

#include <algorithm>
#include <cstring>

#include "execute.h"
#include "merge_runs.h"
#include "parse.h"
#include "vxlan.h"

#if defined(__x86_64__)
#include <x86intrin.h>
static inline uint64_t cycles_now() { return __rdtsc(); }
#else
#include <chrono>
static inline uint64_t cycles_now() {
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}
#endif

namespace dpu {

Worker::Worker(DatapathView* dp, uint32_t pool_size)
    : dp_(dp), rcu_slot_(dp->rcu().attach()), pool_(pool_size), ctw_(dp->conntrack().attach()) {}

void Worker::set_trace(TraceRecorder* rec) {
  trace_ = rec;
  fast_tunnel_ = rec == nullptr;  // the pop shows as a pass of its own
  max_megaflows_ = rec ? 0 : (1u << 20);
}
Worker::~Worker() { dp_->rcu().detach(rcu_slot_); }

void Worker::sync_config() {
  const Config* c = dp_->config();
  cfg_ = c;
  if (c->version == version_) return;
  if (version_) revalidate(*c);
  version_ = c->version;
  if (c->ports != seen_ports_) {
    seen_ports_ = c->ports;
    is_tunnel_.assign(std::max<uint32_t>(c->ports->max_port(), 1), 0);
    for (const PortInfo* p : c->ports->all()) is_tunnel_[p->ofport] = p->tunnel;
    ports.grow(is_tunnel_.size());
    if (tx_.size() < is_tunnel_.size()) tx_.resize(is_tunnel_.size());
  }
  tenants.grow(c->n_tenant_slots + 1);
  if (c->terms != seen_terms_ || is_underlay_.size() != is_tunnel_.size()) {
    seen_terms_ = c->terms;
    tnl_terms_ = *c->terms;
    is_underlay_.assign(is_tunnel_.size(), 0);
    tnl_tx_.clear();
    for (const TunnelTerm& t : tnl_terms_) {
      if (t.underlay < is_underlay_.size()) is_underlay_[t.underlay] = 1;
      tnl_tx_.push_back({t.underlay, t.port, t.cfg.ipv6});
    }
  }
}

// The changes from version_ to c's, newest first in c's chain: applied
// oldest first. A flush among them, or a chain that no longer reaches back
// to version_, flushes everything.
void Worker::revalidate(const Config& c) {
  std::vector<const ChangeNode*> todo;
  const ChangeNode* n = c.changes.get();
  while (n && n->version > version_) {
    todo.push_back(n);
    n = n->prev.get();
  }
  bool flush = todo.empty() || todo.back()->version != version_ + 1;
  for (const ChangeNode* t : todo) flush |= t->set.flush;
  if (flush) {
    push_stats();
    flush_caches();
    counters.flushes++;
    return;
  }
  auto dying = [this](Megaflow& mf) {
    const uint64_t np = mf.n_packets.load(std::memory_order_relaxed);
    if (np != mf.pushed_packets && !trace_)
      dp_->credit(mf.xcache, np - mf.pushed_packets, mf.n_bytes.load(std::memory_order_relaxed) - mf.pushed_bytes);
  };
  for (auto it = todo.rbegin(); it != todo.rend(); ++it) {
    const size_t dropped = dpcls_.revalidate((*it)->set, dying);
    counters.megaflows_revalidated += dropped;
    counters.revalidations++;
    counters.flushes += dropped ? 1 : 0;
  }
  // Dead megaflows wait (an EMC entry may still name one: it answers
  // nothing) until enough of them make the EMC walk worth its cost.
  if (dpcls_.n_dead() >= 1024) forget_dead();
}

void Worker::forget_dead() {
  emc_.forget_dead([](const unsigned char* side) {
    CtResume r;
    std::memcpy(&r, side, sizeof r);
    return r.mf->dead;
  });
  dpcls_.for_each([](Megaflow& mf, Subtable&) {
    if (mf.after_ct && mf.after_ct->dead) mf.after_ct = nullptr;
  });
  dpcls_.free_dead();
}

void Worker::flush_caches() {
  emc_.clear();
  dpcls_.clear();
}

uint32_t Worker::receive(RxQueue& q, uint32_t max, PortSink* sink) {
  Batch b;
  b.count = q.rx_burst(pool_, b.pkts, max, kBatchMax);
  const uint32_t taken = b.count + static_cast<uint32_t>(q.rejects.size());
  if (b.count) {
    PortSink* prev = sink_;
    sink_ = sink;
    process(b);
    sink_ = prev;
  }
  // After the burst they arrived in (the queue does not say where in it).
  for (const RxReject& r : q.rejects) count_reject(r);
  q.rejects.clear();
  return taken;
}

void Worker::count_reject(const RxReject& r) {
  ports.grow(r.port + 1);
  PortCounters& pc = ports[r.port];
  pc.rx_packets++;
  pc.rx_bytes += r.len;
  pc.dropped++;
  pc.drops[r.reason]++;
  // No buffer ever held it: its length only, timestamped as its burst's newest.
  if (drop_sink_) drop_sink_->dropped(r.port, max_ts_, nullptr, 0, r.len, r.reason);
}

void Worker::dump_megaflows(std::vector<MegaflowDump>* out) {
  dpcls_.for_each([out](Megaflow& mf, Subtable& st) {
    MegaflowDump d;
    std::memcpy(words(d.key), mf.key, kKeyBytes);
    std::memcpy(words(d.mask), st.mask, kKeyBytes);
    d.n_packets = mf.n_packets.load(std::memory_order_relaxed);
    d.n_bytes = mf.n_bytes.load(std::memory_order_relaxed);
    d.actions = &mf.actions;
    out->push_back(d);
  });
}

void Worker::housekeeping() {
  push_stats();
  ctw_->sweep(dp_->conntrack().now(dp_->now_ns()), 1024);
}

void Worker::push_stats() {
  dpcls_.for_each([this](Megaflow& mf, Subtable&) {
    uint64_t np = mf.n_packets.load(std::memory_order_relaxed);
    uint64_t nb = mf.n_bytes.load(std::memory_order_relaxed);
    if (np == mf.pushed_packets) return;
    dp_->credit(mf.xcache, np - mf.pushed_packets, nb - mf.pushed_bytes);
    mf.pushed_packets = np;
    mf.pushed_bytes = nb;
  });
}

void Worker::process(Batch& in) {
  dp_->rcu().enter(rcu_slot_);
  sync_config();
  const uint32_t n = in.count;
  counters.packets += n;
  counters.batches++;
  static_assert(DROP_NONE == 0, "reason_ is cleared with zeros");
  std::memset(out_count_, 0, n * sizeof out_count_[0]);
  std::memset(lost_, 0, n * sizeof lost_[0]);
  std::memset(reason_, 0, n * sizeof reason_[0]);
  std::memset(tenant_, 0, n * sizeof tenant_[0]);
  std::memset(icmp_sent_, 0, n * sizeof icmp_sent_[0]);
  max_ts_ = 0;
  // A burst's frames mostly share a port: its rx counts are added once per
  // run of them (a counter incremented per packet is a store-to-load chain).
  uint32_t run_port = 0;
  uint64_t run_packets = 0, run_bytes = 0;
  for (uint32_t i = 0; i < n; i++) {
    Packet* p = in.pkts[i];
    p->origin = static_cast<uint16_t>(i);
    p->md.tenant = 0;
    max_ts_ = std::max(max_ts_, p->md.timestamp_ns);
    const uint32_t port = p->md.in_port < ports.size() ? p->md.in_port : 0;
    in_port_[i] = port;
    if (port != run_port && run_packets) {
      ports[run_port].rx_packets += run_packets;
      ports[run_port].rx_bytes += run_bytes;
      run_packets = run_bytes = 0;
    }
    run_port = port;
    run_packets++;
    run_bytes += p->len;
  }
  if (run_packets) {
    ports[run_port].rx_packets += run_packets;
    ports[run_port].rx_bytes += run_bytes;
  }
  if (__builtin_expect(drop_sink_ != nullptr, 0)) {  // keep each arrival as received
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++) total += in.pkts[i]->len;
    if (arrival_copy_.size() < total) arrival_copy_.resize(total);
    uint32_t ofs = 0;
    for (uint32_t i = 0; i < n; i++) {
      const Packet* p = in.pkts[i];
      std::memcpy(arrival_copy_.data() + ofs, p->data(), p->len);
      arrival_ofs_[i] = ofs;
      arrival_len_[i] = p->len;
      arrival_ts_[i] = p->md.timestamp_ns;
      ofs += p->len;
    }
  }
  recirculated_ = false;
  emit_seq_ = 0;
  uninstalled_.clear();
  resume_notes_.clear();
  std::vector<Packet*>& cur = cur_;
  std::vector<Packet*>& next = next_;
  cur.assign(in.pkts, in.pkts + n);
  for (int pass_no = 0; !cur.empty(); pass_no++) {
    if (pass_no >= kMaxPasses) {
      for (Packet* p : cur) drop(p, DROP_RECIRC_LIMIT);
      break;
    }
    next.clear();
    for (size_t off = 0; off < cur.size(); off += kChunk) {
      pass(cur.data() + off, static_cast<uint32_t>(std::min<size_t>(kChunk, cur.size() - off)), next, pass_no == 0);
      // Conntrack every kCtStageJobs packets, not once for the whole batch:
      // the first ones' bytes and prepared keys are still in cache.
      if (__builtin_expect(ct_jobs_.size() >= kCtStageJobs, 0)) timed_conntrack_stage(next);
    }
    if (!ct_jobs_.empty()) timed_conntrack_stage(next);
    if (!next.empty()) {
      recirculated_ = true;
      counters.recirculations += next.size();
    }
    cur.swap(next);
  }
  for (uint32_t i = 0; i < n; i++) {
    // Copies the pool could not make are drops too (no_buffer), even when
    // other copies of the packet went out; a packet that died of it counts once.
    uint32_t lost = lost_[i];
    if (!out_count_[i]) {
      uint16_t r = reason_[i] == DROP_NONE ? static_cast<uint16_t>(DROP_NO_OUTPUT) : reason_[i];
      count_drop(i, r);
      ports[in_port_[i]].dropped++;
      if (tenant_[i] && tenant_[i] < tenants.size()) tenants[tenant_[i]].dropped++;
      if (r == DROP_NO_BUFFER && lost) lost--;
    }
    for (; lost; lost--) count_drop(i, DROP_NO_BUFFER);
  }
  if (__builtin_expect(drop_sink_ != nullptr, 0)) report_drops(n);
  // The conntrack clock follows every batch's timestamps, not only those of
  // batches that reach a ct action (an ARP at t=60 in a replay moves it
  // too), once the batch is done: each of its packets was tracked at its
  // own time (ct_stage.cc).
  if (max_ts_) {
    // A clock moved by the packets' time (a replay, or process() with
    // timestamps) expires at once what it passed, as a stage would have
    // (its slice ran before the move).
    Conntrack& ct = dp_->conntrack();
    const int64_t mono = dp_->now_ns();
    const int64_t before = ct.now(mono);
    const int64_t after = ct.now(mono, Conntrack::stamp(max_ts_));
    if (after - before >= CtWorker::kTickNs && !trace_) ctw_->sweep(after, 1024);
  }
  uint64_t t0 = profile_ ? cycles_now() : 0;
  flush_tx(recirculated_);
  if (profile_) counters.cycles[STAGE_TX] += cycles_now() - t0;
  in.count = 0;
  if ((++batch_count_ & 1023) == 0) dpcls_.resort();
  cfg_ = nullptr;
  dp_->rcu().leave(rcu_slot_);
}

// The arrivals counted as drops above, as they arrived, to the drop sink.
void Worker::report_drops(uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    if (out_count_[i]) continue;
    uint16_t r = reason_[i] == DROP_NONE ? static_cast<uint16_t>(DROP_NO_OUTPUT) : reason_[i];
    drop_sink_->dropped(in_port_[i], arrival_ts_[i], arrival_copy_.data() + arrival_ofs_[i], arrival_len_[i],
                        arrival_len_[i], r);
  }
}

// Out of line: inlined into process()'s sub-batch loop, it slowed the runs
// without conntrack (262bfc7, cfd1055).
__attribute__((noinline)) void Worker::timed_conntrack_stage(std::vector<Packet*>& next) {
  const uint64_t t0 = profile_ ? cycles_now() : 0;
  conntrack_stage(next);
  if (profile_) counters.cycles[STAGE_CONNTRACK] += cycles_now() - t0;
}

// Stage 1: parse every packet of a sub-batch into keys[]. When the worker
// terminates VXLAN (kTerms), a frame for one of our VTEPs is popped as soon as
// its outer key says so and the inner frame is parsed into the same slot (a
// pass that would only have executed TNL_POP); a pop that fails drops the
// packet, which leaves the sub-batch. Returns the packets left, in live[].
template <bool kTerms>
uint32_t Worker::parse_stage(Packet** pkts, uint32_t n, Flow* keys, Packet** live, bool first) {
  uint32_t m = 0;
  for (uint32_t i = 0; i < n; i++) {
    Packet* p = pkts[i];
    if (i + 2 < n) {
      __builtin_prefetch(pkts[i + 2]->data());
      if (kTerms) __builtin_prefetch(pkts[i + 2]->data() + 64);
    }
    const TunnelTerm* t = nullptr;
    OuterView raw;
    if (kTerms && p->md.in_port < is_underlay_.size() && is_underlay_[p->md.in_port] && outer_view_raw(p, &raw) &&
        (t = find_tunnel_term(tnl_terms_, raw)) != nullptr) {
      p->l3_ofs = 14;  // what the outer parse would have found
      p->l4_ofs = 14 + 20;
    } else {
      uint8_t f = parse_packet(p, &keys[m]);
      if (__builtin_expect(first && f, 0)) {
        PortCounters& pc = ports[in_port_[p->origin]];
        pc.rx_truncated += (f & kParseTruncated) ? 1 : 0;
        pc.rx_malformed += (f & kParseMalformed) ? 1 : 0;
        pc.rx_unknown += (f & kParseUnknown) ? 1 : 0;
      }
      if (kTerms && keys[m].in_port < is_underlay_.size() && is_underlay_[keys[m].in_port])
        t = find_tunnel_term(tnl_terms_, outer_view(keys[m]));
    }
    if (kTerms && t) {
      counters.passes++;  // the outer lookup this replaces
      uint16_t r = vxlan_pop(p, t->pop, t->port);
      if (r != DROP_NONE) {
        drop(p, r);
        continue;
      }
      counters.recirculations++;
      counters.tunnel_pops++;
      count_tunnel_rx(t->port, p->len);
      parse_packet(p, &keys[m]);
    }
    live[m++] = p;
  }
  return m;
}

// One sub-batch, in stages so that each stage's memory accesses were
// prefetched by the previous one: parse + hash (prefetch the EMC slots), EMC
// (prefetch each hit's megaflow), megaflow cache, upcalls, then the actions
// (their lines prefetched while the megaflow counters are updated).
void Worker::pass(Packet** pkts, uint32_t n, std::vector<Packet*>& recirc, bool first) {
  alignas(64) Flow keys[kChunk];
  uint32_t hashes[kChunk];
  bool common[kChunk];  // Emc::common() of each key looked up in the EMC
  Megaflow* mfs[kChunk];
  uint8_t miss[kChunk];
  uint32_t n_miss = 0;
  uint64_t t0 = profile_ ? cycles_now() : 0, t1;

  Packet* live[kChunk];
  if (__builtin_expect(fast_tunnel_ && !tnl_terms_.empty(), 0)) n = parse_stage<true>(pkts, n, keys, live, first);
  else n = parse_stage<false>(pkts, n, keys, live, first);
  pkts = live;
  // The EMC entry of each hit (kNoSlot for a miss) and its stamp now: a miss
  // later in this sub-batch may insert another key into the same entry.
  uint32_t slots[kChunk], stamps[kChunk];
  constexpr uint32_t kNoSlot = ~0u;
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
  for (uint32_t i = 0; i < n; i++) {
    slots[i] = kNoSlot;
    mfs[i] = nullptr;
    const Packet* p = pkts[i];
    if (p->md.ct_state && p->ct.after) {
      Megaflow* next = static_cast<const Megaflow*>(p->ct.after)->after_ct;
      if (next && !next->dead && megaflow_matches(*next, words(keys[i]))) {
        mfs[i] = next;
        __builtin_prefetch(next);
        n_hinted++;
        continue;
      }
    }
    if (use_emc) {  // (bypassed, the EMC needs a hash only for the rare insert)
      common[i] = Emc::common(words(keys[i]));
      hashes[i] = Emc::hash(keys[i], common[i]);
      emc_.prefetch(hashes[i], common[i]);
    }
    look[n_look++] = static_cast<uint8_t>(i);
  }
  counters.passes += n;
  counters.megaflow_hits += n_hinted;
  counters.ct_hinted += n_hinted;
  if (profile_) {
    t1 = cycles_now();
    counters.cycles[STAGE_PARSE] += t1 - t0;
    t0 = t1;
  }

  // Each key's first way, then, for those that missed it, the entries of its
  // bucket whose tags match (their lines fetched in between, all at once).
  uint8_t second[kChunk], cands[kChunk];
  uint32_t n_second = 0;
  auto hit = [&](uint32_t i, Megaflow* mf) {
    mfs[i] = mf;
    __builtin_prefetch(mf);
    stamps[i] = emc_.stamp(slots[i]);
  };
  if (!use_emc) {
    std::memcpy(miss, look, n_look);
    n_miss = n_look;
    counters.emc_skipped += n_look;
    n_look = 0;
  }
  for (uint32_t k = 0; k < n_look; k++) {
    const uint32_t i = look[k];
    if (Megaflow* mf = emc_.lookup_first(keys[i], hashes[i], common[i], &slots[i])) {
      hit(i, mf);
    } else {
      cands[n_second] = static_cast<uint8_t>(emc_.second_candidates(hashes[i], common[i]));
      second[n_second++] = static_cast<uint8_t>(i);
    }
  }
  for (uint32_t k = 0; k < n_second; k++) {
    uint32_t i = second[k];
    if (Megaflow* mf = emc_.lookup_second(keys[i], hashes[i], common[i], cands[k], &slots[i])) hit(i, mf);
    else miss[n_miss++] = static_cast<uint8_t>(i);
  }
  if (use_emc) {
    counters.emc_hits += n_look - n_miss;
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
  if (profile_) {
    t1 = cycles_now();
    counters.cycles[STAGE_EMC] += t1 - t0;
    t0 = t1;
  }

  uint32_t n_up = 0;
  uint8_t up[kChunk];
  uint32_t probes = 0;
  dpcls_.lookup_batch<kChunk>(keys, miss, n_miss, mfs, &probes);
  counters.subtable_probes += probes;
  for (uint32_t k = 0; k < n_miss; k++) {
    uint32_t i = miss[k];
    if (Megaflow* mf = mfs[i]) {
      counters.megaflow_hits++;
      // A packet whose next pass after conntrack will be cached leaves the
      // EMC to the keys that still need it.
      if (next_random() % emc_inv_prob_ == 0 && !(pkts[i]->md.ct_state && pkts[i]->ct.resume))
        emc_.insert(keys[i], use_emc ? hashes[i] : Emc::hash(keys[i]), mf, !emc_bypass_);
    } else {
      up[n_up++] = static_cast<uint8_t>(i);
    }
  }
  if (profile_) {
    t1 = cycles_now();
    counters.cycles[STAGE_MEGAFLOW] += t1 - t0;
    t0 = t1;
  }

  // Upcalls. A packet whose megaflow could not be installed runs straight from
  // its translation and credits the rules at once.
  uint32_t direct[kChunk];
  for (uint32_t k = 0; k < n_up; k++) {
    const uint32_t i = up[k];
    mfs[i] = resolve(pkts[i], keys[i], kNoSlot, use_emc, use_emc ? hashes[i] : 0, &direct[i]);
  }
  if (profile_) {
    t1 = cycles_now();
    counters.cycles[STAGE_UPCALL] += t1 - t0;
    t0 = t1;
  }

  for (uint32_t i = 0; i < n; i++) {
    Megaflow* mf = mfs[i];
    if (!mf) continue;
    if (__builtin_expect(mf->dead, 0)) {  // its EMC entry outlived a revalidation: a miss after all
      counters.emc_hits--;
      mf = mfs[i] = resolve(pkts[i], keys[i], slots[i], use_emc, use_emc ? hashes[i] : 0, &direct[i]);
      slots[i] = kNoSlot;
      if (!mf) continue;
    }
    const Packet* p = pkts[i];
    __builtin_prefetch(mf->acts);
    mf->count(p->len);
  }
  const std::vector<XlateOut>& uninstalled = uninstalled_;
  for (uint32_t i = 0; i < n; i++) {
    Packet* p = pkts[i];
    Megaflow* mf = mfs[i];
    const DpAction* acts;
    size_t n_acts;
    uint16_t tenant;
    if (__builtin_expect(mf != nullptr, 1)) {
      acts = mf->acts;
      n_acts = mf->n_acts;
      tenant = mf->tenant;
    } else {
      const XlateOut& xo = uninstalled[direct[i]];
      acts = xo.actions.data();
      n_acts = xo.actions.size();
      tenant = xo.tenant;
    }
    enter_tenant(p, tenant);
    if (__builtin_expect(p->md.ct_state != 0 && p->ct.after != nullptr, 0)) {
      Megaflow* from = static_cast<Megaflow*>(p->ct.after);
      p->ct.after = nullptr;
      if (mf && from->after_ct != mf) from->after_ct = mf;
    }
    // Resuming after conntrack (ct_stage.cc): a packet the stage noted fills
    // its slot's cache now; a packet whose megaflow is a lone ct(table=T)
    // goes to the stage with that megaflow and its EMC slot, if any.
    if (__builtin_expect(p->md.ct_state != 0 && p->ct.resume != 0, 0)) ct_fill_resume(p, mf, keys[i]);
    if (__builtin_expect(mf != nullptr && mf->ct_resume, 0) && p->md.ct_state == 0 && !trace_) {
      if (slots[i] != kNoSlot) ct_enqueue_resumable(p, mf, slots[i] + 1, stamps[i]);
      else ct_enqueue_resumable(p, mf, 0, 0);
      continue;
    }
    run_actions(p, keys[i], acts, n_acts, recirc);
  }
  if (profile_) counters.cycles[STAGE_EXECUTE] += cycles_now() - t0;
}

// A lookup the caches could not answer: the megaflow cache once more (an
// earlier packet of the sub-batch may have installed it), else the slow path
// at the batch's version, installing a megaflow when there is room. Without
// room (or in a trace) the translation is kept in uninstalled_ (*direct: its
// index) and credited at once; returns null then. `slot`: an EMC entry that
// named a dead megaflow, cleared.
Megaflow* Worker::resolve(Packet* p, const Flow& key, uint32_t slot, bool use_emc, uint32_t hash, uint32_t* direct) {
  if (slot != ~0u) emc_.forget(slot);
  uint32_t probes = 0;
  Megaflow* mf = dpcls_.lookup(words(key), &probes);
  counters.subtable_probes += probes;
  if (mf) {
    counters.megaflow_hits++;
    return mf;
  }
  XlateOut xo;
  if (__builtin_expect(trace_ != nullptr, 0)) {
    std::vector<TraceEvent> events;
    dp_->upcall(*cfg_, key, &xo, &events);
    trace_->walk(key, xo, std::move(events));
  } else {
    dp_->upcall(*cfg_, key, &xo, nullptr);
  }
  counters.upcalls++;
  if (dpcls_.size() < max_megaflows_) {
    Flow wc = xo.wc;
    mf = dpcls_.insert(key, wc, std::move(xo));
    emc_.insert(key, use_emc ? hash : Emc::hash(key), mf, !emc_bypass_);
    return mf;
  }
  counters.upcall_no_install++;
  if (!trace_) dp_->credit(xo.xcache, 1, p->len);
  *direct = static_cast<uint32_t>(uninstalled_.size());
  uninstalled_.push_back(std::move(xo));
  return nullptr;
}

void Worker::enter_tenant(Packet* p, uint16_t tenant) {
  if (!tenant || p->md.tenant || tenant >= tenants.size()) return;
  p->md.tenant = tenant;
  tenant_[p->origin] = tenant;
  tenants[tenant].rx_packets++;
  tenants[tenant].rx_bytes += p->len;
}

void Worker::emit(uint32_t port, Packet* p, bool counts_as_output) {
  if (port >= tx_.size()) {
    drop(p, DROP_NO_OUTPUT);
    return;
  }
  if (counts_as_output) {
    out_count_[p->origin]++;
    if (p->md.tenant) {
      tenants[p->md.tenant].tx_packets++;
      tenants[p->md.tenant].tx_bytes += p->len;
    }
  }
  p->emit_seq = emit_seq_++;
  std::vector<Packet*>& q = tx_[port];
  if (q.empty()) tx_ports_.push_back(port);
  q.push_back(p);
}

void Worker::drop(Packet* p, uint16_t reason) {
  if (reason != DROP_NONE) reason_[p->origin] = reason;
  pool_.put(p);
}

Packet* Worker::copy(Packet* p) {
  Packet* c = pool_.clone(p);
  if (__builtin_expect(c == nullptr, 0)) lost_[p->origin]++;
  return c;
}

void Worker::count_drop(uint32_t i, uint16_t reason) {
  ports[in_port_[i]].drops[reason]++;
  if (tenant_[i] && tenant_[i] < tenants.size()) tenants[tenant_[i]].drops[reason]++;
}

void Worker::flush_tx(bool sort) {
  for (uint32_t port : tx_ports_) {
    std::vector<Packet*>& q = tx_[port];
    // Arrival order, then emission order (each arrival's copies in order).
    if (sort)
      merge_runs(q, tx_scratch_, tx_runs_, [](const Packet* a, const Packet* b) {
        return a->origin != b->origin ? a->origin < b->origin : a->emit_seq < b->emit_seq;
      });
    const uint32_t n = static_cast<uint32_t>(q.size());
    const uint32_t sent = sink_ ? sink_->send(port, q.data(), n) : n;
    counters.tx_batches++;
    counters.tx_packets += sent;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < n; i++) {
      if (i < sent) bytes += q[i]->len;
      pool_.put(q[i]);
    }
    PortCounters& pc = ports[port];
    pc.tx_packets += sent;
    pc.tx_bytes += bytes;
    pc.tx_dropped += n - sent;
    q.clear();
  }
  tx_ports_.clear();
}

}  // namespace dpu
