// transmit.cc: stage "transmit" (see transmit.h).
#include "transmit.h"

#include "merge_runs.h"

namespace dpu {

void TransmitStage::flush(StageEnv& env, bool sort) {
  for (uint32_t port : tx_ports_) {
    std::vector<Packet*>& q = tx_[port];
    // Arrival order, then emission order (each arrival's copies in order).
    if (sort)
      merge_runs(q, scratch_, runs_, [](const Packet* a, const Packet* b) {
        return a->origin != b->origin ? a->origin < b->origin : a->emit_seq < b->emit_seq;
      });
    const uint32_t n = static_cast<uint32_t>(q.size());
    const uint32_t sent = sink_ ? sink_->send(port, q.data(), n) : n;
    counters_.tx_batches++;
    counters_.tx_packets += sent;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < n; i++) {
      if (i < sent) bytes += q[i]->len;
      env.pool.put(q[i]);
    }
    PortCounters& pc = env.ports[port];
    pc.tx_packets += sent;
    pc.tx_bytes += bytes;
    pc.tx_dropped += n - sent;
    q.clear();
  }
  tx_ports_.clear();
}

}  // namespace dpu
