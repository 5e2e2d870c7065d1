// afxdp.h: a Linux interface through AF_XDP (`dpu run --io afxdp`).
//
// One XSK (and its UMEM) per (port, worker), bound to the interface's
// receive queue numbered like the worker: N workers need N queues.
// Built when libxdp and libbpf are found (DPU_HAVE_AFXDP); without them
// opening a queue says how to get them.
#pragma once

#include <memory>

#include "dpu/status.h"
#include "port_io.h"

namespace dpu {

// The live runner's factory (live.cc): an AF_XDP queue for spec.
Status open_afxdp_queue(const QueueSpec& spec, std::unique_ptr<PortQueue>* out);

}  // namespace dpu
