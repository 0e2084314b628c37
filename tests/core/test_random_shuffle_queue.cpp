// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <string>

#include "core/queue_contract.h"
#include "stoker/core/random_shuffle_queue.h"

using stoker::RandomShuffleQueue;
using stoker::ShuffleOptions;
using stoker::ShuffleRule;
using namespace stoker::test;

namespace {

using Queue = RandomShuffleQueue<std::uint32_t>;

// Pushes 0..n-1 and pops everything, one thread, the consumer keeping up: each pop
// happens as soon as it is allowed. Returns the output order.
std::vector<std::uint32_t> shuffle_sequentially(ShuffleOptions o, std::uint32_t n,
                                                ShuffleRule rule = ShuffleRule::all_held) {
  Queue q("q", o, rule);
  std::vector<std::uint32_t> out;
  std::uint32_t v;
  for (std::uint32_t i = 0; i < n; ++i) {
    REQUIRE(q.try_push(i));
    if (q.try_pop(v)) out.push_back(v);
  }
  q.close();
  while (q.pop(v)) out.push_back(v);
  return out;
}

// Same, with a producer and a consumer thread that run at varying speeds.
std::vector<std::uint32_t> shuffle_threaded(ShuffleOptions o, std::uint32_t n, std::uint64_t jitter_seed,
                                            ShuffleRule rule = ShuffleRule::all_held) {
  Queue q("q", o, rule);
  std::vector<std::uint32_t> out;
  run_threads(2, [&](int id) {
    stoker::Rng jitter(jitter_seed + static_cast<std::uint64_t>(id));
    if (id == 0) {
      for (std::uint32_t i = 0; i < n; ++i) {
        REQUIRE(q.push(i));
        if (jitter.below(64) == 0) std::this_thread::sleep_for(std::chrono::microseconds(jitter.below(200)));
      }
      q.close();
    } else {
      std::uint32_t v;
      while (q.pop(v)) {
        out.push_back(v);
        if (jitter.below(64) == 0) std::this_thread::sleep_for(std::chrono::microseconds(jitter.below(200)));
      }
    }
  });
  return out;
}

bool is_permutation_of_iota(std::vector<std::uint32_t> v, std::uint32_t n) {
  if (v.size() != n) return false;
  std::sort(v.begin(), v.end());
  for (std::uint32_t i = 0; i < n; ++i)
    if (v[i] != i) return false;
  return true;
}

double chi_square(const std::vector<double>& observed, double expected) {
  double x = 0;
  for (double o : observed) x += (o - expected) * (o - expected) / expected;
  return x;
}

}  // namespace

TEST_SUITE("RandomShuffleQueue") {
  TEST_CASE("shuffle queue, 4 producers x 4 consumers: 1,000,000 items arrive exactly once, within the bound" *
            doctest::timeout(120)) {
    Queue q("q", {.capacity = 1000, .min_after_dequeue = 200, .seed = 1});
    check_exactly_once(q, 4, 4, 1'000'000);
  }

  TEST_CASE("shuffle queue: close() wakes blocked producers and consumers within 100 ms" * doctest::timeout(30)) {
    check_close_wakes_everyone(
        [] { return std::make_unique<Queue>("q", ShuffleOptions{.capacity = 8, .min_after_dequeue = 3}); });
  }

  TEST_CASE("oldest_window: each dequeue is uniform over the oldest min_after_dequeue + 1 held elements") {
    // Model the queue's contents alongside it and record, for every dequeue, the age rank
    // of the element taken among those held. FIFO always gives rank 0, a queue that
    // favours recent elements gives high ranks; a fair one gives every rank equally often.
    constexpr std::size_t kMad = 19;
    constexpr std::uint32_t kItems = 200'000;
    Queue q("q", {.capacity = 256, .min_after_dequeue = kMad, .seed = 42}, ShuffleRule::oldest_window);
    std::set<std::uint32_t> held;
    std::vector<double> rank_count(kMad + 1, 0.0);
    std::uint32_t v;
    std::size_t pops = 0;
    for (std::uint32_t i = 0; i < kItems; ++i) {
      REQUIRE(q.try_push(i));
      held.insert(i);
      // Let the producer run ahead at times: the window must still be the oldest ones.
      if (i % 1000 < 900) {
        while (q.try_pop(v)) {
          auto it = held.find(v);
          REQUIRE(it != held.end());
          const auto rank = static_cast<std::size_t>(std::distance(held.begin(), it));
          REQUIRE(rank <= kMad);
          rank_count[rank] += 1;
          held.erase(it);
          ++pops;
        }
      }
    }
    const double expected = static_cast<double>(pops) / (kMad + 1);
    // 19 degrees of freedom: P(chi2 > 43.8) = 0.001.
    CHECK(chi_square(rank_count, expected) < 43.8);
  }

  TEST_CASE("the first dequeue is uniform over the first min_after_dequeue + 1 pushed") {
    constexpr std::uint32_t kMad = 9;
    constexpr int kTrials = 20'000;
    std::vector<double> first(kMad + 1, 0.0);
    for (int t = 0; t < kTrials; ++t) {
      Queue q("q", {.capacity = 32, .min_after_dequeue = kMad, .seed = stoker::derive_seed(7, t)});
      std::uint32_t v = 0;
      for (std::uint32_t i = 0; i <= kMad; ++i) REQUIRE(q.try_push(i));
      REQUIRE(q.try_pop(v));
      first[v] += 1;
    }
    // 9 degrees of freedom: P(chi2 > 27.9) = 0.001.
    CHECK(chi_square(first, kTrials / double(kMad + 1)) < 27.9);
  }

  TEST_CASE("oldest_window: elements travel about as far as a window of min_after_dequeue + 1 predicts") {
    // Each element stays in the window a geometric number of dequeues with mean m + 1, so
    // its mean distance from its input position is close to 2m/e (about 0.74 m).
    constexpr std::size_t kMad = 500;
    constexpr std::uint32_t kItems = 100'000;
    const auto out = shuffle_sequentially({.capacity = 1000, .min_after_dequeue = kMad, .seed = 3}, kItems,
                                          ShuffleRule::oldest_window);
    REQUIRE(is_permutation_of_iota(out, kItems));
    double total = 0;
    for (std::uint32_t pos = 0; pos < kItems; ++pos) total += std::abs(double(out[pos]) - double(pos));
    const double mean = total / kItems;
    CHECK(mean > 0.6 * kMad);
    CHECK(mean < 0.9 * kMad);
  }

  TEST_CASE("oldest_window, one producer, one consumer: the order is a function of the seed alone" *
            doctest::timeout(60)) {
    constexpr auto kRule = ShuffleRule::oldest_window;
    const ShuffleOptions o{.capacity = 300, .min_after_dequeue = 100, .seed = 11};
    const auto a = shuffle_threaded(o, 20'000, 1, kRule);
    const auto b = shuffle_threaded(o, 20'000, 2, kRule);
    const auto c = shuffle_sequentially(o, 20'000, kRule);
    REQUIRE(is_permutation_of_iota(a, 20'000));
    CHECK(a == b);
    CHECK(a == c);
    auto other = o;
    other.seed = 12;
    CHECK(shuffle_threaded(other, 20'000, 1, kRule) != a);
  }

  TEST_CASE("all_held: each dequeue is uniform over everything held, whatever its age") {
    // As the oldest_window case, with the producer running far ahead: the rank (by age) of the
    // element taken among all held is uniform. The oldest-window rule never takes a rank past
    // min_after_dequeue, and fails this.
    constexpr std::size_t kMad = 4, kCapacity = 40;
    constexpr std::uint32_t kItems = 400'000;
    Queue q("q", {.capacity = kCapacity, .min_after_dequeue = kMad, .seed = 42});
    std::set<std::uint32_t> held;
    std::vector<double> rank_count(kCapacity, 0.0);
    std::uint32_t v;
    std::size_t pops = 0;
    for (std::uint32_t i = 0; i < kItems; ++i) {
      REQUIRE(q.try_push(i));
      held.insert(i);
      if (held.size() == kCapacity) {  // full: take one, whose rank among all 40 is uniform
        REQUIRE(q.try_pop(v));
        auto it = held.find(v);
        REQUIRE(it != held.end());
        rank_count[static_cast<std::size_t>(std::distance(held.begin(), it))] += 1;
        held.erase(it);
        ++pops;
      }
    }
    // 39 degrees of freedom: P(chi2 > 72.1) = 0.001.
    CHECK(chi_square(rank_count, static_cast<double>(pops) / kCapacity) < 72.1);
  }

  TEST_CASE("all_held: with a slow consumer, elements travel as TensorFlow's rule makes them, not as a window's") {
    // The producer keeps the queue full (capacity = 5 * min_after_dequeue) and each pop is
    // followed by one push. A reference model of TensorFlow's rule (uniform over everything
    // held) and one of the window rule (uniform over the oldest min_after_dequeue + 1), each
    // with a generator of its own, give the distribution of how far an element moves (output
    // position minus arrival position). The queue's distribution, binned at the deciles of
    // the TensorFlow model's, must fit it and not the window model's.
    constexpr std::size_t kMad = 200, kCapacity = 5 * kMad;
    constexpr std::uint32_t kItems = 200'000;
    const auto displacements = [&](auto&& take_from_held) {
      std::vector<std::int64_t> moved;
      std::vector<std::uint32_t> held;
      std::uint32_t next = 0;
      std::int64_t out_pos = 0;
      while (held.size() < kCapacity) held.push_back(next++);
      while (!held.empty()) {
        const std::uint32_t v = take_from_held(held);
        moved.push_back(out_pos++ - static_cast<std::int64_t>(v));
        if (next < kItems) held.push_back(next++);
      }
      return moved;
    };
    std::mt19937_64 model_rng(1);
    auto uniform_below = [&](std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(model_rng); };
    const auto tf_model = displacements([&](std::vector<std::uint32_t>& held) {
      const std::size_t i = uniform_below(held.size());
      const std::uint32_t v = held[i];
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
      return v;
    });
    const auto window_model = displacements([&](std::vector<std::uint32_t>& held) {
      const std::size_t i = uniform_below(std::min(held.size(), kMad + 1));  // held is in arrival order
      const std::uint32_t v = held[i];
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
      return v;
    });
    Queue q("q", {.capacity = kCapacity, .min_after_dequeue = kMad, .seed = 5});
    std::size_t pushed = 0;
    const auto queue = displacements([&](std::vector<std::uint32_t>& held) {
      // The queue holds what the model holds: push what it lacks, then pop one.
      while (pushed < held.back() + 1u) REQUIRE(q.try_push(static_cast<std::uint32_t>(pushed++)));
      if (held.size() <= kMad) q.close();  // the end: the remainder drains
      std::uint32_t v = 0;
      REQUIRE(q.try_pop(v));
      held.erase(std::find(held.begin(), held.end(), v));
      return v;
    });
    REQUIRE(queue.size() == kItems);
    auto sorted_model = tf_model;
    std::sort(sorted_model.begin(), sorted_model.end());
    std::vector<std::int64_t> deciles;
    for (int d = 1; d < 10; ++d)
      deciles.push_back(sorted_model[sorted_model.size() * static_cast<std::size_t>(d) / 10]);
    const auto chi = [&](const std::vector<std::int64_t>& sample) {
      std::vector<double> bins(10, 0.0);
      for (auto m : sample)
        bins[static_cast<std::size_t>(std::upper_bound(deciles.begin(), deciles.end(), m) - deciles.begin())] += 1;
      std::vector<double> expected(10, 0.0);
      for (auto m : tf_model)
        expected[static_cast<std::size_t>(std::upper_bound(deciles.begin(), deciles.end(), m) - deciles.begin())] += 1;
      double x = 0;
      for (std::size_t b = 0; b < 10; ++b) x += (bins[b] - expected[b]) * (bins[b] - expected[b]) / expected[b];
      return x;
    };
    MESSAGE("chi-square against the TensorFlow model: queue " << chi(queue) << ", window model " << chi(window_model));
    // 9 degrees of freedom; successive displacements are correlated, so the threshold is
    // generous: P(chi2 > 60) is negligible for independent draws. The window model is far off.
    CHECK(chi(queue) < 60.0);
    CHECK(chi(window_model) > 1000.0);
  }

  TEST_CASE("fewer elements than min_after_dequeue still drain, in random order, after close") {
    Queue q("q", {.capacity = 1000, .min_after_dequeue = 500, .seed = 5});
    std::uint32_t v;
    for (std::uint32_t i = 0; i < 100; ++i) REQUIRE(q.push(i));
    CHECK_FALSE(q.try_pop(v));  // not enough held yet
    q.close();
    std::vector<std::uint32_t> out;
    while (q.pop(v)) out.push_back(v);
    CHECK(is_permutation_of_iota(out, 100));
    CHECK_FALSE(std::is_sorted(out.begin(), out.end()));
    CHECK(q.drained());
  }

  TEST_CASE("pop_many takes the same elements in the same order as that many pops") {
    const ShuffleOptions o{.capacity = 100, .min_after_dequeue = 20, .seed = 9};
    Queue single("a", o), many("b", o);
    for (std::uint32_t i = 0; i < 100; ++i) {
      REQUIRE(single.push(i));
      REQUIRE(many.push(i));
    }
    std::vector<std::uint32_t> by_one, by_many;
    std::uint32_t v;
    for (int k = 0; k < 30; ++k) {
      REQUIRE(single.pop(v));
      by_one.push_back(v);
    }
    CHECK(many.pop_many(by_many, 30) == 30);
    CHECK(by_one == by_many);
    CHECK(many.size() == 70);
  }

  TEST_CASE("shuffle queue: bursts of pushes and pops, every item exactly once, within the bound" *
            doctest::timeout(120)) {
    RandomShuffleQueue<std::uint32_t> q("q", {.capacity = 300, .min_after_dequeue = 100, .seed = 3});
    check_exactly_once_in_bursts(
        q, 3, 3, 200'000, 16,
        [&](auto first, std::size_t n) { return q.try_push_many(first, first + static_cast<std::ptrdiff_t>(n)); },
        [&](std::vector<std::uint32_t>& out, std::size_t max) { return q.try_pop_some(out, max); });
  }

  TEST_CASE("try_pop_some takes what may be taken now, as that many pops would") {
    const ShuffleOptions o{.capacity = 50, .min_after_dequeue = 10, .seed = 99};
    RandomShuffleQueue<int> a("a", o), b("b", o);
    std::vector<int> values(30);
    std::iota(values.begin(), values.end(), 0);
    CHECK(a.try_push_many(values.begin(), values.end()) == 30);
    for (int v : values) REQUIRE(b.try_push(v));
    std::vector<int> got;
    CHECK(a.try_pop_some(got, 8) == 8);
    CHECK(a.try_pop_some(got, 100) == 12);  // 20 held: 10 may go, 10 must stay
    CHECK(a.try_pop_some(got, 100) == 0);
    std::vector<int> want;
    for (int v; want.size() < 20 && b.try_pop(v);) want.push_back(v);
    CHECK(got == want);
    a.close();
    CHECK(a.try_pop_some(got, 100) == 10);  // the rest drains after close
    CHECK(a.drained());
    std::vector<int> full(60, 7);
    RandomShuffleQueue<int> c("c", o);
    CHECK(c.try_push_many(full.begin(), full.end()) == 50);  // as far as there is room
  }

  TEST_CASE("pop_many after close: a short final batch is taken or left by option") {
    Queue q("q", {.capacity = 100, .min_after_dequeue = 10, .seed = 9});
    for (std::uint32_t i = 0; i < 25; ++i) REQUIRE(q.push(i));
    std::vector<std::uint32_t> out;
    CHECK(q.try_pop_many(out, 10) == 10);  // 25 held, 10 may go
    CHECK(q.try_pop_many(out, 10) == 0);   // 15 held: one more batch would leave 5 < 10
    q.close();
    CHECK(q.pop_many(out, 10, false) == 10);
    CHECK(q.pop_many(out, 10, false) == 0);  // 5 left: not a full batch, left in place
    CHECK(q.size() == 5);
    CHECK(q.pop_many(out, 10, true) == 5);
    CHECK(is_permutation_of_iota(out, 25));
    CHECK(q.pop_many(out, 10, true) == 0);
  }

  TEST_CASE("impossible configurations are rejected with a message naming the option") {
    CHECK_THROWS_WITH_AS(Queue("q", {.capacity = 10, .min_after_dequeue = 10}), doctest::Contains("min_after_dequeue"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(Queue("q", {.capacity = 0, .min_after_dequeue = 0}), doctest::Contains("capacity"),
                         std::invalid_argument);
    Queue q("q", {.capacity = 10, .min_after_dequeue = 4});
    std::vector<std::uint32_t> out;
    CHECK_THROWS_WITH_AS(q.pop_many(out, 7), doctest::Contains("capacity - min_after_dequeue"), std::invalid_argument);
  }

  TEST_CASE("move-only elements") {
    RandomShuffleQueue<std::unique_ptr<int>> q("q", {.capacity = 4, .min_after_dequeue = 1});
    for (int i = 0; i < 4; ++i) REQUIRE(q.push(std::make_unique<int>(i)));
    q.close();
    std::vector<std::unique_ptr<int>> out;
    CHECK(q.pop_many(out, 3) == 3);
    std::unique_ptr<int> last;
    CHECK(q.pop(last));
    int sum = *last;
    for (auto& p : out) sum += *p;
    CHECK(sum == 6);
  }
}
