// Behaviour every stoker queue shares, checked against each queue type.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "support.h"

namespace stoker::test {

/// P producers and P consumers move `total` distinct items through `q`; every item must
/// arrive exactly once and a monitor must never see more than the capacity.
template <class Queue>
void check_exactly_once(Queue& q, int producers, int consumers, std::uint32_t total) {
  std::vector<std::atomic<std::uint8_t>> seen(total);
  std::atomic<bool> done{false};
  std::atomic<std::size_t> max_size{0};
  std::atomic<std::uint64_t> popped{0};
  std::atomic<int> producers_left{producers};

  std::jthread monitor([&] {
    while (!done.load()) {
      const auto s = q.size();
      if (s > max_size.load()) max_size.store(s);
    }
  });
  run_threads(producers + consumers, [&](int id) {
    if (id < producers) {
      for (std::uint32_t v = static_cast<std::uint32_t>(id); v < total; v += static_cast<std::uint32_t>(producers))
        REQUIRE(q.push(v));
      if (producers_left.fetch_sub(1) == 1) q.close();
    } else {
      std::uint32_t v;
      while (q.pop(v)) {
        seen[v].fetch_add(1);
        popped.fetch_add(1);
      }
    }
  });
  done = true;
  monitor.join();

  CHECK(popped.load() == total);
  std::uint32_t lost = 0, repeated = 0;
  for (auto& s : seen) {
    lost += s.load() == 0;
    repeated += s.load() > 1;
  }
  CHECK(lost == 0);
  CHECK(repeated == 0);
  CHECK(max_size.load() <= q.capacity());
  CHECK(max_size.load() > 0);
}

/// As check_exactly_once, with every push and pop a burst of up to `burst` items:
/// `push_some(first, n)` pushes a prefix of n items and says how many, `pop_some(out, max)`
/// appends up to max and says how many; neither waits. Consumers stop once the queue is drained.
template <class Queue, class PushSome, class PopSome>
void check_exactly_once_in_bursts(Queue& q, int producers, int consumers, std::uint32_t total, std::size_t burst,
                                  PushSome push_some, PopSome pop_some) {
  std::vector<std::atomic<std::uint8_t>> seen(total);
  std::atomic<bool> done{false};
  std::atomic<std::size_t> max_size{0};
  std::atomic<int> producers_left{producers};

  std::jthread monitor([&] {
    while (!done.load()) {
      const auto s = q.size();
      if (s > max_size.load()) max_size.store(s);
    }
  });
  run_threads(producers + consumers, [&](int id) {
    if (id < producers) {
      std::vector<std::uint32_t> mine;
      for (std::uint32_t v = static_cast<std::uint32_t>(id); v < total; v += static_cast<std::uint32_t>(producers))
        mine.push_back(v);
      for (std::size_t next = 0; next < mine.size();) {
        const std::size_t n = std::min(burst, mine.size() - next);
        const std::size_t k = push_some(mine.begin() + static_cast<std::ptrdiff_t>(next), n);
        REQUIRE(k <= n);
        next += k;
        if (k == 0) std::this_thread::yield();  // full
      }
      if (producers_left.fetch_sub(1) == 1) q.close();
    } else {
      std::vector<std::uint32_t> got;
      while (!q.drained()) {
        got.clear();
        const std::size_t k = pop_some(got, burst);
        REQUIRE(k == got.size());
        REQUIRE(k <= burst);
        for (std::uint32_t v : got) seen[v].fetch_add(1);
        if (k == 0) std::this_thread::yield();
      }
    }
  });
  done = true;
  monitor.join();

  std::uint32_t lost = 0, repeated = 0;
  for (auto& s : seen) {
    lost += s.load() == 0;
    repeated += s.load() > 1;
  }
  CHECK(lost == 0);
  CHECK(repeated == 0);
  CHECK(max_size.load() <= q.capacity());
  CHECK(max_size.load() > 0);
}

/// Threads blocked in push on a full queue and in pop on an empty one all return
/// within 100 ms of close(): pushes fail, pops report end-of-stream.
template <class MakeQueue>
void check_close_wakes_everyone(MakeQueue make_queue) {
  constexpr int kThreads = 4;
  auto full = make_queue();
  auto empty = make_queue();
  std::uint32_t v = 0;
  while (full->try_push(v)) ++v;

  std::atomic<int> blocked{0};
  std::vector<Clock::time_point> returned(2 * kThreads);
  std::vector<int> result(2 * kThreads, -1);
  Clock::time_point closed_at;
  run_threads(2 * kThreads + 1, [&](int id) {
    if (id < kThreads) {
      blocked.fetch_add(1);
      result[id] = full->push(std::uint32_t{12345});
      returned[id] = Clock::now();
    } else if (id < 2 * kThreads) {
      std::uint32_t out;
      blocked.fetch_add(1);
      result[id] = empty->pop(out);
      returned[id] = Clock::now();
    } else {
      while (blocked.load() < 2 * kThreads) std::this_thread::yield();
      std::this_thread::sleep_for(50ms);  // let them reach their wait
      closed_at = Clock::now();
      full->close();
      empty->close();
    }
  });
  for (int i = 0; i < 2 * kThreads; ++i) {
    CAPTURE(i);
    CHECK(result[i] == 0);
    CHECK(std::chrono::duration<double, std::milli>(returned[i] - closed_at).count() < 100.0);
  }
  // What was in the full queue before close() still drains, then end-of-stream.
  std::uint32_t out, drained = 0;
  while (full->pop(out)) ++drained;
  CHECK(drained == v);
  CHECK(full->drained());
}

}  // namespace stoker::test
