// execute.cc: the out-of-line parts of the execute stage (execute.h): the
// entry clones (group buckets) and the conntrack stage's continuations use,
// and the CRC32c that SCTP checksums need after a port rewrite. Worker thread
// only.
#include <cstddef>
#include <cstdint>

#include "execute.h"

namespace dpu {

void ExecuteStage::run_nested(const ExecPath& to, Packet* p, const Flow& key, const DpAction* a, size_t n) {
  run(to.env, to.tx, to.ct, p, key, a, n, to.recirc);
}

uint32_t crc32c(const uint8_t* p, size_t n) {
  static uint32_t table[256];
  static bool init = [] {
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
      table[i] = c;
    }
    return true;
  }();
  (void)init;
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return ~c;
}

}  // namespace dpu
