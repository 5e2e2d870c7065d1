// pcap_rx.h: capture files as a receive queue (replay). The files, one per
// input port, are merged by timestamp (ties keep input order) and streamed;
// each burst holds one port's frames (see mem_rx.h). A file that turns out
// corrupt stops the queue: what was read before is processed, status() says
// what went wrong.
// Thread-safety: one worker thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dpu/mem.h"
#include "dpu/pcap.h"
#include "port_io.h"

namespace dpu {

class PcapRx : public RxQueue {
 public:
  Status add(uint32_t port, const std::string& path) {
    Input in;
    in.port = port;
    in.reader = std::make_unique<PcapReader>();
    Status st = in.reader->open(path);
    if (!st.ok()) return st;
    inputs_.push_back(std::move(in));
    return Status::Ok();
  }
  // Reads each file's first record (after every add()).
  void start() {
    for (Input& in : inputs_)
      if (error_.ok()) advance(in);
  }

  uint32_t rx_burst(PacketPool& pool, Packet** pkts, uint32_t max, uint32_t cap) override {
    uint32_t got = 0;
    while (got < max && got < cap && error_.ok()) {
      Input* best = nullptr;
      for (Input& in : inputs_)
        if (in.has_head && (!best || in.head.ts_ns < best->head.ts_ns)) best = &in;
      if (!best) break;
      if (got && best->port != pkts[0]->md.in_port) break;  // one input port per burst
      const PcapRecord& r = best->head;
      if (r.caplen > Packet::max_capacity()) {
        rejects.push_back({best->port, r.caplen});
      } else {
        Packet* p = pool.get_for(r.caplen);
        if (!p) break;  // every buffer of the size is in this burst: the rest waits
        copy_frame(p->data(), r.data, r.caplen);
        p->len = static_cast<uint16_t>(r.caplen);
        p->md.in_port = best->port;
        p->md.timestamp_ns = r.ts_ns;
        pkts[got++] = p;
      }
      records_++;
      advance(*best);
    }
    return got;
  }

  bool more() const {
    if (!error_.ok()) return false;
    for (const Input& in : inputs_)
      if (in.has_head) return true;
    return false;
  }
  const Status& status() const { return error_; }
  uint64_t records() const { return records_; }  // taken so far (rejected ones included)
  uint64_t bytes_done() const {
    uint64_t s = 0;
    for (const Input& in : inputs_) s += in.reader->offset();
    return s;
  }
  uint64_t bytes_total() const {
    uint64_t s = 0;
    for (const Input& in : inputs_) s += in.reader->size();
    return s;
  }

 private:
  struct Input {
    uint32_t port = 0;
    std::unique_ptr<PcapReader> reader;
    PcapRecord head;
    bool has_head = false;
  };
  void advance(Input& in) {
    in.has_head = in.reader->next(&in.head);
    if (!in.has_head && !in.reader->status().ok()) error_ = in.reader->status();
  }

  std::vector<Input> inputs_;
  Status error_;
  uint64_t records_ = 0;
};

}  // namespace dpu
