// SPDX-License-Identifier: Apache-2.0
// What every stoker-bench suite shares: the common options, the registration contract and
// the statistics the figures are made of.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <sys/resource.h>
#include <vector>

#include "checks.h"
#include "stoker/core/stage_stats.h"

namespace stoker::bench {

using Json = nlohmann::ordered_json;

/// Options that every suite takes.
struct CommonOptions {
  bool json = false;  ///< print the result as one JSON object on the last line of stdout
  int repeats = 5;    ///< each figure is the median over this many repeats
};

/// Runs a suite: prints a human-readable report on stdout as it goes and returns the
/// suite's figures (`config`, `results`, ...). `suite` and `machine` are added by main.
/// Throws on a broken run: a benchmark must not report figures of a run that lost data.
using SuiteRun = std::function<Json(const CommonOptions&)>;

/// Adds a suite's own options to its subcommand and returns the runner bound to them.
using SuiteSetup = SuiteRun (*)(CLI::App& command);

/// One row of main's registration table: adding a suite is one such row and one function.
struct Suite {
  const char* name;
  const char* summary;
  SuiteSetup setup;
};

SuiteRun setup_shuffle(CLI::App& command);
SuiteRun setup_pipeline(CLI::App& command);
SuiteRun setup_autotune(CLI::App& command);

// Work of a known length. It counts iterations, calibrated once, rather than watching the
// clock: a body that loses its core must take longer, as real work would.
class Work {
 public:
  Work() {
    constexpr std::uint64_t kProbe = 20'000'000;
    const auto t0 = std::chrono::steady_clock::now();
    sink_ = spin(kProbe);
    per_us_ = static_cast<double>(kProbe) /
              (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e6);
  }
  std::uint64_t iterations(double us) const { return static_cast<std::uint64_t>(us * per_us_); }
  static std::uint64_t spin(std::uint64_t n) {
    std::uint64_t x = 0x9E3779B97F4A7C15ull;
    for (std::uint64_t i = 0; i < n; ++i) x = x * 6364136223846793005ull + 1442695040888963407ull;
    return x;
  }
  volatile std::uint64_t sink_ = 0;  // a volatile write: the probe cannot be optimized away

 private:
  double per_us_ = 0;
};

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// CPU time of the whole process so far: on a shared machine, CPU time per item shows what a
/// run costs even when other processes stretch its wall time.
inline double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto seconds = [](timeval t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return seconds(u.ru_utime) + seconds(u.ru_stime);
}

/// A pipeline's summary as JSON: per stage threads, items in and out, busy seconds, busy share
/// per thread, and the shares of the run it starved and was blocked; per queue its capacity and
/// the shares of its life it was empty and full; and the share the consumer waited.
inline Json stage_table(const PipelineSummary& s) {
  const auto percent = [](std::chrono::nanoseconds part, std::chrono::nanoseconds whole) {
    return whole.count() > 0 ? 100.0 * static_cast<double>(part.count()) / static_cast<double>(whole.count()) : 0.0;
  };
  Json stages = Json::array();
  for (const StageStats& st : s.stages)
    stages.push_back({{"name", st.name},
                      {"threads", st.threads},
                      {"items_in", st.items_in},
                      {"items_out", st.items_out},
                      {"busy_s", std::chrono::duration<double>(st.busy).count()},
                      {"busy_per_thread_pct", percent(st.busy, s.wall * st.threads)},
                      {"starved_pct", percent(st.starved, s.wall)},
                      {"blocked_pct", percent(st.blocked, s.wall)}});
  Json queues = Json::array();
  for (const QueueReport& q : s.queues)
    queues.push_back({{"name", q.name},
                      {"capacity", q.capacity},
                      {"empty_pct", percent(q.time_empty, q.lifetime)},
                      {"full_pct", percent(q.time_full, q.lifetime)}});
  return {{"wall_s", std::chrono::duration<double>(s.wall).count()},
          {"stages", std::move(stages)},
          {"queues", std::move(queues)},
          {"consumer_waited_pct", percent(s.consumer_wait, s.wall)}};
}

/// Median, minimum and maximum of one figure over the repeats.
struct Spread {
  double median = 0, min = 0, max = 0;
};

inline Spread spread(std::vector<double> samples) {
  if (samples.empty()) throw std::logic_error("spread of no samples");
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  const double median = n % 2 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2;
  return {median, samples.front(), samples.back()};
}

}  // namespace stoker::bench
