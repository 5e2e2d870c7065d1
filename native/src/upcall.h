// upcall.h: stage "upcall": a lookup no cache could answer.
//
// Uses:  a packet's flow key, the Config its batch runs at (datapath_view.h),
//        the classify stage's caches.
// Sets:  the packet's megaflow: found in the megaflow cache after all (an
//        earlier packet of the sub-batch may have installed it), or
//        translated by the slow path (DatapathView::upcall, at the batch's
//        version) and installed. Without room (max_megaflows) or in a trace,
//        the translation is kept for this batch only (uninstalled(), the
//        packet runs straight from it) and its rules are credited at once.
// Next:  execute (execute.h).
//
// A trace records every walk (TraceRecorder::walk) and installs nothing.
// Thread-safety: the worker's thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "classify.h"
#include "datapath_view.h"
#include "stage.h"
#include "xlate.h"

namespace dpu {

struct UpcallCounters {
#define DPU_UPCALL_COUNTER(m, n, h) uint64_t m = 0;
#include "dpu/counters.def"
#undef DPU_UPCALL_COUNTER
};

class UpcallStage {
 public:
  // The megaflow for `key`, or null when its translation could not be
  // installed (then *direct indexes uninstalled()). `slot`: an EMC entry
  // that named a dead megaflow (SubBatch::kNoSlot if none).
  Megaflow* resolve(StageEnv& env, DatapathView& dp, const Config& cfg, ClassifyStage& cls, Packet* p, const Flow& key,
                    uint32_t slot, bool use_emc, uint32_t hash, uint32_t* direct);
  const XlateOut& uninstalled(uint32_t i) const { return uninstalled_[i]; }
  void begin_batch() { uninstalled_.clear(); }
  void set_max_megaflows(size_t n) { max_megaflows_ = n; }
  const UpcallCounters& counters() const { return counters_; }

 private:
  std::vector<XlateOut> uninstalled_;  // walks run without a megaflow (cache full, trace): this batch
  size_t max_megaflows_ = 1u << 20;
  UpcallCounters counters_;
};

}  // namespace dpu
