// flow_key.h: the flow key, its masks, and the hashes computed over it.
//
// A Flow has two parts, as in Open vSwitch:
//
//  * the datapath key (the first kKeyWords 64-bit words): packet headers plus
//    datapath metadata (in_port, recirc_id, tunnel, ct_*). This is what the
//    exact-match cache and the megaflow cache hash and compare. Parsing a
//    packet (parse.h) fills it; nothing else in the fast path writes it.
//  * pipeline state (metadata, reg0..reg7): OpenFlow-level scratch values that
//    exist only while the slow path walks the tables. They are never part of a
//    megaflow: a megaflow's actions are the outcome of the walk, and every
//    packet field that influenced a register is un-wildcarded at the point it
//    was read (match, move, hash).
//
// Every header field is stored in network byte order, exactly as on the wire,
// so masking is plain byte/word AND and set actions are plain copies. The
// datapath metadata fields (in_port, recirc_id, ct_zone, ct_mark, ct_state)
// and the pipeline state are host order. The conntrack original-direction
// fields (ct_nw_*, ct_ipv6_*, ct_tp_*) are network order, as on the wire, and
// ct_label is a big-endian 128-bit number.
//
// Layout is fixed (static_asserts below); fields.cc describes every field by
// offset and width, so adding a field means adding it here and there.
// Thread-safety: plain values; no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace dpu {

// nw_frag bits (as OVS FLOW_NW_FRAG_*).
enum : uint8_t { kFragAny = 1, kFragLater = 2 };

// ct_state bits (as OVS CS_*), set by the conntrack stage (conntrack/).
enum : uint32_t {
  kCsNew = 1 << 0, kCsEstablished = 1 << 1, kCsRelated = 1 << 2, kCsReplyDir = 1 << 3,
  kCsInvalid = 1 << 4, kCsTracked = 1 << 5, kCsSrcNat = 1 << 6, kCsDstNat = 1 << 7,
};

// tun_flags bits.
enum : uint16_t { kTunPresent = 1, kTunIpv6 = 2 };

// vlan_tci uses the OVS convention: bit 0x1000 (CFI/DEI position) means "a tag
// is present"; the real DEI bit is not represented. 0 means untagged.
constexpr uint16_t kVlanPresent = 0x1000;

struct alignas(8) Flow {
  // ---- datapath key -------------------------------------------------------
  // w0
  uint32_t in_port;      // ofport the packet arrived on (host order)
  uint32_t recirc_id;    // 0 on first pass
  // w1
  uint64_t tun_id;       // VNI/key, network order (tun_id as OVS: 64-bit)
  // w2
  uint32_t tun_src;      // IPv4 outer source (network order)
  uint32_t tun_dst;      // IPv4 outer destination
  // w3..w6
  uint8_t tun_ipv6_src[16];
  uint8_t tun_ipv6_dst[16];
  // w7
  uint8_t ct_state;      // kCs* bits
  uint8_t ct_nw_proto;   // conntrack original direction: IP protocol
  uint16_t key_pad0;
  uint16_t ct_zone;
  uint16_t tun_flags;    // kTunPresent | kTunIpv6
  // w8
  uint32_t ct_mark;
  uint16_t ct_tp_src;    // original direction ports (ICMP: type, code), network order
  uint16_t ct_tp_dst;
  // w9..w10
  uint8_t dl_dst[6];
  uint8_t dl_src[6];
  uint16_t dl_type;      // network order; inner type after one VLAN tag
  uint16_t vlan_tci;     // network order; kVlanPresent set when tagged
  // w11: IPv4 addresses, or ARP spa/tpa
  uint32_t nw_src;
  uint32_t nw_dst;
  // w12..w15
  uint8_t ipv6_src[16];
  uint8_t ipv6_dst[16];
  // w16
  uint16_t tp_src;       // network order; ICMP type in the low byte
  uint16_t tp_dst;       // network order; ICMP code in the low byte
  uint8_t nw_proto;      // IP protocol, or ARP opcode (low byte)
  uint8_t nw_tos;        // whole TOS / traffic class byte (DSCP << 2 | ECN)
  uint8_t nw_ttl;        // TTL / hop limit
  uint8_t nw_frag;       // kFrag*
  // w17..w18
  uint8_t arp_sha[6];
  uint8_t arp_tha[6];
  uint16_t tcp_flags;    // network order, 12 bits
  uint16_t vlan_tpid;    // network order TPID of the tag (not matchable)
  // w19..w25: conntrack, filled only for tracked packets (ct_state has trk)
  uint8_t ct_label[16];  // network order (the 128-bit label, most significant byte first)
  uint8_t ct_ipv6_src[16];  // original direction addresses (IPv6 connections)
  uint8_t ct_ipv6_dst[16];
  uint32_t ct_nw_src;    // original direction addresses (IPv4 connections), network order
  uint32_t ct_nw_dst;
  // ---- pipeline state (slow path only) -------------------------------------
  uint64_t metadata;
  uint32_t regs[8];
};

constexpr size_t kKeyWords = 26;
constexpr size_t kKeyBytes = kKeyWords * 8;
// Words 19..25 (ct_label and the conntrack original-direction tuple) are
// zero unless the packet has been through conntrack (ct_state != 0), so the
// caches hash and compare them only then: a packet that never meets a ct
// action pays for the 19 words it has.
constexpr size_t kKeyHotWords = 19;
constexpr size_t kCtStateWord = 7;  // ct_state is the low byte of this word
constexpr size_t kFlowWords = sizeof(Flow) / 8;

static_assert(offsetof(Flow, tun_id) == 8, "layout");
static_assert(offsetof(Flow, dl_dst) == 72, "layout");
static_assert(offsetof(Flow, nw_src) == 88, "layout");
static_assert(offsetof(Flow, tp_src) == 128, "layout");
static_assert(offsetof(Flow, arp_sha) == 136, "layout");
static_assert(offsetof(Flow, ct_label) == 152, "layout");
static_assert(offsetof(Flow, ct_nw_src) == 200, "layout");
static_assert(offsetof(Flow, ct_state) == kCtStateWord * 8, "layout");
static_assert(offsetof(Flow, ct_label) == kKeyHotWords * 8, "layout");
static_assert(offsetof(Flow, metadata) == kKeyBytes, "datapath key must end before pipeline state");
static_assert(sizeof(Flow) == kKeyBytes + 40, "layout");

// A Flow seen as 64-bit words (masking, hashing, comparing). The may_alias
// type tells the compiler these loads and stores may touch the Flow's
// narrower members: without it, -O3 legitimately drops a 16-bit store that is
// only read back as a word (strict aliasing).
using word_t = uint64_t __attribute__((__may_alias__));
inline const word_t* words(const Flow& f) { return reinterpret_cast<const word_t*>(&f); }
inline word_t* words(Flow& f) { return reinterpret_cast<word_t*>(&f); }

// Common ethertypes / protocols, network order where noted.
constexpr uint16_t kEthIp = 0x0800, kEthArp = 0x0806, kEthIpv6 = 0x86dd, kEthVlan = 0x8100,
                   kEthQinQ = 0x88a8;
constexpr uint8_t kIpTcp = 6, kIpUdp = 17, kIpIcmp = 1, kIpIcmpv6 = 58, kIpSctp = 132;

inline uint16_t be16(uint16_t v) { return __builtin_bswap16(v); }
inline uint32_t be32(uint32_t v) { return __builtin_bswap32(v); }
inline uint64_t be64(uint64_t v) { return __builtin_bswap64(v); }

// xorshift64 (Marsaglia): the worker's sampling (EMC inserts, bypass probes)
// and the self-tests' random keys. The state must not be zero.
struct XorShift {
  uint64_t x;
  uint64_t operator()() {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  }
};

// ---- hashing ------------------------------------------------------------------
// The cache hash covers every datapath key word. With SSE4.2 it is CRC32C in
// three independent chains (one instruction a word); otherwise pairs of words
// are mixed with 64x64->128 multiplies. Either way the result only has to
// spread well: the caches compare whole keys.
inline uint64_t mix128(uint64_t a, uint64_t b) {
  unsigned __int128 r = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(r) ^ static_cast<uint64_t>(r >> 64);
}

inline uint32_t hash_key_words_plain(const word_t* w, uint64_t seed) {
  uint64_t h = seed;
  size_t n = (w[7] & 0xff) ? kKeyWords : kKeyHotWords;  // ct words only for tracked packets
  size_t i = 0;
  for (; i + 1 < n; i += 2) h ^= mix128(w[i] ^ 0x9e3779b97f4a7c15ull, w[i + 1] ^ (0xc2b2ae3d27d4eb4full + i));
  if (i < n) h ^= mix128(w[i] ^ 0xa0761d6478bd642full, seed ^ 0xe7037ed1a0b428dbull);
  return static_cast<uint32_t>(h ^ (h >> 32));
}

inline bool key_tracked(const word_t* w) { return (w[kCtStateWord] & 0xff) != 0; }

inline uint32_t hash_key_words(const word_t* w, uint64_t seed) {
#if defined(__SSE4_2__)
  uint64_t a = seed, b = seed ^ 0x9e3779b97f4a7c15ull, c = seed ^ 0xc2b2ae3d27d4eb4full;
  for (size_t i = 0; i + 3 <= kKeyHotWords; i += 3) {
    a = __builtin_ia32_crc32di(a, w[i]);
    b = __builtin_ia32_crc32di(b, w[i + 1]);
    c = __builtin_ia32_crc32di(c, w[i + 2]);
  }
  static_assert(kKeyHotWords % 3 == 1 && (kKeyWords - kKeyHotWords) == 7, "tail words");
  a = __builtin_ia32_crc32di(a, w[kKeyHotWords - 1]);
  if (__builtin_expect(key_tracked(w), 0)) {
    for (size_t i = kKeyHotWords; i + 3 <= kKeyWords; i += 3) {
      a = __builtin_ia32_crc32di(a, w[i]);
      b = __builtin_ia32_crc32di(b, w[i + 1]);
      c = __builtin_ia32_crc32di(c, w[i + 2]);
    }
    b = __builtin_ia32_crc32di(b, w[kKeyWords - 1]);
  }
  uint64_t h = mix128(a ^ (b << 32), c ^ 0x165667b19e3779f9ull ^ (b >> 32));
  return static_cast<uint32_t>(h ^ (h >> 32));
#else
  return hash_key_words_plain(w, seed);
#endif
}

inline uint32_t hash_key(const Flow& f) { return hash_key_words(words(f), 0x5bd1e995ull); }

// The documented 5-tuple hash (README, "Hashes"), used to pick select-group
// buckets and VXLAN source ports, and re-implemented by the test models.
// Four 32-bit words, read as big-endian numbers:
//   IPv4:  a = nw_src, b = nw_dst
//   IPv6:  a, b = the XOR of the source's / destination's four words
//   other: a = dl_src[0..3], b = dl_src[4..5] dl_dst[0..1], c = dl_dst[2..5], d = dl_type
//   IP:    c = tp_src << 16 | tp_dst (0 unless TCP/UDP/SCTP and not a later
//          fragment), d = nw_proto
// h = fmix32(a*0xcc9e2d51 ^ rotl32(b*0x1b873593, 16) ^ c*0x85ebca6b ^ d*0xc2b2ae35
//            ^ 0x9e3779b9), all mod 2^32, fmix32 being MurmurHash3's finaliser.
// The four multiplies are independent, so a packet pays one multiply's
// latency instead of one per byte.
inline uint32_t rd32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return be32(v);
}

inline bool l4_has_ports(const Flow& f) {
  return (f.nw_proto == kIpTcp || f.nw_proto == kIpUdp || f.nw_proto == kIpSctp) &&
         !(f.nw_frag & kFragLater);
}

inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

inline uint32_t hash_words(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  uint32_t x = b * 0x1b873593u;
  return fmix32((a * 0xcc9e2d51u) ^ ((x << 16) | (x >> 16)) ^ (c * 0x85ebca6bu) ^ (d * 0xc2b2ae35u) ^ 0x9e3779b9u);
}

inline uint32_t hash_5tuple(const Flow& f) {
  const uint16_t t = be16(f.dl_type);
  if (t == kEthIp || t == kEthIpv6) {
    uint32_t a, b;
    if (t == kEthIp) {
      a = be32(f.nw_src);
      b = be32(f.nw_dst);
    } else {
      a = rd32(f.ipv6_src) ^ rd32(f.ipv6_src + 4) ^ rd32(f.ipv6_src + 8) ^ rd32(f.ipv6_src + 12);
      b = rd32(f.ipv6_dst) ^ rd32(f.ipv6_dst + 4) ^ rd32(f.ipv6_dst + 8) ^ rd32(f.ipv6_dst + 12);
    }
    uint32_t c = l4_has_ports(f) ? (static_cast<uint32_t>(be16(f.tp_src)) << 16 | be16(f.tp_dst)) : 0;
    return hash_words(a, b, c, f.nw_proto);
  }
  return hash_words(rd32(f.dl_src), static_cast<uint32_t>(f.dl_src[4]) << 24 | f.dl_src[5] << 16 | f.dl_dst[0] << 8 | f.dl_dst[1],
                    rd32(f.dl_dst + 2), t);
}

// ---- masks ----------------------------------------------------------------------
inline void flow_and(Flow& dst, const Flow& a, const Flow& b) {
  word_t* d = words(dst);
  const word_t*x = words(a), *y = words(b);
  for (size_t i = 0; i < kFlowWords; i++) d[i] = x[i] & y[i];
}

inline void flow_or_into(Flow& dst, const Flow& m) {
  word_t* d = words(dst);
  const word_t* x = words(m);
  for (size_t i = 0; i < kFlowWords; i++) d[i] |= x[i];
}

}  // namespace dpu
