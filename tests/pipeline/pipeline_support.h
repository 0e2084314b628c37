// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the pipeline's tests.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "stoker/core/pipeline.h"
#include "support.h"

namespace stoker::test {

/// A source of 0, 1, ..., n-1 per epoch.
struct CountUpTo {
  int n;
  int next = 0;
  std::optional<int> operator()() {
    if (next == n) {
      next = 0;  // ready for the next epoch
      return std::nullopt;
    }
    return next++;
  }
};

/// A source of 0, 1, ..., n-1 per epoch that can start anywhere (seek): in free order, a
/// pipeline whose source seeks records which items its consumer took (Pipeline::state()).
struct SeekableCount {
  int n;
  int next = 0;
  std::optional<int> operator()() {
    if (next == n) {
      next = 0;
      return std::nullopt;
    }
    return next++;
  }
  void seek(std::uint64_t k) { next = static_cast<int>(k); }
};

/// Ends the process, saying why, unless destroyed within `limit`: for a test whose failure is
/// a deadlock, which no check could report (and ctest's timeout would report only later).
class Deadline {
 public:
  Deadline(std::chrono::seconds limit, std::string what)
      : what_(std::move(what)), watcher_([this, limit] {
          std::unique_lock lock(mutex_);
          if (!done_cv_.wait_for(lock, limit, [&] { return done_; })) {
            std::fprintf(stderr, "deadlock: %s did not finish within %lld s\n", what_.c_str(),
                         static_cast<long long>(limit.count()));
            std::abort();
          }
        }) {}
  ~Deadline() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_all();
  }
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

 private:
  std::string what_;
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::jthread watcher_;  // last: starts once the rest is made, joined first
};

template <class T>
std::vector<T> drain_epoch(Pipeline<T>& p) {
  std::vector<T> out;
  for (auto& x : p.epoch()) out.push_back(std::move(x));
  return out;
}

inline std::vector<int> iota(int n) {
  std::vector<int> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

inline std::vector<int> sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  return v;
}

inline void spin_for(std::chrono::microseconds d) {
  const auto until = Clock::now() + d;
  while (Clock::now() < until) {
  }
}

}  // namespace stoker::test
