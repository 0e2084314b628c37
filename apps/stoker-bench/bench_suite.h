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

SuiteRun setup_queues(CLI::App& command);
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

/// A pipeline's stages as JSON: threads, items in and out, busy seconds and busy share per thread.
inline Json stage_table(const PipelineSummary& s) {
  Json stages = Json::array();
  const double wall = std::chrono::duration<double>(s.wall).count();
  for (const StageStats& st : s.stages) {
    const double busy = std::chrono::duration<double>(st.busy).count();
    const auto share = [&](std::chrono::nanoseconds t) {
      return wall > 0 ? 100.0 * std::chrono::duration<double>(t).count() / wall : 0.0;
    };
    stages.push_back({{"name", st.name},
                      {"threads", st.threads},
                      {"items_in", st.items_in},
                      {"items_out", st.items_out},
                      {"busy_s", busy},
                      {"busy_per_thread_pct", wall > 0 ? 100.0 * busy / (wall * st.threads) : 0.0},
                      {"starved_pct", share(st.starved)},
                      {"blocked_pct", share(st.blocked)}});
  }
  Json queues = Json::array();
  for (const QueueReport& q : s.queues) {
    const double life = std::chrono::duration<double>(q.lifetime).count();
    const auto share = [&](std::chrono::nanoseconds t) {
      return life > 0 ? 100.0 * std::chrono::duration<double>(t).count() / life : 0.0;
    };
    queues.push_back({{"name", q.name},
                      {"capacity", q.capacity},
                      {"empty_pct", share(q.time_empty)},
                      {"full_pct", share(q.time_full)}});
  }
  const double waited = std::chrono::duration<double>(s.consumer_wait).count();
  return {{"wall_s", wall},
          {"stages", std::move(stages)},
          {"queues", std::move(queues)},
          {"consumer_waited_pct", wall > 0 ? 100.0 * waited / wall : 0.0}};
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
