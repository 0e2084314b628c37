// SPDX-License-Identifier: Apache-2.0
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

// Hands out spans on two tracks at every take(), and counts what the pipeline called.
class FakeTimeline final : public TimelineSource {
 public:
  explicit FakeTimeline(bool refuse = false) : refuse_(refuse) {}
  void start() override {
    if (refuse_) throw std::logic_error("fake timeline: refused");
    CHECK(state_ == State::fresh);
    state_ = State::started;
  }
  void take(std::vector<TimedSpan>& out) override {
    CHECK(state_ == State::started);
    const auto now = std::chrono::steady_clock::now();
    out.push_back({"fake A", "work", 0, now - 100us, now - 50us});
    out.push_back({"fake B", "copy", 64, now - 40us, now});
    handed += 2;
  }
  void stop() noexcept override {
    CHECK(state_ == State::started);
    state_ = State::stopped;
  }
  bool started() const { return state_ != State::fresh; }
  bool stopped() const { return state_ == State::stopped; }
  int handed = 0;

 private:
  enum class State { fresh, started, stopped };
  bool refuse_;
  State state_ = State::fresh;
};

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
    CHECK(epochs == std::vector<std::string>{"epoch 1", "epoch 2", "epoch 3"});  // for people, from 1
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

  TEST_CASE("spans from a timeline source go on tracks of a devices process, each taken once" * doctest::timeout(60)) {
    const TempDir dir("trace");
    const auto path = dir / "run.trace.json";
    auto source = std::make_shared<FakeTimeline>();
    {
      auto pipe = PipelineBuilder{}
                      .trace(path.string())
                      .timeline(source)
                      .occupancy_log("", 2ms)
                      .epochs(1)
                      .source("read", CountUpTo{50})
                      .map("slow", [](int x) {
                        std::this_thread::sleep_for(1ms);
                        return x;
                      })
                      .build();
      CHECK(source->started());
      for (int x : pipe.epoch()) (void)x;
    }
    CHECK(source->stopped());
    REQUIRE(source->handed >= 4);  // a few samples in 50 ms at 2 ms

    const Json trace = read_json(path);
    std::map<int, std::string> tracks;  // of the devices process
    std::map<std::string, int> spans;   // per track
    bool process_named = false;
    for (const Json& e : trace["traceEvents"]) {
      if (e.at("pid") != 2) continue;
      const std::string ph = e.at("ph");
      if (ph == "M" && e.at("name") == "process_name") process_named = e.at("args").at("name") == "devices";
      if (ph == "M" && e.at("name") == "thread_name") tracks[e.at("tid").get<int>()] = e.at("args").at("name");
      if (ph == "X") {
        const std::string track = tracks.at(e.at("tid").get<int>());  // named before its first span
        ++spans[track];
        CHECK(e.at("name") == (track == "fake A" ? "work" : "copy"));
        CHECK(e.at("dur").get<double>() > 0);
        if (track == "fake B") CHECK(e.at("args").at("bytes") == 64);
        if (track == "fake A") CHECK(!e.contains("args"));
      }
    }
    CHECK(process_named);
    CHECK(tracks.size() == 2);
    CHECK(spans["fake A"] + spans["fake B"] == source->handed);
  }

  TEST_CASE("a timeline source that refuses to start fails build(), and those started before it are stopped") {
    const TempDir dir("trace");
    auto first = std::make_shared<FakeTimeline>();
    auto builder = PipelineBuilder{}
                       .trace((dir / "run.trace.json").string())
                       .timeline(first)
                       .timeline(std::make_shared<FakeTimeline>(/*refuse=*/true))
                       .source("read", CountUpTo{10});
    CHECK_THROWS_WITH(builder.build(), doctest::Contains("fake timeline: refused"));
    CHECK(first->stopped());
  }

  TEST_CASE("without a trace, timeline sources are left alone") {
    auto source = std::make_shared<FakeTimeline>();
    {
      auto pipe = PipelineBuilder{}.timeline(source).epochs(1).source("read", CountUpTo{10}).build();
      for (int x : pipe.epoch()) (void)x;
    }
    CHECK(!source->started());
  }
}
