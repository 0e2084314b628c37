// SPDX-License-Identifier: Apache-2.0
#include "stoker/core/queue_meter.h"

#include <thread>
#include <utility>

namespace stoker {

QueueMeter::QueueMeter(std::string name, std::size_t capacity)
    : name_(std::move(name)), capacity_(capacity), born_(Clock::now()) {
  since_ = born_;
}

void QueueMeter::count_in(std::size_t n) noexcept {
  if (n != 0) crossed(size_.fetch_add(static_cast<std::ptrdiff_t>(n)), static_cast<std::ptrdiff_t>(n));
}

void QueueMeter::count_out(std::size_t n) noexcept {
  if (n != 0) crossed(size_.fetch_sub(static_cast<std::ptrdiff_t>(n)), -static_cast<std::ptrdiff_t>(n));
}

void QueueMeter::count_waiting(std::ptrdiff_t delta) noexcept {
  if (delta == 0) return;
  // Into waiting_ first when more wait, out of it last when fewer do (raw_size() reads them).
  if (delta > 0) waiting_.fetch_add(delta);
  crossed(size_.fetch_add(delta), delta);
  if (delta < 0) waiting_.fetch_add(delta);
}

void QueueMeter::integrate_locked() const noexcept {
  const auto now = Clock::now();
  in_state_[state_] += now - since_;
  since_ = now;
  state_ = state_of(size_.load());
}

void QueueMeter::account() const noexcept {
  // All operations here are sequentially consistent on purpose: the hand-off between a
  // loser's `dirty_ = true` and the winner's re-check after `clear()` relies on it.
  dirty_.store(true);
  while (dirty_.load() && !busy_.test_and_set()) {
    dirty_.store(false);
    integrate_locked();
    busy_.clear();
  }
}

QueueStats QueueMeter::stats() const {
  while (busy_.test_and_set()) std::this_thread::yield();
  integrate_locked();
  QueueStats s;
  s.name = name_;
  s.capacity = capacity_;
  s.size = size();
  s.waiting = waiting();
  s.time_empty = std::chrono::duration_cast<std::chrono::nanoseconds>(in_state_[kEmpty]);
  s.time_full = std::chrono::duration_cast<std::chrono::nanoseconds>(in_state_[kFull]);
  s.lifetime = std::chrono::duration_cast<std::chrono::nanoseconds>(since_ - born_);
  busy_.clear();
  return s;
}

}  // namespace stoker
