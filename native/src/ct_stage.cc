// ct_stage.cc: the worker's conntrack stage, between two passes.
//
// Uses:  the packets that CT actions handed over during a pass (ct_jobs_),
//        each with its CtSpec and, for a ct without table, the datapath
//        actions that follow it and the pass's key.
// Sets:  the packets' ct_state/ct_zone/ct_mark and Packet::ct (conntrack.h
//        does the work, NAT included); recirc_id for ct(table=T).
// Next:  the next pass (recirculation), or the rest of the action list
//        (which may output, or hand the packet to conntrack again); dropped
//        with the stage's reason when a connection cannot be committed.
//
// The stage runs during a pass whenever kCtStageJobs packets have reached
// it, and at the end of the pass over the rest (in batch order either way),
// inside the worker's epoch read section, and then advances the worker's
// expiry wheel by a bounded slice. Worker thread only.
#include "execute.h"
#include "parse.h"

namespace dpu {

// Connections the expiry wheel looks at per stage: two per job, at least 64.
// Per job, so that expiry keeps pace with creation whatever the batch size
// (snat-new opens one connection per packet).
constexpr size_t kSweepBudget = 64, kSweepPerJob = 2;

void Worker::ct_enqueue(Packet* p, const DpAction& a, const Flow& key, const DpAction* rest, size_t n_rest) {
  uint32_t k = 0;
  if (a.ct->recirc_id == 0) {
    k = static_cast<uint32_t>(ct_keys_.size());
    ct_keys_.push_back(key);
  }
  CtJob& j = ct_jobs_.push();
  j.p = p;
  j.spec = a.ct;
  j.rest = rest;
  j.n_rest = static_cast<uint32_t>(n_rest);
  j.key = k;
  j.slot = j.stamp = 0;
  j.from = nullptr;
}

void Worker::ct_enqueue_resumable(Packet* p, Megaflow* mf, uint32_t slot, uint32_t stamp) {
  if (slot) emc_.prefetch_side(slot - 1);  // read at the stage, if the slot resumes
  // Field by field into the list: a job built on the stack and copied
  // whole stalls on store forwarding (its 4-byte stores, then 16-byte loads).
  CtJob& j = ct_jobs_.push();
  j.p = p;
  j.spec = mf->acts[0].ct;
  j.rest = nullptr;
  j.n_rest = j.key = 0;
  j.slot = slot;
  j.stamp = stamp;
  j.from = mf;
}

static void store_result(Packet* p, const CtSpec& spec, const CtResult& r) {
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

// ---- Resuming after conntrack ------------------------------------------------------------
//
// A packet of an established connection usually takes two passes: its key
// finds a megaflow whose only action is ct(table=T), conntrack tracks and
// translates it, and the recirculated packet is parsed and looked up again.
// The second pass's key depends only on the first pass's key, the
// connection's keys (its translation) and the state, mark and label the
// packet got, so the worker caches it per EMC slot (CtResume): the next time
// a packet hits that slot, the stage tries the cached connection instead of
// a table lookup (Conntrack::execute_known, which takes it only if it is
// still the packet's live connection), and when the result is the cached
// one, the packet goes straight to the cached megaflow's actions with the
// cached key. Anything else (another state, a changed mark, a new
// connection, a refused connection) takes the ordinary second pass. The
// decisions are the same in either case and are made in the same order;
// what the cache saves is a parse, a lookup in the conntrack table, two
// cache lookups, and writing the result into the packet's metadata, which
// nothing after a pass that does not recirculate reads (snat-est-10k
// x1.015). The counters count the pass it stands for (passes,
// recirculations, emc_hits, and ct_resumed).
//
// The cache is filled in three steps: the stage notes an established result
// of a resumable job (ct_note_resume: the packet carries the note's index),
// the next pass supplies its megaflow and key (ct_fill_resume), and the slot
// is marked if it still holds the same key (its stamp). An EMC insert into
// the slot or a cache flush unmarks it.
//
// Without an EMC slot (more connections than slots), a lone ct(table=T)
// megaflow still shortens the next pass: the job carries the megaflow, the
// recirculated packet carries it (CtPacketMeta::after), and the next pass
// tries the megaflow that followed it last time (Megaflow::after_ct) with a
// masked compare before any cache lookup (worker.cc); when that megaflow
// does not recirculate, the stage runs the next pass itself at once
// (ct_continue).

void Worker::ct_note_resume(Packet* p, uint32_t slot, uint32_t stamp, const CtResult& r) {
  if (!r.conn || (r.state & (kCsNew | kCsInvalid | kCsRelated)) || !(r.state & kCsEstablished)) return;
  if (resume_notes_.size() >= 0xffff) return;
  resume_notes_.push_back(ResumeNote{p, slot, stamp, r.conn, r.life, r.state, ct_xlat(r.conn->key[1 - r.dir]), r.label});
  p->ct.resume = static_cast<uint16_t>(resume_notes_.size());
}

void Worker::ct_fill_resume(Packet* p, Megaflow* mf, const Flow& key) {
  const size_t i = p->ct.resume - 1u;
  p->ct.resume = 0;
  if (i >= resume_notes_.size() || resume_notes_[i].p != p) return;  // a copy, or a stale note
  ResumeNote& note = resume_notes_[i];
  note.p = nullptr;
  if (!mf || mf->recirculates) return;  // not installed; or its actions would make passes a cache cannot count
  if (emc_.stamp(note.slot) != note.stamp) return;  // the slot holds another key now
  if (!ct_resume_) ct_resume_ = std::make_unique<HugeArray<CtResumeCold>>(Emc::kEntries);
  CtResumeCold& cold = (*ct_resume_)[note.slot];
  cold.label = note.label;
  cold.key = key;
  emc_.set_side(note.slot, CtResume::tag(note.state, note.label != 0), CtResume{note.conn, mf, note.life, note.other});
}

// A next pass run by the stage: what pass() would have done with the packet
// once its key found `mf` (counted as a pass and a recirculation).
void Worker::ct_next_pass(Packet* p, Megaflow* mf, const Flow& key, std::vector<Packet*>& next) {
  if (p->ct.resume) ct_fill_resume(p, mf, key);
  ct_run_pass(p, mf, key, next);
}

void Worker::ct_run_pass(Packet* p, Megaflow* mf, const Flow& key, std::vector<Packet*>& next) {
  counters.passes++;
  counters.recirculations++;
  recirculated_ = true;
  ct_run_actions(p, mf, key, next);
}

void Worker::ct_run_actions(Packet* p, Megaflow* mf, const Flow& key, std::vector<Packet*>& next) {
  mf->count(p->len);
  enter_tenant(p, mf->tenant);
  run_actions_nested(p, key, mf->acts, mf->n_acts, next);
}

// The next pass of a packet whose lone ct(table=T) megaflow was followed
// by a megaflow last time, run right here while its bytes are still in L1:
// parsed and, if that megaflow matches it, executed, exactly as pass()
// would (it counts as the same pass). Otherwise it takes the ordinary next
// pass. Not for a megaflow whose actions recirculate (the pass count
// decides the recirculation limit) nor for a frame the next pass might
// pop a tunnel from (parse_stage<true>).
bool Worker::ct_continue(Packet* p, const Megaflow* from, std::vector<Packet*>& next) {
  Megaflow* mf = from->after_ct;
  if (!mf || mf->dead || mf->recirculates) return false;
  if (fast_tunnel_ && !tnl_terms_.empty() && p->md.in_port < is_underlay_.size() && is_underlay_[p->md.in_port])
    return false;
  Flow key;
  parse_packet(p, &key);
  if (!megaflow_matches(*mf, words(key))) return false;  // parsed again there: rare
  counters.megaflow_hits++;
  counters.ct_hinted++;
  ct_next_pass(p, mf, key, next);
  return true;
}

void Worker::conntrack_stage(std::vector<Packet*>& next) {
  Conntrack& ct = dp_->conntrack();
  ctw_->begin();
  // The conntrack clock: monotonic, and in a replay its capture's time. A
  // packet is tracked at its own time (its timestamp, when that is ahead of
  // the clock): a batch of a sparse capture may span hours, and a packet
  // must not find its connection expired by the time of a later packet of
  // its batch. The clock moves to the batch's newest timestamp once the
  // batch is done (Worker::process); expiry here runs at the clock.
  const int64_t clock = ct.now(dp_->now_ns());
  const bool dry_run = trace_ != nullptr;
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
  const size_t n = ct_jobs_.size();
  if (ct_prep_.size() < n) ct_prep_.resize(n);
  if (ct_kind_.size() < n) ct_kind_.resize(n);
  auto fetch_head = [&](size_t j) {
    const CtJob& job = ct_jobs_[j];
    ct_kind_[j] = job.slot && emc_.side_tag(job.slot - 1, job.stamp) ? kKnown : kLookup;
    if (ct_kind_[j] == kKnown) return;  // its entry was prefetched when the job was queued
    if (job.p->md.ct_state && job.p->ct_conn) {
      ct_kind_[j] = kCarried;
      ct.prepare(job.p, *job.spec, &ct_prep_[j], false);
      Conntrack::prefetch_conn(static_cast<const Conn*>(job.p->ct_conn));
      return;
    }
    ct.prepare(job.p, *job.spec, &ct_prep_[j]);
    if (ct_prep_[j].ok) ct.prefetch_head(ct_prep_[j].hash);
  };
  auto fetch_node = [&](size_t j) {
    if (ct_kind_[j] == kKnown) {
      const CtResume& e = emc_.side<CtResume>(ct_jobs_[j].slot - 1);
      __builtin_prefetch(e.conn);  // the line an IPv4 TCP or UDP packet reads (execute_known)
      __builtin_prefetch(e.mf);
    } else if (ct_kind_[j] == kLookup && ct_prep_[j].ok) {
      const CtPrep& pr = ct_prep_[j];
      const CtSpec& spec = *ct_jobs_[j].spec;
      // A commit with source NAT whose key is not in the table will create
      // a connection: where its mapping is looked up too.
      if (!ct.prefetch_node(pr.hash) && spec.commit && spec.range.type == kNatSrc && !pr.cp.key.v6) {
        ct.nat().prefetch_acquire(spec.zone, pr.cp.key.proto, pr.cp.key.src[0], pr.cp.key.sport, spec.range);
        ct_kind_[j] = kSnatNew;
      }
    }
  };
  for (size_t j = 0; j < std::min(n, kHeadAhead); j++) fetch_head(j);
  for (size_t j = 0; j < std::min(n, kNodeAhead); j++) fetch_node(j);
  for (size_t j = 0; j < std::min(n, kReplyAhead); j++)
    if (ct_kind_[j] == kSnatNew) ct.prefetch_snat_reply(ct_prep_[j], *ct_jobs_[j].spec);
  uint64_t resumed = 0;  // packets that took their slot's cached next pass
  // A continuation may hand its packet to conntrack again: those jobs join
  // this same stage (prepared when they come up).
  for (size_t j = 0; j < ct_jobs_.size(); j++) {
    if ((j & (kGroup - 1)) == 0) {
      for (size_t k = j + kHeadAhead; k < std::min(n, j + kHeadAhead + kGroup); k++) fetch_head(k);
      for (size_t k = j + kNodeAhead; k < std::min(n, j + kNodeAhead + kGroup); k++) fetch_node(k);
    }
    if (__builtin_expect(j + kReplyAhead < n && ct_kind_[j + kReplyAhead] == kSnatNew, 0))
      ct.prefetch_snat_reply(ct_prep_[j + kReplyAhead], *ct_jobs_[j + kReplyAhead].spec);
    const CtJob job = ct_jobs_[j];
    const int64_t now = std::max(clock, Conntrack::stamp(job.p->md.timestamp_ns));
    CtResult r;
    const CtResume* known = nullptr;
    uint16_t known_tag = 0;
    if (j < n && ct_kind_[j] == kKnown) {
      const CtResume& e = emc_.side<CtResume>(job.slot - 1);
      known_tag = emc_.side_tag(job.slot - 1, job.stamp);
      if (known_tag &&
          ct.execute_known(*ctw_, job.p, *job.spec, e.conn, CtResume::dir_of(known_tag), e.life, e.other, now, &r))
        known = &e;
      else ct.execute(*ctw_, job.p, *job.spec, now, dry_run, &r);
    } else if (j < n && ct_kind_[j] == kCarried) {
      CtPrep& pr = ct_prep_[j];
      if (ct.execute_carried(*ctw_, job.p, *job.spec, pr, static_cast<Conn*>(job.p->ct_conn), job.p->ct_conn_dir,
                             now, dry_run, &r)) {
        counters.ct_carried++;
      } else {
        Conntrack::hash_prep(&pr);
        ct.execute(*ctw_, job.p, *job.spec, pr, now, dry_run, &r);
      }
    } else if (j < n) {
      ct.execute(*ctw_, job.p, *job.spec, ct_prep_[j], now, dry_run, &r);
    } else {
      ct.execute(*ctw_, job.p, *job.spec, now, dry_run, &r);
    }
    if (trace_) trace_->conntrack(*job.spec, r);
    if (r.drop != DROP_NONE) {
      drop(job.p, r.drop);
      continue;
    }
    if (known) {  // (a resumable job's ct has a table: ct_resume is set only for ct(table=T))
      const CtResumeCold& cold = (*ct_resume_)[job.slot - 1];
      // The cached next pass. Its megaflow never recirculates
      // (ct_fill_resume), so nothing after it reads the packet's conntrack
      // metadata: the result is not stored in the packet (store_result),
      // and the packet has no note to fill. Counted below.
      if (known->same(r, known_tag, cold.label) && !known->mf->dead) {
        resumed++;
        ct_run_actions(job.p, known->mf, cold.key, next);
        continue;
      }
    }
    store_result(job.p, *job.spec, r);
    if (job.spec->recirc_id) {
      job.p->md.recirc_id = job.spec->recirc_id;
      if (job.slot) ct_note_resume(job.p, job.slot - 1, job.stamp, r);
      if (job.from && ct_continue(job.p, job.from, next)) continue;
      job.p->ct.after = job.from;  // its next pass tries what followed this megaflow last time
      next.push_back(job.p);
    } else {
      const Flow key = ct_keys_[job.key];  // copied: the continuation may add keys
      run_actions_nested(job.p, key, job.rest, job.n_rest, next);
    }
  }
  // The stage's counts: every job was tracked once; each resumed packet
  // made the pass it stands for (a recirculation, answered as an EMC hit).
  counters.ct_packets += ct_jobs_.size();
  if (resumed) {
    counters.passes += resumed;
    counters.recirculations += resumed;
    counters.emc_hits += resumed;
    counters.ct_resumed += resumed;
    recirculated_ = true;
  }
  const size_t budget = std::max(kSweepBudget, kSweepPerJob * ct_jobs_.size());
  ct_jobs_.clear();
  ct_keys_.clear();
  ctw_->end();
  if (!dry_run) ctw_->sweep(clock, budget);
}

}  // namespace dpu
