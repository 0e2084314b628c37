// Reads a pipeline's occupancy log (the JSON Lines that `.occupancy_log()` writes), sums
// up each queue and stage, names the stage that limits the pipeline, and draws the run.
// Kept apart from main.cpp so that the tests can feed it logs of real runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace stoker::inspect {

/// One sample of one queue.
struct FillSample {
  double t = 0;          ///< seconds since the pipeline started
  std::size_t size = 0;  ///< items held
  double fill = 0;       ///< size / capacity, 0..1
};

/// Every sample of one queue, in the order of the log.
struct QueueSeries {
  std::string name, producer, consumer;
  std::size_t capacity = 0;
  std::vector<FillSample> samples;
};

/// The counters a stage reports when the pipeline stops.
struct StageCounters {
  std::string name;
  int threads = 1;
  std::uint64_t items_in = 0, items_out = 0;
  double busy_s = 0;     ///< time its bodies ran, summed over its threads
  double starved_s = 0;  ///< time no body ran because its input was empty
  double blocked_s = 0;  ///< time no body ran because its output was full
  double t = 0;          ///< when the record was written: the length of the run
};

/// The start of an epoch, from the log's `epoch` record.
struct EpochMark {
  double t = 0;             ///< seconds since the pipeline started
  std::uint64_t epoch = 0;  ///< the epoch's number as the pipeline counts it, the first is 0
};

/// A move of the autotuner (PipelineBuilder::autotune), from the log's `autotune` record.
struct TuningMove {
  double t = 0;          ///< seconds since the pipeline started
  std::string what;      ///< "crops 1 -> 2 threads, collate 3 -> 2"
  std::string evidence;  ///< the busy shares that called for it
};

/// The training loop's waits for its input, from the log's `consumer` record.
struct ConsumerCounters {
  std::uint64_t items = 0;  ///< items it took
  double waited_s = 0;      ///< time it waited for them
  double t = 0;             ///< when the record was written: the length of the run
};

/// A parsed log. Queues are in pipeline order, source first.
struct OccupancyLog {
  std::string source;  ///< the file, for messages
  std::string rank;    ///< its records' "rank" label (one rank of a job), empty when none
  std::optional<ConsumerCounters> consumer;
  int pipeline_threads = 0;  ///< the threads all stages share (its "pipeline" record); 0 when unknown
  int cores = 0;             ///< of the machine it ran on; 0 when unknown
  std::vector<QueueSeries> queues;
  std::vector<StageCounters> stages;
  std::vector<EpochMark> epochs;                                ///< in the order of the log; empty when it has none
  std::vector<TuningMove> moves;                                ///< the autotuner's, in order; empty when it was off
  std::vector<std::pair<std::string, std::uint64_t>> counters;  ///< kept outside the graph, e.g. copies
  std::size_t skipped_lines = 0;                                ///< malformed lines passed over with skip_bad_lines
  std::string first_skipped;                                    ///< "line N: what is wrong" for the first of them
};

/// A log that cannot be read or makes no sense. The message names the file, and the line
/// where there is one ("run.jsonl:12: ..."), and fits on one line.
class LogError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ReadOptions {
  bool skip_bad_lines = false;  ///< count malformed lines instead of throwing on the first
};

/// Parses the log at `path`. Throws LogError for a missing or unreadable file, a malformed
/// line (unless skipped) and a log without a single sample record.
OccupancyLog read_log(const std::string& path, ReadOptions options = {});
/// The same from a stream; `source` names it in messages.
OccupancyLog parse_log(std::istream& in, const std::string& source, ReadOptions options = {});

/// One queue summed up over the run.
struct QueueSummary {
  std::string name, producer, consumer;
  std::size_t capacity = 0;
  std::size_t samples = 0;
  double mean_fill = 0;    ///< mean of size / capacity
  double p95_fill = 0;     ///< 95th percentile of size / capacity
  double empty_pct = 0;    ///< share of samples with the queue empty, %
  double full_pct = 0;     ///< share of samples with the queue full, %
  std::size_t swings = 0;  ///< times it went from empty to full or back
};

/// A stage's counters as shares of the run.
struct StageSummary {
  StageCounters counters;
  double busy_pct = 0;     ///< busy time over threads x run length, %
  double starved_pct = 0;  ///< of the run length, %
  double blocked_pct = 0;  ///< of the run length, %
};

struct Report {
  std::string source;
  double duration_s = 0;  ///< from the first sample to the last
  std::vector<QueueSummary> queues;
  std::vector<StageSummary> stages;                             ///< empty when the log has no stage records
  std::vector<std::pair<std::string, std::uint64_t>> counters;  ///< empty when the log has none
  std::string bottleneck;                                       ///< a stage's name; "consumer" is the training loop
  double confidence = 0;          ///< 0..1: how well the run fits the picture of that bottleneck
  std::string evidence;           ///< the observations behind the verdict
  std::string suggestion;         ///< the change that should help most
  std::vector<TuningMove> moves;  ///< the autotuner's, from the log
};

/// Sums up the log and names the bottleneck. The log must hold at least one queue.
Report analyze(const OccupancyLog& log);

/// The tables and the verdict, for people.
void print_report(std::ostream& out, const Report& report);

/// The logs of the ranks of one job, read together.
struct JobReport {
  struct Rank {
    std::string name;  ///< its label ("rank 2"), or its file without one
    double wait = 0;   ///< share of the run its training loop waited for input, 0..1
    Report report;     ///< analyze() of its log
  };
  std::vector<Rank> ranks;  ///< in the order of the logs given
  std::string straggler;    ///< the rank whose input holds the others back; empty when none stands out
  std::string evidence;
  std::string suggestion;
};

/// Sums up each rank's log and names the straggler: in a data-parallel job every step waits
/// for the slowest rank, whose training loop alone waits for its input (the others wait for it
/// in the step's allreduce). A rank stands out when it waited at least 5% of its run and at
/// least twice the median rank.
JobReport analyze_job(const std::vector<OccupancyLog>& logs);
/// A line per rank, each rank's report, and the verdict.
void print_job(std::ostream& out, const JobReport& job);
/// {"ranks": [{"rank", "input_wait_pct", "report"}...], "straggler", "evidence", "suggestion"}.
nlohmann::json to_json(const JobReport& job);
/// The ranks' plots side by side under the job's verdict, the straggler's framed in red: an
/// SVG document. `job` is `analyze_job(logs)`.
std::string plot_job_svg(const std::vector<OccupancyLog>& logs, const JobReport& job);
/// The same in an HTML page (which scrolls sideways; the plots in it do not zoom).
std::string plot_job_html(const std::vector<OccupancyLog>& logs, const JobReport& job);

/// The report as one JSON object: queues, stages, counters, bottleneck, confidence, evidence,
/// suggestion, autotune (the moves).
nlohmann::json to_json(const Report& report);

/// The run as one picture, a standalone SVG document: the verdict on top, then one lane per
/// queue in pipeline order, source at the top, with each stage's row between the queue that
/// feeds it and the queue it fills (its busy, starved and blocked shares as a bar), the
/// epochs and the autotuner's moves across the lanes, and the counters. `report` is `analyze(log)`
/// (std::invalid_argument for a report with other queues).
std::string plot_svg(const OccupancyLog& log, const Report& report);
/// The same picture in a self-contained HTML page that can zoom into a time range and shows
/// each queue's fill under the pointer. It carries each queue's fill at a finer resolution
/// than the picture, but never more than a few MiB of it, however long the run.
std::string plot_html(const OccupancyLog& log, const Report& report);

}  // namespace stoker::inspect
