// SPDX-License-Identifier: Apache-2.0
// The autotuner (PipelineBuilder::autotune): it moves threads to the stage that holds the
// pipeline back, says why, and leaves a well-set pipeline alone.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "pipeline/pipeline_support.h"
#include "stoker/core/pipeline.h"

using namespace stoker;
using namespace stoker::test;
using namespace std::chrono_literals;

namespace {

// 200 us an item. A copy per body (copy_per_body): a body that the tuner adds gets a copy of
// its own too, which never sees two calls at once.
struct Slow {
  bool in_call = false;
  int operator()(int x) {
    if (in_call) throw std::logic_error("two calls at once on one copy");
    in_call = true;
    spin_for(200us);
    in_call = false;
    return x;
  }
};

struct Run {
  std::vector<int> items;
  int slow_threads = 0, cheap_threads = 0;
  std::vector<nlohmann::json> moves;  // the log's autotune records
};

// read -> slow (200 us an item) -> cheap (10 us an item), a budget of 4 threads.
Run run(int slow_threads, int cheap_threads, int items) {
  const TempDir dir("autotune");
  const auto log = dir / "occupancy.jsonl";
  Run r;
  {
    auto pipe = PipelineBuilder{}
                    .epochs(1)
                    .autotune({.threads = 4, .interval = 50ms})
                    .occupancy_log(log.string(), 10ms)
                    .source("read", CountUpTo{items}, {.queue = 16})
                    .map("slow", Slow{}, {.threads = slow_threads, .queue = 16, .copy_per_body = true})
                    .map("cheap",
                         [](int x) {
                           spin_for(10us);
                           return x;
                         },
                         {.threads = cheap_threads, .queue = 16})
                    .build();
    r.items = sorted(drain_epoch(pipe));
    for (const auto& s : pipe.summary().stages) {
      if (s.name == "slow") r.slow_threads = s.threads;
      if (s.name == "cheap") r.cheap_threads = s.threads;
    }
  }
  std::ifstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.at("type") == "autotune") r.moves.push_back(std::move(j));
  }
  return r;
}

}  // namespace

TEST_SUITE("Autotune") {
  TEST_CASE("from a bad split it moves threads to the slow stage, logging each move with its evidence" *
            doctest::timeout(60)) {
    const Run r = run(/*slow=*/1, /*cheap=*/3, 8'000);
    CHECK(r.items == iota(8'000));  // every item once while threads move
    CHECK(r.slow_threads >= 2);
    CHECK(r.slow_threads + r.cheap_threads <= 4);
    REQUIRE(!r.moves.empty());
    const auto& first = r.moves.front();
    CHECK(first.at("t").get<double>() > 0);
    REQUIRE(first.at("changes").size() == 2);
    CHECK(first.at("changes")[0] == nlohmann::json{{"stage", "slow"}, {"from", 1}, {"to", 2}});
    CHECK(first.at("changes")[1] == nlohmann::json{{"stage", "cheap"}, {"from", 3}, {"to", 2}});
    const std::string evidence = first.at("evidence");
    CHECK(evidence.find("slow") != std::string::npos);
    CHECK(evidence.find("busy on 1 thread") != std::string::npos);
    for (const auto& m : r.moves)  // never away from the slow stage
      for (const auto& c : m.at("changes"))
        if (c.at("stage") == "slow") CHECK(c.at("to").get<int>() > c.at("from").get<int>());
  }

  TEST_CASE("a pipeline already well set is left alone" * doctest::timeout(60)) {
    const Run r = run(/*slow=*/3, /*cheap=*/1, 6'000);
    CHECK(r.items == iota(6'000));
    CHECK(r.moves.empty());
    CHECK(r.slow_threads == 3);
    CHECK(r.cheap_threads == 1);
  }

  TEST_CASE("impossible autotune settings are refused, naming what is wrong") {
    auto build = [](AutotuneOptions a, int pipeline_threads, int stage_threads) {
      return PipelineBuilder{}
          .threads(pipeline_threads)
          .autotune(a)
          .source("read", CountUpTo{10})
          .map("square", [](int x) { return x * x; }, {.threads = stage_threads})
          .build();
    };
    CHECK_THROWS_WITH(build({.threads = 2}, 4, 1), doctest::Contains("budget of 2 threads"));
    CHECK_THROWS_WITH(build({.threads = 2, .interval = 0ms}, 0, 1), doctest::Contains("interval"));
    CHECK_THROWS_WITH(build({.threads = -1}, 0, 1), doctest::Contains("autotune: threads"));
    CHECK_THROWS_WITH(build({.threads = 65}, 0, 1), doctest::Contains("65 threads"));
    CHECK_NOTHROW(build({.threads = 2}, 2, 2));
  }

  TEST_CASE("stages that ask for more threads than the budget start within it, scaled down, whatever the machine") {
    // Without a budget it is one thread per core: the same pipeline must build on any machine.
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    struct Case {
      int budget;              // 0: the pipeline's threads, one per core
      std::vector<int> asked;  // the tuned stages' threads
      std::vector<int> start;  // what they start with
    };
    for (const Case& c : {Case{0, {cores + 1, 1}, {}}, Case{2, {2, 1}, {1, 1}}, Case{3, {4, 2}, {2, 1}},
                          Case{6, {10, 1, 1}, {4, 1, 1}}, Case{2, {1, 1, 1}, {1, 1, 1}}}) {
      CAPTURE(c.budget);
      CAPTURE(c.asked);
      auto builder = PipelineBuilder{}.epochs(1).autotune({.threads = c.budget}).source("read", CountUpTo{2000});
      auto step = [](int x) { return x; };
      auto built = [&] {
        auto b1 = std::move(builder).map("s0", step, {.threads = c.asked[0]});
        auto b2 = std::move(b1).map("s1", step, {.threads = c.asked[1]});
        if (c.asked.size() == 2) return std::move(b2).build();
        return std::move(b2).map("s2", step, {.threads = c.asked[2]}).build();
      };
      auto pipe = built();
      const auto summary = pipe.summary();
      int total = 0;
      for (std::size_t i = 0; i < c.asked.size(); ++i) {
        total += summary.stages[i + 1].threads;
        if (!c.start.empty()) CHECK(summary.stages[i + 1].threads == c.start[i]);
      }
      const int budget = c.budget != 0 ? c.budget : cores;
      CHECK(total <= std::max(budget, static_cast<int>(c.asked.size())));
      CHECK(sorted(drain_epoch(pipe)) == iota(2000));
    }
  }
}
