// batch.h: the packet buffer, its metadata, and the batch (one type, defined once).
//
// A Packet is metadata plus a 2 KiB buffer with 128 bytes of headroom
// so tunnel encapsulation can prepend headers without moving the frame; a big
// packet (jumbo frames, up to Packet::max_capacity() bytes) is the same header followed by
// a 10 KiB buffer, from a pool of its own, so the 64-byte path pays nothing
// for it. A Batch holds up to kBatchMax packet pointers; every stage takes a
// whole batch.
// Packets come from a PacketPool owned by one worker (or one API call); they are
// never shared between threads while in flight.
//
// Uses: nothing. Sets: nothing. This is the vocabulary of the fast path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "dpu/flow_key.h"
#include "dpu/mem.h"

namespace dpu {

constexpr uint32_t kBatchMax = 256;
// Frames a worker takes from one receive queue at a time by default (live
// `--burst`, the in-memory benchmark's `--burst`). 128 rather than OVS's 32:
// the conntrack stage pipelines its memory accesses over a longer run of
// jobs and per-batch costs are shared by more packets (A/B, 6 rounds:
// snat-new x1.13, snat-1m x1.04, snat-est-10k x1.02; l3-rewrite-1k and
// rules-10k x0.98, their larger working set out of L1). VPP's vectors are 256.
constexpr uint32_t kDefaultBurst = 128;
constexpr uint32_t kHeadroom = 128;
constexpr uint32_t kPacketBlock = 2048;   // small packets: frames up to 1,920 bytes
constexpr uint32_t kBigBlock = 10240;     // big packets: frames up to 10,112 bytes (9,216-byte jumbo frames and more)

// Offsets filled by the parser; kNoOffset when the layer is absent/truncated.
constexpr uint16_t kNoOffset = 0xffff;

// Per-packet metadata that every pass reads: with the offsets below it fills
// the packet's first cache line. The IPv6 tunnel addresses, needed only after
// decapsulating from an IPv6 underlay, live in the second line (Packet::tun6).
struct PacketMeta {
  uint64_t timestamp_ns = 0;  // capture time, carried to the output unchanged
  uint64_t tun_id = 0;        // network order
  uint32_t in_port = 0;       // current pass (a tunnel port after decap)
  uint32_t recirc_id = 0;
  uint32_t tun_src = 0, tun_dst = 0;
  uint32_t ct_mark = 0;
  uint16_t tun_flags = 0;     // kTunPresent | kTunIpv6
  uint16_t ct_zone = 0;
  uint16_t tenant = 0;        // index into tenant counters, 0 = none yet
  uint8_t ct_state = 0;       // kCs* bits
};

struct TunnelIpv6 {
  uint8_t src[16], dst[16];   // valid when md.tun_flags has kTunIpv6
};

// What the conntrack stage found beyond ct_state/zone/mark: the connection's
// label and original-direction tuple, which the next pass's key carries
// (ct_label, ct_nw_*, ct_ipv6_*, ct_tp_*). Valid when md.ct_state is set.
struct CtPacketMeta {
  uint8_t label[16];               // network order
  uint8_t src[16], dst[16];        // original direction; IPv4 in the first 4 bytes
  uint16_t tp_src = 0, tp_dst = 0; // original direction ports (ICMP: type, code), network order
  uint8_t proto = 0;               // 0: no tuple (untracked or invalid)
  uint8_t ipv6 = 0;
  uint16_t resume = 0;             // the worker's note to cache this packet's next pass (1 + index), 0: none
  void* after = nullptr;           // the lone ct(table=T) megaflow that sent it here (Worker, "hint"), or null
};
static_assert(sizeof(CtPacketMeta) <= 64, "conntrack results fit one line");

// Line 0: metadata and offsets (all a pass reads); line 1: IPv6 tunnel
// addresses; line 2: conntrack results; then the buffer, whose frame starts
// cache-line aligned after the headroom, so a 64-byte packet touches one line
// of data.
struct alignas(64) Packet {
  PacketMeta md;
  uint16_t data_off = kHeadroom;  // start of frame inside buf
  uint16_t len = 0;               // frame length
  uint16_t l3_ofs = kNoOffset;    // from frame start
  uint16_t l4_ofs = kNoOffset;
  uint16_t origin = 0;            // index (in its input batch) of the arrival it descends from
  uint8_t big = 0;                // a big packet (kBigBlock buffer); set by the pool, kept across reset
  uint8_t pad_ = 0;
  uint32_t emit_seq = 0;          // order in which the batch emitted it (output order across ports)
  alignas(64) TunnelIpv6 tun6;
  // The connection the last conntrack stage put the packet in, and its
  // direction there (valid while md.ct_state is set, written with every
  // result): a later ct of the same zone tries it before a table lookup
  // (Conntrack::execute_carried), as OVS keeps the connection in a packet's
  // metadata between recirculations.
  void* ct_conn = nullptr;
  uint8_t ct_conn_dir = 0;
  alignas(64) CtPacketMeta ct;
  alignas(64) uint8_t buf[kPacketBlock];

  uint8_t* data() { return buf + data_off; }
  const uint8_t* data() const { return buf + data_off; }
  // Frame bytes a small packet holds after the headroom; a big one; this one.
  static constexpr uint32_t capacity() { return kPacketBlock - kHeadroom; }
  static constexpr uint32_t max_capacity() { return kBigBlock - kHeadroom; }
  uint32_t buf_size() const { return big ? kBigBlock : kPacketBlock; }
  void reset() {
    zero_fixed<sizeof(PacketMeta)>(&md);
    data_off = kHeadroom;
    len = 0;
    l3_ofs = l4_ofs = kNoOffset;
    origin = 0;
  }
};

static_assert(sizeof(PacketMeta) + 16 <= 64, "metadata and offsets share one cache line");

// A big packet: the same header, the buffer going on past kPacketBlock.
struct alignas(64) BigPacket {
  Packet p;
  uint8_t more[kBigBlock - kPacketBlock];
};
static_assert(offsetof(BigPacket, more) == offsetof(Packet, buf) + kPacketBlock, "the big buffer is contiguous");

static_assert(offsetof(Packet, buf) % 64 == 0, "frame data must stay cache-line aligned");
static_assert(offsetof(Packet, tun6) == 64, "hot header fits the first line");

struct Batch {
  uint32_t count = 0;
  Packet* pkts[kBatchMax];
  bool full() const { return count == kBatchMax; }
  void push(Packet* p) { pkts[count++] = p; }
  void clear() { count = 0; }
};

// Fixed arenas of small and big packets with LIFO free lists (warm buffers
// are reused first). Not thread-safe: one pool per worker.
class PacketPool {
 public:
  explicit PacketPool(uint32_t n, uint32_t n_big = 0) : arena_(n), big_(n_big ? n_big : std::max<uint32_t>(n / 16, 16)), n_(n) {
    free_.reserve(n);
    for (uint32_t i = n; i-- > 0;) free_.push_back(&arena_[i]);
    free_big_.reserve(big_size());
    for (uint32_t i = big_size(); i-- > 0;) {
      big_[i].p.big = 1;
      free_big_.push_back(&big_[i].p);
    }
  }
  Packet* get() { return take(free_); }
  Packet* get_big() { return take(free_big_); }
  // A packet that can hold `len` frame bytes, or nullptr.
  Packet* get_for(uint32_t len) { return len <= Packet::capacity() ? get() : get_big(); }
  void put(Packet* p) { (p->big ? free_big_ : free_).push_back(p); }
  uint32_t size() const { return n_; }
  uint32_t big_size() const { return static_cast<uint32_t>(big_.size()); }
  // Copy of p (metadata and frame) or nullptr when the pool is empty.
  Packet* clone(const Packet* p) {
    Packet* c = p->big ? get_big() : get();
    if (!c) return nullptr;
    c->md = p->md;
    if (p->md.tun_flags & kTunIpv6) c->tun6 = p->tun6;
    if (p->md.ct_state) {
      c->ct = p->ct;
      c->ct_conn = p->ct_conn;
      c->ct_conn_dir = p->ct_conn_dir;
    }
    c->data_off = p->data_off;
    c->len = p->len;
    c->l3_ofs = p->l3_ofs;
    c->l4_ofs = p->l4_ofs;
    c->origin = p->origin;
    std::memcpy(c->data(), p->data(), p->len);
    return c;
  }

 private:
  HugeArray<Packet> arena_;
  HugeArray<BigPacket> big_;
  uint32_t n_;
  std::vector<Packet*> free_, free_big_;

  // always_inline here and on the parse and execute helpers: the link-time
  // optimiser (setup.py) otherwise leaves them out of line on the fast path.
  __attribute__((always_inline)) static Packet* take(std::vector<Packet*>& list) {
    if (list.empty()) return nullptr;
    Packet* p = list.back();
    list.pop_back();
    p->reset();
    return p;
  }
};

}  // namespace dpu
