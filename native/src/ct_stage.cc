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
// The stage runs once per pass over every packet that reached it, inside the
// worker's epoch read section, and then advances the worker's expiry wheel by
// a bounded slice. Worker thread only.
#include "dataplane.h"
#include "execute.h"

namespace dpu {

constexpr size_t kSweepBudget = 64;  // connections the expiry wheel looks at per stage

void Worker::ct_enqueue(Packet* p, const DpAction& a, const Flow& key, const DpAction* rest, size_t n_rest) {
  uint32_t k = 0;
  if (a.ct->recirc_id == 0) {
    k = static_cast<uint32_t>(ct_keys_.size());
    ct_keys_.push_back(key);
  }
  ct_jobs_.push_back(CtJob{p, a.ct, rest, static_cast<uint32_t>(n_rest), k});
}

static void store_result(Packet* p, const CtSpec& spec, const CtResult& r) {
  PacketMeta& md = p->md;
  md.ct_state = r.state;
  md.ct_zone = spec.zone;
  md.ct_mark = r.mark;
  CtPacketMeta& ct = p->ct;
  for (int i = 0; i < 16; i++) ct.label[i] = static_cast<uint8_t>(r.label >> (8 * (15 - i)));
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

void Worker::conntrack_stage(std::vector<Packet*>& next) {
  Conntrack& ct = dp_->conntrack();
  ctw_->begin();
  // The conntrack clock: monotonic, or the batch's newest packet timestamp
  // when that is ahead (a replay follows its capture's time).
  const int64_t now = ct.now(dp_->now_ns(), static_cast<int64_t>(max_ts_));
  const bool dry_run = trace_ != nullptr;
  // The batch's chains are fetched before any is walked: every packet's
  // chain head, then every chain's first connection, then the decisions.
  const size_t n = ct_jobs_.size();
  if (ct_prep_.size() < n) ct_prep_.resize(n);
  for (size_t j = 0; j < n; j++) {
    ct.prepare(ct_jobs_[j].p, *ct_jobs_[j].spec, &ct_prep_[j]);
    if (ct_prep_[j].ok) ct.prefetch_head(ct_prep_[j].hash);
  }
  for (size_t j = 0; j < n; j++)
    if (ct_prep_[j].ok) ct.prefetch_node(ct_prep_[j].hash);
  // A continuation may hand its packet to conntrack again: those jobs join
  // this same stage (prepared when they come up).
  for (size_t j = 0; j < ct_jobs_.size(); j++) {
    const CtJob job = ct_jobs_[j];
    CtResult r;
    if (j < n) ct.execute(*ctw_, job.p, *job.spec, ct_prep_[j], now, dry_run, &r);
    else ct.execute(*ctw_, job.p, *job.spec, now, dry_run, &r);
    counters.ct_packets++;
    if (trace_) trace_->conntrack(*job.spec, r);
    if (r.drop != DROP_NONE) {
      drop(job.p, r.drop);
      continue;
    }
    store_result(job.p, *job.spec, r);
    if (job.spec->recirc_id) {
      job.p->md.recirc_id = job.spec->recirc_id;
      next.push_back(job.p);
    } else {
      const Flow key = ct_keys_[job.key];  // copied: the continuation may add keys
      run_actions_nested(job.p, key, job.rest, job.n_rest, next);
    }
  }
  ct_jobs_.clear();
  ct_keys_.clear();
  ctw_->end();
  if (!dry_run) ctw_->sweep(now, kSweepBudget);
}

}  // namespace dpu
