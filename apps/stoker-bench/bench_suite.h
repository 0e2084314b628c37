// What every stoker-bench suite shares: the common options, the registration contract and
// the statistics the figures are made of.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

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
