// conn.h: a tracked connection and the key it is found by.
//
// A connection has two keys, as in Open vSwitch's userspace conntrack: the
// original direction (the tuple of the packet that committed it) and the
// reply direction (what a reply looks like, after NAT). Both are linked into
// the table (conntrack.h), so a packet of either direction finds it with one
// lookup, and the direction it was found by says whether it is a reply.
//
// Lifetime: the keys, zone, protocol and NAT of a connection never change
// once it is published; the mutable state (expiry, mark, label, protocol
// state) is written under the connection's spinlock (TCP) or with single
// atomic stores (UDP, ICMP). Its life count says whether it is in the
// table and, to a worker that cached it, whether it is still the same
// connection with the same mark and label. A connection unlinked from the
// table stays readable until the epoch says no worker can still hold it
// (epoch.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE4_1__)
#include <immintrin.h>
#endif

#include "dpu/flow_key.h"

namespace dpu {

// A 5-tuple in a zone. Addresses are network-order words (IPv4 in src[0] and
// dst[0], the rest zero); ports network order. ICMP/ICMPv6 echo: sport is the
// identifier and dport holds the type and code bytes ([type][code]).
struct CtKey {
  uint32_t src[4];
  uint32_t dst[4];
  uint16_t sport, dport;
  uint16_t zone;  // host order
  uint8_t proto;
  uint8_t v6;     // 1 for IPv6
};
static_assert(sizeof(CtKey) == 40, "a key is five words");

// Keys are read and written as three parts: the two addresses (16 bytes
// each) and the last eight bytes. A packet's key is compared moments after
// ct_extract() wrote it, so each load must find one store that holds all its
// bytes: a load spanning narrower stores (the fields one by one) waits for
// them to reach the cache, which cost snat-est-1k a twelfth of its time.
#if defined(__SSE4_1__)
inline bool ct_key_eq(const CtKey& a, const CtKey& b) {
  const __m128i s = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.src)),
                                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.src)));
  const __m128i d = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.dst)),
                                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.dst)));
  uint64_t x, y;
  std::memcpy(&x, &a.sport, 8);
  std::memcpy(&y, &b.sport, 8);
  const __m128i o = _mm_or_si128(s, d);
  return _mm_testz_si128(o, o) && x == y;
}
// An IPv4 key, written as the three parts (`ports`: the L4 header's first
// four bytes, network order).
inline void ct_key_set_v4(CtKey* k, uint32_t src, uint32_t dst, uint32_t ports, uint16_t zone, uint8_t proto) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(k->src), _mm_cvtsi32_si128(static_cast<int>(src)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(k->dst), _mm_cvtsi32_si128(static_cast<int>(dst)));
  const uint64_t tail = ports | uint64_t{zone} << 32 | uint64_t{proto} << 48;  // v6 = 0
  std::memcpy(&k->sport, &tail, 8);
}
#else
inline bool ct_key_eq(const CtKey& a, const CtKey& b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}
inline void ct_key_set_v4(CtKey* k, uint32_t src, uint32_t dst, uint32_t ports, uint16_t zone, uint8_t proto) {
  std::memset(k, 0, sizeof *k);
  k->src[0] = src;
  k->dst[0] = dst;
  std::memcpy(&k->sport, &ports, 4);
  k->zone = zone;
  k->proto = proto;
}
#endif
static_assert(offsetof(CtKey, dst) == 16 && offsetof(CtKey, sport) == 32 && offsetof(CtKey, zone) == 36 &&
                  offsetof(CtKey, proto) == 38 && offsetof(CtKey, v6) == 39,
              "the three parts, and the last one's layout");

// What of a connection's key[1 - d] NAT may make differ from its key[d]
// reversed: the first words of the addresses, and the ports. Zone, protocol
// and family are the same in both keys, an IPv4 address is its first word,
// and IPv6 is never translated (its key[1 - d] holds key[d]'s addresses
// swapped). So with key[d], these twelve bytes name the connection's keys,
// translation included.
struct CtXlat {
  uint32_t src, dst;
  uint16_t sport, dport;
};
inline CtXlat ct_xlat(const CtKey& k) { return CtXlat{k.src[0], k.dst[0], k.sport, k.dport}; }
inline bool ct_xlat_eq(const CtKey& k, const CtXlat& x) {
  return ((k.src[0] ^ x.src) | (k.dst[0] ^ x.dst) | static_cast<uint32_t>((k.sport ^ x.sport) | (k.dport ^ x.dport))) == 0;
}

inline uint32_t ct_key_hash(const CtKey& k) {
  uint64_t w[5];
  std::memcpy(w, &k, 40);
#if defined(__SSE4_2__)
  uint64_t a = __builtin_ia32_crc32di(0x9e3779b9u, w[0]);
  uint64_t b = __builtin_ia32_crc32di(0x85ebca6bu, w[1]);
  a = __builtin_ia32_crc32di(a, w[2]);
  b = __builtin_ia32_crc32di(b, w[3]);
  a = __builtin_ia32_crc32di(a, w[4]);
  return static_cast<uint32_t>(mix128(a ^ (b << 32), b ^ 0x9e3779b97f4a7c15ull));
#else
  uint64_t h = mix128(w[0] ^ 0x9e3779b97f4a7c15ull, w[1] ^ 0xc2b2ae3d27d4eb4full);
  h ^= mix128(w[2] ^ h, w[3] ^ 0x165667b19e3779f9ull);
  h ^= mix128(w[4] ^ h, 0xa0761d6478bd642full);
  return static_cast<uint32_t>(h ^ (h >> 32));
#endif
}

// The ICMP type that answers `type` (echo request <-> reply), or -1.
inline int icmp_reply_type(uint8_t type, bool v6) {
  if (v6) return type == 128 ? 129 : type == 129 ? 128 : -1;
  switch (type) {
    case 8: return 0;
    case 0: return 8;
    case 13: return 14;
    case 14: return 13;
    default: return -1;
  }
}

// What a reply to `k` looks like (no NAT).
inline CtKey ct_key_reverse(const CtKey& k) {
  CtKey r = k;
  std::memcpy(r.src, k.dst, 16);
  std::memcpy(r.dst, k.src, 16);
  if (k.proto == kIpIcmp || k.proto == kIpIcmpv6) {
    uint8_t tc[2];
    std::memcpy(tc, &k.dport, 2);
    int t = icmp_reply_type(tc[0], k.v6 != 0);
    tc[0] = static_cast<uint8_t>(t < 0 ? tc[0] : t);
    std::memcpy(&r.dport, tc, 2);
  } else {
    r.sport = k.dport;
    r.dport = k.sport;
  }
  return r;
}

// Node of a connection in one hash chain (one per direction).
struct CtNode {
  std::atomic<CtNode*> next{nullptr};
  uint32_t hash = 0;
  uint8_t dir = 0;  // 0 original, 1 reply
};

// TCP window tracking (conntrack_tcp.cc), [0] the original direction's
// sender, [1] the reply direction's.
struct TcpTrack {
  uint32_t seqlo[2];    // highest sequence number sent + 1
  uint32_t seqhi[2];    // highest the peer's window lets this side send
  uint32_t max_win[2];  // largest (unscaled) window advertised
  uint8_t wscale[2];    // window scale shift | kWscaleSet
  uint8_t state[2];     // TcpState of each side
};
static_assert(sizeof(TcpTrack) == 28, "layout");

enum : uint8_t { kNatSrc = 1, kNatDst = 2 };

struct NatMapping;

// Three cache lines. The first holds everything a packet of an established
// connection reads or writes (expiry, mark, liveness, flags, TCP state): a
// packet the worker's resume cache vouches for (execute_known(), IPv4 TCP or
// UDP) reads nothing else. The keys fill the rest of the first line and the
// second, so a packet looked up in the table reads two lines. The third holds
// what only insertion, removal, expiry and labelled connections touch.
// Expiry reads the first and the third (the zone is copied there), so the
// sweep fetches those two.
struct alignas(64) Conn {
  // ---- line 0: per-packet state -------------------------------------------------
  std::atomic<int64_t> expires{0};   // ns on the conntrack clock
  std::atomic<uint32_t> mark{0};
  // Odd while the connection is not in the table (not yet inserted, or
  // unlinked), even while it is. insert() and unlinking add 1, a change of
  // the mark or the label adds 2, and the count goes on when the memory is
  // reused (alloc()): a worker that saw a value and finds it again knows it
  // is the same live connection, with the same mark and label.
  std::atomic<uint32_t> life{1};
  uint8_t nat = 0;                   // kNatSrc / kNatDst
  std::atomic<uint8_t> lock{0};      // spinlock for TCP state, label and mark writes
  uint8_t tmo = 0;                   // timeout class in use (CtTimeoutClass)
  std::atomic<uint8_t> labelled{0};  // a label was ever set (else label_hi/lo are zero, unread)
  TcpTrack tcp{};                    // TCP; UDP and ICMP keep their state in tcp.state[0] (other_state())
  // ---- lines 0-1: keys, immutable once published -----------------------------------
  CtKey key[2];                      // [0] original, [1] reply (after NAT)
  // ---- line 2: hash chains, label, NAT mapping, expiry's own fields -----------------
  CtNode node[2];
  std::atomic<uint64_t> label_hi{0}, label_lo{0};  // the 128-bit ct_label
  NatMapping* mapping = nullptr;     // SNAT mapping this connection holds a reference on
  uint16_t zone = 0;                 // key[0].zone, for expiry
  uint8_t owner = 0;                 // worker slot whose expiry wheel holds it

  bool dead(std::memory_order mo = std::memory_order_acquire) const { return life.load(mo) & 1u; }
  // UDP and ICMP: 0 until a reply was seen, then 1 (single atomic stores).
  uint8_t other_state() const { return __atomic_load_n(&tcp.state[0], __ATOMIC_RELAXED); }
  void set_other_state(uint8_t v) { __atomic_store_n(&tcp.state[0], v, __ATOMIC_RELAXED); }
  void spin_lock() {
    while (lock.exchange(1, std::memory_order_acquire)) __builtin_ia32_pause();
  }
  void spin_unlock() { lock.store(0, std::memory_order_release); }
  // The connection a chain node belongs to.
  static Conn* of(const CtNode* n);
};
static_assert(sizeof(Conn) == 192, "a connection is three cache lines");
static_assert(offsetof(Conn, key) == 48 && offsetof(Conn, node) == 128,
              "a known packet's fields in the first line, the keys up to the end of the second");
static_assert(offsetof(Conn, life) < 64 && offsetof(Conn, tcp) + sizeof(TcpTrack) <= offsetof(Conn, key),
              "what execute_known reads of an IPv4 TCP or UDP connection is in the first line");
static_assert(offsetof(Conn, mapping) >= 128 && offsetof(Conn, zone) >= 128 && offsetof(Conn, owner) >= 128,
              "expiry reads lines 0 and 2 only");

inline Conn* Conn::of(const CtNode* n) {
  return reinterpret_cast<Conn*>(reinterpret_cast<char*>(const_cast<CtNode*>(n - n->dir)) - offsetof(Conn, node));
}

}  // namespace dpu
