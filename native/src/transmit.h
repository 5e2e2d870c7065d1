// transmit.h: stage "transmit": the worker's per-port transmit queues.
//
// Uses:  the packets the execute stage (and the ICMP errors of vxlan.cc) emit,
//        each with its arrival slot (Packet::origin) and emission order.
// Sets:  Packet::emit_seq; the arrivals' output counts and the tenants' tx
//        counts (emit); per-port tx counters, tx_dropped for what a sink did
//        not take (flush).
// Next:  the sink of each port (PortSink: a pcap writer, a live TX ring, a
//        capture list, a counter), once per batch, in arrival order: after
//        recirculation a queue is a few runs each in arrival order, which
//        merge_runs.h merges. The packets then return to the pool.
//
// Thread-safety: the worker's thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "stage.h"

namespace dpu {

struct TransmitCounters {
#define DPU_TX_COUNTER(m, n, h) uint64_t m = 0;
#include "dpu/counters.def"
#undef DPU_TX_COUNTER
};

class TransmitStage {
 public:
  // The packet joins port's queue; counts_as_output: it is one of its
  // arrival's outputs (an ICMP error about it is not).
  void emit(StageEnv& env, uint32_t port, Packet* p, bool counts_as_output) {
    if (__builtin_expect(port >= tx_.size(), 0)) {
      drop_no_output(env, p);
      return;
    }
    if (counts_as_output) {
      env.arrivals.sent(p);
      if (p->md.tenant) {
        env.tenants[p->md.tenant].tx_packets++;
        env.tenants[p->md.tenant].tx_bytes += p->len;
      }
    }
    p->emit_seq = env.emit_seq++;
    std::vector<Packet*>& q = tx_[port];
    // The common case without a call (the push cannot grow the queue): a
    // call's possibility alone makes the caller save registers, and the
    // stages run at about one store a cycle (docs/performance.md).
    if (__builtin_expect(!q.empty() && q.size() != q.capacity(), 1)) {
      q.push_back(p);
      return;
    }
    queue_first_or_grow(q, port, p);
  }
  // Every queue to its port's sink, in arrival order when some packet made a
  // second pass (`sort`).
  void flush(StageEnv& env, bool sort);
  // Queues for ports 0..n-1.
  void ports(size_t n) {
    if (tx_.size() < n) tx_.resize(n);
  }
  void set_sink(PortSink* s) { sink_ = s; }
  PortSink* sink() const { return sink_; }
  const TransmitCounters& counters() const { return counters_; }

 private:
  __attribute__((noinline)) static void drop_no_output(StageEnv& env, Packet* p) { env.drop(p, DROP_NO_OUTPUT); }
  // emit()'s rare end: the port's first packet of the batch, or a full queue.
  __attribute__((noinline)) void queue_first_or_grow(std::vector<Packet*>& q, uint32_t port, Packet* p) {
    if (q.empty()) tx_ports_.push_back(port);
    q.push_back(p);
  }
  std::vector<std::vector<Packet*>> tx_;  // by ofport
  std::vector<uint32_t> tx_ports_;        // ports with queued packets
  std::vector<Packet*> scratch_;          // merge_runs() buffers
  std::vector<uint32_t> runs_;
  PortSink* sink_ = nullptr;
  TransmitCounters counters_;
};

}  // namespace dpu
