// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>
#include <set>
#include <sstream>
#include <thread>
#include <time.h>

#include "pipeline/pipeline_support.h"
#include "stoker/core/pipeline.h"

using namespace stoker;
using namespace stoker::test;

namespace {

// An endless pipeline whose call for item 10 takes `call`, under way once this is made:
// `returned` says whether it has returned.
struct OneSlowCall {
  explicit OneSlowCall(std::chrono::milliseconds call)
      : pipe(PipelineBuilder{}
                 .threads(2)
                 .source("read", [n = 0]() mutable { return std::optional<int>(n++); })
                 .map("slow",
                      [this, call](int x) {
                        if (x == 10) {
                          inside = true;
                          std::this_thread::sleep_for(call);
                          returned = true;
                        }
                        return x;
                      },
                      {.max_chunk = 1})
                 .build()) {
    while (!inside.load()) std::this_thread::sleep_for(1ms);
  }
  std::atomic<bool> inside{false}, returned{false};
  Pipeline<int> pipe;
};

}  // namespace

TEST_SUITE("Pipeline") {
  TEST_CASE("1 -> 1 and 1 -> k stages deliver every item exactly once, at several thread counts" *
            doctest::timeout(120)) {
    constexpr int kItems = 20'000;
    for (int budget : {1, 2, 4}) {
      for (int threads : {1, 2, 4}) {
        CAPTURE(budget);
        CAPTURE(threads);
        auto pipe = PipelineBuilder{}
                        .threads(budget)
                        .epochs(1)
                        .source("read", CountUpTo{kItems}, {.queue = 16})
                        .map("square", [](int x) { return x * 2; }, {.threads = threads, .queue = 16})
                        // x -> x % 3 copies of x: zero, one or two outputs per input
                        .flat_map<int>("copies",
                                       [](int x, Emitter<int>& emit) {
                                         for (int i = 0; i < x % 3; ++i) emit(x);
                                       },
                                       {.threads = threads, .queue = 16})
                        .build();
        const auto out = sorted(drain_epoch(pipe));
        std::vector<int> expected;
        for (int x = 0; x < kItems; ++x)
          for (int i = 0; i < (2 * x) % 3; ++i) expected.push_back(2 * x);
        std::sort(expected.begin(), expected.end());
        CHECK(out == expected);
        CHECK(pipe.finished());
        CHECK_FALSE(pipe.next().has_value());
      }
    }
  }

  TEST_CASE("items in flight never exceed the queue capacities plus what the running bodies hold" *
            doctest::timeout(60)) {
    // Every live Item is counted; the consumer is slow, so every queue fills up.
    static std::atomic<int> live{0}, max_live{0};
    struct Item {
      bool owns = true;
      explicit Item(int) { note(live.fetch_add(1) + 1); }
      Item(Item&& o) noexcept : owns(std::exchange(o.owns, false)) {}
      Item& operator=(Item&& o) noexcept {
        if (owns) live.fetch_sub(1);
        owns = std::exchange(o.owns, false);
        return *this;
      }
      ~Item() {
        if (owns) live.fetch_sub(1);
      }
      static void note(int n) {
        int m = max_live.load();
        while (n > m && !max_live.compare_exchange_weak(m, n)) {
        }
      }
    };
    constexpr std::size_t kQueue = 8;
    constexpr int kThreads = 2;
    bool deterministic = false, autotune = false;
    int fan_out = 3, inputs = 2000;
    SUBCASE("free order") {}
    // A budget of 16: each stage holds chunks for the threads it has, not for the budget (no
    // decision falls within the run, so they stay at kThreads).
    SUBCASE("autotune with a large budget") { autotune = true; }
    SUBCASE("deterministic mode") { deterministic = true; }
    // One call emits many chunks' worth: its emits wait for room, as a file read into records.
    SUBCASE("a flat_map with a fan-out of 1000") { fan_out = 1000, inputs = 20; }
    SUBCASE("a flat_map with a fan-out of 1000, deterministic mode") {
      fan_out = 1000, inputs = 20, deterministic = true;
    }
    live = 0;
    max_live = 0;
    {
      PipelineBuilder builder;
      if (autotune) builder.threads(16).autotune({.interval = 60s});
      auto pipe =
          std::move(builder)
              .threads(autotune ? 16 : 4)
              .epochs(1)
              .deterministic(deterministic)
              .source("read",
                      [n = 0, inputs]() mutable { return n < inputs ? std::optional<Item>(Item(n++)) : std::nullopt; },
                      {.queue = kQueue})
              .map("pass", [](Item x) { return x; }, {.threads = kThreads, .queue = kQueue})
              .flat_map<Item>("split",
                              [fan_out](Item, Emitter<Item>& emit) {
                                for (int i = 0; i < fan_out; ++i) emit(Item(i));
                              },
                              {.threads = kThreads, .queue = kQueue})
              .build();
      int n = 0;
      while (auto x = pipe.next()) {
        if (++n % 100 == 0) std::this_thread::sleep_for(1ms);
      }
      CHECK(n == inputs * fan_out);
    }
    // The documented bound: the queues' capacities, plus for each body a chunk of inputs and two
    // of outputs (one on its way, one being made), plus the consumer's chunk; a chunk is at
    // most half its queue.
    constexpr int kChunk = kQueue / 2;
    const int bound = 3 * kQueue + 1 * kChunk /* read */ + kThreads * 3 * kChunk /* pass */ +
                      kThreads * 3 * kChunk /* split */ + kChunk /* consumer */;
    CAPTURE(deterministic);
    CAPTURE(fan_out);
    CAPTURE(autotune);
    CHECK(max_live.load() <= bound);
    CHECK(max_live.load() >= static_cast<int>(3 * kQueue) - 2);  // the queues did fill up
    CHECK(live.load() == 0);
  }

  TEST_CASE("a budget of one oneTBB thread still runs a pipeline of parallel stages to the end" *
            doctest::timeout(60)) {
    for (int budget : {1, 2}) {
      CAPTURE(budget);
      auto pipe = PipelineBuilder{}
                      .threads(budget)
                      .epochs(2)
                      .source("read", CountUpTo{5000}, {.queue = 2})
                      .map("a", [](int x) { return x + 1; }, {.threads = 4, .queue = 2})
                      .map("b", [](int x) { return x - 1; }, {.threads = 3, .queue = 2})
                      .shuffle("shuffle", {.capacity = 64, .min_after_dequeue = 16, .seed = 1})
                      .batch("batch", 10)
                      .build();
      for (int e = 0; e < 2; ++e) {
        std::vector<int> all;
        for (auto& b : pipe.epoch()) all.insert(all.end(), b.begin(), b.end());
        CHECK(sorted(all) == iota(5000));
      }
      CHECK(pipe.finished());
    }
  }
}

TEST_SUITE("Pipeline") {
  TEST_CASE("an exception in any stage reaches the consumer with the stage's name" * doctest::timeout(60)) {
    for (std::string failing : {"read", "decode", "crops", "late"}) {
      CAPTURE(failing);
      auto thrower = [failing](const std::string& here, int x) {
        if (here == failing && x == 500) throw std::runtime_error("bad item " + std::to_string(x));
      };
      auto pipe = PipelineBuilder{}
                      .threads(2)
                      .source("read",
                              [n = 0, thrower]() mutable -> std::optional<int> {
                                thrower("read", n);
                                return n++;
                              })
                      .map("decode",
                           [thrower](int x) {
                             thrower("decode", x);
                             return x;
                           },
                           {.threads = 2})
                      .flat_map<int>("crops",
                                     [thrower](int x, Emitter<int>& emit) {
                                       thrower("crops", x);
                                       emit(x);
                                       emit(x);
                                     },
                                     {.threads = 2})
                      .shuffle("shuffle", {.capacity = 100, .min_after_dequeue = 10})
                      .map("late",
                           [thrower](int x) {
                             thrower("late", x);
                             return x;
                           })
                      .batch("batch", 7)
                      .build();
      std::string caught;
      try {
        while (pipe.next()) {
        }
      } catch (const StageError& e) {
        caught = e.stage();
        CHECK(std::string(e.what()).find("bad item 500") != std::string::npos);
        CHECK(std::string(e.what()).find("'" + failing + "'") != std::string::npos);
      }
      CHECK(caught == failing);
      CHECK(pipe.finished());                    // a loop over epochs() that catches the error ends
      CHECK_THROWS_AS(pipe.next(), StageError);  // and again, not a silent end
    }
  }

  TEST_CASE("stop() from a stage function stops the run without waiting for itself" * doctest::timeout(30)) {
    for (int threads : {1, 2}) {
      for (bool from_source : {false, true}) {
        CAPTURE(threads);
        CAPTURE(from_source);
        std::atomic<Pipeline<int>*> self{nullptr};
        auto stop_at = [&](int x) {
          if (x == 1000)
            if (auto* p = self.load()) p->stop();
        };
        auto pipe = PipelineBuilder{}
                        .threads(threads)
                        .source("read",
                                [&, n = 0]() mutable -> std::optional<int> {
                                  if (from_source) stop_at(n);
                                  return n++;
                                })
                        .map("check",
                             [&](int x) {
                               if (!from_source) stop_at(x);
                               return x;
                             },
                             {.threads = threads})
                        .build();
        self = &pipe;
        while (pipe.next()) {
        }
        CHECK(pipe.finished());
        pipe.stop();  // the consumer's: waits for every body
      }
    }
  }

  // A stage function runs a parallel_for through `in_arena` (directly, or in an arena of its
  // own); an iteration on a thread other than the body's stops the pipeline while the body waits
  // for it. Runs for at most 10 s and checks that such an iteration did stop the run.
  template <class InArena>
  void stop_from_an_iteration(int threads, InArena in_arena) {
    std::atomic<Pipeline<int>*> self{nullptr};
    std::atomic<bool> stopped_elsewhere{false};
    auto pipe = PipelineBuilder{}
                    .threads(threads)
                    .source("read", [n = 0]() mutable { return std::optional<int>(n++); })  // endless
                    .map("parallel",
                         [&](int x) {
                           const auto body_thread = std::this_thread::get_id();
                           in_arena([&] {
                             tbb::parallel_for(
                                 0, 64,
                                 [&](int) {
                                   spin_for(100us);
                                   if (std::this_thread::get_id() == body_thread || x < 10) return;
                                   if (auto* p = self.load(); p != nullptr && !stopped_elsewhere.exchange(true))
                                     p->stop();
                                 },
                                 tbb::simple_partitioner{});
                           });
                           return x;
                         })
                    .build();
    self = &pipe;
    const auto t0 = Clock::now();
    while (pipe.next() && ms_since(t0) < 10'000.0) {
    }
    CHECK(stopped_elsewhere.load());  // another thread took an iteration, and stopped the run
    CHECK(pipe.finished());
    pipe.stop();  // the consumer's: waits for every body
  }

  TEST_CASE("stop() from oneTBB work of a stage function, on another of the pipeline's threads, does not deadlock" *
            doctest::timeout(60)) {
    // The stage function's parallel_for runs on the pipeline's threads, which steal its
    // iterations: the stop() comes from an iteration on a thread other than the body's.
    const Deadline deadline(30s, "a pipeline stopped from a stolen parallel_for iteration");
    for (int threads : {2, 4}) {
      CAPTURE(threads);
      stop_from_an_iteration(threads, [](auto&& work) { work(); });
    }
  }

  TEST_CASE("stop() from a worker of a stage function's own task_arena does not deadlock" * doctest::timeout(60)) {
    // The stage function runs its parallel_for in an arena of its own: oneTBB's workers, not the
    // pipeline's threads, steal its iterations, and one of them stops the run while the body
    // waits for it.
    const Deadline deadline(30s, "a pipeline stopped from a worker of a stage function's own arena");
    tbb::task_arena arena(2);
    stop_from_an_iteration(1, [&](auto&& work) { arena.execute(work); });
  }

  TEST_CASE("a second stop(), made while the first waits, also returns only once every body has returned" *
            doctest::timeout(30)) {
    // A consumer that frees what its stages use after its stop() must find them all returned,
    // whoever stopped first.
    OneSlowCall run(300ms);
    std::jthread first([&] { run.pipe.stop(); });
    std::this_thread::sleep_for(20ms);  // the first stop() waits for the slow call
    run.pipe.stop();
    CHECK(run.returned.load());
  }

  TEST_CASE("stop() waits for the bodies asleep, not spinning, whether it stops or waits for another stop()" *
            doctest::timeout(30)) {
    auto cpu_ms = [] {
      timespec t{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
      return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
    };
    for (bool second : {false, true}) {
      CAPTURE(second);
      OneSlowCall run(400ms);
      std::optional<std::jthread> first;
      if (second) {
        first.emplace([&] { run.pipe.stop(); });
        std::this_thread::sleep_for(20ms);
      }
      const double cpu0 = cpu_ms();
      const auto t0 = Clock::now();
      run.pipe.stop();
      CHECK(ms_since(t0) > 200.0);    // it did wait for the slow call
      CHECK(cpu_ms() - cpu0 < 50.0);  // asleep: a thread that spins burns most of the 400 ms
    }
  }

  TEST_CASE("stop() mid-epoch returns within 1 s with every stage body finished" * doctest::timeout(30)) {
    static std::atomic<int> inside{0};
    for (bool by_destructor : {false, true}) {
      CAPTURE(by_destructor);
      auto slow = [](int x) {
        inside.fetch_add(1);
        std::this_thread::sleep_for(2ms);
        inside.fetch_sub(1);
        return x;
      };
      std::optional<Pipeline<int>> pipe;
      pipe.emplace(PipelineBuilder{}
                       .threads(4)
                       .source("read", [n = 0]() mutable { return std::optional<int>(n++); })  // endless
                       .map("slow", slow, {.threads = 4})
                       .map("slow2", slow, {.threads = 2})
                       .build());
      for (int i = 0; i < 50; ++i) REQUIRE(pipe->next());
      const auto t0 = Clock::now();
      if (by_destructor)
        pipe.reset();
      else
        pipe->stop();
      CHECK(ms_since(t0) < 1000.0);
      CHECK(inside.load() == 0);
      if (!by_destructor) {
        CHECK_FALSE(pipe->next());
        CHECK(pipe->finished());
      }
    }
  }

  TEST_CASE("an exception in the consumer's loop unwinds through the pipeline without hanging" * doctest::timeout(30)) {
    const auto t0 = Clock::now();
    try {
      auto pipe = PipelineBuilder{}
                      .source("read", [n = 0]() mutable { return std::optional<int>(n++); })
                      .map("work", [](int x) { return x; }, {.threads = 2})
                      .build();
      for (auto& x : pipe.epoch())
        if (x == 100) throw std::runtime_error("trainer failed");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) == "trainer failed");
    }
    // A bound for a stall (a stop that waits out a timeout), not a speed: the unwinding took up to
    // 1.3 s under ThreadSanitizer on 2 loaded cores, and a hang is ctest's TIMEOUT's to end.
    CHECK(ms_since(t0) < 10'000.0);
  }

  TEST_CASE("deterministic mode gives the same sequence whatever the thread counts" * doctest::timeout(120)) {
    auto run = [](int budget, int threads) {
      auto pipe = PipelineBuilder{}
                      .threads(budget)
                      .deterministic()
                      .seed(5)
                      .epochs(2)
                      .source("read", CountUpTo{3000}, {.queue = 8})
                      .map("jitter",
                           [](int x, const StageContext& ctx) {
                             // Time varies per item so that threads finish out of order.
                             Rng r(derive_seed(ctx.seed, ctx.epoch, static_cast<std::uint64_t>(x)));
                             spin_for(std::chrono::microseconds(r.below(20)));
                             return x;
                           },
                           {.threads = threads, .queue = 8})
                      .flat_map<int>("crops",
                                     [](int x, Emitter<int>& emit) {
                                       for (int i = 0; i <= x % 4; ++i) emit(x * 10 + i);
                                     },
                                     {.threads = threads, .queue = 8})
                      .shuffle("shuffle", {.capacity = 500, .min_after_dequeue = 100, .seed = 9})
                      .batch("batch", 32)
                      .build();
      std::vector<std::vector<int>> batches;
      for (int e = 0; e < 2; ++e)
        for (auto& b : pipe.epoch()) batches.push_back(b);
      return batches;
    };
    const auto reference = run(1, 1);
    REQUIRE(!reference.empty());
    CHECK(run(2, 4) == reference);
    CHECK(run(4, 3) == reference);
    CHECK(run(3, 2) == reference);
  }

  TEST_CASE("a stage drawing from a pool of threads + 1 buffers cannot deadlock, in either mode" *
            doctest::timeout(60)) {
    // A pool of tokens, as a stage drawing pinned buffers from a SlotPool has: acquire waits.
    struct Tokens {
      std::mutex mutex;
      std::condition_variable returned;
      int free = 0;
    };
    struct Held {  // an item and the token it holds, given back when it is dropped
      int value = 0;
      std::shared_ptr<Tokens> tokens;
      Held(int v, std::shared_ptr<Tokens> t) : value(v), tokens(std::move(t)) {}
      Held(Held&& o) noexcept : value(o.value), tokens(std::move(o.tokens)) {}
      Held& operator=(Held&& o) noexcept {
        give_back();
        value = o.value;
        tokens = std::move(o.tokens);
        return *this;
      }
      ~Held() { give_back(); }
      void give_back() {
        if (!tokens) return;
        {
          std::lock_guard lock(tokens->mutex);
          ++tokens->free;
        }
        tokens->returned.notify_all();
        tokens.reset();
      }
    };
    constexpr int kThreads = 2;
    auto tokens = std::make_shared<Tokens>();
    tokens->free = kThreads + 1;  // one for each body, one for the item the consumer holds
    const auto take = [tokens](int x, const StageContext& ctx) {
      // Every fifth item is slow to start, so that the other body runs ahead of it; outputs
      // that wait for it in the reorder window keep their tokens.
      if (x % 5 == 4) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      std::unique_lock lock(tokens->mutex);
      if (!tokens->returned.wait_for(lock, std::chrono::seconds(10),
                                     [&] { return tokens->free > 0 || ctx.stop.stop_requested(); }))
        throw std::runtime_error("no token for 10 s: deadlock at item " + std::to_string(x) + ", free " +
                                 std::to_string(tokens->free));
      if (tokens->free == 0) throw PipelineStopped();
      --tokens->free;
      return Held(x, tokens);
    };
    // In free order, with deep queues: a body that took several inputs at once and kept
    // their outputs until the last one was made would wait here for a token it holds.
    bool deterministic = false;
    SUBCASE("deterministic mode") { deterministic = true; }
    SUBCASE("free order, deep queues") {}
    CAPTURE(deterministic);
    auto pipe = PipelineBuilder{}
                    .threads(4)
                    .deterministic(deterministic)
                    .epochs(1)
                    .source("read", CountUpTo{200}, {.queue = deterministic ? 2u : 64u})
                    .map("take", take, {.threads = kThreads, .queue = deterministic ? 1u : 8u, .max_chunk = 1})
                    .build();
    std::vector<int> seen;
    for (auto& h : pipe.epoch()) seen.push_back(h.value);
    std::vector<int> want(200);
    std::iota(want.begin(), want.end(), 0);
    if (!deterministic) std::sort(seen.begin(), seen.end());
    CHECK(seen == want);
  }

  TEST_CASE("a source that turns slow mid-burst hands on the items it has made within one slow call" *
            doctest::timeout(60)) {
    // 300 items in microseconds each (bursts grow to their longest), then slow ones. A burst
    // that kept the fast items until it was full would hold them for up to 31 slow calls.
    constexpr int kFast = 300;
    constexpr auto kSlow = 100ms;
    std::atomic<Clock::rep> slow_from{0};
    auto pipe = PipelineBuilder{}
                    .epochs(1)
                    .source("read",
                            [&, n = 0]() mutable -> std::optional<int> {
                              if (n == kFast + 8) return std::nullopt;
                              if (n >= kFast) {
                                if (n == kFast) slow_from = Clock::now().time_since_epoch().count();
                                std::this_thread::sleep_for(kSlow);
                              }
                              return n++;
                            })
                    .build();
    std::optional<Clock::duration> last_fast_after_slow_began;
    while (auto x = pipe.next())
      if (*x == kFast - 1 && slow_from != 0)
        last_fast_after_slow_began = Clock::now().time_since_epoch() - Clock::duration(slow_from.load());
    // Never set: the last fast item came before the slow calls began, which is as good.
    if (last_fast_after_slow_began) CHECK(*last_fast_after_slow_began < 5 * kSlow);
  }

  TEST_CASE("epochs: each one delivers every item, reshuffled, and ends visibly" * doctest::timeout(60)) {
    auto pipe = PipelineBuilder{}
                    .epochs(3)
                    .source("read", CountUpTo{1000})
                    .map("id", [](int x) { return x; }, {.threads = 2})
                    .shuffle("shuffle", {.capacity = 300, .min_after_dequeue = 100, .seed = 3})
                    .batch("batch", 1)
                    .build();
    std::vector<std::vector<int>> orders;
    for (int e = 0; e < 3; ++e) {
      CHECK(pipe.current_epoch() == static_cast<std::uint32_t>(e));
      std::vector<int> order;
      for (auto& b : pipe.epoch()) order.push_back(b.at(0));
      CHECK(sorted(order) == iota(1000));
      orders.push_back(order);
    }
    CHECK(orders[0] != orders[1]);
    CHECK(orders[1] != orders[2]);
    CHECK(pipe.finished());
    CHECK_FALSE(pipe.next());
  }

  TEST_CASE("endless epochs end at the first one that yields nothing, rather than spin" * doctest::timeout(30)) {
    // Two epochs of 100 items, then a filter that lets nothing through: the run ends there.
    const auto pass = std::make_shared<std::atomic<int>>(0);
    auto pipe = PipelineBuilder{}
                    .threads(2)
                    .source("read", CountUpTo{100})
                    .flat_map<int>("filter",
                                   [pass](int x, Emitter<int>& emit) {
                                     if (x == 0) pass->fetch_add(1);  // each epoch's first item
                                     if (pass->load() <= 2) emit(x);
                                   })
                    .build();
    std::vector<std::size_t> sizes;
    for (auto epoch : pipe.epochs()) {
      std::size_t n = 0;
      for (auto& x : epoch) n += x >= 0;
      sizes.push_back(n);
    }
    CHECK(sizes == std::vector<std::size_t>{100, 100, 0});
    CHECK(pipe.finished());
    CHECK(pipe.current_epoch() == 3);

    // An empty source, endless epochs: one empty epoch.
    auto empty = PipelineBuilder{}.source("read", CountUpTo{0}).map("id", [](int x) { return x; }).build();
    CHECK(drain_epoch(empty).empty());
    CHECK(empty.finished());
  }

  TEST_CASE("a moved-from pipeline says so rather than crash") {
    auto pipe = PipelineBuilder{}.epochs(1).source("read", CountUpTo{10}).map("id", [](int x) { return x; }).build();
    auto moved = std::move(pipe);
    CHECK_THROWS_WITH_AS(pipe.next(), doctest::Contains("moved from"), std::logic_error);
    CHECK_THROWS_WITH_AS(pipe.state(), doctest::Contains("moved from"), std::logic_error);
    // wait_for waited on the new owner's edge, then counted the wait in a core it no longer had.
    CHECK_THROWS_WITH_AS(pipe.wait_for(std::chrono::milliseconds(10)), doctest::Contains("moved from"),
                         std::logic_error);
    CHECK(sorted(drain_epoch(moved)) == iota(10));
  }

  TEST_CASE("a short last batch of an epoch is kept, or dropped by option") {
    for (bool drop : {false, true}) {
      CAPTURE(drop);
      auto pipe =
          PipelineBuilder{}.epochs(2).source("read", CountUpTo{10}).batch("batch", 4, {.drop_remainder = drop}).build();
      for (int e = 0; e < 2; ++e) {
        std::vector<std::size_t> sizes;
        for (auto& b : pipe.epoch()) sizes.push_back(b.size());
        CHECK(sizes == (drop ? std::vector<std::size_t>{4, 4} : std::vector<std::size_t>{4, 4, 2}));
      }
    }
  }

  TEST_CASE(
      "the occupancy log is JSON Lines naming every queue, marking each epoch, with each stage's counters "
      "at the end" *
      doctest::timeout(60)) {
    const TempDir dir("pipeline");
    const auto path = dir / "occupancy.jsonl";
    {
      auto pipe = PipelineBuilder{}
                      .threads(3)
                      .epochs(2)
                      .occupancy_log(path.string(), 5ms)
                      .log_label("rank", "3")
                      .counters([] {
                        return std::vector<Counter>{{"h2d_copies", 7}};
                      })
                      .source("read", CountUpTo{3000})
                      .map("decode",
                           [](int x) {
                             spin_for(20us);
                             return x;
                           },
                           {.threads = 2})
                      .shuffle("shuffle", {.capacity = 200, .min_after_dequeue = 50})
                      .batch("batch", 10)
                      .build();
      for (auto epoch : pipe.epochs())
        for ([[maybe_unused]] auto& batch : epoch) {
        }
    }
    std::ifstream in(path);
    REQUIRE(in);
    std::set<std::string> queues, stages;
    std::vector<int> epochs;
    std::string line;
    int samples = 0, counter_records = 0, consumer_records = 0, pipeline_records = 0, run_records = 0;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);  // throws, failing the test, if malformed
      if (run_records == 0) {                      // first, whose log it is, with the pipeline's label
        ++run_records;
        CHECK(j.at("type") == "run");
        CHECK(j.at("rank") == "3");
        CHECK(j.at("program") == "test_pipeline");
        CHECK(!j.at("job").get<std::string>().empty());
        CHECK(j.at("threads") == 3);
        continue;
      }
      CHECK(j.at("type") != "run");
      CHECK(!j.contains("rank"));  // the labels are the run record's
      if (j.at("type") == "sample") {
        ++samples;
        queues.insert(j.at("queue").get<std::string>());
        CHECK(j.at("size").get<std::size_t>() <= j.at("capacity").get<std::size_t>());
        CHECK(j.contains("waiting"));
        CHECK(j.value("floor", 0) == (j.at("queue") == "shuffle" ? 50 : 0));  // what a shuffle keeps back
        CHECK(j.contains("producer"));
        CHECK(j.contains("consumer"));
        CHECK(j.at("t").get<double>() >= 0.0);
      } else if (j.at("type") == "counters") {
        ++counter_records;
        CHECK(j.at("counters").at("h2d_copies") == 7);
      } else if (j.at("type") == "epoch") {
        CHECK(stages.empty());  // the stage records come at the end
        epochs.push_back(j.at("epoch").get<int>());
      } else if (j.at("type") == "pipeline") {
        ++pipeline_records;
        CHECK(j.at("threads") == 3);
        CHECK(j.at("cores").get<unsigned>() == std::thread::hardware_concurrency());
      } else if (j.at("type") == "consumer") {
        ++consumer_records;
        CHECK(j.at("items") == 2 * 3000 / 10);  // the batches the loop took
        CHECK(j.at("waited_s").get<double>() >= 0.0);
      } else {
        CHECK(j.at("type") == "stage");
        stages.insert(j.at("stage").get<std::string>());
        if (j.at("stage") == "decode") CHECK(j.at("items_in").get<int>() == 6000);
      }
    }
    CHECK(epochs == std::vector<int>{0, 1});
    CHECK(samples >= 4);
    CHECK(counter_records == 1);
    CHECK(consumer_records == 1);
    CHECK(pipeline_records == 1);
    CHECK(queues == std::set<std::string>{"read->decode", "shuffle", "batch->consumer"});
    CHECK(stages == std::set<std::string>{"read", "decode", "batch"});
  }

  TEST_CASE("the occupancy log's counters count what the consumer did after the last item" * doctest::timeout(60)) {
    // A trainer reads its counters back from the device after the last batch: the log says so,
    // as the trainer's own count does.
    const TempDir dir("pipeline");
    const auto path = dir / "occupancy.jsonl";
    std::atomic<std::uint64_t> copies{0};
    {
      auto pipe = PipelineBuilder{}
                      .epochs(1)
                      .occupancy_log(path.string(), 5ms)
                      .counters([&] {
                        return std::vector<Counter>{{"d2h_copies", copies.load()}};
                      })
                      .source("read", CountUpTo{100})
                      .build();
      for (auto& x : pipe.epoch()) copies += x == 99;  // one copy with the last item
      REQUIRE(pipe.finished());
      copies += 1;  // and one after it
    }
    std::ifstream in(path);
    REQUIRE(in);
    std::vector<std::string> types;
    std::uint64_t logged = 0;
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      types.push_back(j.at("type").get<std::string>());
      if (types.back() == "counters") logged = j.at("counters").at("d2h_copies").get<std::uint64_t>();
    }
    CHECK(logged == 2);
    // The run's records (its consumer's among them) still come before the counters.
    REQUIRE(types.size() >= 2);
    CHECK(types.back() == "counters");
    CHECK(std::count(types.begin(), types.end(), "consumer") == 1);
  }

  TEST_CASE("stop() from another thread while the consumer crosses epochs leaves a whole log" * doctest::timeout(60)) {
    // Epochs of 3 items: the consumer writes an epoch record to the log as the stopper closes it.
    const TempDir dir("pipeline");
    const auto log = (dir / "occupancy.jsonl").string();
    for (int round = 0; round < 40; ++round) {
      CAPTURE(round);
      auto pipe = PipelineBuilder{}
                      .threads(2)
                      .occupancy_log(log, 1ms)
                      .source("read", CountUpTo{3})
                      .map("id", [](int x) { return x; })
                      .build();
      std::thread stopper([&] {
        std::this_thread::sleep_for(std::chrono::microseconds(100 + round * 37 % 900));
        pipe.stop();
      });
      std::uint64_t taken = 0;
      while (!pipe.finished())
        if (pipe.next()) ++taken;
      stopper.join();
      CHECK(pipe.summary().consumed == taken);
      std::ifstream in(log);
      int lines = 0;
      for (std::string line; std::getline(in, line); ++lines) CHECK(nlohmann::json::accept(line));
      CHECK(lines > 0);
    }
  }

  TEST_CASE(
      "stop() from another thread as the consumer reaches the end of the last epoch: one of them ends the run, and the "
      "log is whole" *
      doctest::timeout(120)) {
    // The consumer's end of the run wrote the run's last records through the log while the
    // stopper closed it (a crash in about one round in ten): they are one state machine now.
    const TempDir dir("pipeline");
    const auto log = (dir / "occupancy.jsonl").string();
    for (int round = 0; round < 150; ++round) {
      CAPTURE(round);
      auto pipe = PipelineBuilder{}
                      .threads(2)
                      .epochs(1)
                      .occupancy_log(log, 1ms)
                      .source("read", CountUpTo{300})
                      .batch("batch", 7)
                      .build();
      std::thread stopper([&] {
        std::this_thread::sleep_for(std::chrono::microseconds(round * 53 % 1500));
        pipe.stop();
      });
      while (!pipe.finished()) (void)pipe.next();
      stopper.join();
      pipe.stop();
      std::ifstream in(log);
      int lines = 0;
      for (std::string line; std::getline(in, line); ++lines) CHECK(nlohmann::json::accept(line));
      CHECK(lines > 0);
    }
  }

  TEST_CASE("an occupancy log that cannot be written is a clear error naming the file") {
    // A path below a regular file can never be created.
    const TempDir dir("pipeline");
    const auto file = dir / "not-a-dir";
    std::ofstream(file) << "x";
    const auto bad = (file / "x.jsonl").string();
    CHECK_THROWS_WITH(PipelineBuilder{}.occupancy_log(bad).source("read", CountUpTo{1}).build(),
                      doctest::Contains(bad.c_str()));
  }

  TEST_CASE("the summary counts items per stage and prints a table") {
    auto pipe = PipelineBuilder{}
                    .epochs(1)
                    .counters([] {
                      return std::vector<Counter>{{"h2d_copies", 4}, {"h2d_bytes", 1'234'567}};
                    })
                    .source("read", CountUpTo{100})
                    .flat_map<int>("twice",
                                   [](int x, Emitter<int>& emit) {
                                     emit(x);
                                     emit(x);
                                   })
                    .batch("batch", 50)
                    .build();
    while (pipe.next()) {
    }
    const auto s = pipe.summary();
    REQUIRE(s.stages.size() == 3);
    CHECK(s.stages[0].items_out == 100);
    CHECK(s.stages[1].items_in == 100);
    CHECK(s.stages[1].items_out == 200);
    CHECK(s.stages[2].items_out == 4);
    CHECK(s.consumed == 4);
    std::ostringstream table;
    print_summary(table, s);
    CHECK(table.str().find("twice") != std::string::npos);
    CHECK(table.str().find("batch->consumer") != std::string::npos);
    REQUIRE(s.counters.size() == 2);
    CHECK(table.str().find("h2d_copies") != std::string::npos);
    CHECK(table.str().find("1234567 (1.23 MB)") != std::string::npos);  // bytes, and their size for people
    CHECK(table.str().find("4 (") == std::string::npos);                // a count is only a count
    CHECK(table.str().find("size") == std::string::npos);  // a queue's size at the end, always 0, is not shown
  }

  TEST_CASE("sizes for people: three significant digits in decimal units") {
    CHECK(format_bytes(0) == "0 B");
    CHECK(format_bytes(999) == "999 B");
    CHECK(format_bytes(1000) == "1.00 kB");
    CHECK(format_bytes(1'536) == "1.54 kB");
    CHECK(format_bytes(99'949) == "99.9 kB");
    CHECK(format_bytes(999'949) == "1.00 MB");  // 999.949 kB rounds to 1000 kB: the next unit says it
    CHECK(format_bytes(588'240) == "588 kB");
    CHECK(format_bytes(123'456'789) == "123 MB");
    CHECK(format_bytes(2'050'000'000) == "2.05 GB");
    CHECK(format_bytes(18'446'744'073'709'551'615ull) == "18.4 EB");
  }

  TEST_CASE("impossible configurations are rejected with the option named") {
    auto src = [] { return PipelineBuilder{}.source("read", CountUpTo{1}); };
    CHECK_THROWS_WITH(src().map("m", [](int x) { return x; }, {.threads = 0}), doctest::Contains("threads"));
    CHECK_THROWS_WITH(src().map("m", [](int x) { return x; }, {.queue = 0}), doctest::Contains("queue"));
    CHECK_THROWS_WITH(src().shuffle("s", {.capacity = 10, .min_after_dequeue = 10}),
                      doctest::Contains("min_after_dequeue"));
    CHECK_THROWS_WITH(src().map("read", [](int x) { return x; }), doctest::Contains("used twice"));
    CHECK_THROWS_WITH(src().shuffle("s", {.capacity = 10, .min_after_dequeue = 5}).build(),
                      doctest::Contains("must be followed by a stage"));
    CHECK_THROWS_WITH(src().threads(-1).build(), doctest::Contains("threads"));
  }
}
