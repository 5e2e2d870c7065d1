// worker.cc: the worker's thread state: the batch loop, configuration
// versions and revalidation, receive, housekeeping and counters (see
// worker.h). What happens to packets is the stages' (stage.h).
#include "worker.h"

#include <algorithm>
#include <cstring>

#include "dpu/mem.h"

namespace dpu {

Worker::Worker(DatapathView* dp, uint32_t pool_size)
    : dp_(dp), rcu_slot_(dp->rcu().attach()), env_(pool_size), ct_(dp->conntrack()) {}

Worker::~Worker() { dp_->rcu().detach(rcu_slot_); }

void Worker::set_sink(PortSink* s) {
  std::lock_guard<std::mutex> g(mu_);
  tx_.set_sink(s);
}
void Worker::set_drop_sink(DropSink* s) {
  std::lock_guard<std::mutex> g(mu_);
  drop_sink_ = s;
}
void Worker::set_profile(bool on) {
  std::lock_guard<std::mutex> g(mu_);
  env_.profile = on;
}
void Worker::set_emc_insert_inv_prob(uint32_t n) {
  std::lock_guard<std::mutex> g(mu_);
  classify_.set_emc_insert_inv_prob(n);
}
void Worker::set_max_megaflows(size_t n) {
  std::lock_guard<std::mutex> g(mu_);
  upcall_.set_max_megaflows(n);
}
void Worker::set_fast_tunnel(bool on) {
  std::lock_guard<std::mutex> g(mu_);
  classify_.set_fast_tunnel(on);
}
void Worker::set_trace(TraceRecorder* rec) {
  std::lock_guard<std::mutex> g(mu_);
  env_.trace = rec;
  classify_.set_fast_tunnel(rec == nullptr);  // the pop shows as a pass of its own
  upcall_.set_max_megaflows(rec ? 0 : (1u << 20));
}

// ---- configuration versions ----------------------------------------------------------------

void Worker::sync_config() {
  const Config* c = dp_->config();
  cfg_ = c;
  if (c->version == version_) return;
  if (version_) revalidate(*c);
  version_ = c->version;
  PortView& v = env_.view;
  if (c->ports != seen_ports_) {
    seen_ports_ = c->ports;
    v.is_tunnel.assign(std::max<uint32_t>(c->ports->max_port(), 1), 0);
    for (const PortInfo* p : c->ports->all()) v.is_tunnel[p->ofport] = p->tunnel;
    env_.ports.grow(v.is_tunnel.size());
    tx_.ports(v.is_tunnel.size());
  }
  env_.tenants.grow(c->n_tenant_slots + 1);
  if (c->terms != seen_terms_ || v.is_underlay.size() != v.is_tunnel.size()) {
    seen_terms_ = c->terms;
    v.terms = *c->terms;
    v.is_underlay.assign(v.is_tunnel.size(), 0);
    v.tnl_tx.clear();
    for (const TunnelTerm& t : v.terms) {
      if (t.underlay < v.is_underlay.size()) v.is_underlay[t.underlay] = 1;
      v.tnl_tx.push_back({t.underlay, t.port, t.cfg.ipv6});
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
  ThreadCounters& k = env_.counters;
  if (flush) {
    push_stats_locked();
    flush_caches();
    k.flushes++;
    return;
  }
  auto dying = [this](Megaflow& mf) {
    const uint64_t np = mf.n_packets.load(std::memory_order_relaxed);
    if (np != mf.pushed_packets && !env_.trace)
      dp_->credit(mf.xcache, np - mf.pushed_packets, mf.n_bytes.load(std::memory_order_relaxed) - mf.pushed_bytes);
  };
  for (auto it = todo.rbegin(); it != todo.rend(); ++it) {
    const size_t dropped = classify_.revalidate((*it)->set, dying);
    k.megaflows_revalidated += dropped;
    k.revalidations++;
    k.flushes += dropped ? 1 : 0;
  }
  classify_.forget_dead(CtStage::side_names_dead);
}

void Worker::flush_caches() { classify_.flush(); }

// ---- counters ----------------------------------------------------------------------------------

void Worker::push_stats() {
  std::lock_guard<std::mutex> g(mu_);
  push_stats_locked();
}

void Worker::push_stats_locked() {
  int64_t now = 0;  // read once, and only if something moved
  classify_.for_each_megaflow([this, &now](Megaflow& mf, Subtable&) {
    uint64_t np = mf.n_packets.load(std::memory_order_relaxed);
    uint64_t nb = mf.n_bytes.load(std::memory_order_relaxed);
    if (np == mf.pushed_packets) return;
    dp_->credit(mf.xcache, np - mf.pushed_packets, nb - mf.pushed_bytes);
    mf.pushed_packets = np;
    mf.pushed_bytes = nb;
    mf.used_ns = now ? now : (now = dp_->now_ns());
  });
}

void Worker::housekeeping() {
  std::lock_guard<std::mutex> g(mu_);
  push_stats_locked();
  ct_.ct_worker().sweep(dp_->conntrack().now(dp_->now_ns()), 1024);
}

WorkerCounters Worker::counters() const {
  WorkerCounters w;
  const ThreadCounters& t = env_.counters;
#define DPU_THREAD_COUNTER(m, n, h) w.m = relaxed(t.m);
#define DPU_CLASSIFY_COUNTER(m, n, h) w.m = relaxed(classify_.counters().m);
#define DPU_UPCALL_COUNTER(m, n, h) w.m = relaxed(upcall_.counters().m);
#define DPU_EXECUTE_COUNTER(m, n, h) w.m = relaxed(execute_.counters().m);
#define DPU_CT_COUNTER(m, n, h) w.m = relaxed(ct_.counters().m);
#define DPU_TX_COUNTER(m, n, h) w.m = relaxed(tx_.counters().m);
#include "dpu/counters.def"
#undef DPU_THREAD_COUNTER
#undef DPU_CLASSIFY_COUNTER
#undef DPU_UPCALL_COUNTER
#undef DPU_EXECUTE_COUNTER
#undef DPU_CT_COUNTER
#undef DPU_TX_COUNTER
  // What the conntrack stage did for the classify stage (counters.def).
  w.emc_hits += w.ct_resumed;
  w.megaflow_hits += w.ct_continued;
  w.ct_hinted += w.ct_continued;
  for (int i = 0; i < STAGE_COUNT; i++) w.cycles[i] = relaxed(t.cycles[i]);
  return w;
}

// ---- a batch -----------------------------------------------------------------------------------

uint32_t Worker::receive(RxQueue& q, uint32_t max, PortSink* sink, DropSink* drops) {
  std::lock_guard<std::mutex> g(mu_);
  DropSink* const kept_drops = drop_sink_;
  if (drops) drop_sink_ = drops;
  Batch b;
  b.count = q.rx_burst(env_.pool, b.pkts, max, kBatchMax);
  const uint32_t taken = b.count + static_cast<uint32_t>(q.rejects.size());
  if (b.count) {
    PortSink* prev = tx_.sink();
    tx_.set_sink(sink);
    process_locked(b);
    tx_.set_sink(prev);
  }
  // After the burst they arrived in (the queue does not say where in it).
  for (const RxReject& r : q.rejects) count_reject(r, drop_sink_);
  q.rejects.clear();
  if (drop_sink_) drop_sink_->end_batch();
  drop_sink_ = kept_drops;
  return taken;
}

void Worker::count_reject(const RxReject& r, DropSink* drops) {
  env_.ports.grow(r.port + 1);
  PortCounters& pc = env_.ports[r.port];
  pc.rx_packets++;
  pc.rx_bytes += r.len;
  pc.dropped++;
  pc.drops[r.reason]++;
  // No buffer ever held it: its length only, timestamped as its burst's newest.
  if (drops) drops->dropped(r.port, env_.arrivals.max_ts(), nullptr, 0, r.len, r.reason);
}

void Worker::process(Batch& in) {
  std::lock_guard<std::mutex> g(mu_);
  process_locked(in);
  if (drop_sink_) drop_sink_->end_batch();
}

void Worker::process_locked(Batch& in) {
  dp_->rcu().enter(rcu_slot_);
  sync_config();
  const uint32_t n = in.count;
  ThreadCounters& k = env_.counters;
  k.packets += n;
  k.batches++;
  env_.arrivals.begin(in.pkts, n, env_.ports, drop_sink_ != nullptr);
  env_.recirculated = false;
  env_.emit_seq = 0;
  upcall_.begin_batch();
  ct_.begin_batch();
  std::vector<Packet*>& cur = cur_;
  std::vector<Packet*>& next = next_;
  cur.assign(in.pkts, in.pkts + n);
  for (int pass_no = 0; !cur.empty(); pass_no++) {
    if (pass_no >= kMaxPasses) {
      for (Packet* p : cur) env_.drop(p, DROP_RECIRC_LIMIT);
      break;
    }
    next.clear();
    for (size_t off = 0; off < cur.size(); off += kChunk) {
      pass(cur.data() + off, static_cast<uint32_t>(std::min<size_t>(kChunk, cur.size() - off)), next, pass_no == 0);
      // Conntrack every kCtStageJobs packets, not once for the whole batch:
      // the first ones' bytes and prepared keys are still in cache.
      if (__builtin_expect(ct_.waiting() >= kCtStageJobs, 0)) conntrack_stage(next);
    }
    if (ct_.waiting()) conntrack_stage(next);
    if (!next.empty()) {  // each goes on to one more pass
      env_.add_passes(0, next.size());
      env_.recirculated = true;
    }
    cur.swap(next);
  }
  env_.arrivals.finish(n, env_.ports, env_.tenants, drop_sink_);
  follow_packet_clock();
  uint64_t t0 = env_.profile ? stage_cycles() : 0;
  tx_.flush(env_, env_.recirculated);
  if (env_.profile) k.cycles[STAGE_TX] += stage_cycles() - t0;
  in.count = 0;
  if ((++batch_count_ & 1023) == 0) classify_.every_1024_batches();
  cfg_ = nullptr;
  dp_->rcu().leave(rcu_slot_);
}

// The conntrack clock follows every batch's timestamps, not only those of
// batches that reach a ct action (an ARP at t=60 in a replay moves it too),
// once the batch is done: each of its packets was tracked at its own time
// (ct_stage.h). A clock moved that way expires at once what it passed, as a
// stage would have (its slice ran before the move).
void Worker::follow_packet_clock() {
  const uint64_t ts = env_.arrivals.max_ts();
  if (!ts) return;
  Conntrack& ct = dp_->conntrack();
  const int64_t mono = dp_->now_ns();
  const int64_t before = ct.now(mono);
  const int64_t after = ct.now(mono, Conntrack::stamp(ts));
  if (after - before >= CtWorker::kTickNs && !env_.trace) ct_.ct_worker().sweep(after, 1024);
}

__attribute__((noinline)) void Worker::conntrack_stage(std::vector<Packet*>& next) {
  const uint64_t t0 = env_.profile ? stage_cycles() : 0;
  const ExecPath to{env_, tx_, ct_, next};
  ct_.run(env_, classify_, dp_->conntrack(), dp_->now_ns(), next,
          [this, &to](Packet* p, const Flow& key, const DpAction* a, size_t n) {
            execute_.run_nested(to, p, key, a, n);
          });
  if (env_.profile) env_.counters.cycles[STAGE_CONNTRACK] += stage_cycles() - t0;
}

// One sub-batch through classify, upcall and execute (their lines prefetched
// step by step: classify.h).
void Worker::pass(Packet** pkts, uint32_t n, std::vector<Packet*>& recirc, bool first) {
  SubBatch sb;
  classify_.lookup(env_, pkts, n, first, sb);
  uint64_t t0 = env_.profile ? stage_cycles() : 0, t1;
  n = sb.n;
  pkts = sb.pkts;
  Megaflow** mfs = sb.mfs;

  // Upcalls. A packet whose megaflow could not be installed runs straight from
  // its translation and credits the rules at once.
  uint32_t direct[kChunk];
  for (uint32_t k = 0; k < sb.n_up; k++) {
    const uint32_t i = sb.up[k];
    mfs[i] = upcall_.resolve(env_, *dp_, *cfg_, classify_, pkts[i], sb.keys[i], SubBatch::kNoSlot, sb.use_emc,
                             sb.hashes[i], &direct[i]);
  }
  if (env_.profile) {
    t1 = stage_cycles();
    env_.counters.cycles[STAGE_UPCALL] += t1 - t0;
    t0 = t1;
  }

  for (uint32_t i = 0; i < n; i++) {
    Megaflow* mf = mfs[i];
    if (!mf) continue;
    if (__builtin_expect(mf->dead, 0)) {  // its EMC entry outlived a revalidation: a miss after all
      mf = mfs[i] = upcall_.resolve(env_, *dp_, *cfg_, classify_, pkts[i], sb.keys[i], sb.slots[i], sb.use_emc,
                                    sb.hashes[i], &direct[i]);
      sb.slots[i] = SubBatch::kNoSlot;
      if (!mf) continue;
    }
    const Packet* p = pkts[i];
    dpu::prefetch(mf->acts);
    if (const char* side = static_cast<const char*>(mf->side)) {  // a tunnel header or ct spec: two lines
      dpu::prefetch(side);
      dpu::prefetch(side + 64);
    }
    mf->count(p->len);
  }
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
      const XlateOut& xo = upcall_.uninstalled(direct[i]);
      acts = xo.actions.data();
      n_acts = xo.actions.size();
      tenant = xo.tenant;
    }
    env_.enter_tenant(p, tenant);
    if (__builtin_expect(p->md.ct_state != 0 && p->ct.after != nullptr, 0)) {
      Megaflow* from = static_cast<Megaflow*>(p->ct.after);
      p->ct.after = nullptr;
      if (mf && from->after_ct != mf) from->after_ct = mf;
    }
    // Resuming after conntrack (ct_stage.cc): a packet the stage noted fills
    // its slot's cache now; a packet whose megaflow is a lone ct(table=T)
    // goes to the stage with that megaflow and its EMC slot, if any.
    if (__builtin_expect(p->md.ct_state != 0 && p->ct.resume != 0, 0)) ct_.fill_resume(classify_, p, mf, sb.keys[i]);
    if (__builtin_expect(mf != nullptr && mf->ct_resume, 0) && p->md.ct_state == 0 && !env_.trace) {
      if (sb.slots[i] != SubBatch::kNoSlot) ct_.enqueue_resumable(classify_, p, mf, sb.slots[i] + 1, sb.stamps[i]);
      else ct_.enqueue_resumable(classify_, p, mf, 0, 0);
      continue;
    }
    execute_.run(env_, tx_, ct_, p, sb.keys[i], acts, n_acts, recirc);
  }
  if (env_.profile) env_.counters.cycles[STAGE_EXECUTE] += stage_cycles() - t0;
}

}  // namespace dpu
