// port_io.h: the port-I/O seam. A worker receives through RxQueues and
// transmits through TxQueues; the worker loop is the same whatever is behind
// them (docs/design.md, "Port I/O"):
//
//   memory   mem_rx.h: a list of frames (process) or template frames cycled (bench)
//   pcap     pcap_rx.h: capture files merged by timestamp (replay); writers as sinks
//   AF_PACKET  afpacket.h: a TPACKET_V3 ring per (port, worker), PACKET_FANOUT
//   AF_XDP     afxdp.h: a UMEM and an XSK per (port, worker)
//
// rx_burst fills up to `max` frames from the worker's pool (data, len,
// md.in_port, md.timestamp_ns) and returns how many; a queue never blocks and
// never returns more than max, so one busy port cannot monopolise a worker.
// tx_burst sends what it can of n packets and returns how many went out; the
// caller counts the rest as refused and frees every packet afterwards.
//
// Thread-safety: a queue belongs to one worker thread.
#pragma once

#include <dirent.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dpu/batch.h"
#include "dpu/drops.h"

namespace dpu {

// Counters of one queue, written by its owner, read with relaxed loads.
struct QueueCounters {
  // rx_ring_drops, rx_too_long, tx_refused, link_errors: counters.def
#define DPU_QUEUE_COUNTER(m, help) uint64_t m = 0;
#include "dpu/counters.def"
#undef DPU_QUEUE_COUNTER
  uint64_t offload_kinds = 0;   // OffloadKind bits (gso.h) of super-frames refused, OR'd: the live loop logs each once
};

// A frame the queue did not turn into packets: no packet buffer can hold it
// (oversize), or a sender's super-frame it cannot cut (offload_unsupported).
// The queue reports it, the worker counts it against its port.
struct RxReject {
  uint32_t port, len;
  uint16_t reason = DROP_OVERSIZE;
};

class RxQueue {
 public:
  virtual ~RxQueue() = default;
  // Stops at max frames; a frame that becomes several packets (a TCP
  // super-frame cut into segments) may take it past max, never past cap.
  virtual uint32_t rx_burst(PacketPool& pool, Packet** pkts, uint32_t max, uint32_t cap) = 0;
  virtual int fd() const { return -1; }  // to sleep on when every queue is empty; -1: never sleeps
  virtual void refresh_counters() {}     // the owner, now and then: fetch what the kernel counted
  // poll() returned POLLERR for fd(): takes the socket's pending error (set
  // when the interface goes down), which would otherwise wake every poll at
  // once and keep the worker spinning while nothing arrives.
  virtual void clear_error() {}
  std::vector<RxReject> rejects;         // filled by rx_burst, emptied by Worker::receive
};

class TxQueue {
 public:
  virtual ~TxQueue() = default;
  virtual uint32_t tx_burst(Packet* const* pkts, uint32_t n) = 0;
};

// One worker's queue of a Linux interface: both directions, and what the
// backend counted. LiveWorkers opens one per (attached port, worker).
class PortQueue : public RxQueue, public TxQueue {
 public:
  // Still bound to its interface: false once the interface was unregistered
  // (deleted, or moved to another namespace, even if it comes back with the
  // same index). LiveWorkers then opens the queue again.
  virtual bool bound() const { return true; }
  QueueCounters counters;
};

struct QueueSpec {
  std::string ifname;
  uint32_t ofport = 0;
  uint32_t worker = 0;      // this queue's worker, 0..n_workers-1
  uint32_t n_workers = 1;
  uint32_t queue = 0;       // AF_XDP: the interface's receive queue it binds
  uint32_t n_queues = 1;    // AF_XDP: how many the interface has (all bound, spread over the workers)
  int group = -1;           // a number shared by the queues of one interface (AF_PACKET fanout group)
};

// Receive and transmit queues the interface has (sysfs of this namespace);
// 0 when it cannot be read.
inline uint32_t interface_queues(const std::string& ifname) {
  DIR* d = opendir(("/sys/class/net/" + ifname + "/queues").c_str());
  if (!d) return 0;
  uint32_t rx = 0, tx = 0;
  while (const dirent* e = readdir(d)) {
    if (!std::strncmp(e->d_name, "rx-", 3)) rx++;
    else if (!std::strncmp(e->d_name, "tx-", 3)) tx++;
  }
  closedir(d);
  return std::min(rx, tx);
}

}  // namespace dpu
