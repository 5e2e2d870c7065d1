// epoch.h: epoch-based reclamation for the conntrack table's lock-free readers.
//
// Workers look connections up without taking a lock (conntrack.h), so a
// connection that is unlinked from the table may still be read by a worker
// that found it a moment earlier. Its memory is handed back only when every
// reader that could have seen it has moved on:
//
//   reader:   enter() before a batch's conntrack stage, leave() after it;
//             enter() publishes the global epoch the reader started in.
//   writer:   after unlinking, retire(obj) tags it with the current epoch E
//             and advances the global epoch to E+1.
//   reclaim:  an object tagged E may be freed once no reader is still inside
//             an epoch <= E (min_active() > E); readers that entered later
//             cannot have seen it, because they loaded the epoch after the
//             unlink.
//
// Slots are handed out to workers (and to the API's short-lived workers) by
// acquire()/release(). Thread-safety: enter/leave only by the slot's owner;
// everything else from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>

namespace dpu {

class Epoch {
 public:
  static constexpr int kSlots = 128;

  int acquire() {
    for (int i = 0; i < kSlots; i++) {
      bool expected = false;
      if (slots_[i].used.compare_exchange_strong(expected, true)) return i;
    }
    return -1;  // too many concurrent readers: the caller runs without a slot (never reads)
  }
  void release(int slot) {
    if (slot < 0) return;
    slots_[slot].active.store(0, std::memory_order_release);
    slots_[slot].used.store(false, std::memory_order_release);
  }

  void enter(int slot) {
    if (slot < 0) return;
    slots_[slot].active.store(global_.load(std::memory_order_acquire), std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);  // publish before any table read
  }
  void leave(int slot) {
    if (slot >= 0) slots_[slot].active.store(0, std::memory_order_release);
  }

  // Tag for an object unlinked just now; advances the epoch.
  uint64_t retire_tag() {
    std::atomic_thread_fence(std::memory_order_seq_cst);  // the unlink is visible before the bump
    return global_.fetch_add(1, std::memory_order_acq_rel);
  }
  // Objects tagged below this may be freed.
  uint64_t min_active() const {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    uint64_t m = std::numeric_limits<uint64_t>::max();
    for (const Slot& s : slots_) {
      uint64_t a = s.active.load(std::memory_order_acquire);
      if (a && a < m) m = a;
    }
    return m;
  }

 private:
  struct alignas(64) Slot {
    std::atomic<uint64_t> active{0};  // 0: outside any read section
    std::atomic<bool> used{false};
  };
  std::atomic<uint64_t> global_{1};
  Slot slots_[kSlots];
};

}  // namespace dpu
