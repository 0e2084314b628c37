// SPDX-License-Identifier: Apache-2.0
// The verdict on real runs whose bottleneck is known: a pipeline made slow in one place (a
// training loop, each stage in turn, the device's copies, too few threads, too few cores, a
// source that waits) runs for a fixed time, writes its occupancy log, and stoker-inspect's
// verdict on it must name that place, with a fit above kFit, in every one of kRepeats runs: a
// verdict that is right only most of the time is wrong. Each case runs about kRun seconds.
//
// What is slow sleeps (or, where the case is about computing, spins) for long enough to stand
// out by a wide margin on a loaded machine: CI runs this beside the rest of the suite on 2 cores.
// Each case prints what the verdict said, as docs/inspect.md quotes.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "inspect.h"
#include "stoker/core/pipeline.h"
#include "stoker/gpu/staging.h"
#include "stoker/stages/batch.h"
#include "support.h"

using namespace stoker;
using namespace stoker::inspect;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kRepeats = 5;
constexpr double kFit = 0.7;
constexpr auto kRun = 800ms;
constexpr auto kPace = 2ms;  // the balanced case's: an item every kPace

void spin(std::chrono::microseconds d) {
  const auto until = Clock::now() + d;
  while (Clock::now() < until) {
  }
}

// A source of ints until the deadline, each after `cost()`.
auto timed_source(Clock::time_point deadline, std::function<void()> cost = {}) {
  return [deadline, cost, n = 0]() mutable -> std::optional<int> {
    if (Clock::now() >= deadline) return std::nullopt;
    if (cost) cost();
    return n++;
  };
}

auto costly(std::function<void()> cost) {
  return [cost](int x) {
    cost();
    return x;
  };
}

// Runs `build(builder)` to the end, the training loop calling `step` for every item, and returns
// the verdict on its log.
template <class Build, class Step>
Report run_case(const std::string& name, Build build, Step step) {
  stoker::test::TempDir dir("matrix-" + name);
  const auto log = (dir / "run.jsonl").string();
  {
    auto pipe = build(PipelineBuilder{}.epochs(1).occupancy_log(log, 10ms));
    for (auto epoch : pipe.epochs())
      for (auto& item : epoch) step(item);
  }
  return analyze(read_log(log));
}

struct Expect {
  Bottleneck kind;
  std::string part;
};

// kRepeats runs of `once()`, each right with a fit above kFit; prints what each said.
void check_case(const std::string& name, const Expect& want, const std::function<Report()>& once) {
  int right = 0;
  for (int i = 0; i < kRepeats; ++i) {
    const Report r = once();
    const Verdict& v = r.verdict;
    const bool ok = v.kind == want.kind && v.part == want.part && v.fit >= kFit;
    right += ok;
    std::ostringstream text;
    print_report(text, r);
    std::printf("matrix: %-26s run %d: %s: bottleneck: %s (fit %.2f)%s\n", name.c_str(), i + 1, ok ? "right" : "WRONG",
                v.headline.c_str(), v.fit, i == 0 ? ("\n    suggestion: " + v.suggestion).c_str() : "");
    if (std::getenv("STOKER_MATRIX_VERBOSE")) std::printf("%s\n", text.str().c_str());  // every run's report
    CHECK_MESSAGE(ok, name << " run " << i + 1 << ":\n" << text.str());
  }
  std::printf("matrix: %-26s %d of %d right\n", name.c_str(), right, kRepeats);
}

// read -> decode -> augment -> batch -> the loop, with the given costs; threads enough for every
// body unless `threads` says otherwise.
Report chain(const std::string& name, std::function<void()> read, std::function<void()> decode,
             std::function<void()> augment, std::function<void()> loop, int threads = 8) {
  const auto deadline = Clock::now() + kRun;
  return run_case(
      name,
      [&](PipelineBuilder b) {
        return std::move(b.threads(threads))
            .source("read", timed_source(deadline, read), {.queue = 32})
            .map("decode", costly(decode ? decode : [] {}), {.threads = 2, .queue = 32})
            .map("augment", costly(augment ? augment : [] {}), {.queue = 32})
            .batch("batch", 8, {.queue = 4})
            .build();
      },
      [&](const std::vector<int>&) {
        if (loop) loop();
      });
}

// Four stages that each take `cost` per item on each of their threads (the source one, the
// others `bodies`, so that each stage can do as much as the source), on `threads` threads of
// the pipeline.
Report four_equal(const std::string& name, int threads, std::function<void()> cost, int bodies = 1) {
  const auto deadline = Clock::now() + kRun;
  const auto source_cost = [cost, bodies] {
    for (int i = 0; i < bodies; ++i) cost();  // as the others do with `bodies` threads
  };
  return run_case(
      name,
      [&](PipelineBuilder b) {
        return std::move(b.threads(threads))
            .source("read", timed_source(deadline, bodies == 1 ? cost : source_cost), {.queue = 16})
            .map("decode", costly(cost), {.threads = bodies, .queue = 16})
            .map("augment", costly(cost), {.threads = bodies, .queue = 16})
            .map("collate", costly(cost), {.threads = bodies, .queue = 16})
            .build();
      },
      [](int) {});
}

// Processes that spin on every core until ended: the competition of an oversubscribed machine.
class Spinners {
 public:
  explicit Spinners(int n) {
    for (int i = 0; i < n; ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        for (;;) {
        }
      }
      if (pid > 0) pids_.push_back(pid);
    }
  }
  ~Spinners() {
    for (const pid_t pid : pids_) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }

 private:
  std::vector<pid_t> pids_;
};

int cores() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

}  // namespace

TEST_SUITE("the verdict on real runs") {
  TEST_CASE("a slow training loop" * doctest::timeout(60)) {
    check_case("slow training loop", {Bottleneck::training, "consumer"},
               [] { return chain("consumer", {}, {}, {}, [] { std::this_thread::sleep_for(4ms); }); });
  }

  TEST_CASE("a slow source that computes" * doctest::timeout(60)) {
    check_case("slow source (computes)", {Bottleneck::source, "read"},
               [] { return chain("source", [] { spin(500us); }, {}, {}, {}); });
  }

  TEST_CASE("a source that waits for its data (I/O)" * doctest::timeout(60)) {
    check_case("source waiting for I/O", {Bottleneck::source, "read"},
               [] { return chain("io", [] { std::this_thread::sleep_for(1ms); }, {}, {}, {}); });
  }

  TEST_CASE("a slow middle stage" * doctest::timeout(60)) {
    check_case("slow middle stage", {Bottleneck::stage, "decode"},
               [] { return chain("middle", {}, [] { std::this_thread::sleep_for(2ms); }, {}, {}); });
  }

  TEST_CASE("a slow stage before the training loop" * doctest::timeout(60)) {
    check_case("slow last stage", {Bottleneck::stage, "augment"},
               [] { return chain("augment", {}, {}, [] { std::this_thread::sleep_for(1ms); }, {}); });
  }

  TEST_CASE("a slow collate" * doctest::timeout(60)) {
    // read -> batch -> collate (a batch's worth of work) -> the loop.
    check_case("slow collate", {Bottleneck::stage, "collate"}, [] {
      const auto deadline = Clock::now() + kRun;
      return run_case(
          "collate",
          [&](PipelineBuilder b) {
            return std::move(b.threads(8))
                .source("read", timed_source(deadline), {.queue = 64})
                .batch("batch", 16, {.queue = 4})
                .map("collate",
                     [](std::vector<int> v) {
                       std::this_thread::sleep_for(4ms);
                       return v.size();
                     },
                     {.queue = 4})
                .build();
          },
          [](std::size_t) {});
    });
  }

  TEST_CASE("slow copies to the device (the CPU backend)" * doctest::timeout(60)) {
    // Batches of 4 MB: collated for free into the staging pool's pinned buffers (nothing is
    // written), then copied by the device's copy stream, which is all the work there is. A
    // staging buffer comes back only once its copy is done, so collate waits for them.
    check_case("slow device copies", {Bottleneck::stage, "collate"}, [] {
      auto device = gpu::Device::open("cpu");
      const Shape shape{1, 1, 512, 512, false};
      const std::size_t count = 4;
      // Device buffers for the queue after h2d and one the loop holds: the copies' order of 4
      // staging buffers, not the device's, is what limits.
      gpu::ToDevice to_device(device,
                              {.bytes = Batch::storage_bytes(shape, DType::f32, count),
                               .staging_buffers = 4,
                               .device_buffers = gpu::OutputSizing{.per_call = 1, .queued = 8, .held = 1}.buffers()});
      const auto deadline = Clock::now() + kRun;
      const Report r = run_case(
          "copy",
          [&](PipelineBuilder b) {
            return std::move(b.threads(4))
                .source("read", timed_source(deadline), {.queue = 8})
                .map("collate",
                     [pool = to_device.staging(), shape](int, const StageContext& ctx) {
                       return Batch::allocate(*pool, shape, DType::f32, count, ctx);
                     },
                     {.queue = 2, .max_chunk = 1})
                .map("h2d", to_device, {.queue = 8})
                .build();
          },
          [](gpu::DeviceBatch&) {});
      CHECK(r.verdict.headline.find("the device") != std::string::npos);
      return r;
    });
  }

  TEST_CASE("too few threads: four equally busy stages on one thread" * doctest::timeout(60)) {
    check_case("4 stages on 1 thread", {Bottleneck::threads, "pipeline"},
               [] { return four_equal("threads1", 1, [] { std::this_thread::sleep_for(300us); }); });
  }

  TEST_CASE("too few threads: four equally busy stages on two threads" * doctest::timeout(60)) {
    check_case("4 stages on 2 threads", {Bottleneck::threads, "pipeline"},
               [] { return four_equal("threads2", 2, [] { std::this_thread::sleep_for(300us); }); });
  }

  TEST_CASE("too few cores: more threads than cores, and another process spinning" * doctest::timeout(60)) {
    // The stages compute, four of them equally; the pipeline has more threads than the machine
    // has cores, all of them the stages', and a spinning process per core competes for the cores.
    check_case("oversubscribed cores", {Bottleneck::threads, "pipeline"}, [] {
      const Spinners others(cores());
      const int bodies = (cores() + 2 + 3) / 4;  // a stage's threads; 4 of them: more than the cores
      const Report r = four_equal(
          "cores", 4 * bodies, [] { spin(200us); }, bodies);
      CHECK(r.verdict.headline.find("the machine's cores") != std::string::npos);
      return r;
    });
  }

  TEST_CASE("a stage that waits for a lock the training loop holds" * doctest::timeout(60)) {
    // 'decode' takes a lock that the training loop holds through each of its steps: the stage
    // is busy, asleep in its function, and the loop works; their work is one after the other.
    check_case("lock shared with the loop", {Bottleneck::training, "consumer"}, [] {
      std::mutex shared;
      const Report r = chain(
          "lock", {}, [&] { const std::lock_guard lock(shared); }, {},
          [&] {
            const std::lock_guard lock(shared);
            std::this_thread::sleep_for(2ms);
          });
      const auto& e = r.verdict.evidence;
      CHECK(std::any_of(e.begin(), e.end(), [](const std::string& line) {
        return line.find("'decode' was busy") != std::string::npos &&
               line.find("sleeps in its function") != std::string::npos;
      }));
      return r;
    });
  }

  TEST_CASE("a shuffle that keeps back nearly an epoch makes the loop wait at every epoch's start" *
            doctest::timeout(60)) {
    // 500 items an epoch, 475 kept back: each epoch starts with the loop waiting until 475 are
    // in, and the source then idles while the loop drains the epoch. The source makes an item
    // every 100 us or so, the loop takes one as often (both sleep): with no floor, neither would
    // wait much.
    check_case("shuffle keeps back an epoch", {Bottleneck::shuffle, "shuffle"}, [] {
      const auto deadline = Clock::now() + kRun;
      const Report r = run_case(
          "shuffle",
          [&](PipelineBuilder b) {
            return std::move(b.threads(4).epochs(0))
                .source("read",
                        [deadline, n = 0]() mutable -> std::optional<int> {
                          if (n == 500 || Clock::now() >= deadline) {
                            n = 0;
                            return std::nullopt;
                          }
                          std::this_thread::sleep_for(100us);
                          return n++;
                        },
                        {.queue = 64})
                .shuffle("shuffle", {.capacity = 500, .min_after_dequeue = 475})
                .map("use", [](int x) { return x; }, {.queue = 16})
                .build();
          },
          [](int) { std::this_thread::sleep_for(100us); });
      CHECK(r.verdict.suggestion.find(".min_after_dequeue = 47}") != std::string::npos);
      return r;
    });
  }

  TEST_CASE("balanced: the input and the training loop on one pace" * doctest::timeout(60)) {
    // 'decode' and the training loop each keep a pace of an item every 2 ms (sleeping until the
    // next tick, so that a late wake-up is made up), the rest is free: neither waits much for the
    // other, and each is at work nearly all the time.
    check_case("balanced", {Bottleneck::balanced, "none"}, [] {
      const auto start = Clock::now();
      const auto deadline = start + kRun;
      return run_case(
          "balanced",
          [&](PipelineBuilder b) {
            return std::move(b.threads(4))
                .source("read", timed_source(deadline), {.queue = 16})
                .map("decode",
                     [start, n = 0](int x) mutable {
                       std::this_thread::sleep_until(start + ++n * kPace);
                       return x;
                     },
                     {.queue = 16})
                .build();
          },
          [start, n = 0](int) mutable { std::this_thread::sleep_until(start + 5ms + ++n * kPace); });
    });
  }
}
