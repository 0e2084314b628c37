// SPDX-License-Identifier: Apache-2.0
// A multi-producer multi-consumer queue with a real bound.
#pragma once

#include <chrono>
#include <concurrentqueue/concurrentqueue.h>
#include <concurrentqueue/lightweightsemaphore.h>
#include <iterator>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "stoker/core/queue_meter.h"

namespace stoker {

/// Bounded MPMC queue on top of moodycamel::ConcurrentQueue.
///
/// moodycamel's capacity is only a pre-allocation hint, so the bound is enforced here by
/// a semaphore of free slots; a second semaphore counts items ready to pop. A full queue
/// makes `push` wait (or `try_push` fail); an empty one makes `pop` wait.
///
/// Ordering is FIFO per producer, not across producers.
///
/// `close()` ends the stream: pushes that have not yet claimed a slot fail, every waiter
/// wakes at once, and consumers drain what is left before `pop` returns false.
///
/// Every member function is thread-safe except construction and destruction.
template <class T>
class BoundedQueue : public QueueMeter {
 public:
  /// `capacity` must be at least 1.
  BoundedQueue(std::string name, std::size_t capacity)
      : QueueMeter(std::move(name), checked(capacity)),
        queue_(capacity),
        free_slots_(static_cast<Semaphore::ssize_t>(capacity), kSpins),
        items_(0, kSpins) {}

  /// Waits while full. Returns false, leaving `value` untouched, if the queue is closed.
  template <class U = T>
  bool push(U&& value) {
    if (closed()) return false;
    free_slots_.wait();
    return insert(std::forward<U>(value));
  }
  /// Returns false at once if the queue is full or closed; `value` is then untouched.
  template <class U = T>
  bool try_push(U&& value) {
    if (closed() || !free_slots_.tryWait()) return false;
    return insert(std::forward<U>(value));
  }
  /// Pushes the first k of the `n` values from `first` (moving from them), k being as many as
  /// there are free slots now; returns k, 0 when the queue is full or closed. One slot claim
  /// and one wake-up for all k: what makes a chunk cheaper than k pushes.
  template <class It>
  std::size_t try_push_many(It first, std::size_t n) {
    if (n == 0 || closed()) return 0;
    const auto k = static_cast<std::size_t>(free_slots_.tryWaitMany(static_cast<Semaphore::ssize_t>(n)));
    return k != 0 && insert_many(first, k) ? k : 0;
  }
  /// Waits at most `timeout` for a free slot.
  template <class U = T, class Rep, class Period>
  bool push_for(U&& value, std::chrono::duration<Rep, Period> timeout) {
    if (closed() || !free_slots_.wait(micros(timeout))) return false;
    return insert(std::forward<U>(value));
  }

  /// Waits while empty. Returns false once the queue is closed and drained.
  bool pop(T& out) {
    items_.wait();
    return take(out);
  }
  /// Returns false at once if nothing is ready; `drained()` tells whether more may come.
  bool try_pop(T& out) { return items_.tryWait() && take(out); }
  /// Appends up to `max` items to `out` without waiting; returns how many. Each producer's
  /// items come out in the order it pushed them, as with try_pop.
  std::size_t try_pop_many(std::vector<T>& out, std::size_t max) {
    const auto k = static_cast<std::size_t>(items_.tryWaitMany(static_cast<Semaphore::ssize_t>(max)));
    return k == 0 ? 0 : take_many(out, k);
  }
  /// Waits at most `timeout` for an item.
  template <class Rep, class Period>
  bool pop_for(T& out, std::chrono::duration<Rep, Period> timeout) {
    return items_.wait(micros(timeout)) && take(out);
  }

  /// Idempotent. Wakes every blocked producer and consumer.
  void close() {
    if (closed_.exchange(true)) return;
    free_slots_.signal(kWakeAll);
    items_.signal(kWakeAll);
  }
  bool closed() const noexcept { return closed_.load(); }
  /// True once closed with nothing left and no push still in progress: no pop can succeed.
  bool drained() const noexcept { return closed_.load() && inserting_.load() == 0 && raw_size() == 0; }

 private:
  using Semaphore = moodycamel::LightweightSemaphore;
  // After close() the semaphores stop counting anything real; a waiter that gets one of
  // these tokens re-checks the state and hands its token back.
  static constexpr Semaphore::ssize_t kWakeAll = Semaphore::ssize_t{1} << 40;
  // Spin briefly before sleeping: long enough to catch a hand-off between two running
  // threads, short enough not to steal a core from the thread we are waiting for.
  static constexpr int kSpins = 1024;

  static std::size_t checked(std::size_t capacity) {
    if (capacity == 0) throw std::invalid_argument("BoundedQueue capacity must be at least 1");
    return capacity;
  }
  template <class Rep, class Period>
  static std::int64_t micros(std::chrono::duration<Rep, Period> d) {
    const auto us = std::chrono::ceil<std::chrono::microseconds>(d).count();
    return us < 0 ? 0 : static_cast<std::int64_t>(us);
  }

  // Called holding a free slot. `inserting_` lets a consumer tell "closed and empty" from
  // "closed, but a producer that got in before close() has not finished inserting".
  template <class U>
  bool insert(U&& value) {
    inserting_.fetch_add(1);
    if (closed_.load()) {
      inserting_.fetch_sub(1);
      free_slots_.signal();
      return false;
    }
    if (!queue_.enqueue(std::forward<U>(value))) {
      inserting_.fetch_sub(1);
      free_slots_.signal();
      throw std::bad_alloc();
    }
    count_in();
    inserting_.fetch_sub(1);
    items_.signal();
    return true;
  }

  template <class It>
  bool insert_many(It first, std::size_t k) {
    inserting_.fetch_add(1);
    if (closed_.load()) {
      inserting_.fetch_sub(1);
      free_slots_.signal(static_cast<Semaphore::ssize_t>(k));
      return false;
    }
    if (!queue_.enqueue_bulk(std::make_move_iterator(first), k)) {
      inserting_.fetch_sub(1);
      free_slots_.signal(static_cast<Semaphore::ssize_t>(k));
      throw std::bad_alloc();
    }
    count_in(k);
    inserting_.fetch_sub(1);
    items_.signal(static_cast<Semaphore::ssize_t>(k));
    return true;
  }
  // Called holding `k` item tokens; as take(), for k items. What it takes is counted out at
  // once: drained() must not see items that a consumer already holds.
  std::size_t take_many(std::vector<T>& out, std::size_t k) {
    std::size_t taken = 0;
    while (taken < k) {
      const std::size_t got = queue_.try_dequeue_bulk(std::back_inserter(out), k - taken);
      if (got != 0) {
        taken += got;
        count_out(got);
        free_slots_.signal(static_cast<Semaphore::ssize_t>(got));
      } else if (drained()) {
        items_.signal(static_cast<Semaphore::ssize_t>(k - taken));  // tokens without items go back
        break;
      } else {
        std::this_thread::yield();
      }
    }
    return taken;
  }
  // Called holding an item token (real, or a wake-up token after close()).
  bool take(T& out) {
    for (;;) {
      if (queue_.try_dequeue(out)) {
        count_out();
        free_slots_.signal();
        return true;
      }
      if (drained()) {
        items_.signal();  // keep the wake-up token for the next caller
        return false;
      }
      // Our item was taken by a consumer holding a wake-up token, or moodycamel has not
      // yet published it to this thread: either way it is moments away.
      std::this_thread::yield();
    }
  }

  moodycamel::ConcurrentQueue<T> queue_;
  Semaphore free_slots_;
  Semaphore items_;
  std::atomic<bool> closed_{false};
  std::atomic<int> inserting_{0};
};

}  // namespace stoker
