// flat_map.h: an open-addressing hash map for the NAT tables (nat.cc).
//
// Linear probing in one power-of-two array of slots, at most half full,
// with backward-shift deletion (no tombstones), so a lookup touches one or
// two cache lines and an insert or erase allocates nothing but the rare
// doubling. Large arrays sit on huge pages (dpu/mem.h): a table of a million
// mappings is probed at random, and on 4 KiB pages nearly every probe would
// also miss the TLB. Keys and values are small trivially copyable values;
// Hash returns 64 bits.
// Not thread-safe: the NAT table's mutex guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "dpu/mem.h"

namespace dpu {

template <class K, class V, class Hash>
class FlatMap {
 public:
  FlatMap() { alloc(64); }
  ~FlatMap() { std::free(slots_); }
  FlatMap(const FlatMap&) = delete;
  FlatMap& operator=(const FlatMap&) = delete;

  V* find(const K& k) {
    size_t m = cap_ - 1;
    for (size_t i = Hash()(k) & m;; i = (i + 1) & m) {
      Slot& s = slots_[i];
      if (!s.used) return nullptr;
      if (s.key == k) return &s.val;
    }
  }

  // Inserts or replaces.
  void put(const K& k, const V& v) {
    if ((n_ + 1) * 2 > cap_) grow();
    size_t m = cap_ - 1;
    for (size_t i = Hash()(k) & m;; i = (i + 1) & m) {
      Slot& s = slots_[i];
      if (!s.used) {
        s.used = true;
        s.key = k;
        s.val = v;
        n_++;
        return;
      }
      if (s.key == k) {
        s.val = v;
        return;
      }
    }
  }

  bool erase(const K& k) {
    size_t m = cap_ - 1;
    size_t i = Hash()(k) & m;
    for (;; i = (i + 1) & m) {
      if (!slots_[i].used) return false;
      if (slots_[i].key == k) break;
    }
    // Backward shift: pull later members of the probe run into the hole.
    for (size_t j = (i + 1) & m;; j = (j + 1) & m) {
      Slot& s = slots_[j];
      if (!s.used) break;
      size_t home = Hash()(s.key) & m;
      bool movable = ((j - home) & m) >= ((j - i) & m);  // the hole lies on s's probe path
      if (movable) {
        slots_[i] = s;
        i = j;
      }
    }
    slots_[i].used = false;
    n_--;
    return true;
  }

  size_t size() const { return n_; }

  // Fetches the line where a lookup of `k` starts. Safe from any thread
  // while another changes the map (it only reads the slots' address and
  // count, atomically; a stale pair prefetches a harmless wrong line).
  // With `erasing`, the next slot's line too: erase() reads on to the end
  // of the probe run, which often crosses into it.
  void prefetch(const K& k, bool erasing = false) const {
    const Slot* sl = __atomic_load_n(&slots_, __ATOMIC_RELAXED);
    const size_t cap = __atomic_load_n(&cap_, __ATOMIC_RELAXED);
    if (!sl) return;
    const size_t i = Hash()(k) & (cap - 1);
    if (erasing) {  // (the builtin's read/write argument must be a constant, at -O0 too)
      dpu::prefetch_w(&sl[i]);
      dpu::prefetch_w(&sl[(i + 1) & (cap - 1)]);
    } else {
      dpu::prefetch(&sl[i]);
    }
  }

  template <class F>
  void for_each(F&& f) {
    for (size_t i = 0; i < cap_; i++)
      if (slots_[i].used) f(slots_[i].key, slots_[i].val);
  }

 private:
  struct Slot {
    K key{};
    V val{};
    bool used = false;
  };
  void alloc(size_t cap) {
    size_t bytes = cap * sizeof(Slot);
    void* p = bytes >= (2u << 20) ? huge_alloc(bytes) : std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    Slot* sl = static_cast<Slot*>(p);
    for (size_t i = 0; i < cap; i++) new (&sl[i]) Slot();
    __atomic_store_n(&cap_, cap, __ATOMIC_RELAXED);  // read by prefetch() without the owner's lock
    __atomic_store_n(&slots_, sl, __ATOMIC_RELAXED);
  }
  void grow() {
    Slot* old = slots_;
    size_t old_cap = cap_;
    alloc(old_cap * 2);
    n_ = 0;
    for (size_t i = 0; i < old_cap; i++)
      if (old[i].used) put(old[i].key, old[i].val);
    std::free(old);
  }
  Slot* slots_ = nullptr;
  size_t cap_ = 0;
  size_t n_ = 0;
};

}  // namespace dpu
