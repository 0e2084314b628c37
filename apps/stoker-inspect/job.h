// SPDX-License-Identifier: Apache-2.0
// The logs of the ranks of one job, read together: which rank holds the others back, and why.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "log.h"
#include "verdict.h"

namespace stoker::inspect {

struct JobReport {
  struct Rank {
    std::string name;  ///< "rank 2"
    std::string role;  ///< "trainer" or "worker" in a job with remote workers; empty in a data-parallel one
    double wait = 0;   ///< share of the run its training loop (a worker's sender) waited for input, 0..1
    /// Share of the run it waited for the other ranks in the gradient exchange, 0..1; none when
    /// its log does not count it.
    std::optional<double> exchange;
    std::uint64_t items = 0;  ///< items its loop took (a worker: the batches it sent)
    Report report;            ///< analyze() of its log
  };
  bool remote = false;      ///< a trainer with remote workers; else data-parallel
  std::vector<Rank> ranks;  ///< in the order of the logs given
  std::string straggler;    ///< the rank that holds the others back; empty when none stands out
  std::vector<std::string> evidence;
  std::string suggestion;
};

/// Sums up each rank's log and names the straggler. Throws LogError for logs that are not the
/// ranks of one job: a log without a rank, two logs of one rank, or logs of different jobs.
///
/// Data-parallel, every step waits for the slowest rank in the gradient exchange, so the slowest
/// rank waits there least: with each rank's exchange wait counted (the `exchange_wait_ns`
/// counter), the straggler is the rank that waited at least 10 points of its run less than the
/// median of the others. Its own figures then say why: its input (its training loop waited for
/// it) or its training step. Otherwise, or without the counter, the input alone: only the slowest
/// rank's training loop waits for its input, so a rank stands out when it waited at least 5% of
/// its run and at least twice the median rank.
///
/// With remote workers (logs labelled role "trainer" and "worker"), a worker stands out when it
/// sent at most 60% of the batches per second of the median other worker.
JobReport analyze_job(const std::vector<OccupancyLog>& logs);
/// A line per rank, each rank's report, and the verdict.
void print_job(std::ostream& out, const JobReport& job);
/// {"mode", "ranks": [{"rank", "role", "input_wait_pct", "exchange_wait_pct", "items", "report"}...],
///  "straggler", "evidence", "suggestion"}.
nlohmann::json to_json(const JobReport& job);
/// The ranks' plots side by side under the job's verdict, the straggler's framed in red: an
/// SVG document. `job` is `analyze_job(logs)`.
std::string plot_job_svg(const std::vector<OccupancyLog>& logs, const JobReport& job);
/// The same in an HTML page (which scrolls sideways; the plots in it do not zoom).
std::string plot_job_html(const std::vector<OccupancyLog>& logs, const JobReport& job);

}  // namespace stoker::inspect
