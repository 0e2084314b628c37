// SPDX-License-Identifier: Apache-2.0
// A queue that hands out its elements in random order (TensorFlow's RandomShuffleQueue).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "stoker/core/queue_meter.h"
#include "stoker/core/random.h"

namespace stoker {

struct ShuffleOptions {
  std::size_t capacity = 10000;          ///< most elements held at once
  std::size_t min_after_dequeue = 2000;  ///< a dequeue leaves at least this many behind
  /// The stream of random draws. In a pipeline, a shuffle without a seed of its own takes one
  /// derived from the pipeline's seed; a RandomShuffleQueue without one uses 0.
  std::optional<std::uint64_t> seed = std::nullopt;
};

/// Which of the held elements a dequeue draws from.
enum class ShuffleRule : std::uint8_t {
  /// Any of them, uniformly (TensorFlow's rule): a larger capacity mixes more.
  all_held,
  /// The oldest min_after_dequeue + 1, uniformly; the rest wait in arrival order. The output is
  /// then a function of the seed and the arrival order alone, however far the producers ran
  /// ahead (what a pipeline's deterministic mode uses). When the consumer keeps up, exactly
  /// min_after_dequeue + 1 are held at each dequeue and the two rules agree.
  oldest_window,
};

/// The elements of a shuffle and the rule that draws them, without any locking: the state of a
/// RandomShuffleQueue, and of a pipeline's shuffle. A take is O(1).
template <class T>
class ShuffleBuffer {
 public:
  /// A take draws from the oldest `window` elements held.
  ShuffleBuffer(std::size_t window, std::uint64_t seed) : window_size_(window), rng_(seed) {}

  std::size_t size() const noexcept { return window_.size() + backlog_.size(); }
  template <class U>
  void push(U&& value) {
    if (window_.size() < window_size_)
      window_.emplace_back(std::forward<U>(value));
    else
      backlog_.emplace_back(std::forward<U>(value));
  }
  /// One element drawn uniformly from the window; the oldest of the backlog takes its place.
  /// Removal is always swap-with-last, and the backlog's oldest element then arrives at the end,
  /// exactly where a push made after this take would have put it: the window's order does not
  /// depend on how pushes and takes interleave. Not on an empty buffer.
  T take() {
    const auto i = static_cast<std::size_t>(rng_.below(window_.size()));
    T value = std::move(window_[i]);
    if (i + 1 != window_.size()) window_[i] = std::move(window_.back());
    window_.pop_back();
    if (!backlog_.empty()) {
      window_.push_back(std::move(backlog_.front()));
      backlog_.pop_front();
    }
    return value;
  }
  void reseed(std::uint64_t seed) noexcept { rng_ = Rng(seed); }

  /// Calls `f(element)` for every element.
  template <class F>
  void for_each(F&& f) const {
    for (const auto& v : window_) f(v);
    for (const auto& v : backlog_) f(v);
  }
  /// A buffer of `f(element)` for every element, each in the same place, drawing the same
  /// stream: its takes yield the images of this one's, in the same order.
  template <class F>
  auto map(F&& f) const {
    ShuffleBuffer<std::remove_cvref_t<std::invoke_result_t<F&, const T&>>> out(window_size_, 0);
    out.rng_ = rng_;
    out.window_.reserve(window_.size());
    for (const auto& v : window_) out.window_.push_back(f(v));
    for (const auto& v : backlog_) out.backlog_.push_back(f(v));
    return out;
  }

 private:
  template <class>
  friend class ShuffleBuffer;

  std::size_t window_size_;
  std::vector<T> window_;  // candidates for the next take, oldest elements first in
  std::deque<T> backlog_;  // the rest, in arrival order
  Rng rng_;
};

/// Bounded MPMC queue whose dequeue returns a random element.
///
/// A dequeue waits until more than `min_after_dequeue` elements are held (or the queue is
/// closed) and takes one of them chosen by `rule`: by default uniformly among all held, as
/// TensorFlow's RandomShuffleQueue does. After `close()` the remainder drains in random order.
/// Nothing is lost or repeated.
///
/// Every member function is thread-safe except construction and destruction.
template <class T>
class RandomShuffleQueue : public QueueMeter {
 public:
  RandomShuffleQueue(std::string name, ShuffleOptions options, ShuffleRule rule = ShuffleRule::all_held)
      : QueueMeter(std::move(name), checked(options)),
        min_after_dequeue_(options.min_after_dequeue),
        buffer_(rule == ShuffleRule::all_held ? options.capacity : options.min_after_dequeue + 1,
                options.seed.value_or(0)) {}

  std::size_t min_after_dequeue() const noexcept { return min_after_dequeue_; }

  /// Waits while full. Returns false, leaving `value` untouched, if the queue is closed.
  template <class U = T>
  bool push(U&& value) {
    std::unique_lock lock(mutex_);
    not_full_.wait(lock, [&] { return closed_ || held() < capacity(); });
    return insert(lock, std::forward<U>(value));
  }
  template <class U = T>
  bool try_push(U&& value) {
    std::unique_lock lock(mutex_);
    return held() < capacity() && insert(lock, std::forward<U>(value));
  }
  /// Pushes the values of [first, last) in order (moving from them) as far as there is room
  /// now; returns how many, 0 when full or closed. One lock and one wake-up for all.
  template <class It>
  std::size_t try_push_many(It first, It last) {
    std::unique_lock lock(mutex_);
    if (closed_) return 0;
    std::size_t n = 0;
    for (; first != last && held() < capacity(); ++first, ++n) buffer_.push(std::move(*first));
    if (n == 0) return 0;
    count_in(n);
    const bool wake = can_pop(1);
    lock.unlock();
    if (wake) ready_.notify_all();
    return n;
  }
  template <class U = T, class Rep, class Period>
  bool push_for(U&& value, std::chrono::duration<Rep, Period> timeout) {
    std::unique_lock lock(mutex_);
    return not_full_.wait_for(lock, timeout, [&] { return closed_ || held() < capacity(); }) &&
           insert(lock, std::forward<U>(value));
  }

  /// Waits until an element may be dequeued. Returns false once closed and drained.
  bool pop(T& out) {
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [&] { return can_pop(1); });
    return take(lock, out);
  }
  /// Returns false at once when no element may be dequeued yet.
  bool try_pop(T& out) {
    std::unique_lock lock(mutex_);
    return can_pop(1) && take(lock, out);
  }
  template <class Rep, class Period>
  bool pop_for(T& out, std::chrono::duration<Rep, Period> timeout) {
    std::unique_lock lock(mutex_);
    return ready_.wait_for(lock, timeout, [&] { return can_pop(1); }) && take(lock, out);
  }

  /// Appends `n` elements to `out`, the same elements in the same order as `n` calls to
  /// `pop`. Waits until all `n` may be taken. Once the queue is closed with fewer than `n`
  /// left, takes them all if `allow_partial`; otherwise takes none, and they stay for a
  /// later call. Returns how many were appended; 0 means none were.
  /// `n` may be at most `capacity - min_after_dequeue`, else no call could ever finish.
  std::size_t pop_many(std::vector<T>& out, std::size_t n, bool allow_partial = true) {
    check_batch(n);
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [&] { return can_pop(n); });
    return take_many(lock, out, n, allow_partial);
  }
  /// `pop_many` that returns 0 at once instead of waiting.
  std::size_t try_pop_many(std::vector<T>& out, std::size_t n, bool allow_partial = true) {
    check_batch(n);
    std::unique_lock lock(mutex_);
    return can_pop(n) ? take_many(lock, out, n, allow_partial) : 0;
  }

  /// Appends as many elements as may be dequeued now, at most `max`: the same elements in the
  /// same order as that many calls to `try_pop`. Returns how many; 0 when none may be.
  std::size_t try_pop_some(std::vector<T>& out, std::size_t max) {
    std::unique_lock lock(mutex_);
    const std::size_t poppable = closed_ ? held() : held() > min_after_dequeue() ? held() - min_after_dequeue() : 0;
    return poppable == 0 || max == 0 ? 0 : take_many(lock, out, std::min(max, poppable), false);
  }
  /// Idempotent. Wakes every blocked producer and consumer.
  void close() {
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
    }
    not_full_.notify_all();
    ready_.notify_all();
  }
  bool closed() const {
    std::lock_guard lock(mutex_);
    return closed_;
  }
  /// True once closed and empty: no pop can succeed.
  bool drained() const {
    std::lock_guard lock(mutex_);
    return closed_ && held() == 0;
  }
  /// True when a pop would not wait: an element may be dequeued, or the queue is drained.
  bool ready() const {
    std::lock_guard lock(mutex_);
    return can_pop(1);
  }
  /// Makes a closed, drained queue accept elements again, drawing from a new seed (one
  /// epoch after another). Throws std::logic_error if the queue is open or not empty.
  void reopen(std::uint64_t seed) {
    std::lock_guard lock(mutex_);
    if (!closed_ || held() != 0)
      throw std::logic_error("shuffle queue '" + name() + "' can only be reopened when closed and drained");
    closed_ = false;
    buffer_.reseed(seed);
  }

 private:
  static std::size_t checked(const ShuffleOptions& o) {
    if (o.capacity == 0) throw std::invalid_argument("shuffle capacity must be at least 1");
    if (o.min_after_dequeue >= o.capacity)
      throw std::invalid_argument("shuffle min_after_dequeue (" + std::to_string(o.min_after_dequeue) +
                                  ") must be less than capacity (" + std::to_string(o.capacity) + ")");
    return o.capacity;
  }
  void check_batch(std::size_t n) const {
    if (n == 0 || n > capacity() - min_after_dequeue())
      throw std::invalid_argument(
          "pop_many of " + std::to_string(n) + " from shuffle queue '" + name() +
          "' must be between 1 and capacity - min_after_dequeue = " + std::to_string(capacity() - min_after_dequeue()));
  }

  std::size_t held() const { return buffer_.size(); }
  // n pops in a row are possible when each leaves min_after_dequeue behind.
  bool can_pop(std::size_t n) const { return closed_ || held() >= min_after_dequeue() + n; }

  template <class U>
  bool insert(std::unique_lock<std::mutex>& lock, U&& value) {
    if (closed_) return false;
    buffer_.push(std::forward<U>(value));
    count_in();
    const bool wake = can_pop(1);
    lock.unlock();
    // notify_all: waiters may want different counts (pop and pop_many).
    if (wake) ready_.notify_all();
    return true;
  }

  bool take(std::unique_lock<std::mutex>& lock, T& out) {
    if (held() == 0) return false;  // closed and drained
    out = buffer_.take();
    count_out();
    lock.unlock();
    not_full_.notify_one();
    return true;
  }

  std::size_t take_many(std::unique_lock<std::mutex>& lock, std::vector<T>& out, std::size_t n, bool allow_partial) {
    if (held() < n) {
      if (!allow_partial || held() == 0) return 0;
      n = held();
    }
    out.reserve(out.size() + n);
    for (std::size_t k = 0; k < n; ++k) out.push_back(buffer_.take());
    count_out(n);
    lock.unlock();
    not_full_.notify_all();
    return n;
  }

  const std::size_t min_after_dequeue_;
  mutable std::mutex mutex_;
  std::condition_variable not_full_;
  std::condition_variable ready_;
  ShuffleBuffer<T> buffer_;
  bool closed_ = false;
};

}  // namespace stoker
