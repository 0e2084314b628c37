// Helpers shared by the pipeline's tests.
#pragma once

#include <algorithm>
#include <chrono>
#include <numeric>
#include <optional>
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
