// SPDX-License-Identifier: Apache-2.0
// Pipelines that share a ThreadBudget: never more bodies at once than its threads, a pipeline
// nobody consumes never holds the turns another needs, and stopping one leaves the others be.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <oneapi/tbb/global_control.h>
#include <stdexcept>
#include <thread>
#include <vector>

#include "pipeline/pipeline_support.h"
#include "stoker/gpu/device.h"
#include "stoker/gpu/staging.h"
#include "stoker/stages/batch.h"

using namespace stoker;
using namespace stoker::test;
using namespace std::chrono_literals;

namespace {

// Counts the stage calls running at once, in every pipeline that uses it, and the most seen.
struct Concurrency {
  std::atomic<int> now{0};
  std::atomic<int> most{0};
  int operator()(int x) {
    const int n = now.fetch_add(1) + 1;
    for (int m = most.load(); n > m && !most.compare_exchange_weak(m, n);) {
    }
    std::this_thread::sleep_for(50us);  // long enough for others to start, on any number of cores
    now.fetch_sub(1);
    return x;
  }
};

Pipeline<std::vector<int>> counted(std::shared_ptr<ThreadBudget> budget, Concurrency& c, int items) {
  return PipelineBuilder{}
      .budget(std::move(budget))
      .threads(4)
      .epochs(2)
      .source("read", CountUpTo{items})
      .map("work", [&c](int x) { return c(x); }, {.threads = 4, .max_chunk = 4})
      .batch("batch", 10)
      .build();
}

// Every epoch's items, until the run ends or stops.
std::vector<int> all_items(Pipeline<std::vector<int>>& p) {
  std::vector<int> out;
  for (auto epoch : p.epochs())
    for (auto& b : epoch) out.insert(out.end(), b.begin(), b.end());
  return out;
}

std::vector<int> twice(int n) {
  std::vector<int> v = iota(n);
  v.insert(v.end(), v.begin(), v.end());
  return sorted(v);
}

}  // namespace

TEST_SUITE("Thread budget") {
  TEST_CASE("pipelines that share a budget never run more stage calls at once than its threads" *
            doctest::timeout(120)) {
    // Each pipeline alone would run 4 calls at once; a host that limits oneTBB changes nothing.
    tbb::global_control host(tbb::global_control::max_allowed_parallelism, 1);
    for (const int threads : {1, 2}) {
      CAPTURE(threads);
      auto budget = std::make_shared<ThreadBudget>(threads);
      Concurrency calls;
      auto a = counted(budget, calls, 600);
      auto b = counted(budget, calls, 400);
      std::vector<int> from_a, from_b;
      {
        std::jthread consume_a([&] { from_a = all_items(a); });
        std::jthread consume_b([&] { from_b = all_items(b); });
      }
      CHECK(sorted(from_a) == twice(600));
      CHECK(sorted(from_b) == twice(400));
      CHECK(calls.most.load() <= threads);
      CHECK(budget->running() == 0);
      CHECK(budget->waiting() == 0);
    }
  }

  TEST_CASE("a pipeline's threads default to its budget's, and a budget of 0 threads is one per core") {
    auto budget = std::make_shared<ThreadBudget>(3);
    auto p = PipelineBuilder{}.budget(budget).epochs(1).source("read", CountUpTo{5}).build();
    CHECK(p.summary().threads == 3);
    CHECK(ThreadBudget(0).threads() >= 1);
    CHECK_THROWS_WITH_AS(ThreadBudget(-1), doctest::Contains("threads must be at least 1"), std::invalid_argument);
  }

  TEST_CASE("a pipeline nobody consumes gives back the turns another pipeline needs" * doctest::timeout(120)) {
    // One turn. Pipeline `idle` is built and then left alone, with a body that waits: the
    // other pipeline must still run to its end (a turn held while waiting would stall it for
    // ever: ctest's timeout ends the test, and the Deadline says why first).
    auto budget = std::make_shared<ThreadBudget>(1);
    std::atomic<bool> release{false};
    std::optional<Pipeline<int>> idle;
    SUBCASE("a flat_map call whose outputs fill chunks waits for room downstream") {
      idle.emplace(PipelineBuilder{}
                       .budget(budget)
                       .threads(2)
                       .source("read", CountUpTo{1'000})
                       .flat_map<int>("many",
                                      [](int x, Emitter<int>& emit) {
                                        for (int i = 0; i < 10'000; ++i) emit(x);
                                      },
                                      {.queue = 2, .max_chunk = 16})
                       .build());
    }
    SUBCASE("a call waits inside BlockedTime") {
      idle.emplace(PipelineBuilder{}
                       .budget(budget)
                       .threads(2)
                       .source("read", CountUpTo{1'000})
                       .map("waits",
                            [&](int x, const StageContext& ctx) {
                              const BlockedTime waiting(ctx);
                              while (!release.load() && !ctx.stop.stop_requested()) std::this_thread::sleep_for(1ms);
                              return x;
                            })
                       .build());
    }
    REQUIRE(idle);
    std::this_thread::sleep_for(20ms);  // its bodies start, and wait
    const Deadline deadline(60s, "a pipeline sharing a budget with one nobody consumes");
    Concurrency calls;
    auto busy = counted(budget, calls, 500);
    CHECK(sorted(all_items(busy)) == twice(500));
    release = true;
    idle->stop();
    CHECK(budget->running() == 0);
  }

  TEST_CASE("stopping one pipeline of a budget leaves the other running, and wakes its own waiting bodies" *
            doctest::timeout(120)) {
    auto budget = std::make_shared<ThreadBudget>(1);
    Concurrency calls;
    auto stopped = counted(budget, calls, 1'000'000);
    auto kept = counted(budget, calls, 3'000);
    const Deadline deadline(60s, "a stop() of one pipeline sharing a budget");
    std::vector<int> from_kept;
    std::size_t from_stopped = 0;
    std::jthread consume_kept([&] { from_kept = all_items(kept); });
    std::jthread consume_stopped([&] { from_stopped = all_items(stopped).size(); });
    std::this_thread::sleep_for(20ms);  // both run, their bodies taking turns, some waiting for one
    stopped.stop();                     // returns once its bodies, those waiting for a turn too, have
    CHECK(stopped.finished());
    consume_stopped.join();  // its next() ends with the stop
    consume_kept.join();
    CHECK(from_stopped < 2'000'000);
    CHECK(sorted(from_kept) == twice(3'000));
    CHECK(budget->running() == 0);
    CHECK(budget->waiting() == 0);
  }

  TEST_CASE("stop() returns while another pipeline holds every turn: the stopped one's waiting bodies wake" *
            doctest::timeout(120)) {
    auto budget = std::make_shared<ThreadBudget>(1);
    std::atomic<bool> holding{false}, release{false};
    auto holder = PipelineBuilder{}
                      .budget(budget)
                      .epochs(1)
                      .source("read", CountUpTo{1})
                      .map("hold",
                           [&](int x) {  // computes, as far as the budget knows: keeps its turn
                             holding = true;
                             while (!release.load()) std::this_thread::sleep_for(1ms);
                             return x;
                           })
                      .build();
    while (!holding.load()) std::this_thread::sleep_for(1ms);
    Concurrency calls;
    auto waits = counted(budget, calls, 1'000);
    {
      const Deadline deadline(60s, "stop() of a pipeline whose bodies wait for a turn another holds");
      while (budget->waiting() == 0) std::this_thread::sleep_for(1ms);  // a body of `waits` waits for the turn
      waits.stop();
    }
    CHECK(waits.finished());
    CHECK(calls.most.load() == 0);
    CHECK(budget->waiting() == 0);
    CHECK(budget->running() == 1);  // still the holder's
    release = true;
    CHECK(drain_epoch(holder) == std::vector<int>{0});
  }

  TEST_CASE("one turn for a collate that waits for staging buffers and the copies that give them back" *
            doctest::timeout(120)) {
    // The staging pool's wait (BlockedTime) gives the turn back; the collate must take it again
    // only after it let go of the pool's lock, which the copy stage's release of a buffer needs.
    auto device = gpu::Device::open("cpu");
    const Shape shape{1, 1, 64, 64, false};
    const std::size_t count = 4;
    gpu::ToDevice to_device(device,
                            {.bytes = Batch::storage_bytes(shape, DType::f32, count),
                             .staging_buffers = 2,
                             .device_buffers = gpu::OutputSizing{.per_call = 1, .queued = 4, .held = 1}.buffers()});
    auto budget = std::make_shared<ThreadBudget>(1);
    const Deadline deadline(60s, "a collate and a copy stage on one turn");
    auto pipe = PipelineBuilder{}
                    .budget(budget)
                    .threads(3)
                    .epochs(1)
                    .source("read", CountUpTo{400}, {.queue = 8})
                    .map("collate",
                         [pool = to_device.staging(), shape, count](int, const StageContext& ctx) {
                           return Batch::allocate(*pool, shape, DType::f32, count, ctx);
                         },
                         {.threads = 2, .queue = 2, .max_chunk = 1})
                    .map("h2d", to_device, {.queue = 4})
                    .build();
    std::size_t batches = 0;
    for (auto& b : pipe.epoch()) batches += b.count == count;
    CHECK(batches == 400);
    CHECK(budget->running() == 0);
  }

  TEST_CASE("a budget shared with a deterministic pipeline leaves its output as it is without one") {
    auto run = [](std::shared_ptr<ThreadBudget> budget) {
      auto builder = PipelineBuilder{};
      if (budget) builder.budget(std::move(budget));
      auto p = std::move(builder)
                   .threads(3)
                   .deterministic()
                   .epochs(2)
                   .source("read", CountUpTo{2'000})
                   .map("square", [](int x) { return x * x; }, {.threads = 3, .max_chunk = 7})
                   .shuffle("mix", {.capacity = 100, .min_after_dequeue = 99})
                   .batch("batch", 32)
                   .build();
      return all_items(p);
    };
    auto budget = std::make_shared<ThreadBudget>(1);
    Concurrency calls;
    auto other = counted(budget, calls, 5'000);  // takes turns meanwhile
    std::vector<int> from_other;
    std::jthread consume([&] { from_other = all_items(other); });
    CHECK(run(budget) == run(nullptr));
    consume.join();
    CHECK(sorted(from_other) == twice(5'000));
  }
}
