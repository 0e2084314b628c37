// Helpers shared by stoker's tests.
#pragma once

#include <chrono>
#include <functional>
#include <thread>
#include <vector>

namespace stoker::test {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

/// Runs `n` threads of `body(index)` and joins them all.
inline void run_threads(int n, const std::function<void(int)>& body) {
  std::vector<std::jthread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) threads.emplace_back(body, i);
}

/// Milliseconds since `t0`.
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace stoker::test
