// SPDX-License-Identifier: Apache-2.0
// Occupancy accounting shared by every stoker queue.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

namespace stoker {

/// What a monitor reads off a queue at one instant.
struct QueueStats {
  std::string_view name;
  std::size_t capacity = 0;
  std::size_t size = 0;                    ///< items held
  std::size_t waiting = 0;                 ///< items a producer holds at the entrance, waiting for room
  std::chrono::nanoseconds time_empty{0};  ///< total time spent holding nothing
  /// Total time spent at capacity or with a producer waiting for room: the time its producer
  /// could not put in what it had.
  std::chrono::nanoseconds time_full{0};
  std::chrono::nanoseconds lifetime{0};  ///< time since construction
};

/// Name, capacity, current size and time spent empty and full, for a queue.
///
/// The size is kept in one atomic counter that a queue bumps after each insertion and
/// drops after each removal. Time accounting runs only when the count crosses a boundary
/// (0 or capacity), so a queue that stays between the two pays one atomic add per
/// operation and nothing more. A pipeline's queue moves items in chunks, and a producer
/// whose chunk does not fit waits with it at the entrance: those items are counted apart
/// (waiting()), never in size(), which is what a consumer could find in the queue. The
/// time accounting counts them with the items held, so that a queue whose producer waits
/// is full for time_full even when the chunk left a few places free.
/// Every public method is safe from any thread.
class QueueMeter {
 public:
  QueueMeter(std::string name, std::size_t capacity);
  QueueMeter(const QueueMeter&) = delete;
  QueueMeter& operator=(const QueueMeter&) = delete;

  const std::string& name() const noexcept { return name_; }
  std::size_t capacity() const noexcept { return capacity_; }
  /// Items held now, at most the capacity. Exact when the queue is quiescent, otherwise a
  /// recent value.
  std::size_t size() const noexcept {
    const auto s = raw_size();
    return s <= 0 ? 0 : std::min(static_cast<std::size_t>(s), capacity_);
  }
  /// Items a producer holds at the entrance, waiting for room (none in a queue whose pushes
  /// wait inside push()). A recent value.
  std::size_t waiting() const noexcept {
    const auto w = waiting_.load(std::memory_order_relaxed);
    return w <= 0 ? 0 : static_cast<std::size_t>(w);
  }
  QueueStats stats() const;

 protected:
  ~QueueMeter() = default;
  void count_in() noexcept { crossed(size_.fetch_add(1), +1); }
  void count_out() noexcept { crossed(size_.fetch_sub(1), -1); }
  void count_in(std::size_t n) noexcept;
  void count_out(std::size_t n) noexcept;
  /// `delta` more (or, negative, fewer) items wait at the entrance for room.
  void count_waiting(std::ptrdiff_t delta) noexcept;
  /// Items held, not clamped. The count and the waiting items are two atomics: read while the
  /// waiting ones stay put, so that a chunk moving in is never counted twice (it may be missed
  /// for an instant instead).
  std::ptrdiff_t raw_size() const noexcept {
    for (;;) {
      const auto before = waiting_.load();
      const auto counted = size_.load();
      if (waiting_.load() == before) return counted - before;
    }
  }

 private:
  enum State { kEmpty, kPartial, kFull };
  using Clock = std::chrono::steady_clock;

  State state_of(std::ptrdiff_t size) const noexcept {
    return size <= 0 ? kEmpty : size >= static_cast<std::ptrdiff_t>(capacity_) ? kFull : kPartial;
  }
  void crossed(std::ptrdiff_t before, std::ptrdiff_t delta) noexcept {
    if (state_of(before) != state_of(before + delta)) account();
  }
  void account() const noexcept;
  void integrate_locked() const noexcept;

  const std::string name_;
  const std::size_t capacity_;
  std::atomic<std::ptrdiff_t> size_{0};     // held and waiting: what the time accounting classifies
  std::atomic<std::ptrdiff_t> waiting_{0};  // of size_, those waiting at the entrance

  // Time accounting. Whoever wins `busy_` classifies the *current* size and charges the
  // time since the previous classification to the previous state. A thread that loses
  // the race sets `dirty_` so the winner looks once more before leaving: no crossing is
  // ever left unaccounted, and no caller waits.
  mutable std::atomic<bool> dirty_{false};
  mutable std::atomic_flag busy_ = ATOMIC_FLAG_INIT;
  mutable State state_ = kEmpty;
  mutable Clock::time_point since_;
  mutable Clock::duration in_state_[3]{};
  const Clock::time_point born_;
};

}  // namespace stoker
