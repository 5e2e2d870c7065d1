// checksum.h: Internet checksum helpers (RFC 1071 sums, RFC 1624 updates).
//
// The ones'-complement sum does not depend on byte order as long as every
// 16-bit word is read the same way, so these functions take and return raw
// 16-bit words as they sit in memory; callers never byte-swap checksums.
// Header-only, pure, any thread.
#pragma once

#include <cstdint>
#include <cstring>

namespace dpu {

inline uint16_t load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline void store16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
inline uint32_t load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void store32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// Partial sum over bytes (raw word order); odd trailing byte padded with zero.
inline uint64_t csum_partial(const uint8_t* p, size_t n, uint64_t sum = 0) {
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    sum += (w & 0xffffffffull) + (w >> 32);
    p += 8;
    n -= 8;
  }
  while (n >= 2) {
    sum += load16(p);
    p += 2;
    n -= 2;
  }
  if (n) {
    uint8_t tail[2] = {p[0], 0};
    sum += load16(tail);
  }
  return sum;
}

inline uint16_t csum_fold(uint64_t sum) {
  sum = (sum & 0xffffffffull) + (sum >> 32);
  sum = (sum & 0xffffffffull) + (sum >> 32);
  sum = (sum & 0xffff) + (sum >> 16);
  sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(sum);
}

// Finished checksum (complemented) over a buffer.
inline uint16_t csum(const uint8_t* p, size_t n, uint64_t sum = 0) {
  return static_cast<uint16_t>(~csum_fold(csum_partial(p, n, sum)));
}

// RFC 1624 eqn. 3 for several words at once: HC' = ~(~HC + terms), where
// `terms` sums ~m + m' over the changed words (at most about 0x10000 of them).
inline uint16_t csum_apply_terms(uint16_t hc, uint32_t terms) {
  uint32_t s = static_cast<uint16_t>(~hc) + terms;
  s = (s & 0xffff) + (s >> 16);
  s = (s & 0xffff) + (s >> 16);
  return static_cast<uint16_t>(~s);
}

// The term one 16-bit word's change adds: ~m + m'.
inline uint32_t csum_term(uint16_t old_w, uint16_t new_w) {
  return static_cast<uint16_t>(~old_w) + static_cast<uint32_t>(new_w);
}

// The terms of a 32-bit field's change (two words at once: a ones'-complement
// sum does not depend on how its words are grouped; an unchanged word of the
// two adds ~m + m, a ones'-complement zero). Summed in 64 bits and applied
// with csum_apply_sum().
inline uint64_t csum_term32(uint32_t old_v, uint32_t new_v) {
  return static_cast<uint32_t>(~old_v) + static_cast<uint64_t>(new_v);
}

// HC' = ~(~HC + terms) for terms summed in 64 bits (csum_term, csum_term32).
inline uint16_t csum_apply_sum(uint16_t hc, uint64_t terms) {
  return static_cast<uint16_t>(~csum_fold(static_cast<uint16_t>(~hc) + terms));
}

// RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m'), for one 16-bit word.
inline uint16_t csum_replace16(uint16_t hc, uint16_t old_w, uint16_t new_w) {
  return csum_apply_terms(hc, csum_term(old_w, new_w));
}

// IPv4/IPv6 pseudo-header partial sums (addresses as raw bytes).
inline uint64_t pseudo_sum_v4(const uint8_t* src, const uint8_t* dst, uint8_t proto, uint32_t l4_len) {
  uint64_t s = csum_partial(src, 4) + csum_partial(dst, 4);
  uint8_t tail[4] = {0, proto, static_cast<uint8_t>(l4_len >> 8), static_cast<uint8_t>(l4_len)};
  return csum_partial(tail, 4, s);
}

inline uint64_t pseudo_sum_v6(const uint8_t* src, const uint8_t* dst, uint8_t proto, uint32_t l4_len) {
  uint64_t s = csum_partial(src, 16) + csum_partial(dst, 16);
  uint8_t tail[8] = {static_cast<uint8_t>(l4_len >> 24), static_cast<uint8_t>(l4_len >> 16),
                     static_cast<uint8_t>(l4_len >> 8), static_cast<uint8_t>(l4_len), 0, 0, 0, proto};
  return csum_partial(tail, 8, s);
}

}  // namespace dpu
