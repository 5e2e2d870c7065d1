// backend.h: an I/O backend as an object, the way a live worker reaches a
// Linux interface (`dpu run --io NAME`; OVS keeps the same facts in a
// netdev_class). Each backend says:
//
//   name     what --io, the topology and the binding call it
//   built    whether this binary can open it: AF_PACKET always, AF_XDP when
//            setup.py found the headers of libxdp and libbpf (DPU_HAVE_AFXDP;
//            the libraries are opened when a queue is, afxdp_lib.h). One that
//            is not built is still known: opening it says how to get it.
//   queues   how many queues of an interface it opens for N workers
//            (AF_PACKET: one per worker, a fanout group spreads the flows;
//            AF_XDP: one per receive queue of the interface, at least N)
//   open     one of those queues (QueueSpec: interface, worker, queue number,
//            group); any error names the interface
//   reopen   the reattach policy, for a queue whose interface was created
//            again (a new ifindex) or whose socket lost its binding:
//            AF_PACKET joins a new fanout group (a socket cannot leave its
//            group, and the old one belongs to the old device), the first
//            that the kernel accepts of a sequence every worker walks alike;
//            AF_XDP needs the interface back with the queues it started with.
//
// One registry (io_backends(), backend.cc) lists them; LiveWorkers picks
// one by name from it, and the binding's IO_BACKENDS (the CLI's --io choices)
// is its built ones. Offloads that senders leave to the receiver (GRO on our
// side, GSO and partial checksums on theirs) are handled in ports/gso.h, the
// one place for them, whatever the backend.
//
// Thread-safety: the objects are immutable; open and reopen may run on
// several workers' threads at once (each backend serialises what its queues
// share).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dpu/status.h"
#include "port_io.h"

namespace dpu {

class IoBackend {
 public:
  virtual ~IoBackend() = default;
  virtual const char* name() const = 0;
  virtual bool built() const = 0;
  // Queues to open on `ifname` for n_workers workers (queue i goes to
  // worker i mod n_workers).
  virtual uint32_t queues(const std::string& ifname, uint32_t n_workers) const = 0;
  virtual Status open(const QueueSpec& spec, std::unique_ptr<PortQueue>* out) const = 0;
  // `spec` as the queue was first opened with; `ifindex` the interface's
  // new index.
  virtual Status reopen(const QueueSpec& spec, int ifindex, std::unique_ptr<PortQueue>* out) const = 0;
};

// Every backend of this source tree, built or not, in the order they are
// offered (the default first).
const std::vector<const IoBackend*>& io_backends();
// The backend of that name, or nullptr.
const IoBackend* find_io_backend(const std::string& name);
// "afpacket, afxdp": every name, for a message about a name that is none.
std::string io_backend_names();

// The backends' objects (afpacket.cc, afxdp.cc).
const IoBackend& afpacket_backend();
const IoBackend& afxdp_backend();

}  // namespace dpu
