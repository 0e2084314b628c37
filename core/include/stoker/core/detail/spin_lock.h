// SPDX-License-Identifier: Apache-2.0
// A lock that spins, then yields. Internal.
#pragma once

#include <atomic>
#include <thread>

namespace stoker::detail {

/// A lock for critical sections of a few hundred nanoseconds (a chunk's moves): it spins,
/// then yields, and never sleeps in the kernel. With more threads than cores, a std::mutex
/// here sent a thread to sleep (and another to wake it) about once per ten items.
class SpinLock {
 public:
  void lock() noexcept {
    for (int spins = 0; flag_.exchange(true, std::memory_order_acquire);) {
      while (flag_.load(std::memory_order_relaxed)) {
        if (++spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
          __builtin_ia32_pause();
#elif defined(__aarch64__)
          asm volatile("yield");
#endif
        } else {
          std::this_thread::yield();  // the holder may have lost its core
        }
      }
    }
  }
  bool try_lock() noexcept { return !flag_.exchange(true, std::memory_order_acquire); }
  void unlock() noexcept { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

}  // namespace stoker::detail
