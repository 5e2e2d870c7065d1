// drops.h: the DropReason enum generated from drop_reasons.def.
//
// Counters are arrays indexed by DropReason; names and help texts live in
// ofparse.cc (drop_reason_name/help), generated from the same file.
#pragma once

#include <cstdint>

namespace dpu {

enum DropReason : uint16_t {
#define DPU_DROP(e, n, h) DROP_##e,
#include "dpu/drop_reasons.def"
#undef DPU_DROP
  DROP_COUNT
};

}  // namespace dpu
