// The trace of a run (PipelineBuilder::trace): Chrome trace events, read back as a viewer would.
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "pipeline/pipeline_support.h"
#include "stoker/core/pipeline.h"

using namespace stoker;
using namespace stoker::test;
using namespace std::chrono_literals;
using Json = nlohmann::json;

namespace {

Json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return Json::parse(in);  // throws, failing the test, if the file is not one JSON document
}

}  // namespace

TEST_SUITE("Pipeline trace") {
  TEST_CASE("a traced run writes a track per stage body with a span per chunk, queue counters, waits and epochs" *
            doctest::timeout(60)) {
    const TempDir dir("trace");
    const auto path = dir / "run.trace.json";
    constexpr int kEpochs = 3, kItems = 2'000;
    {
      auto pipe = PipelineBuilder{}
                      .threads(3)
                      .epochs(kEpochs)
                      .trace(path.string())
                      .occupancy_log((dir / "run.occupancy.jsonl").string(), 5ms)
                      .source("read", CountUpTo{kItems}, {.queue = 32})
                      .map("square",
                           [](int x) {
                             spin_for(5us);
                             return x * x;
                           },
                           {.threads = 2, .queue = 32})
                      .shuffle("mix", {.capacity = 64, .min_after_dequeue = 16})
                      .batch("batch", 10)
                      .build();
      int epochs = 0;
      for (auto epoch : pipe.epochs()) {
        int n = 0;
        for (auto& b : epoch) {
          n += static_cast<int>(b.size());
          if (n % 200 == 0) std::this_thread::sleep_for(1ms);  // a slow consumer now and then
        }
        CHECK(n == kItems);
        ++epochs;
      }
      CHECK(epochs == kEpochs);
    }  // the trace is complete once the pipeline is gone

    const Json trace = read_json(path);
    REQUIRE(trace.contains("traceEvents"));
    std::map<int, std::string> track_names;                       // tid -> name
    std::map<int, std::vector<std::pair<double, double>>> spans;  // tid -> (ts, dur), in file order
    std::map<std::string, std::vector<double>> counters;          // name -> ts, in file order
    std::map<int, std::string> span_names;
    std::vector<std::string> epochs;
    for (const Json& e : trace["traceEvents"]) {
      const std::string ph = e.at("ph");
      if (ph == "M" && e.at("name") == "thread_name") track_names[e.at("tid").get<int>()] = e.at("args").at("name");
      if (ph == "X") {
        const int tid = e.at("tid");
        CHECK(track_names.contains(tid));  // named before its first span
        spans[tid].emplace_back(e.at("ts").get<double>(), e.at("dur").get<double>());
        span_names[tid] = e.at("name");
      }
      if (ph == "C") {
        counters[e.at("name")].push_back(e.at("ts").get<double>());
        CHECK(e.at("args").at("items").get<int>() >= 0);
      }
      if (ph == "i") epochs.push_back(e.at("name"));
    }

    // A track per body slot, in pipeline order, and the consumer's.
    std::vector<std::string> names;
    for (const auto& [tid, name] : track_names) names.push_back(name);
    CHECK(names == std::vector<std::string>{"read", "square #0", "square #1", "batch", "consumer (waiting)"});

    // Every stage did work, as spans on its own tracks; spans on a track never overlap (each
    // body slot is held by one body at a time) and come in time order.
    std::set<std::string> stages_with_spans;
    for (const auto& [tid, list] : spans) {
      CAPTURE(track_names[tid]);
      stages_with_spans.insert(span_names[tid]);
      for (std::size_t i = 0; i < list.size(); ++i) {
        CHECK(list[i].first >= 0);
        CHECK(list[i].second >= 0);
        if (i > 0) CHECK(list[i].first >= list[i - 1].first + list[i - 1].second - 0.001);  // microseconds
      }
    }
    CHECK(stages_with_spans == std::set<std::string>{"read", "square", "batch", "wait"});
    // Per chunk, not per item: fewer spans than items moved.
    std::size_t read_spans = 0;
    for (const auto& [tid, list] : spans)
      if (span_names[tid] == "read") read_spans += list.size();
    CHECK(read_spans < static_cast<std::size_t>(kEpochs * kItems));

    // A counter track per queue, sampled in time order.
    for (const std::string q : {"queue read->square", "queue mix", "queue batch->consumer"}) {
      CAPTURE(q);
      REQUIRE(counters.contains(q));
      CHECK(counters[q].size() >= 2);
      CHECK(std::is_sorted(counters[q].begin(), counters[q].end()));
    }
    CHECK(epochs == std::vector<std::string>{"epoch 0", "epoch 1", "epoch 2"});
  }

  TEST_CASE("a trace file that cannot be opened is refused at build(), naming the file") {
    const TempDir dir("trace");
    const auto path = dir / "no-such-directory" / "run.trace.json";
    auto builder = PipelineBuilder{}.trace(path.string()).source("read", CountUpTo{10});
    try {
      builder.build();
      FAIL("build() accepted a trace file it cannot write");
    } catch (const std::exception& e) {
      CHECK(std::string(e.what()).find(path.string()) != std::string::npos);
    }
  }
}
