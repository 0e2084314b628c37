// SPDX-License-Identifier: Apache-2.0
#include "stoker/core/detail/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ctime>

namespace stoker::detail {

void Futex::wait(std::uint32_t seen, std::chrono::nanoseconds timeout) noexcept {
  if (timeout <= std::chrono::nanoseconds::zero()) return;
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(timeout);
  const timespec relative{static_cast<std::time_t>(s.count()), static_cast<long>((timeout - s).count())};
  syscall(SYS_futex, address(), FUTEX_WAIT_PRIVATE, seen, &relative, nullptr, 0);
}

void Futex::wait(std::uint32_t seen) noexcept {
  syscall(SYS_futex, address(), FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
}

void Futex::notify_one() noexcept {
  word_.fetch_add(1);
  syscall(SYS_futex, address(), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

}  // namespace stoker::detail
