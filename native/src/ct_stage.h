// ct_stage.h: stage "conntrack": the worker's conntrack stage, between two passes.
//
// Uses:  the packets that CT actions handed over during a pass (enqueue():
//        jobs), each with its CtSpec and, for a ct without table, the
//        datapath actions that follow it and the pass's key.
// Sets:  the packets' ct_state/ct_zone/ct_mark and Packet::ct (conntrack.h
//        does the work, NAT included); recirc_id for ct(table=T).
// Next:  the next pass (recirculation), or the rest of the action list
//        (which may output, or hand the packet to conntrack again): either way
//        through the caller's executor (`exec`, the execute stage: this stage
//        does not know it); dropped with the stage's reason when a connection
//        cannot be committed.
//
// The stage runs during a pass whenever kCtStageJobs packets have reached
// it, and at the end of the pass over the rest (in batch order either way),
// inside the worker's conntrack epoch read section, and then advances the
// worker's expiry wheel by a bounded slice.
//
// A packet leaves the stage in one of three ways, all in run(): dropped; on
// to actions (the rest of its list, or a megaflow's: the cached pass after an
// established connection's conntrack, or the hinted next pass run here at
// once, run_megaflow()); or to the next pass (recirculated). The caching of
// the pass after conntrack is explained in ct_stage.cc.
//
// Thread-safety: the worker's thread only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "classify.h"
#include "conntrack/conntrack.h"
#include "dpu/mem.h"
#include "stage.h"

namespace dpu {

struct CtCounters {
#define DPU_CT_COUNTER(m, n, h) uint64_t m = 0;
#include "dpu/counters.def"
#undef DPU_CT_COUNTER
};

// The worker's list of conntrack jobs (std::vector's interface, the part
// the stage uses). push() is a bump with its growth out of line, so that
// the pass's call that queues a job saves no registers (std::vector's
// inline reallocation made that leaf function save six). Elements are
// not initialised: every field of a job is written when it is queued.
template <class T>
class JobList {
 public:
  static_assert(std::is_trivially_copyable<T>::value, "jobs are copied as bytes when the list grows");
  T& push() {
    if (__builtin_expect(n_ == cap_, 0)) grow();
    return data_[n_++];
  }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  void clear() { n_ = 0; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
#if defined(__SANITIZE_ADDRESS__)
  static constexpr size_t kFirst = 2;  // under the sanitizers every stage grows it
#else
  static constexpr size_t kFirst = 256;
#endif
  __attribute__((noinline)) void grow() {
    const size_t cap = cap_ ? 2 * cap_ : kFirst;
    std::unique_ptr<T[]> d(new T[cap]);
    if (n_) std::memcpy(static_cast<void*>(d.get()), data_.get(), n_ * sizeof(T));
    data_ = std::move(d);
    cap_ = cap;
  }
  std::unique_ptr<T[]> data_;
  size_t n_ = 0, cap_ = 0;
};

// The pass after conntrack of an established connection, cached (ct_stage.cc,
// "Resuming after conntrack"). One per EMC slot whose key's megaflow is a
// lone ct(table=T) (Megaflow::ct_resume): the connection that key's packets
// belonged to, the state they got, and the megaflow and key the next pass
// found. The next pass's key is a function of the first pass's key, the
// connection's translation (its keys) and its state, mark and label, so a
// packet with the same key whose conntrack result is the same skips that
// pass's parse and lookups.
// What every resumed packet reads is kept in the EMC entry itself (its side
// data, on the page the hit has just read), its state and whether it has a
// label in the entry's side tag; the label and the next pass's key, which
// few packets read, in an array by slot. The connection's life count (conn.h)
// stands for its mark and label: unchanged, so are they.
struct CtResume {
  Conn* conn;
  Megaflow* mf;
  uint32_t life;
  CtXlat other;  // the connection's other key (the translation)
  // The side tag: set, the state, and whether the result had a label.
  static uint16_t tag(uint8_t state, bool labelled) {
    return static_cast<uint16_t>(0x8000u | (labelled ? 0x100u : 0u) | state);
  }
  static uint8_t dir_of(uint16_t tag) { return (tag & kCsReplyDir) ? 1 : 0; }
  // Whether conntrack gave the packet the cached result (the direction is in
  // the state); `label` (of the cold part) is read only if the cached result
  // had one.
  bool same(const CtResult& r, uint16_t tag, const u128& label) const {
    return r.conn == conn && r.state == static_cast<uint8_t>(tag) && r.life == life &&
           ((tag & 0x100u) ? r.label == label : r.label == 0);
  }
};
static_assert(sizeof(CtResume) == Emc::kSideBytes, "kept in an EMC entry");
struct CtResumeCold {
  u128 label = 0;
  Flow key{};
};

class CtStage {
 public:
  explicit CtStage(Conntrack& ct) : ctw_(ct.attach()) {}

  // ct(...) with or without table: the packet and, without a table, the
  // actions after the ct and the pass's key (they run after the stage).
  void enqueue(Packet* p, const DpAction& a, const Flow& key, const DpAction* rest, size_t n_rest) {
    uint32_t k = 0;
    if (a.ct->recirc_id == 0) {
      k = static_cast<uint32_t>(keys_.size());
      keys_.push_back(key);
    }
    CtJob& j = jobs_.push();
    j.p = p;
    j.spec = a.ct;
    j.rest = rest;
    j.n_rest = static_cast<uint32_t>(n_rest);
    j.key = k;
    j.slot = j.stamp = 0;
    j.from = nullptr;
  }
  // A packet whose megaflow `mf` is a lone ct(table=T); slot: 1 + its key's
  // EMC slot, or 0; stamp: that slot's stamp then.
  __attribute__((always_inline)) void enqueue_resumable(ClassifyStage& cls, Packet* p, Megaflow* mf, uint32_t slot,
                                                        uint32_t stamp) {
    if (slot) cls.emc().prefetch_side(slot - 1);  // read at the stage, if the slot resumes
    // Field by field into the list: a job built on the stack and copied
    // whole stalls on store forwarding (its 4-byte stores, then 16-byte loads).
    CtJob& j = jobs_.push();
    j.p = p;
    j.spec = mf->acts[0].ct;
    j.rest = nullptr;
    j.n_rest = j.key = 0;
    j.slot = slot;
    j.stamp = stamp;
    j.from = mf;
  }
  size_t waiting() const { return jobs_.size(); }
  // The jobs: each tracked, then on its way (see the top of this file).
  // exec(p, key, actions, n) runs datapath actions on p (the caller binds
  // where they send it: ExecPath, execute.h).
  template <class Exec>
  void run(StageEnv& env, ClassifyStage& cls, Conntrack& ct, int64_t mono_ns, std::vector<Packet*>& next, Exec&& exec);
  // The pass after a noted packet's conntrack found `mf` with `key`: its
  // slot's cache is filled (ct_stage.cc, "Resuming after conntrack").
  void fill_resume(ClassifyStage& cls, Packet* p, Megaflow* mf, const Flow& key);
  void begin_batch() { notes_.clear(); }
  // Whether an EMC entry's side data names a dead megaflow (revalidation).
  static bool side_names_dead(const unsigned char* side) {
    CtResume r;
    std::memcpy(&r, side, sizeof r);
    return r.mf->dead;
  }
  CtWorker& ct_worker() { return *ctw_; }
  const CtCounters& counters() const { return counters_; }

 private:
  void note_resume(Packet* p, uint32_t slot, uint32_t stamp, const CtResult& r);
  template <class Exec>
  bool continue_pass(StageEnv& env, ClassifyStage& cls, Packet* p, const Megaflow* from, Exec& exec);
  // What pass() would have done with a packet whose key found mf (the
  // caller counts it as a pass).
  template <class Exec>
  void run_megaflow(StageEnv& env, Packet* p, Megaflow* mf, const Flow& key, Exec& exec) {
    mf->count(p->len);
    env.enter_tenant(p, mf->tenant);
    exec(p, key, mf->acts, mf->n_acts);
  }

  struct CtJob {
    Packet* p;
    const CtSpec* spec;
    const DpAction* rest;
    uint32_t n_rest;
    uint32_t key;    // index in keys_
    uint32_t slot;   // 1 + the EMC slot of the pass's key when its megaflow is a lone ct(table=T), else 0
    uint32_t stamp;  // that slot's stamp then
    Megaflow* from;  // that megaflow (with or without a slot), else null
  };
  JobList<CtJob> jobs_;
  std::vector<uint8_t> kind_;  // by job: looked up, its slot's cached connection tried first, or opening a SNAT connection
  // By EMC slot; allocated by the first fill (a worker that never resumes,
  // such as a trace's, never pays for its 4.25 MiB).
  std::unique_ptr<HugeArray<CtResumeCold>> cold_;
  // Packets recirculated after conntrack whose next pass will be cached
  // (Packet::ct.resume indexes this; cleared with every batch).
  struct ResumeNote {
    Packet* p;
    uint32_t slot, stamp;
    Conn* conn;
    uint32_t life;
    uint8_t state;
    CtXlat other;
    u128 label;
  };
  std::vector<ResumeNote> notes_;
  std::vector<Flow> keys_;
  std::vector<CtPrep> prep_;
  std::unique_ptr<CtWorker> ctw_;
  CtCounters counters_;
};

// A conntrack result into the packet's metadata (what the next pass matches).
inline void ct_store_result(Packet* p, const CtSpec& spec, const CtResult& r) {
  PacketMeta& md = p->md;
  md.ct_state = r.state;
  md.ct_zone = spec.zone;
  md.ct_mark = r.mark;
  p->ct_conn = r.conn;
  p->ct_conn_dir = r.dir;
  CtPacketMeta& ct = p->ct;
  ct.resume = 0;
  ct.after = nullptr;
  const uint64_t label[2] = {__builtin_bswap64(static_cast<uint64_t>(r.label >> 64)),
                             __builtin_bswap64(static_cast<uint64_t>(r.label))};
  std::memcpy(ct.label, label, 16);  // network order
  if (!r.have_tuple) {
    ct.proto = 0;
    return;
  }
  const CtKey& k = r.orig;
  ct.proto = k.proto;
  ct.ipv6 = k.v6;
  std::memcpy(ct.src, k.src, 16);
  std::memcpy(ct.dst, k.dst, 16);
  if (k.proto == kIpIcmp || k.proto == kIpIcmpv6) {  // ct_tp_src/dst: the ICMP type and code
    uint8_t tc[2];
    std::memcpy(tc, &k.dport, 2);
    ct.tp_src = be16(tc[0]);
    ct.tp_dst = be16(tc[1]);
  } else {
    ct.tp_src = k.sport;
    ct.tp_dst = k.dport;
  }
}

// Connections the expiry wheel looks at per stage: two per job, at least 64.
// Per job, so that expiry keeps pace with creation whatever the batch size
// (snat-new opens one connection per packet).
constexpr size_t kCtSweepBudget = 64, kCtSweepPerJob = 2;

// The next pass of a packet whose lone ct(table=T) megaflow was followed
// by a megaflow last time, run right here while its bytes are still in L1:
// parsed and, if that megaflow matches it, executed, exactly as pass()
// would (it counts as the same pass). Otherwise it takes the ordinary next
// pass. Not for a megaflow whose actions recirculate (the pass count
// decides the recirculation limit) nor for a frame the next pass might
// pop a tunnel from (the fast tunnel of classify.h).
template <class Exec>
bool CtStage::continue_pass(StageEnv& env, ClassifyStage& cls, Packet* p, const Megaflow* from, Exec& exec) {
  Megaflow* mf = from->after_ct;
  if (!mf || mf->dead || mf->recirculates) return false;
  const PortView& v = env.view;
  if (cls.fast_tunnel() && !v.terms.empty() && p->md.in_port < v.is_underlay.size() && v.is_underlay[p->md.in_port])
    return false;
  Flow key;
  parse_packet(p, &key);
  if (!megaflow_matches(*mf, words(key))) return false;  // parsed again there: rare
  counters_.ct_continued++;
  if (p->ct.resume) fill_resume(cls, p, mf, key);
  env.add_passes(1, 1);
  env.recirculated = true;
  run_megaflow(env, p, mf, key, exec);
  return true;
}

template <class Exec>
void CtStage::run(StageEnv& env, ClassifyStage& cls, Conntrack& ct, int64_t mono_ns, std::vector<Packet*>& next,
                  Exec&& exec) {
  Emc& emc = cls.emc();
  ctw_->begin();
  // The conntrack clock: monotonic, and in a replay its capture's time. A
  // packet is tracked at its own time (its timestamp, when that is ahead of
  // the clock): a batch of a sparse capture may span hours, and a packet
  // must not find its connection expired by the time of a later packet of
  // its batch. The clock moves to the batch's newest timestamp once the
  // batch is done (Worker::process); expiry here runs at the clock.
  const int64_t clock = ct.now(mono_ns);
  const bool dry_run = env.trace != nullptr;
  // Memory latency is overlapped by a software pipeline over the batch's
  // jobs: a job is prepared and its bucket fetched kHeadAhead jobs before it
  // is executed, and the connections its hash tag points to kNodeAhead jobs
  // before. A job whose slot has a cached connection fetches that instead.
  // A job that will open a source-NATed connection fetches, kNodeAhead
  // before, its mapping's map slot and port bitmap words, and kReplyAhead
  // before, the bucket its reply key is expected in (the port read from the
  // bitmap by then). (Fetching every bucket of a 256-packet batch at once
  // would push the first ones out of L1 before they are used.)
  // The fetches are issued kGroup jobs at a time, back to back: with a
  // million connections nearly every one misses the TLB, and the profile
  // showed the pipeline stalled at each prefetch for its page walk. Issued
  // together, the walks overlap; one per job, each stalled on its own
  // (snat-1m x1.07).
  constexpr size_t kHeadAhead = 12, kNodeAhead = 4, kReplyAhead = 2, kGroup = 4;
  // kCarried: an earlier ct of the batch put the packet in a connection
  // (Packet::ct_conn), which is fetched instead of its bucket.
  enum : uint8_t { kLookup, kKnown, kSnatNew, kCarried };
  const size_t n = jobs_.size();
  if (prep_.size() < n) prep_.resize(n);
  if (kind_.size() < n) kind_.resize(n);
  auto fetch_head = [&](size_t j) {
    const CtJob& job = jobs_[j];
    kind_[j] = job.slot && emc.side_tag(job.slot - 1, job.stamp) ? kKnown : kLookup;
    if (kind_[j] == kKnown) return;  // its entry was prefetched when the job was queued
    if (job.p->md.ct_state && job.p->ct_conn) {
      kind_[j] = kCarried;
      ct.prepare(job.p, *job.spec, &prep_[j], false);
      Conntrack::prefetch_conn(static_cast<const Conn*>(job.p->ct_conn));
      return;
    }
    ct.prepare(job.p, *job.spec, &prep_[j]);
    if (prep_[j].ok) ct.prefetch_head(prep_[j].hash);
  };
  auto fetch_node = [&](size_t j) {
    if (kind_[j] == kKnown) {
      const CtResume& e = emc.side<CtResume>(jobs_[j].slot - 1);
      dpu::prefetch(e.conn);  // the line an IPv4 TCP or UDP packet reads (execute_known)
      dpu::prefetch(e.mf);
    } else if (kind_[j] == kLookup && prep_[j].ok) {
      const CtPrep& pr = prep_[j];
      const CtSpec& spec = *jobs_[j].spec;
      // A commit with source NAT whose key is not in the table will create
      // a connection: where its mapping is looked up too.
      if (!ct.prefetch_node(pr.hash) && spec.commit && spec.range.type == kNatSrc && !pr.cp.key.v6) {
        ct.nat().prefetch_acquire(spec.zone, pr.cp.key.proto, pr.cp.key.src[0], pr.cp.key.sport, spec.range);
        kind_[j] = kSnatNew;
      }
    }
  };
  for (size_t j = 0; j < std::min(n, kHeadAhead); j++) fetch_head(j);
  for (size_t j = 0; j < std::min(n, kNodeAhead); j++) fetch_node(j);
  for (size_t j = 0; j < std::min(n, kReplyAhead); j++)
    if (kind_[j] == kSnatNew) ct.prefetch_snat_reply(prep_[j], *jobs_[j].spec);
  uint64_t resumed = 0;  // packets that took their slot's cached next pass
  // A continuation may hand its packet to conntrack again: those jobs join
  // this same stage (prepared when they come up).
  for (size_t j = 0; j < jobs_.size(); j++) {
    if ((j & (kGroup - 1)) == 0) {
      for (size_t k = j + kHeadAhead; k < std::min(n, j + kHeadAhead + kGroup); k++) fetch_head(k);
      for (size_t k = j + kNodeAhead; k < std::min(n, j + kNodeAhead + kGroup); k++) fetch_node(k);
    }
    if (__builtin_expect(j + kReplyAhead < n && kind_[j + kReplyAhead] == kSnatNew, 0))
      ct.prefetch_snat_reply(prep_[j + kReplyAhead], *jobs_[j + kReplyAhead].spec);
    // Read in place (a copy is three stores, and the stage runs at about a
    // store a cycle); no path reads it after an exec(), which may move it.
    const CtJob& job = jobs_[j];
    const int64_t now = std::max(clock, Conntrack::stamp(job.p->md.timestamp_ns));
    CtResult r;
    const CtResume* known = nullptr;
    if (j < n && kind_[j] == kKnown) {
      const CtResume& e = emc.side<CtResume>(job.slot - 1);
      const uint16_t known_tag = emc.side_tag(job.slot - 1, job.stamp);
      if (known_tag &&
          ct.execute_known(*ctw_, job.p, *job.spec, e.conn, CtResume::dir_of(known_tag), e.life, e.other, now, &r))
        known = &e;
      else ct.execute(*ctw_, job.p, *job.spec, now, dry_run, &r);
    } else if (j < n && kind_[j] == kCarried) {
      CtPrep& pr = prep_[j];
      if (ct.execute_carried(*ctw_, job.p, *job.spec, pr, static_cast<Conn*>(job.p->ct_conn), job.p->ct_conn_dir,
                             now, dry_run, &r)) {
        counters_.ct_carried++;
      } else {
        Conntrack::hash_prep(&pr);
        ct.execute(*ctw_, job.p, *job.spec, pr, now, dry_run, &r);
      }
    } else if (j < n) {
      ct.execute(*ctw_, job.p, *job.spec, prep_[j], now, dry_run, &r);
    } else {
      ct.execute(*ctw_, job.p, *job.spec, now, dry_run, &r);
    }
    if (env.trace) env.trace->conntrack(*job.spec, r);
    if (r.drop != DROP_NONE) {
      env.drop(job.p, r.drop);
      continue;
    }
    if (known) {  // (a resumable job's ct has a table: ct_resume is set only for ct(table=T))
      const CtResumeCold& cold = (*cold_)[job.slot - 1];
      // The cached next pass. Its megaflow never recirculates
      // (ct_fill_resume), so nothing after it reads the packet's conntrack
      // metadata: the result is not stored in the packet (store_result),
      // and the packet has no note to fill. Counted below. (The tag is read
      // again: kept across the decision, it was spilled.)
      if (known->same(r, emc.side_tag(job.slot - 1, job.stamp), cold.label) && !known->mf->dead) {
        resumed++;
        run_megaflow(env, job.p, known->mf, cold.key, exec);
        continue;
      }
    }
    ct_store_result(job.p, *job.spec, r);
    if (job.spec->recirc_id) {
      job.p->md.recirc_id = job.spec->recirc_id;
      if (job.slot) note_resume(job.p, job.slot - 1, job.stamp, r);
      if (job.from && continue_pass(env, cls, job.p, job.from, exec)) continue;
      job.p->ct.after = job.from;  // its next pass tries what followed this megaflow last time
      next.push_back(job.p);
    } else {
      const Flow key = keys_[job.key];  // copied: the continuation may add keys
      exec(job.p, key, job.rest, job.n_rest);
    }
  }
  // The stage's counts: every job was tracked once; each resumed packet
  // made the pass it stands for (a recirculation, answered as an EMC hit:
  // Worker::counters adds ct_resumed to emc_hits).
  counters_.ct_packets += jobs_.size();
  if (resumed) {
    env.add_passes(resumed, resumed);
    env.recirculated = true;
    counters_.ct_resumed += resumed;
  }
  const size_t budget = std::max(kCtSweepBudget, kCtSweepPerJob * jobs_.size());
  jobs_.clear();
  keys_.clear();
  ctw_->end();
  if (!dry_run) ctw_->sweep(clock, budget);
}


}  // namespace dpu
