// traffic.h: a packet blaster and a receive counter on Linux interfaces, for
// measuring live forwarding (`dpu bench live-*`, bench/live_bench.py,
// `python3 -m dpu.traffic`), the way pktgen and a counting sink would.
//
// blast: sendmmsg on an AF_PACKET socket (PACKET_QDISC_BYPASS) cycling through
// template frames, as fast as the kernel takes them or at rate_pps, for
// `seconds`. count_rx: a TPACKET_V3 ring whose blocks are only counted, the
// cheapest receiver AF_PACKET allows (the I/O ceiling a dataplane's receive
// side is held to). Both block the calling thread; call them without the GIL.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "dpu/status.h"

namespace dpu {

struct TrafficResult {
  uint64_t packets = 0;
  uint64_t bytes = 0;
  double seconds = 0;
};

Status blast(const std::string& ifname, const uint8_t* data, const uint64_t* offsets, const uint32_t* lens, size_t n,
             double seconds, double rate_pps, TrafficResult* out);
Status count_rx(const std::string& ifname, double seconds, TrafficResult* out);

}  // namespace dpu
