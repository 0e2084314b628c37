// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <memory>
#include <string>

#include "core/queue_contract.h"
#include "stoker/core/bounded_queue.h"

using stoker::BoundedQueue;
using namespace stoker::test;

TEST_SUITE("BoundedQueue") {
  TEST_CASE("4 producers x 4 consumers: 1,000,000 items arrive exactly once, within the bound" *
            doctest::timeout(120)) {
    BoundedQueue<std::uint32_t> q("q", 1024);
    check_exactly_once(q, 4, 4, 1'000'000);
  }

  TEST_CASE("bursts of pushes and pops: every item exactly once, within the bound" * doctest::timeout(120)) {
    for (std::size_t capacity : {std::size_t{5}, std::size_t{256}}) {
      CAPTURE(capacity);
      BoundedQueue<std::uint32_t> q("q", capacity);
      check_exactly_once_in_bursts(
          q, 3, 3, 300'000, 16, [&](auto first, std::size_t n) { return q.try_push_many(first, n); },
          [&](std::vector<std::uint32_t>& out, std::size_t max) { return q.try_pop_many(out, max); });
    }
  }

  TEST_CASE("a burst pushes what fits, leaves the rest with the caller, and pops in order" * doctest::timeout(30)) {
    BoundedQueue<std::unique_ptr<int>> q("q", 3);
    std::vector<std::unique_ptr<int>> items;
    for (int i = 0; i < 5; ++i) items.push_back(std::make_unique<int>(i));
    CHECK(q.try_push_many(items.begin(), 5) == 3);
    CHECK(q.size() == 3);
    CHECK(items[0] == nullptr);
    REQUIRE(items[3] != nullptr);  // not pushed: still the caller's
    CHECK(*items[3] == 3);
    CHECK(q.try_push_many(items.begin() + 3, 2) == 0);  // full

    std::vector<std::unique_ptr<int>> out;
    CHECK(q.try_pop_many(out, 2) == 2);
    CHECK(q.try_pop_many(out, 5) == 1);
    CHECK(q.try_pop_many(out, 5) == 0);
    REQUIRE(out.size() == 3);
    for (int i = 0; i < 3; ++i) CHECK(*out[static_cast<std::size_t>(i)] == i);  // one producer: its order

    CHECK(q.try_push_many(items.begin() + 3, 2) == 2);
    q.close();
    CHECK(q.try_push_many(items.begin(), 1) == 0);
    out.clear();
    CHECK(q.try_pop_many(out, 10) == 2);  // drains after close
    CHECK(q.try_pop_many(out, 10) == 0);
    CHECK(q.drained());
  }

  TEST_CASE("a tiny capacity is still exact and bounded" * doctest::timeout(60)) {
    BoundedQueue<std::uint32_t> q("q", 1);
    check_exactly_once(q, 3, 2, 100'000);
  }

  TEST_CASE("close() wakes blocked producers and consumers within 100 ms" * doctest::timeout(30)) {
    check_close_wakes_everyone([] { return std::make_unique<BoundedQueue<std::uint32_t>>("q", 8); });
  }

  TEST_CASE("try_ and timed variants fail on a full or empty queue without waiting forever" * doctest::timeout(30)) {
    BoundedQueue<int> q("q", 2);
    int out = 0;
    CHECK_FALSE(q.try_pop(out));
    auto t0 = Clock::now();
    CHECK_FALSE(q.pop_for(out, 30ms));
    CHECK(ms_since(t0) >= 25.0);

    CHECK(q.try_push(1));
    CHECK(q.push_for(2, 10ms));
    CHECK_FALSE(q.try_push(3));
    t0 = Clock::now();
    CHECK_FALSE(q.push_for(3, 30ms));
    CHECK(ms_since(t0) >= 25.0);
    CHECK(q.size() == 2);

    CHECK(q.pop_for(out, 10ms));
    CHECK(out == 1);
    CHECK(q.try_pop(out));
    CHECK(out == 2);
    CHECK(q.size() == 0);
  }

  TEST_CASE("move-only items, and a failed push leaves the value with the caller" * doctest::timeout(30)) {
    BoundedQueue<std::unique_ptr<std::string>> q("q", 1);
    CHECK(q.push(std::make_unique<std::string>("a")));
    auto b = std::make_unique<std::string>("b");
    CHECK_FALSE(q.try_push(std::move(b)));
    REQUIRE(b != nullptr);
    CHECK(*b == "b");

    q.close();
    CHECK_FALSE(q.push(std::move(b)));
    REQUIRE(b != nullptr);

    std::unique_ptr<std::string> out;
    CHECK(q.pop(out));
    CHECK(*out == "a");
    CHECK_FALSE(q.pop(out));
    CHECK(q.drained());
  }

  TEST_CASE("after close() consumers drain what is left, then get end-of-stream, repeatedly" * doctest::timeout(30)) {
    BoundedQueue<int> q("q", 16);
    for (int i = 0; i < 10; ++i) REQUIRE(q.push(i));
    q.close();
    CHECK(q.closed());
    CHECK_FALSE(q.drained());
    CHECK_FALSE(q.try_push(99));
    int out = 0, sum = 0, n = 0;
    while (q.pop(out)) {
      sum += out;
      ++n;
    }
    CHECK(n == 10);
    CHECK(sum == 45);
    for (int i = 0; i < 1000; ++i) CHECK_FALSE(q.pop(out));
    CHECK_FALSE(q.try_pop(out));
    CHECK_FALSE(q.pop_for(out, 1ms));
  }

  TEST_CASE("name, capacity and the time spent empty and full are reported") {
    BoundedQueue<int> q("decode->crop", 2);
    CHECK(q.name() == "decode->crop");
    CHECK(q.capacity() == 2);
    std::this_thread::sleep_for(40ms);  // empty
    q.push(1);
    q.push(2);
    std::this_thread::sleep_for(40ms);  // full
    const auto s = q.stats();
    CHECK(s.name == "decode->crop");
    CHECK(s.size == 2);
    CHECK(s.time_empty >= 35ms);
    CHECK(s.time_full >= 35ms);
    CHECK(s.time_empty + s.time_full <= s.lifetime);
  }

  TEST_CASE("capacity 0 is a configuration error") {
    CHECK_THROWS_WITH_AS(BoundedQueue<int>("q", 0), doctest::Contains("capacity"), std::invalid_argument);
  }
}
