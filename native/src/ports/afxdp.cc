// afxdp.cc: AF_XDP queues (see afxdp.h).
#include "afxdp.h"

namespace dpu {

Status open_afxdp_queue(const QueueSpec& spec, std::unique_ptr<PortQueue>*) {
  return Status::Error(Err::INVALID, "interface " + spec.ifname +
                                         ": AF_XDP is not in this build (install libxdp-dev and libbpf-dev, rebuild)");
}

}  // namespace dpu
