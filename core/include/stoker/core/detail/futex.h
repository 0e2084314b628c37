// SPDX-License-Identifier: Apache-2.0
// A word one thread sleeps on until another changes it: a Linux futex, with the timed wait that
// std::atomic::wait lacks. Internal; the system calls are in core/src/futex.cpp, so that no
// user file gets Linux's headers and their macros.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace stoker::detail {

/// Waiting without a lost wake-up: read value() while the condition waited for is known false
/// (under the lock that guards it), drop the lock, then wait(seen): a notify_one() made in
/// between changed the word, and the wait returns at once.
///
/// The kernel compares the word itself: one futex call per wait and per wake-up, and none while
/// no thread waits (callers notify only a waiter they know of). Both may return spuriously (a
/// signal, a timeout): callers check their condition again.
class Futex {
 public:
  std::uint32_t value() const noexcept { return word_.load(); }

  /// Sleeps while the word equals `seen`, at most `timeout`.
  void wait(std::uint32_t seen, std::chrono::nanoseconds timeout) noexcept;
  /// Sleeps while the word equals `seen`.
  void wait(std::uint32_t seen) noexcept;
  /// Changes the word and wakes one thread in wait().
  void notify_one() noexcept;

 private:
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) &&
                std::atomic<std::uint32_t>::is_always_lock_free);
  // The kernel reads the atomic's own 4 bytes, as libstdc++'s std::atomic::wait does.
  std::uint32_t* address() noexcept { return reinterpret_cast<std::uint32_t*>(&word_); }
  std::atomic<std::uint32_t> word_{0};
};

}  // namespace stoker::detail
