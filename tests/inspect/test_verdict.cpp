// SPDX-License-Identifier: Apache-2.0
// The verdict as a model: records made up to order go in, a verdict with its evidence comes out.
// The pictures of each bottleneck, the rules that keep the verdict from contradicting the run's own
// figures, the program's terms in suggestions, a job's ranks, and files that are not logs.
#include <doctest/doctest.h>

#include <cstdint>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "inspect.h"
#include "stoker/core/pipeline.h"
#include "support.h"

using namespace stoker::inspect;

namespace {

struct StagePart {
  std::string name;
  int threads = 1;
  // Shares: busy of threads x run, the others of the run; pool_wait is part of blocked.
  double busy = 0, starved = 0, blocked = 0, pool_wait = 0;
};

// A run of `stages` in a chain, their queues filled `fills` (one per queue, mean fill, 0..1, with
// the given share of samples empty and with the producer waiting), the training loop waiting
// `wait` of a 10 s run.
struct Made {
  std::vector<StagePart> stages;
  std::vector<double> fills, empty, waiting;  // per queue
  double wait = 0;
  int threads = 0, cores = 0;
  std::optional<double> cpu_share;  // of the stages' busy time
  std::optional<double> machine_busy_pct;
  std::string program;
  std::string rank, job, role, data;
  std::vector<std::pair<std::string, std::uint64_t>> counters;
  std::uint64_t items = 1000;
};

OccupancyLog make(const Made& m) {
  constexpr double kRun = 10;
  constexpr int kSamples = 100;
  OccupancyLog log;
  log.source = "made.jsonl";
  log.program = m.program;
  log.rank = m.rank;
  log.job = m.job;
  log.role = m.role;
  log.data = m.data;
  for (std::size_t i = 0; i < m.stages.size(); ++i) {
    const std::string consumer = i + 1 < m.stages.size() ? m.stages[i + 1].name : "consumer";
    QueueSeries q{m.stages[i].name + "->" + consumer, m.stages[i].name, consumer, 100, 0, {}};
    const double fill = i < m.fills.size() ? m.fills[i] : 0.5;
    const double empty = i < m.empty.size() ? m.empty[i] : 0;
    const double waiting = i < m.waiting.size() ? m.waiting[i] : 0;
    for (int n = 0; n < kSamples; ++n) {
      const bool is_empty = n < empty * kSamples;
      const auto size = is_empty ? 0 : static_cast<std::size_t>(fill * 100);
      q.samples.push_back({n * kRun / kSamples, size, n < waiting * kSamples ? 2u : 0u, size / 100.0});
    }
    log.queues.push_back(std::move(q));
  }
  double busy_s = 0;
  for (const StagePart& p : m.stages) {
    StageCounters c;
    c.name = p.name;
    c.threads = p.threads;
    c.busy_s = p.busy * kRun * p.threads;
    c.starved_s = p.starved * kRun;
    c.pool_wait_s = p.pool_wait * kRun;
    c.blocked_s = p.blocked * kRun;
    c.items_out = 1000;
    c.t = kRun;
    busy_s += c.busy_s;
    log.stages.push_back(c);
  }
  log.consumer = ConsumerCounters{m.items, m.wait * kRun, kRun};
  log.pipeline.threads = m.threads;
  log.pipeline.cores = m.cores;
  if (m.cpu_share) log.pipeline.cpu_s = *m.cpu_share * busy_s;
  log.pipeline.machine_busy_pct = m.machine_busy_pct;
  log.counters = m.counters;
  return log;
}

// read -> decode -> augment -> batch, with decode the slow one.
Made slow_decode() {
  Made m;
  m.stages = {{"read", 1, 0.02, 0.0, 0.95},
              {"decode", 2, 0.99, 0.0, 0.0},
              {"augment", 1, 0.05, 0.93, 0.0},
              {"batch", 1, 0.02, 0.95, 0.0}};
  m.fills = {0.9, 0.02, 0.01, 0.01};
  m.empty = {0.0, 0.9, 0.95, 0.95};
  m.waiting = {0.8, 0, 0, 0};
  m.wait = 0.9;
  m.threads = 8;
  m.cores = 8;
  return m;
}

// Four stages sharing one thread, each busy a quarter of the run.
Made thread_bound() {
  Made m;
  m.stages = {{"read", 1, 0.25, 0.3, 0.4},
              {"crops", 1, 0.25, 0.4, 0.3},
              {"collate", 1, 0.24, 0.5, 0.2},
              {"h2d", 1, 0.24, 0.6, 0.1}};
  m.fills = {0.5, 0.5, 0.4, 0.3};
  m.empty = {0.2, 0.3, 0.4, 0.5};
  m.wait = 0.9;
  m.threads = 1;
  m.cores = 4;
  return m;
}

std::string text_of(const Report& r) {
  std::ostringstream out;
  print_report(out, r);
  return out.str();
}

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

}  // namespace

TEST_SUITE("the verdict") {
  TEST_CASE("each picture: training loop, one stage, the source, the pipeline's threads, balanced") {
    Made ahead;
    ahead.stages = {{"read", 1, 0.05, 0, 0.9}, {"crops", 2, 0.1, 0, 0.85}};
    ahead.fills = {0.9, 0.8};
    ahead.waiting = {0.6, 0.5};
    ahead.wait = 0.01;
    ahead.threads = 4;
    ahead.cores = 4;
    const Report training = analyze(make(ahead));
    CHECK(training.verdict.kind == Bottleneck::training);
    CHECK(training.verdict.part == "consumer");
    CHECK(training.verdict.fit > 0.8);

    const Report stage = analyze(make(slow_decode()));
    CHECK(stage.verdict.kind == Bottleneck::stage);
    CHECK(stage.verdict.part == "decode");
    CHECK(stage.verdict.fit > 0.8);
    CHECK(has(stage.verdict.suggestion, "give 'decode' more threads (it has 2; try {.threads = 4} on stage 'decode')"));

    Made source = slow_decode();
    source.stages = {{"read", 1, 0.99, 0, 0}, {"decode", 2, 0.02, 0.97, 0}, {"augment", 1, 0.01, 0.97, 0}};
    source.fills = {0.01, 0.01, 0.01};
    source.empty = {0.95, 0.95, 0.95};
    const Report src = analyze(make(source));
    CHECK(src.verdict.kind == Bottleneck::source);
    CHECK(src.verdict.part == "read");
    CHECK(has(src.verdict.suggestion, "called by one thread at a time"));

    const Report threads = analyze(make(thread_bound()));
    CHECK(threads.verdict.kind == Bottleneck::threads);
    CHECK(threads.verdict.part == "pipeline");
    CHECK(threads.verdict.fit > 0.8);
    CHECK(has(threads.verdict.suggestion, "PipelineBuilder::threads(4)"));

    Made even = slow_decode();
    even.stages[1].busy = 0.95;
    even.wait = 0.08;
    even.fills = {0.9, 0.5, 0.5, 0.5};
    even.empty = {0, 0.05, 0.05, 0.05};
    const Report balanced = analyze(make(even));
    CHECK(balanced.verdict.kind == Bottleneck::balanced);
    CHECK(balanced.verdict.part == "none");
    CHECK(balanced.verdict.fit > 0.8);
  }

  TEST_CASE(
      "a stage asleep at the loop's own pace is balanced with it; asleep while the loop holds the input back, "
      "it waits for the loop") {
    // 'decode' sleeps through every call (its threads on a CPU 3% of their busy time) and the
    // loop never waits. Its last queue never empty and its producer never waiting for room: the
    // input goes exactly as fast as the loop, which a faster step would only make wait.
    Made paced;
    paced.stages = {{"read", 1, 0.0, 0.0, 0.95}, {"decode", 1, 0.95, 0.0, 0.0}};
    paced.fills = {0.75, 0.09};
    paced.empty = {0.02, 0.01};
    paced.waiting = {0.94, 0.0};
    paced.wait = 0.0;
    paced.threads = 4;
    paced.cores = 2;
    paced.cpu_share = 0.03;
    paced.machine_busy_pct = 40;
    const Report balanced = analyze(make(paced));
    CHECK(balanced.verdict.kind == Bottleneck::balanced);
    CHECK(balanced.verdict.fit > 0.8);

    // The same, but the last queue's producer waits for room nearly always: the input is held
    // back by the loop, and its stage sleeps on something the loop holds.
    Made held = paced;
    held.fills = {0.75, 0.9};
    held.waiting = {0.94, 0.85};
    const Report training = analyze(make(held));
    CHECK(training.verdict.kind == Bottleneck::training);
    CHECK(training.verdict.fit > 0.8);
    CHECK(has(text_of(training), "'decode' was busy 95% of the time of its 1 thread"));
  }

  TEST_CASE("the verdict never contradicts the training loop's own wait") {
    // Whatever the stages and queues show, a loop that waited more than half the run is not the
    // bottleneck, and one that waited less than a fifth is not held back by any part of the input.
    std::mt19937 rng(7);
    std::uniform_real_distribution<double> share(0, 1);
    for (int i = 0; i < 500; ++i) {
      Made m;
      const int n = 1 + static_cast<int>(rng() % 5);
      for (int k = 0; k < n; ++k) {
        StagePart part;
        part.name = "stage " + std::to_string(k);
        part.threads = 1 + static_cast<int>(rng() % 4);
        part.busy = share(rng);
        part.starved = share(rng) / 2;
        part.blocked = share(rng) / 2;
        part.pool_wait = part.blocked * share(rng);
        m.stages.push_back(part);
        m.fills.push_back(share(rng));
        m.empty.push_back(share(rng));
        m.waiting.push_back(share(rng));
      }
      m.wait = share(rng);
      m.threads = 1 + static_cast<int>(rng() % 8);
      m.cores = 1 + static_cast<int>(rng() % 8);
      const Report r = analyze(make(m));
      CAPTURE(m.wait);
      CAPTURE(r.verdict.headline);
      if (m.wait > kTrainingMaxWait) CHECK(r.verdict.kind != Bottleneck::training);
      if (m.wait < kInputMinWait)
        CHECK((r.verdict.kind == Bottleneck::training || r.verdict.kind == Bottleneck::balanced));
      CHECK(r.verdict.fit >= 0);
      CHECK(r.verdict.fit <= 1);
      CHECK(r.verdict.evidence.front().find("the training loop waited for its input") == 0);
    }
  }

  TEST_CASE("suggestions are spelled in the terms of the program that wrote the log") {
    Made train = slow_decode();
    train.program = "stoker-train";
    train.stages[1].name = "crops";
    const Report r = analyze(make(train));
    CHECK(r.verdict.part == "crops");
    CHECK(has(r.verdict.suggestion, "try --crop-threads 4"));
    CHECK(!has(r.verdict.suggestion, "{.threads"));
    CHECK(!has(r.verdict.suggestion, "PipelineBuilder"));

    // A stage stoker-train has no option for is said to be so, not given C++.
    Made batch = slow_decode();
    batch.program = "stoker-train";
    batch.stages[1].name = "batch";
    batch.stages[3].name = "collate";
    const Report b = analyze(make(batch));
    CHECK(b.verdict.part == "batch");
    CHECK(has(b.verdict.suggestion, "stoker-train gives 'batch' 2 threads and no option for more"));

    Made bound = thread_bound();
    bound.program = "stoker-train";
    const Report t = analyze(make(bound));
    CHECK(has(t.verdict.suggestion, "--threads 4"));
    CHECK(!has(t.verdict.suggestion, "PipelineBuilder"));
  }

  TEST_CASE("more threads than cores are suggested only with the reason") {
    // One thread for four stages on two cores: they would use four.
    Made bound = thread_bound();
    bound.cores = 2;
    // The stages compute (CPU time as long as their busy time): two threads, no more.
    bound.cpu_share = 0.98;
    bound.machine_busy_pct = 60;
    const Report compute = analyze(make(bound));
    CHECK(compute.verdict.kind == Bottleneck::threads);
    CHECK(has(compute.verdict.suggestion, "PipelineBuilder::threads(2)"));
    CHECK(has(compute.verdict.suggestion, "as many as the machine's cores"));
    CHECK(!has(compute.verdict.suggestion, "PipelineBuilder::threads(4)"));
    // They wait (sleep, I/O) while the machine is idle: four, because they wait.
    bound.cpu_share = 0.05;
    const Report wait = analyze(make(bound));
    CHECK(has(wait.verdict.suggestion,
              "PipelineBuilder::threads(4)): more than the machine's 2 cores, which helps "
              "here because its stages wait"));
    // The machine was busy, so a thread that did not run may have waited for a core: no more
    // than the cores.
    bound.machine_busy_pct = 100;
    const Report busy = analyze(make(bound));
    CHECK(has(busy.verdict.suggestion, "PipelineBuilder::threads(2)"));
    // Already on every core: add cores or move work to the GPU; other processes named.
    bound.threads = 2;
    bound.cpu_share = 0.5;
    bound.stages = {{"read", 1, 0.5, 0.2, 0.2},
                    {"crops", 1, 0.5, 0.2, 0.2},
                    {"collate", 1, 0.5, 0.2, 0.2},
                    {"h2d", 1, 0.48, 0.2, 0.2}};
    const Report cores = analyze(make(bound));
    CHECK(cores.verdict.kind == Bottleneck::threads);
    CHECK(has(cores.verdict.headline, "the machine's cores"));
    CHECK(has(cores.verdict.suggestion, "add cores, move work to the GPU"));
    // stoker-train spells it --augment gpu, except on --images, which refuses it.
    bound.program = "stoker-train";
    CHECK(has(analyze(make(bound)).verdict.suggestion, "add cores, move work to the GPU (--augment gpu), or make"));
    bound.data = "images";
    const Report images = analyze(make(bound));
    CHECK(has(images.verdict.suggestion, "add cores, or make the stages cheaper"));
    CHECK(!has(images.verdict.suggestion, "GPU"));
  }

  TEST_CASE("a stage waiting for its pool is told so, and not given threads") {
    Made copy = slow_decode();
    copy.stages = {{"read", 1, 0.01, 0, 0.95}, {"collate", 1, 0.05, 0.1, 0.8, 0.75}, {"h2d", 1, 0.05, 0.02, 0.9, 0.9}};
    copy.fills = {0.9, 0.6, 0.02};
    copy.empty = {0, 0.1, 0.9};
    copy.program = "stoker-train";
    const Report r = analyze(make(copy));
    CHECK(r.verdict.part == "h2d");
    CHECK(has(r.verdict.suggestion, "'h2d' waits for its pool's buffers (90% of the run)"));
    CHECK(has(r.verdict.suggestion, "--augment gpu"));
    CHECK(!has(r.verdict.suggestion, "more threads (it has"));
  }

  TEST_CASE("the JSON carries the verdict, its evidence, every fit and the training loop's figures") {
    const Report r = analyze(make(slow_decode()));
    const nlohmann::json j = to_json(r);
    CHECK(j.at("verdict") == "stage");
    CHECK(j.at("bottleneck") == "decode");
    CHECK(j.at("fit").get<double>() > 0.8);
    CHECK(j.at("evidence").is_array());
    CHECK(j.at("evidence").size() == r.verdict.evidence.size());
    CHECK(j.at("consumer").at("waited_pct") == doctest::Approx(90));
    CHECK(j.at("consumer").at("items") == 1000);
    CHECK(j.at("consumer").at("recorded") == true);
    CHECK(j.at("fits").contains("consumer") == false);  // the loop waited 90%: ruled out
    CHECK(j.at("fits").contains("decode"));
    CHECK(j.at("pipeline").at("threads") == 8);
    for (const char* key : {"queues", "stages", "suggestion", "headline", "counters", "autotune"})
      CHECK(j.contains(key));
    const std::string text = text_of(r);
    CHECK(has(text, "bottleneck: stage 'decode' (fit "));
    CHECK(has(text, "evidence:   the training loop waited for its input 90% of the run"));
    CHECK(has(text, "training loop: took 1000 items in 10.00 s, waiting for them 90.0% of the run"));
  }
}

TEST_SUITE("files that are not occupancy logs") {
  TEST_CASE("a trace, a checkpoint, a pipeline's state or a binary file says what it is and what to give") {
    struct Case {
      std::string first_line, says;
    };
    const std::vector<Case> cases = {
        {R"({"displayTimeUnit":"ms","traceEvents":[)", "a Chrome trace (--trace, .trace()), not an occupancy log"},
        {R"([{"ph":"X","pid":1}])", "a Chrome trace"},
        {R"({"format":"stoker-train-checkpoint","version":1,"step":3})", "a stoker-train checkpoint (--checkpoint)"},
        {R"({"format":"stoker-pipeline-state","version":1})", "a pipeline's state (Pipeline::state())"},
        {std::string("\x7f"
                     "ELF\x02\x01\x01\0\0\0",
                     10),
         "not an occupancy log: it is not text"},
    };
    for (const Case& c : cases) {
      CAPTURE(c.first_line);
      std::istringstream in(c.first_line + "\nmore\n");
      std::string message;
      try {
        parse_log(in, "f.json");
      } catch (const LogError& e) {
        message = e.what();
      }
      CHECK(message.rfind("f.json: ", 0) == 0);
      CHECK(has(message, c.says));
      CHECK(has(message, "--occupancy-log"));
      CHECK(message.find('\n') == std::string::npos);
    }
    stoker::test::TempDir dir("checkpoint-dir");
    std::ofstream(dir / "checkpoint") << R"({"format":"stoker-train-checkpoint"})"
                                      << "\n";
    CHECK_THROWS_WITH_AS(read_log(dir.path().string()), doctest::Contains("is a checkpoint directory"), LogError);
  }

  TEST_CASE("a file holding two runs' logs is refused") {
    const std::string run = R"({"type":"run","t":0,"program":"p","job":"j","threads":2,"cores":2})";
    const std::string sample =
        R"({"type":"sample","t":0.1,"queue":"q","size":1,"capacity":4,"waiting":0,"producer":"a","consumer":"consumer"})";
    std::istringstream in(run + "\n" + sample + "\n" + run + "\n" + sample + "\n");
    CHECK_THROWS_WITH_AS(parse_log(in, "two.jsonl"), doctest::Contains("two.jsonl:3: a second run record"), LogError);
  }

  TEST_CASE("the run record says who wrote the log; the sample records what a consumer could take and what waits") {
    std::istringstream in(
        R"({"type":"run","t":0,"program":"stoker-train","job":"pmix:77","host":"h","pid":5,"threads":3,"cores":2,"rank":"1","role":"worker","data":"images"})"
        "\n"
        R"({"type":"sample","t":0.1,"queue":"shuffle","size":3,"capacity":10,"floor":6,"waiting":2,"producer":"a","consumer":"consumer"})"
        "\n");
    const OccupancyLog log = parse_log(in, "r.jsonl");
    CHECK(log.program == "stoker-train");
    CHECK(log.job == "pmix:77");
    CHECK(log.rank == "1");
    CHECK(log.role == "worker");
    CHECK(log.data == "images");
    CHECK(log.pipeline.threads == 3);
    REQUIRE(log.queues.size() == 1);
    CHECK(log.queues[0].floor == 6);
    CHECK(log.queues[0].samples[0].waiting == 2);
    CHECK(log.queues[0].samples[0].fill == doctest::Approx(0.75));  // 3 of the 4 it can hand out
  }
}

TEST_SUITE("a job's ranks") {
  TEST_CASE("logs of different runs, or of one rank twice, or without a rank are not read as one job") {
    Made a = slow_decode(), b = slow_decode();
    a.rank = "0", a.job = "pmix:1";
    b.rank = "1", b.job = "pmix:2";
    CHECK_THROWS_WITH_AS(analyze_job({make(a), make(b)}), doctest::Contains("are logs of different runs"), LogError);
    b.job = "pmix:1";
    b.rank = "0";
    CHECK_THROWS_WITH_AS(analyze_job({make(a), make(b)}), doctest::Contains("are both the log of rank 0"), LogError);
    b.rank = "";
    CHECK_THROWS_WITH_AS(analyze_job({make(a), make(b)}), doctest::Contains("the log has no rank"), LogError);
    b.rank = "1";
    CHECK(analyze_job({make(a), make(b)}).ranks.size() == 2);
  }

  TEST_CASE("data-parallel: the rank the others wait for in the gradient exchange is named, and why") {
    // Rank 2's step is slow: it waits in the exchange least, the others 40%; its input keeps up.
    auto rank = [](int r, double exchange, double input) {
      Made m = slow_decode();
      m.rank = std::to_string(r);
      m.job = "pmix:9";
      m.wait = input;
      m.counters = {{"exchange_wait_ns", static_cast<std::uint64_t>(exchange * 10e9)}};
      return make(m);
    };
    const JobReport job = analyze_job({rank(0, 0.40, 0.01), rank(1, 0.42, 0.01), rank(2, 0.01, 0.01)});
    CHECK(job.straggler == "rank 2");
    CHECK(has(job.evidence.at(0),
              "rank 2 waited for the others in the gradient exchange 1.0% of its run, the "
              "other 2 ranks 40.0% to 42.0%"));
    CHECK(has(job.evidence.at(1), "its training step itself is slower"));
    CHECK(has(job.suggestion, "rank 2's training step"));
    // Rank 1's input is slow: it too waits least in the exchange, and its input is named.
    const JobReport input = analyze_job({rank(0, 0.40, 0.01), rank(1, 0.01, 0.45), rank(2, 0.41, 0.01)});
    CHECK(input.straggler == "rank 1");
    CHECK(has(input.evidence.at(1), "its input is slow"));
    CHECK(has(input.suggestion, "speed up rank 1's input"));
    // Even ranks: none.
    CHECK(analyze_job({rank(0, 0.05, 0.01), rank(1, 0.04, 0.01), rank(2, 0.06, 0.01)}).straggler.empty());
    // The plain text and the JSON both name it.
    std::ostringstream text;
    print_job(text, job);
    CHECK(has(text.str(), "straggler:  rank 2\n"));
    CHECK(to_json(job).at("straggler") == "rank 2");
    CHECK(to_json(job).at("ranks").at(2).at("exchange_wait_pct") == doctest::Approx(1.0));
  }

  TEST_CASE("remote workers: the worker that sends least is named, with its own verdict") {
    auto rank = [](int r, const std::string& role, std::uint64_t items, double wait) {
      Made m = slow_decode();
      m.rank = std::to_string(r);
      m.job = "pmix:3";
      m.role = role;
      m.items = items;
      m.wait = wait;
      return make(m);
    };
    const JobReport job = analyze_job({rank(0, "trainer", 900, 0.3), rank(1, "worker", 400, 0.1),
                                       rank(2, "worker", 120, 0.9), rank(3, "worker", 380, 0.1)});
    CHECK(job.remote);
    CHECK(job.straggler == "rank 2");
    CHECK(has(job.evidence.at(1), "rank 2 sent 12.0 batches per second (120 in all), the other workers 38.0 to 40.0"));
    CHECK(to_json(job).at("mode") == "remote workers");
    CHECK(analyze_job({rank(0, "trainer", 900, 0.3), rank(1, "worker", 400, 0.1), rank(2, "worker", 390, 0.1)})
              .straggler.empty());
  }
}

TEST_SUITE("the occupancy log's records") {
  TEST_CASE("a queue's size is what its consumer could take; what its producer holds waiting is beside it" *
            doctest::timeout(30)) {
    // A shuffle of capacity 10 keeps 6 back: at most 4 can be taken at once. Its producer fills it,
    // and then waits with what does not fit while the loop here takes nothing.
    stoker::test::TempDir dir("occupancy");
    const auto path = (dir / "run.jsonl").string();
    double pause_from = 0, pause_to = 0;  // seconds since build(), about the log's times
    {
      auto pipe =
          stoker::PipelineBuilder{}
              .threads(2)
              .epochs(1)
              .occupancy_log(path, std::chrono::milliseconds(5))
              .source("read",
                      [n = 0]() mutable -> std::optional<int> { return n < 200 ? std::optional(n++) : std::nullopt; })
              .shuffle("shuffle", {.capacity = 10, .min_after_dequeue = 6, .seed = 1})
              .map("take", [](int x) { return x; }, {.queue = 2})
              .build();
      const auto built = std::chrono::steady_clock::now();
      const auto since_built = [built] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - built).count();
      };
      REQUIRE(pipe.next());
      pause_from = since_built() + 0.05;  // time to fill up
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      pause_to = since_built();
      while (pipe.next()) {
      }
    }
    const OccupancyLog log = read_log(path);
    CHECK(log.program == "test_inspect");
    CHECK(!log.job.empty());
    CHECK(log.pipeline.threads == 2);
    CHECK(log.pipeline.cores > 0);
    REQUIRE(log.queues.size() == 2);
    const QueueSeries& q = log.queues.front();
    CHECK(q.name == "shuffle");
    CHECK(q.capacity == 10);
    CHECK(q.floor == 6);
    // While the loop sleeps, the source cannot end the epoch (after which all 10 may be taken).
    std::size_t waited = 0, most = 0, early = 0;
    for (const FillSample& s : q.samples) {
      if (s.t < pause_from || s.t > pause_to) continue;
      ++early;
      most = std::max(most, s.size);
      waited += s.waiting > 0;
    }
    CHECK(early >= 5);
    CHECK(most <= 4);  // never the items kept back, never the producer's
    CHECK(waited > 0);
    CHECK(log.pipeline.cpu_s.has_value());
  }
}
