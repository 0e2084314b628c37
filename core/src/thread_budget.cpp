// SPDX-License-Identifier: Apache-2.0
#include "stoker/core/thread_budget.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include <oneapi/tbb/info.h>

#include "turns.h"

namespace stoker {

ThreadBudget::ThreadBudget(int threads) {
  if (threads < 0)
    throw std::invalid_argument("thread budget: threads must be at least 1 (or 0 for one per core), not " +
                                std::to_string(threads));
  turns_ = std::make_unique<Turns>(threads == 0 ? tbb::info::default_concurrency() : threads);
}

ThreadBudget::~ThreadBudget() = default;

int ThreadBudget::threads() const noexcept { return turns_->threads; }

int ThreadBudget::running() const noexcept {
  std::lock_guard lock(turns_->mutex);
  return turns_->threads - turns_->free;
}

int ThreadBudget::waiting() const noexcept { return turns_->waiting.load(std::memory_order_relaxed); }

bool ThreadBudget::Turns::take(const void* owner, const std::atomic<bool>& stopping) {
  std::unique_lock lock(mutex);
  if (free > 0) {
    --free;
    return true;
  }
  Waiter me{owner};
  queue.push_back(&me);
  waiting.store(static_cast<int>(queue.size()), std::memory_order_relaxed);
  me.cv.wait(lock, [&] { return me.granted || stopping.load(); });
  if (!stopping.load()) return true;  // granted
  if (me.granted) {                   // and stopping: the turn goes on to the next waiter (or back)
    lock.unlock();
    give();
    return false;
  }
  queue.erase(std::find(queue.begin(), queue.end(), &me));
  waiting.store(static_cast<int>(queue.size()), std::memory_order_relaxed);
  return false;
}

void ThreadBudget::Turns::give() {
  std::lock_guard lock(mutex);
  if (queue.empty()) {
    ++free;
    return;
  }
  Waiter* next = queue.front();
  queue.pop_front();
  waiting.store(static_cast<int>(queue.size()), std::memory_order_relaxed);
  next->granted = true;
  next->cv.notify_one();  // under the lock: the waiter, and its condition variable, are still there
}

void ThreadBudget::Turns::wake(const void* owner) {
  std::lock_guard lock(mutex);
  for (Waiter* w : queue)
    if (w->owner == owner) w->cv.notify_one();
}

}  // namespace stoker
