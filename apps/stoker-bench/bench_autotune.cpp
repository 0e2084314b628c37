// SPDX-License-Identifier: Apache-2.0
// stoker-bench autotune: how close the autotuner gets, and how fast, to the best hand-chosen
// split of a thread budget between a slow and a cheap stage, and what it costs a pipeline
// that is already well set.
//
// The pipeline: read (a counter) -> slow (SLOW us of work an item) -> cheap (CHEAP us an item).
// Each repeat runs, one after another:
//   - every split of the budget (slow k threads, cheap budget - k), untuned: the best of them
//     is the hand-chosen figure;
//   - the autotuner from the worst start (slow 1, cheap budget - 1), its items/s measured in
//     windows of a tenth of a second: when it first reaches 0.9 of the best split, and its
//     items/s from 2 s on against the best split;
//   - the best split with the autotuner on, against the same split without it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "app_main.h"
#include "bench_suite.h"
#include "stoker/core/pipeline.h"

namespace stoker::bench {
namespace {

using Clock = std::chrono::steady_clock;
using apps::fixed;

struct Config {
  double slow_us = 40, cheap_us = 4;
  int budget = 0;  // 0: 2 x cores, at least 4
  double seconds = 4;
};

// Items/s of one run, in windows of `window` from the start, and the threads at the end.
struct Run {
  std::vector<double> windows;  // items/s in each window
  int slow_threads = 0, cheap_threads = 0;
  double rate(double from_s, double window_s) const {
    const auto first = static_cast<std::size_t>(from_s / window_s);
    if (first >= windows.size()) return 0;
    double sum = 0;
    for (std::size_t i = first; i < windows.size(); ++i) sum += windows[i];
    return sum / static_cast<double>(windows.size() - first);
  }
};

constexpr double kWindow = 0.1;  // s

Run run(const Config& c, const Work& work, int slow, int cheap, bool tuned) {
  const std::uint64_t slow_n = work.iterations(c.slow_us), cheap_n = work.iterations(c.cheap_us);
  PipelineBuilder builder;
  builder.threads(c.budget);
  if (tuned) builder.threads(0).autotune({.threads = c.budget});
  auto pipe =
      std::move(builder)
          .source("read", [n = std::uint64_t{0}]() mutable -> std::optional<std::uint64_t> { return n++; })
          .map("slow", [slow_n](std::uint64_t x) { return x + (Work::spin(slow_n) & 1); }, {.threads = slow})
          .map("cheap", [cheap_n](std::uint64_t x) { return x + (Work::spin(cheap_n) & 1); }, {.threads = cheap})
          .build();
  Run r;
  const auto t0 = Clock::now();
  auto window_end = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kWindow));
  const auto end = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(c.seconds));
  std::uint64_t in_window = 0;
  while (auto x = pipe.next()) {
    ++in_window;
    const auto now = Clock::now();
    if (now < window_end) continue;
    r.windows.push_back(static_cast<double>(in_window) / kWindow);
    in_window = 0;
    window_end += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kWindow));
    if (now >= end) break;
  }
  for (const auto& s : pipe.summary().stages) {
    if (s.name == "slow") r.slow_threads = s.threads;
    if (s.name == "cheap") r.cheap_threads = s.threads;
  }
  pipe.stop();
  return r;
}

Json run_suite(Config c, const CommonOptions& common) {
  if (c.budget == 0) c.budget = std::max(4, 2 * static_cast<int>(std::thread::hardware_concurrency()));
  if (c.budget < 2) throw std::invalid_argument("autotune: --budget must be at least 2");
  const Work work;
  std::cout << "autotune: read -> slow (" << c.slow_us << " us an item) -> cheap (" << c.cheap_us
            << " us an item), a budget of " << c.budget << " threads, runs of " << c.seconds << " s, " << common.repeats
            << " repeats\n";
  const int splits = c.budget - 1;
  std::vector<std::vector<double>> split_rates(static_cast<std::size_t>(splits));
  std::vector<double> best_rates, reach_s, after_2s, tuned_best, untuned_best;
  std::vector<std::string> ends;
  for (int rep = 0; rep < common.repeats; ++rep) {
    int best_k = 1;
    double best = 0;
    for (int k = 1; k <= splits; ++k) {
      const double rate = run(c, work, k, c.budget - k, false).rate(1.0, kWindow);  // after a second
      split_rates[static_cast<std::size_t>(k - 1)].push_back(rate);
      if (rate > best) best = rate, best_k = k;
    }
    best_rates.push_back(best);
    const Run tuned = run(c, work, 1, c.budget - 1, true);
    double reached = -1;
    for (std::size_t i = 0; i < tuned.windows.size() && reached < 0; ++i)
      if (tuned.windows[i] >= 0.9 * best) reached = static_cast<double>(i + 1) * kWindow;
    reach_s.push_back(reached);
    after_2s.push_back(tuned.rate(2.0, kWindow) / best);
    ends.push_back(std::to_string(tuned.slow_threads) + "/" + std::to_string(tuned.cheap_threads));
    // The best split, with and without the tuner, one after the other.
    const double on = run(c, work, best_k, c.budget - best_k, true).rate(1.0, kWindow);
    const double off = run(c, work, best_k, c.budget - best_k, false).rate(1.0, kWindow);
    tuned_best.push_back(on / off);
    std::cout << "  repeat " << rep + 1 << ": best split slow " << best_k << " / cheap " << c.budget - best_k << " at "
              << fixed(best / 1e3, 1) << "k items/s; tuned from 1/" << c.budget - 1 << ": 0.9 of it after "
              << (reached < 0 ? std::string("never") : fixed(reached, 1) + " s") << ", from 2 s on "
              << fixed(after_2s.back(), 3) << " of it, ended at " << ends.back() << "; the best split tuned / untuned "
              << fixed(tuned_best.back(), 3) << "\n";
  }
  Json split_json = Json::array();
  std::cout << "\nitems/s after the first second, median of " << common.repeats << " repeats, per split (slow/cheap):";
  for (int k = 1; k <= splits; ++k) {
    const double m = spread(split_rates[static_cast<std::size_t>(k - 1)]).median;
    std::cout << "  " << k << "/" << c.budget - k << " " << fixed(m / 1e3, 1) << "k";
    split_json.push_back({{"slow_threads", k}, {"cheap_threads", c.budget - k}, {"items_per_s_median", m}});
  }
  std::vector<double> reached_only;
  for (double r : reach_s)
    if (r >= 0) reached_only.push_back(r);
  const Spread after = spread(after_2s), cost = spread(tuned_best);
  std::cout << "\ntuned from the worst split: reached 0.9 of the best in " << reached_only.size() << " of "
            << common.repeats << " repeats"
            << (reached_only.empty() ? std::string()
                                     : ", after " + fixed(spread(reached_only).median, 1) + " s (median)")
            << "; from 2 s on " << fixed(after.median, 3) << " of the best (min " << fixed(after.min, 3)
            << "); goal: 0.9 within 2 s, and staying\n"
            << "the best split, tuned / untuned: " << fixed(cost.median, 3) << " (min " << fixed(cost.min, 3)
            << "); goal >= 0.98\n";
  Json out;
  out["config"] = {{"slow_us", c.slow_us}, {"cheap_us", c.cheap_us}, {"budget", c.budget},
                   {"seconds", c.seconds}, {"window_s", kWindow},    {"repeats", common.repeats}};
  out["results"] = {{"splits", split_json},
                    {"best_items_per_s_median", spread(best_rates).median},
                    {"tuned_reached_0_9_s", reach_s},
                    {"tuned_after_2s_over_best", after_2s},
                    {"tuned_after_2s_over_best_median", after.median},
                    {"tuned_final_split", ends},
                    {"well_set_tuned_over_untuned", tuned_best},
                    {"well_set_tuned_over_untuned_median", cost.median}};
  return out;
}

}  // namespace

SuiteRun setup_autotune(CLI::App& command) {
  auto cfg = std::make_shared<Config>();
  command.add_option("--slow-us", cfg->slow_us, "Work per item of the slow stage, us")
      ->check(apps::above(0.0))
      ->capture_default_str();
  command.add_option("--cheap-us", cfg->cheap_us, "Work per item of the cheap stage, us")
      ->check(apps::above(0.0))
      ->capture_default_str();
  command.add_option("--budget", cfg->budget, "Threads to split (default: 2 x cores, at least 4)")
      ->check(apps::in_range(2, 64));
  command.add_option("--seconds", cfg->seconds, "Length of each run")
      ->check(apps::in_range(2.5, 600.0))
      ->capture_default_str();
  return [cfg](const CommonOptions& common) { return run_suite(*cfg, common); };
}

}  // namespace stoker::bench
