// ct_stage.cc: stage "conntrack" (see ct_stage.h): what it keeps between
// batches to resume a known connection's packets.
#include "ct_stage.h"

namespace dpu {

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
// of a resumable job (note_resume: the packet carries the note's index),
// the next pass supplies its megaflow and key (fill_resume), and the slot
// is marked if it still holds the same key (its stamp). An EMC insert into
// the slot or a cache flush unmarks it.
//
// Without an EMC slot (more connections than slots), a lone ct(table=T)
// megaflow still shortens the next pass: the job carries the megaflow, the
// recirculated packet carries it (CtPacketMeta::after), and the next pass
// tries the megaflow that followed it last time (Megaflow::after_ct) with a
// masked compare before any cache lookup (classify.h); when that megaflow
// does not recirculate, the stage runs the next pass itself at once
// (continue_pass, ct_stage.h).

void CtStage::note_resume(Packet* p, uint32_t slot, uint32_t stamp, const CtResult& r) {
  if (!r.conn || (r.state & (kCsNew | kCsInvalid | kCsRelated)) || !(r.state & kCsEstablished)) return;
  if (notes_.size() >= 0xffff) return;
  notes_.push_back(ResumeNote{p, slot, stamp, r.conn, r.life, r.state, ct_xlat(r.conn->key[1 - r.dir]), r.label});
  p->ct.resume = static_cast<uint16_t>(notes_.size());
}

void CtStage::fill_resume(ClassifyStage& cls, Packet* p, Megaflow* mf, const Flow& key) {
  const size_t i = p->ct.resume - 1u;
  p->ct.resume = 0;
  if (i >= notes_.size() || notes_[i].p != p) return;  // a copy, or a stale note
  ResumeNote& note = notes_[i];
  note.p = nullptr;
  if (!mf || mf->recirculates) return;  // not installed; or its actions would make passes a cache cannot count
  if (cls.emc().stamp(note.slot) != note.stamp) return;  // the slot holds another key now
  if (!cold_) cold_ = std::make_unique<HugeArray<CtResumeCold>>(Emc::kEntries);
  CtResumeCold& cold = (*cold_)[note.slot];
  cold.label = note.label;
  cold.key = key;
  cls.emc().set_side(note.slot, CtResume::tag(note.state, note.label != 0), CtResume{note.conn, mf, note.life, note.other});
}

}  // namespace dpu
