// nat.h: NAT address and port selection (RFC 4787, RFC 5382, RFC 5508).
//
// Source NAT is endpoint-independent (RFC 4787 REQ-1): an internal endpoint
// (zone, protocol, address, port) keeps one public endpoint, its mapping,
// whatever it talks to, for as long as any connection uses it. New mappings
// keep the source port when it is free (ICMP echo: the identifier), and an
// internal address always leaves from the same public address of a pool
// ("paired" pooling, REQ-2): the address is a hash of the internal one.
//
// Every public address has a bitmap of its ports per protocol with a summary
// of the words that still have a free bit, so finding a free port is a scan
// of at most 17 words, never a walk of 64,000 candidates on the packet path;
// when the address has no free port left the new connection is refused
// (drop reason nat_no_port) and existing ones are untouched.
//
// Static mappings (port forwards) reserve their public port and serve as the
// internal endpoint's mapping for source NAT from the same address.
//
// Destination NAT (floating addresses, forwards) needs no allocation: the
// target is chosen from the rule's range by a hash of the client.
//
// Thread-safety: one mutex; taken only when a connection is created or ends
// (never for packets of established connections).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "dpu/mem.h"
#include "dpu/rule.h"
#include "flat_map.h"
#include "dpu/status.h"

namespace dpu {

struct NatMapping {
  uint16_t zone = 0;
  uint8_t proto = 0;
  uint32_t int_addr = 0;  // network order
  uint16_t int_port = 0;  // network order
  uint32_t ext_addr = 0;  // network order
  uint16_t ext_port = 0;  // network order
  uint64_t pool = 0;      // the range it was taken from
  uint32_t refs = 0;      // connections holding it
  bool is_static = false;
  bool reachable = false; // indexed by its public endpoint (endpoint-independent filtering)
  void* port_bits = nullptr;  // the bitmap its public port is taken in (nat.cc), while it holds one
};

struct StaticMapping {
  uint16_t zone;
  uint8_t proto;
  uint32_t int_addr, ext_addr;  // network order
  uint16_t int_port, ext_port;  // network order
};

class NatTable {
 public:
  NatTable();
  ~NatTable();

  // The public endpoint for a new source-NATed connection from an internal
  // endpoint, taking a reference on its mapping (created if needed), or
  // nullptr when the chosen public address has no free port. With dry_run
  // nothing is taken: *ext_* say what would be picked (trace).
  // `reachable`: the zone filters endpoint-independently, so the mapping
  // must be found by its public endpoint (find_ext) too.
  NatMapping* acquire(uint16_t zone, uint8_t proto, uint32_t int_addr, uint16_t int_port, const NatRange& r,
                      bool reachable, bool dry_run, uint32_t* ext_addr, uint16_t* ext_port);
  void release(NatMapping* m);
  void release(NatMapping* const* ms, size_t n);  // each, under one lock
  // Prefetches, any thread, no lock: the line where acquire() will look for
  // an internal endpoint's mapping; the mapping's own line; and (its line
  // having been fetched) where release() will find it in the map. Their
  // fields are read atomically: a mapping freed meanwhile prefetches a
  // harmless wrong line.
  void prefetch_acquire(uint16_t zone, uint8_t proto, uint32_t int_addr, uint16_t int_port, const NatRange& r) const;
  // What acquire() would pick for a new mapping of the internal endpoint
  // (public address and port, network order), read without the lock: false
  // when it cannot tell (random ports, no bitmap for the address yet). A
  // guess that a concurrent change can make wrong: for prefetching only.
  bool predict(uint16_t zone, uint8_t proto, uint32_t int_addr, uint16_t int_port, const NatRange& r,
               uint32_t* ext_addr, uint16_t* ext_port) const;
  static void prefetch_mapping(const NatMapping* m) { dpu::prefetch(m); }
  void prefetch_release(const NatMapping* m) const;
  // The zone's mapping of a public endpoint (endpoint-independent filtering),
  // with a reference taken for the connection it lets in (release() it), or
  // nullptr. *out gets a copy of it; with dry_run no reference is taken.
  NatMapping* find_ext(uint16_t zone, uint8_t proto, uint32_t ext_addr, uint16_t ext_port, bool dry_run,
                       NatMapping* out);
  // A zone starts filtering endpoint-independently: its existing mappings
  // become reachable by their public endpoints too.
  void make_reachable(uint16_t zone);
  // Replaces the set of static mappings.
  void set_static(const std::vector<StaticMapping>& maps);
  size_t mappings();  // live mappings, dynamic and static

  // Destination NAT target for a client address and port (no allocation):
  // an address of the range by a hash of the client, and the original port
  // unless the range has ports that exclude it.
  static void pick_dst(const NatRange& r, uint32_t client, uint16_t client_port, uint16_t orig_port, uint32_t* addr,
                       uint16_t* port);

 private:
  struct PortBits;
  struct IntKey {
    uint64_t a = 0, b = 0;
    bool operator==(const IntKey& o) const { return a == o.a && b == o.b; }
  };
  struct IntKeyHash {
    uint64_t operator()(const IntKey& k) const;
  };
  struct U64Hash {
    uint64_t operator()(uint64_t k) const;
  };
  static IntKey int_key(uint16_t zone, uint8_t proto, uint32_t addr, uint16_t port, uint64_t pool);
  static uint64_t ext_key(uint8_t proto, uint32_t addr, uint16_t port);
  PortBits& bits(uint8_t proto, uint32_t addr);  // addr network order
  bool take_port(uint8_t proto, uint32_t addr, uint16_t lo, uint16_t hi, uint16_t preferred, uint32_t start,
                 bool dry_run, uint16_t* out);
  NatMapping* new_mapping();
  static void set_keys(NatMapping* m, uint16_t zone, uint8_t proto, uint32_t int_addr, uint16_t int_port,
                       uint16_t ext_port, uint64_t pool, void* port_bits);
  void free_mapping(NatMapping* m);

  // Where acquire() will read a public address's bitmap, for
  // prefetch_acquire() without the lock: a direct-mapped cache of
  // (protocol, address) -> bitmap, written under mu_. Key and pointer are
  // separate words; a torn pair still names a bitmap (they live as long as
  // the table), so at worst a wrong line is prefetched.
  static constexpr size_t kBitsHints = 1024;
  struct BitsHint {
    std::atomic<uint64_t> key{~0ull};
    std::atomic<PortBits*> bits{nullptr};
  };
  std::unique_ptr<BitsHint[]> hints_{new BitsHint[kBitsHints]};
  static size_t hint_slot(uint64_t k) { return static_cast<size_t>((k * 0x9e3779b97f4a7c15ull) >> 54); }
  // What acquire() picks for a new mapping, shared with prefetch_acquire():
  // the public address, the port range and where a port search starts.
  static uint32_t paired_addr(uint16_t zone, uint32_t int_addr, const NatRange& r);
  static void port_range(uint8_t proto, const NatRange& r, uint16_t* lo, uint16_t* hi);
  static uint32_t hashed_start(uint16_t zone, uint8_t proto, uint32_t int_addr, uint16_t want);
  static uint32_t search_from(uint16_t lo, uint16_t hi, uint32_t start);
  std::mutex mu_;
  FlatMap<IntKey, NatMapping*, IntKeyHash> by_int_;
  FlatMap<uint64_t, NatMapping*, U64Hash> by_ext_;
  FlatMap<uint64_t, PortBits*, U64Hash> ports_;      // (proto, address) -> bitmap
  std::vector<std::unique_ptr<PortBits>> port_bits_;
  std::vector<std::unique_ptr<NatMapping[]>> chunks_;
  std::vector<NatMapping*> free_;
  std::vector<NatMapping*> static_;
  size_t n_mappings_ = 0;
  uint64_t rng_ = 0x2545f4914f6cdd1dull;
};

}  // namespace dpu
