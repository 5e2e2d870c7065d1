// mem.h: fixed-size memory helpers for the fast path.
//
// GCC lowers a memset of a mid-sized constant length (the 152-byte flow key,
// the 88-byte packet metadata) to `rep stos`, which costs tens of cycles to
// start; these helpers store whole vector registers instead. Pure, any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif

namespace dpu {

template <size_t N>
inline void zero_fixed(void* dst) {
  char* p = static_cast<char*>(dst);
  size_t i = 0;
#if defined(__AVX__)
  const __m256i z = _mm256_setzero_si256();
  for (; i + 32 <= N; i += 32) _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + i), z);
#endif
#if defined(__SSE2__)
  const __m128i z16 = _mm_setzero_si128();
  for (; i + 16 <= N; i += 16) _mm_storeu_si128(reinterpret_cast<__m128i*>(p + i), z16);
#endif
  for (; i + 8 <= N; i += 8) {
    const uint64_t z8 = 0;
    std::memcpy(p + i, &z8, 8);
  }
  for (; i < N; i++) p[i] = 0;
}

}  // namespace dpu
