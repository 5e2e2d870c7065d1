// mem.h: memory helpers for the fast path: fixed-size clears and copies,
// prefetches, huge-page arrays. Any thread.
//
// GCC lowers a memset of a mid-sized constant length (the 152-byte flow key,
// the 88-byte packet metadata) to `rep stos`, which costs tens of cycles to
// start; the fixed-size helpers store whole vector registers instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <cstdlib>
#include <new>

#if defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace dpu {

// Always inlined: out of line (as LTO once chose for the flow key), the stores are a loop
// behind a call, +30 instructions a packet on the decap path (callgrind).
template <size_t N>
[[gnu::always_inline]] inline void zero_fixed(void* dst) {
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

// Copies a frame into a packet buffer (the rx path: pcap records, in-memory
// batches, the benchmark's "DMA"). Frames up to 128 bytes, most of them, are
// copied with a few overlapping 32-byte moves instead of a call to memcpy.
inline void copy_frame(uint8_t* dst, const uint8_t* src, size_t n) {
#if defined(__AVX__)
  if (n >= 32 && n <= 128) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + n - 32));
    if (n > 64) {
      __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32));
      __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + n - 64));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32), b);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + n - 64), y);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + n - 32), z);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

// Prefetches the compiler keeps. GCC 12's modref pass finds a function whose
// only effect is __builtin_prefetch to be pure, and a call to a pure function
// whose result is unused is dead code: wherever such a helper had not been
// inlined before the caller's dead-code pass, the prefetch was deleted. That is
// how the exact-match cache's first-way prefetch (Emc::prefetch) left the
// worker's pass when it was split into stages, and the probe then waited on
// memory for every packet (issue 27). A volatile asm is a side effect no pass
// removes; its operand is the address ("p"), not the memory behind it, so the
// compiler infers nothing from it (a null pointer is a valid prefetch).
// Native code prefetches through these only (tests/test_layout.py).
[[gnu::always_inline]] inline void prefetch(const void* p) {
#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE__))
  asm volatile("prefetcht0 %a0" : : "p"(p));
#elif defined(__aarch64__)
  asm volatile("prfm pldl1keep, [%0]" : : "r"(p));
#else
  __builtin_prefetch(p);
#endif
}

// For a line about to be written: PREFETCHW where the target has it (as
// __builtin_prefetch(p, 1) chooses), else an ordinary prefetch.
[[gnu::always_inline]] inline void prefetch_w(const void* p) {
#if defined(__PRFCHW__)
  asm volatile("prefetchw %a0" : : "p"(p));
#elif defined(__aarch64__)
  asm volatile("prfm pstl1keep, [%0]" : : "r"(p));
#else
  prefetch(p);
#endif
}

// Memory for the fast path's big arrays (packet pool, exact-match cache):
// 2 MiB aligned and, on Linux, marked for transparent huge pages, so a worker's
// hot data needs a handful of TLB entries (DPDK uses hugepages for the same
// reason). Falls back to normal pages silently.
inline void* huge_alloc(size_t bytes) {
  constexpr size_t kHuge = 2u << 20;
  size_t n = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = nullptr;
  if (posix_memalign(&p, kHuge, n) != 0) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Memory the allocator hands back out (an earlier table's) keeps the small
  // pages it was first touched with: dropped here, it is faulted in again,
  // as huge pages, when first written.
  madvise(p, n, MADV_DONTNEED);
  madvise(p, n, MADV_HUGEPAGE);
#endif
  return p;
}

// Zero-filled memory like huge_alloc(), for tables too big to clear on the
// packet path that created them (the conntrack table: tens of MiB at its
// first connection): fresh anonymous pages, zeroed by the kernel when first
// touched. Released with huge_free_zeroed(p, bytes).
inline void* huge_alloc_zeroed(size_t bytes) {
#if defined(__linux__)
  constexpr size_t kHuge = 2u << 20;
  const size_t n = (bytes + kHuge - 1) / kHuge * kHuge;
  void* m = mmap(nullptr, n + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t a = reinterpret_cast<uintptr_t>(m);
  const uintptr_t start = (a + kHuge - 1) & ~(kHuge - 1);  // 2 MiB aligned; the rest is given back
  if (start > a) munmap(m, start - a);
  if (a + kHuge > start) munmap(reinterpret_cast<void*>(start + n), a + kHuge - start);
#if defined(MADV_HUGEPAGE)
  madvise(reinterpret_cast<void*>(start), n, MADV_HUGEPAGE);
#endif
  return reinterpret_cast<void*>(start);
#else
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  return p;
#endif
}

inline void huge_free_zeroed(void* p, size_t bytes) {
  if (!p) return;
#if defined(__linux__)
  constexpr size_t kHuge = 2u << 20;
  munmap(p, (bytes + kHuge - 1) / kHuge * kHuge);
#else
  (void)bytes;
  std::free(p);
#endif
}

template <class T>
struct HugeArray {
  explicit HugeArray(size_t n) : n_(n), p_(static_cast<T*>(huge_alloc(n * sizeof(T)))) {
    for (size_t i = 0; i < n; i++) new (p_ + i) T();
  }
  ~HugeArray() {
    for (size_t i = 0; i < n_; i++) p_[i].~T();
    std::free(p_);
  }
  HugeArray(const HugeArray&) = delete;
  HugeArray& operator=(const HugeArray&) = delete;
  T& operator[](size_t i) { return p_[i]; }
  size_t size() const { return n_; }
  const T& operator[](size_t i) const { return p_[i]; }

 private:
  size_t n_;
  T* p_;
};

}  // namespace dpu
