// mem_rx.h: frames from memory as a receive queue: the API's process() (a
// list of frames, each with its port and time) and the benchmark (template
// frames cycled for ever, copied into buffers as a NIC's DMA would).
//
// With one_port_per_burst (process), a burst stops where the input port
// changes, as a NIC queue's burst holds one port's frames: a packet then sees
// every connection the packets before it committed. The benchmark keeps
// mixing ports in a burst, as its figures always have.
// Thread-safety: one worker thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dpu/mem.h"
#include "port_io.h"

namespace dpu {

class MemRx : public RxQueue {
 public:
  MemRx(const uint8_t* data, const uint64_t* offsets, const uint32_t* lens, const uint32_t* ports,
        const uint64_t* ts, size_t n, bool cycle, bool one_port_per_burst)
      : data_(data), offsets_(offsets), lens_(lens), ports_(ports), ts_(ts), n_(n), cycle_(cycle),
        one_port_(one_port_per_burst) {
    for (size_t i = 1; i < n && !scattered_; i++) scattered_ = offsets[i] != offsets[i - 1] + lens[i - 1];
  }

  uint32_t rx_burst(PacketPool& pool, Packet** pkts, uint32_t max, uint32_t cap) override {
    uint32_t got = 0;
    while (got < max && got < cap && more()) {
      // Frames not back to back (a caller's shuffled offsets into one
      // buffer) are fetched a few ahead: a NIC's ring has them in order,
      // and the hardware prefetcher does that.
      if (scattered_) {
        size_t ahead = next_ + kAhead;
        if (ahead >= n_) ahead = cycle_ && n_ > kAhead ? ahead - n_ : n_ - 1;
        dpu::prefetch(data_ + offsets_[ahead]);
      }
      const uint32_t len = lens_[next_];
      if (one_port_ && got && ports_[next_] != pkts[0]->md.in_port) break;
      if (len > Packet::max_capacity()) {
        rejects.push_back({ports_[next_], len});
      } else {
        Packet* p = pool.get_for(len);
        if (!p) break;  // every buffer of the size is in this burst: the rest waits
        copy_frame(p->data(), data_ + offsets_[next_], len);
        p->len = static_cast<uint16_t>(len);
        p->md.in_port = ports_[next_];
        p->md.timestamp_ns = ts_ ? ts_[next_] : 0;
        index_[got] = static_cast<uint32_t>(next_);
        pkts[got++] = p;
      }
      if (++next_ == n_ && cycle_) next_ = 0;
    }
    return got;
  }
  bool more() const { return n_ && next_ < n_; }
  // Input index of each packet of the last burst, by its position in it.
  const uint32_t* burst_index() const { return index_; }

 private:
  static constexpr size_t kAhead = 8;
  const uint8_t* data_;
  const uint64_t* offsets_;
  const uint32_t* lens_;
  const uint32_t* ports_;
  const uint64_t* ts_;
  size_t n_, next_ = 0;
  bool cycle_, one_port_;
  bool scattered_ = false;  // frames not back to back in input order
  uint32_t index_[kBatchMax];
};

}  // namespace dpu
