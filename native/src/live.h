// live.h: the dataplane on Linux interfaces (`dpu run`): worker threads over
// port queues.
//
// Worker i owns at least one queue of every attached port (AF_PACKET sockets
// of an interface form one fanout group, so the kernel spreads each
// interface's flows over the workers; AF_XDP binds every receive queue of the
// interface, queue q to worker q mod N), its caches and its counters; tables are shared
// (read-mostly, versioned) and so is conntrack, so the two directions of a
// connection work whichever worker sees them.
//
// The loop of a worker, per round: a burst of at most `burst` frames from
// each of its queues in turn (the starting queue rotates, so no port can keep
// the others waiting), each burst one batch through Worker::process under the
// worker's mutex (a table commit waits at most one burst), outputs straight
// to the ports' transmit side. A round that found nothing sleeps in poll()
// on every queue for at most `idle_ms`: an idle worker costs no CPU, and on a
// machine whose kernel receives on the same cores, the kernel gets its turn
// (a worker that never slept would starve the receive work feeding it:
// receive livelock). A worker busy for `yield_every` rounds in a row yields
// the CPU once for the same reason. Every `housekeeping_ms` it pushes its
// megaflow counts to the rules and runs a slice of conntrack expiry, so
// counters and timeouts move without any call from outside, and checks that
// its interfaces are the ones its queues are bound to: an interface deleted
// and created again under the same name (a VM's tap device when the VM
// restarts) has a new ifindex, and the worker opens its queues of it again
// (reattach; also when a socket lost its binding: an interface moved to
// another namespace and back keeps its index).
//
// Counters are read from other threads without taking a worker's lock.
// Thread-safety: start/stop from one control thread.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dataplane.h"
#include "drop_writer.h"
#include "ports/backend.h"
#include "ports/gso.h"

namespace dpu {

struct LivePort {
  uint32_t ofport = 0;
  std::string ifname;
};

struct LiveConfig {
  std::vector<LivePort> ports;
  std::string io = "afpacket";  // a backend's name (ports/backend.h)
  uint32_t first_worker = 0;     // workers first_worker.. run the ports (0 may be kept for API calls)
  uint32_t burst = kDefaultBurst;
  uint32_t idle_ms = 1;
  uint32_t yield_every = 64;
  uint32_t housekeeping_ms = 50;
  std::string drops_pcap;        // every dropped arrival to this pcapng file ("": none)
};

// What each worker's queues saw, per port (summed over workers by stats()).
struct LiveQueueStats {
  uint32_t ofport = 0;
  std::string ifname;
  QueueCounters c;
};

class LiveWorkers {
 public:
  LiveWorkers(Dataplane* dp, LiveConfig cfg);
  ~LiveWorkers();
  LiveWorkers(const LiveWorkers&) = delete;
  LiveWorkers& operator=(const LiveWorkers&) = delete;

  // Opens every queue of every worker first (any error, nothing runs), then
  // starts the threads.
  Status start();
  // Joins the threads; GRO goes back on where start() turned it off; the
  // drops file is closed (its status: drops_status()).
  void stop();
  uint64_t drops_written() const { return drops_ ? drops_->packets() : 0; }
  const Status& drops_status() const { return drops_status_; }
  bool running() const { return !threads_.empty(); }
  std::vector<LiveQueueStats> queue_stats() const;

 private:
  class Sink;
  void loop(size_t wi);
  // Worker wi's queues whose interface has a new index or whose socket lost
  // its binding opened again; true if any was (live.cc).
  bool reattach(size_t wi, int64_t now_ns);

  Dataplane* dp_;
  LiveConfig cfg_;
  std::vector<std::vector<std::unique_ptr<PortQueue>>> queues_;  // [worker][k]
  std::vector<std::vector<size_t>> queue_port_;                   // [worker][k]: its port's index in cfg_.ports
  std::vector<std::vector<QueueSpec>> queue_spec_;                // [worker][k]: what it was opened with
  std::vector<std::vector<int>> queue_ifindex_;                   // [worker][k]: the interface it is bound to
  std::vector<std::vector<int>> queue_failed_;                    // [worker][k]: a new one it could not open
  std::vector<std::vector<int64_t>> queue_retry_;                 // [worker][k]: not before (steady clock, ns)
  // Held while a worker replaces a queue (reattach) and while queue_stats()
  // reads them: never on the forwarding path.
  mutable std::mutex queues_mu_;
  const IoBackend* io_ = nullptr;  // cfg_.io's
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  GroOff gro_;  // interfaces whose GRO start() or a reattach turned off: back on at stop()
  std::unique_ptr<PcapngDropWriter> drops_;
  Status drops_status_;
  void set_drop_sinks(DropSink* s);
};

}  // namespace dpu
