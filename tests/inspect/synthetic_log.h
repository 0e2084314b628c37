// SPDX-License-Identifier: Apache-2.0
// Occupancy logs made up to order, for the plot's tests: the shape of stoker-train's pipeline
// (read -> crops -> shuffle -> batch -> collate -> h2d -> the training loop) with one stage
// as the bottleneck, of any length, with or without epochs, stage records and counters.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "inspect.h"

namespace stoker::test {

struct SyntheticRun {
  double seconds = 60;
  double interval = 0.05;      ///< between two samples of every queue
  int epochs = 3;              ///< 0: no epoch records
  bool stage_records = true;   ///< the stages' counters at the end
  bool counters = true;        ///< a counters record (copies and bytes)
  std::size_t bottleneck = 3;  ///< 0 (read) to 5 (the training loop): "collate"
};

/// The stages in pipeline order, the training loop last.
inline const std::vector<std::string>& synthetic_stages() {
  static const std::vector<std::string> names{"read", "crops", "batch", "collate", "h2d", "consumer"};
  return names;
}

/// The queues before the bottleneck swing between half full and full (their producers are
/// blocked and resume at half), those after it hold an item now and then; every epoch starts
/// with the queues empty and fills them in its first second.
inline inspect::OccupancyLog synthetic_log(const SyntheticRun& run) {
  struct Queue {
    const char* name;
    std::size_t capacity;
  };
  static constexpr Queue kQueues[] = {
      {"read->crops", 64}, {"shuffle", 10000}, {"batch->collate", 4}, {"collate->h2d", 4}, {"h2d->consumer", 4}};
  const std::vector<std::string>& stages = synthetic_stages();
  inspect::OccupancyLog log;
  log.source = "synthetic.jsonl";
  for (std::size_t i = 0; i < std::size(kQueues); ++i)
    log.queues.push_back({kQueues[i].name, stages[i], stages[i + 1], kQueues[i].capacity, 0, {}});

  const double epoch_length = run.epochs > 0 ? run.seconds / run.epochs : run.seconds;
  for (int e = 0; e < run.epochs; ++e) log.epochs.push_back({0.001 + e * epoch_length, static_cast<std::uint64_t>(e)});

  std::uint64_t state = 12345;  // a fixed LCG: the same log on every run
  auto next = [&state] { return (state = state * 6364136223846793005ULL + 1442695040888963407ULL) >> 33; };
  const auto samples = static_cast<std::size_t>(run.seconds / run.interval);
  for (std::size_t n = 0; n < samples; ++n) {
    const double t = 0.002 + static_cast<double>(n) * run.interval;
    const double into_epoch = t - epoch_length * static_cast<double>(static_cast<int>(t / epoch_length));
    const double ramp = std::min(1.0, into_epoch);  // filling at the start of each epoch
    for (std::size_t i = 0; i < log.queues.size(); ++i) {
      inspect::QueueSeries& q = log.queues[i];
      const auto capacity = static_cast<double>(q.capacity);
      double size = i < run.bottleneck ? (next() % 3 == 0 ? capacity / 2 + static_cast<double>(next() % 4) : capacity)
                                       : static_cast<double>(next() % 8 == 0);
      size = std::floor(size * ramp);
      q.samples.push_back({t, static_cast<std::size_t>(size), 0, std::min(1.0, size / capacity)});
    }
  }

  if (run.stage_records) {
    for (std::size_t k = 0; k + 1 < stages.size(); ++k) {
      inspect::StageCounters s;
      s.name = stages[k];
      s.threads = stages[k] == "crops" ? 2 : 1;
      s.t = run.seconds;
      // Shares of the run: busy (of threads x run), starved, blocked.
      const double before[] = {0.2, 0.02, 0.75}, at[] = {0.96, 0.01, 0.01}, after[] = {0.1, 0.85, 0.02};
      const double* shares = k < run.bottleneck ? before : k == run.bottleneck ? at : after;
      s.busy_s = shares[0] * run.seconds * s.threads;
      s.starved_s = shares[1] * run.seconds;
      s.blocked_s = shares[2] * run.seconds;
      s.items_in = k == 0 ? 0 : 1000;
      s.items_out = 1000;
      log.stages.push_back(s);
    }
  }
  if (run.counters)
    log.counters = {{"h2d_copies", 2356}, {"h2d_bytes", 1652747624}, {"d2h_copies", 1}, {"d2h_bytes", 12}};
  return log;
}

/// The log as `.occupancy_log()` writes it: epoch marks and samples in time order, then the
/// stage records and the counters.
inline std::string to_jsonl(const inspect::OccupancyLog& log) {
  std::string out;
  std::size_t epoch = 0;
  const std::size_t samples = log.queues.front().samples.size();
  for (std::size_t n = 0; n < samples; ++n) {
    const double t = log.queues.front().samples[n].t;
    for (; epoch < log.epochs.size() && log.epochs[epoch].t <= t; ++epoch)
      out += nlohmann::json{{"type", "epoch"}, {"t", log.epochs[epoch].t}, {"epoch", log.epochs[epoch].epoch}}.dump() +
             "\n";
    for (const inspect::QueueSeries& q : log.queues)
      out += nlohmann::json{{"type", "sample"},          {"t", q.samples[n].t},    {"queue", q.name},
                            {"size", q.samples[n].size}, {"capacity", q.capacity}, {"producer", q.producer},
                            {"consumer", q.consumer}}
                 .dump() +
             "\n";
  }
  for (const inspect::StageCounters& s : log.stages)
    out += nlohmann::json{{"type", "stage"},         {"t", s.t},
                          {"stage", s.name},         {"threads", s.threads},
                          {"items_in", s.items_in},  {"items_out", s.items_out},
                          {"busy_s", s.busy_s},      {"starved_s", s.starved_s},
                          {"blocked_s", s.blocked_s}}
               .dump() +
           "\n";
  if (!log.counters.empty()) {
    nlohmann::json counters = nlohmann::json::object();
    for (const auto& [name, value] : log.counters) counters[name] = value;
    out += nlohmann::json{{"type", "counters"}, {"t", log.queues.front().samples.back().t}, {"counters", counters}}
               .dump() +
           "\n";
  }
  return out;
}

}  // namespace stoker::test
