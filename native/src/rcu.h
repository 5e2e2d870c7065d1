// rcu.h: read-copy-update for the configuration the workers read without locks.
//
// The tables, groups, ports and tenants are read by every worker's upcalls
// while the control thread changes them (docs/design.md, "Changes without
// stopping the world"). A writer never changes in place what a reader may be
// looking at: it publishes new objects and hands the old ones here, and they
// are freed only once every reader that could have seen them has left its
// read section (epoch.h's scheme, one Epoch per dataplane, apart from
// conntrack's).
//
//   reader:  enter(slot) before a batch, leave(slot) after it: the batch sees
//            one configuration version and everything it points to.
//   writer:  publish the new object, then retire(old) (or defer(fn), a step to
//            run once no reader can still be using what fn would free, such as
//            unlinking a deleted rule from its table).
//   reclaim: frees what is safe and runs the deferred steps, on the caller's
//            thread; the dataplane calls it with its control mutex held, so a
//            deferred step is a writer step like any other.
//
// Thread-safety: enter/leave by the slot's owner; retire/defer/reclaim from any
// thread (a mutex of its own, never taken by a reader).
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>

#include "conntrack/epoch.h"

namespace dpu {

class Rcu {
 public:
  Rcu() = default;
  ~Rcu() { drain(); }
  Rcu(const Rcu&) = delete;
  Rcu& operator=(const Rcu&) = delete;

  int attach() { return epoch_.acquire(); }
  void detach(int slot) { epoch_.release(slot); }
  void enter(int slot) { epoch_.enter(slot); }
  void leave(int slot) { epoch_.leave(slot); }

  // `obj` was unpublished just now: freed after a grace period.
  void retire(std::shared_ptr<const void> obj) {
    std::lock_guard<std::mutex> g(mu_);
    items_.push_back(Item{epoch_.retire_tag(), std::move(obj), nullptr});
  }
  template <class T>
  void retire(T* p) {
    retire(std::shared_ptr<const void>(p, [](const void* q) { delete static_cast<const T*>(q); }));
  }
  // Runs `fn` from a later reclaim() once every reader in a read section now
  // has left it.
  void defer(std::function<void()> fn) {
    std::lock_guard<std::mutex> g(mu_);
    items_.push_back(Item{epoch_.retire_tag(), nullptr, std::move(fn)});
  }
  // Frees and runs what no reader can still be using; returns how many items.
  size_t reclaim() {
    std::deque<Item> ready;
    {
      std::lock_guard<std::mutex> g(mu_);
      const uint64_t safe = epoch_.min_active();
      while (!items_.empty() && items_.front().tag < safe) {
        ready.push_back(std::move(items_.front()));
        items_.pop_front();
      }
    }
    for (Item& it : ready)
      if (it.fn) it.fn();
    return ready.size();  // the objects go with `ready`
  }
  // At destruction (no reader left): everything, deferred steps included.
  void drain() {
    std::deque<Item> all;
    {
      std::lock_guard<std::mutex> g(mu_);
      all.swap(items_);
    }
    for (Item& it : all)
      if (it.fn) it.fn();
  }

 private:
  struct Item {
    uint64_t tag;
    std::shared_ptr<const void> obj;
    std::function<void()> fn;
  };
  Epoch epoch_;
  mutable std::mutex mu_;
  std::deque<Item> items_;  // in tag order
};

}  // namespace dpu
