// SPDX-License-Identifier: Apache-2.0
// A ThreadBudget's turns (thread_budget.h): what the runtime takes and gives back.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "stoker/core/thread_budget.h"

namespace stoker {

// Invariant: free > 0 only while nobody waits. give() hands a turn straight to the oldest
// waiter when there is one, so a body that gives its turn back and asks again goes behind
// those already waiting.
struct ThreadBudget::Turns {
  explicit Turns(int threads) : threads(threads), free(threads) {}

  // A turn, first come, first served; false without one once `stopping` reads true (the
  // waiter's pipeline stops: wake() with its `owner`).
  bool take(const void* owner, const std::atomic<bool>& stopping);
  void give();
  // Wakes the waiters of `owner`, whose stop flag was set before the call.
  void wake(const void* owner);
  // Someone waits: a body that holds a turn passes it on after its chunk.
  bool wanted() const noexcept { return waiting.load(std::memory_order_relaxed) != 0; }

  struct Waiter {
    explicit Waiter(const void* owner) : owner(owner) {}
    const void* owner;
    bool granted = false;
    std::condition_variable cv;
  };
  const int threads;
  mutable std::mutex mutex;
  int free;                     // turns nobody holds
  std::deque<Waiter*> queue;    // oldest first; each on its waiter's stack
  std::atomic<int> waiting{0};  // queue.size(), for wanted()
};

}  // namespace stoker
