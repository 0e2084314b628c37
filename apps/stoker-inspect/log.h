// SPDX-License-Identifier: Apache-2.0
// A pipeline's occupancy log (the JSON Lines that `.occupancy_log()` writes), read into records:
// who wrote it, every sample of every queue, each stage's counters, the consumer's waits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace stoker::inspect {

/// One sample of one queue.
struct FillSample {
  double t = 0;             ///< seconds since the pipeline started
  std::size_t size = 0;     ///< items a consumer could take
  std::size_t waiting = 0;  ///< items its producer held at the entrance, waiting for room
  double fill = 0;          ///< size over the most it can be (QueueSeries::room()), 0..1
};

/// Every sample of one queue, in the order of the log.
struct QueueSeries {
  std::string name, producer, consumer;
  std::size_t capacity = 0;
  std::size_t floor = 0;  ///< what a shuffle keeps back (min_after_dequeue); 0 for a FIFO
  std::vector<FillSample> samples;

  /// The most items a consumer can find in it while the epoch's input goes on.
  std::size_t room() const { return capacity > floor ? capacity - floor : 1; }
};

/// The counters a stage reports when the pipeline stops.
struct StageCounters {
  std::string name;
  int threads = 1;
  std::uint64_t items_in = 0, items_out = 0;
  double busy_s = 0;       ///< time its bodies ran, summed over its threads
  double starved_s = 0;    ///< time no body ran because its input was empty
  double blocked_s = 0;    ///< time no body ran because its output was full, and pool waits
  double pool_wait_s = 0;  ///< of blocked_s, the time its function waited for a pool's buffer
  double t = 0;            ///< when the record was written: the length of the run
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

/// What the stages' threads shared, from the log's `pipeline` record (and its `run` record).
struct PipelineFigures {
  int threads = 0;              ///< the pipeline's threads, which all its stages share; 0 when unknown
  int cores = 0;                ///< of the machine it ran on; 0 when unknown
  std::optional<double> cpu_s;  ///< CPU time its threads spent
  /// Thread-seconds its threads ran a stage body while runnable (on a core or waiting for one),
  /// not asleep in it: against the stages' busy time, whether they compute or wait.
  std::optional<double> runnable_s;
  std::optional<double> process_cpu_s;     ///< CPU time the whole process spent
  std::optional<double> machine_busy_pct;  ///< share of the machine's CPU time any process used
};

/// A parsed log. Queues are in pipeline order, source first.
struct OccupancyLog {
  std::string source;   ///< the file, for messages
  std::string program;  ///< the program that wrote it ("stoker-train"); empty in a log without a run record
  std::string job;      ///< the job it belongs to; logs of one job's ranks have the same; empty when unknown
  std::string rank;     ///< its rank in the job, empty when none
  std::string role;     ///< "trainer" or "worker" for a job with remote workers; empty otherwise
  std::string data;     ///< the run record's "data" label: "images" for stoker-train --images
  std::optional<ConsumerCounters> consumer;
  PipelineFigures pipeline;
  std::vector<QueueSeries> queues;
  std::vector<StageCounters> stages;
  std::vector<EpochMark> epochs;                                ///< in the order of the log; empty when it has none
  std::vector<TuningMove> moves;                                ///< the autotuner's, in order; empty when it was off
  std::vector<std::pair<std::string, std::uint64_t>> counters;  ///< kept outside the graph, e.g. copies
  std::size_t skipped_lines = 0;                                ///< malformed lines passed over with skip_bad_lines
  std::string first_skipped;                                    ///< "line N: what is wrong" for the first of them

  /// The value of counter `name`, if the log has it.
  std::optional<std::uint64_t> counter(const std::string& name) const;
};

/// A log that cannot be read or makes no sense, or a file that is not a log. The message
/// names the file, and the line where there is one ("run.jsonl:12: ..."), and fits on one line.
class LogError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ReadOptions {
  bool skip_bad_lines = false;  ///< count malformed lines instead of throwing on the first
};

/// Parses the log at `path`. Throws LogError for a missing or unreadable file, a file of
/// another kind (a trace, a checkpoint: the message says what it is and what to give instead),
/// a malformed line (unless skipped) and a log without a single sample record.
OccupancyLog read_log(const std::string& path, ReadOptions options = {});
/// The same from a stream; `source` names it in messages.
OccupancyLog parse_log(std::istream& in, const std::string& source, ReadOptions options = {});

}  // namespace stoker::inspect
