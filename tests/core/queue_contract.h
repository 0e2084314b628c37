// SPDX-License-Identifier: Apache-2.0
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

/// `producers` threads each give `produce(values)` their share of `total` distinct items,
/// and the queue is closed once they have all returned; `consumers` threads run
/// `consume(saw)`, which pops until the end and calls `saw(v)` for each item. Every item must
/// arrive exactly once, and a monitor must never see more than the capacity.
template <class Queue, class Produce, class Consume>
void check_exactly_once_with(Queue& q, int producers, int consumers, std::uint32_t total, Produce produce,
                             Consume consume) {
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
      std::vector<std::uint32_t> mine;
      for (std::uint32_t v = static_cast<std::uint32_t>(id); v < total; v += static_cast<std::uint32_t>(producers))
        mine.push_back(v);
      produce(mine);
      if (producers_left.fetch_sub(1) == 1) q.close();
    } else {
      // The consumers start once the monitor has seen items in the queue, so that its bound
      // check is never vacuous, however the threads are scheduled on a loaded machine.
      while (max_size.load() == 0) std::this_thread::yield();
      consume([&](std::uint32_t v) {
        seen[v].fetch_add(1);
        popped.fetch_add(1);
      });
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

/// P producers and P consumers move `total` distinct items through `q` with blocking push
/// and pop.
template <class Queue>
void check_exactly_once(Queue& q, int producers, int consumers, std::uint32_t total) {
  check_exactly_once_with(
      q, producers, consumers, total,
      [&](const std::vector<std::uint32_t>& values) {
        for (std::uint32_t v : values) REQUIRE(q.push(v));
      },
      [&](auto saw) {
        for (std::uint32_t v; q.pop(v);) saw(v);
      });
}

/// The same with every push and pop a burst of up to `burst` items: `push_some(first, n)`
/// pushes a prefix of n items and says how many, `pop_some(out, max)` appends up to max and
/// says how many; neither waits. Consumers stop once the queue is drained.
template <class Queue, class PushSome, class PopSome>
void check_exactly_once_in_bursts(Queue& q, int producers, int consumers, std::uint32_t total, std::size_t burst,
                                  PushSome push_some, PopSome pop_some) {
  check_exactly_once_with(
      q, producers, consumers, total,
      [&](std::vector<std::uint32_t>& values) {
        for (std::size_t next = 0; next < values.size();) {
          const std::size_t n = std::min(burst, values.size() - next);
          const std::size_t k = push_some(values.begin() + static_cast<std::ptrdiff_t>(next), n);
          REQUIRE(k <= n);
          next += k;
          if (k == 0) std::this_thread::yield();  // full
        }
      },
      [&](auto saw) {
        std::vector<std::uint32_t> got;
        while (!q.drained()) {
          got.clear();
          const std::size_t k = pop_some(got, burst);
          REQUIRE(k == got.size());
          REQUIRE(k <= burst);
          for (std::uint32_t v : got) saw(v);
          if (k == 0) std::this_thread::yield();
        }
      });
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
