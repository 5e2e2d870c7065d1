// upcall.cc: stage "upcall" (see upcall.h).
#include "upcall.h"

namespace dpu {

Megaflow* UpcallStage::resolve(StageEnv& env, DatapathView& dp, const Config& cfg, ClassifyStage& cls, Packet* p,
                               const Flow& key, uint32_t slot, bool use_emc, uint32_t hash, uint32_t* direct) {
  if (slot != SubBatch::kNoSlot) cls.unhit(slot);
  if (Megaflow* mf = cls.find(key)) return mf;
  XlateOut xo;
  if (__builtin_expect(env.trace != nullptr, 0)) {
    std::vector<TraceEvent> events;
    dp.upcall(cfg, key, &xo, &events);
    env.trace->walk(key, xo, std::move(events));
  } else {
    dp.upcall(cfg, key, &xo, nullptr);
  }
  counters_.upcalls++;
  if (cls.megaflows() < max_megaflows_) return cls.install(key, std::move(xo), use_emc, hash);
  counters_.upcall_no_install++;
  if (!env.trace) dp.credit(xo.xcache, 1, p->len);
  *direct = static_cast<uint32_t>(uninstalled_.size());
  uninstalled_.push_back(std::move(xo));
  return nullptr;
}

}  // namespace dpu
