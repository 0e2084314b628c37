// SPDX-License-Identifier: Apache-2.0
// Pipeline::wait_for: the consumer's timed wait, for a consumer that must do something else now
// and then while it waits (a Python loop checking for Ctrl-C).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <thread>

#include "pipeline/pipeline_support.h"
#include "stoker/core/pipeline.h"

using namespace stoker;
using namespace stoker::test;

namespace {

// A source that yields 0, 1, ... only as far as `allowed` lets it, then ends the epoch at `end`;
// it waits for more to be allowed, and gives up when the pipeline stops.
struct GatedSource {
  std::atomic<int>* allowed;
  int end;
  int next = 0;
  std::optional<int> operator()(const StageContext& ctx) {
    if (next == end) return std::nullopt;
    while (next >= allowed->load()) {
      if (ctx.stop.stop_requested()) throw PipelineStopped();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return next++;
  }
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

TEST_SUITE("Pipeline") {
  TEST_CASE("wait_for times out while nothing comes, and is true, taking nothing, once an item or an end is there" *
            doctest::timeout(60)) {
    std::atomic<int> allowed{0};
    auto pipe = PipelineBuilder{}
                    .threads(2)
                    .epochs(1)
                    .source("read", GatedSource{&allowed, 3}, {.max_chunk = 1})
                    .map("twice", [](int x) { return 2 * x; })
                    .build();

    auto t0 = Clock::now();
    CHECK_FALSE(pipe.wait_for(std::chrono::milliseconds(50)));
    const double waited = seconds_since(t0);
    CHECK(waited >= 0.045);
    CHECK(waited < 5);  // a slice, not a wait for the item

    allowed = 1;
    t0 = Clock::now();
    CHECK(pipe.wait_for(std::chrono::seconds(20)));
    CHECK(seconds_since(t0) < 10);
    CHECK(pipe.wait_for(std::chrono::milliseconds(1)));  // it took nothing: the item is still there
    CHECK(pipe.next() == 0);
    CHECK_FALSE(pipe.wait_for(std::chrono::milliseconds(10)));

    allowed = 3;
    for (int expected : {2, 4}) {
      CHECK(pipe.wait_for(std::chrono::seconds(20)));
      CHECK(pipe.next() == expected);
    }
    CHECK(pipe.wait_for(std::chrono::seconds(20)));  // the end of the epoch, which is the run's
    CHECK(pipe.next() == std::nullopt);
    CHECK(pipe.finished());
    CHECK(pipe.wait_for(std::chrono::milliseconds(0)));
    CHECK(pipe.summary().consumer_wait >= std::chrono::milliseconds(50));  // the slices count as waits
  }

  TEST_CASE("wait_for returns once another thread stops the pipeline, or a stage fails" * doctest::timeout(60)) {
    SUBCASE("stop") {
      std::atomic<int> allowed{0};
      auto pipe = PipelineBuilder{}.threads(2).source("read", GatedSource{&allowed, 10}, {.max_chunk = 1}).build();
      const auto t0 = Clock::now();
      std::thread stopper([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        pipe.stop();
      });
      CHECK(pipe.wait_for(std::chrono::seconds(30)));
      CHECK(seconds_since(t0) < 20);
      stopper.join();
      CHECK(pipe.next() == std::nullopt);
      CHECK(pipe.finished());
    }
    SUBCASE("a stage's error") {
      auto pipe = PipelineBuilder{}
                      .threads(2)
                      .source("read", CountUpTo{10})
                      .map("fail", [](int) -> int { throw std::runtime_error("no"); })
                      .build();
      CHECK(pipe.wait_for(std::chrono::seconds(30)));
      CHECK_THROWS_AS(pipe.next(), StageError);
    }
  }

  TEST_CASE("a consumer that waits only in short slices gets every item once" * doctest::timeout(120)) {
    constexpr int kItems = 20'000;
    auto pipe = PipelineBuilder{}
                    .threads(2)
                    .epochs(2)
                    .source("read", CountUpTo{kItems}, {.queue = 16})
                    .map("same", [](int x) { return x; }, {.threads = 2, .queue = 16})
                    .build();
    for (int epoch = 0; epoch < 2; ++epoch) {
      std::vector<int> got;
      for (;;) {
        while (!pipe.wait_for(std::chrono::microseconds(200))) {
        }
        const std::optional<int> x = pipe.next();
        if (!x) break;
        got.push_back(*x);
      }
      CHECK(sorted(got) == iota(kItems));
    }
    CHECK(pipe.finished());
  }
}
