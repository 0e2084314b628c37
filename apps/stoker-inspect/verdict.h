// SPDX-License-Identifier: Apache-2.0
// The verdict: which part of a run holds it back, from every record of its occupancy log (the
// queues' fills, each stage's busy, starved and blocked time, the training loop's waits, the
// pipeline's threads against the machine's cores), with the evidence and a suggestion spelled
// for the program that wrote the log. Records in, verdict out: nothing here prints or draws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "log.h"

namespace stoker::inspect {

/// One queue summed up over the run.
struct QueueSummary {
  std::string name, producer, consumer;
  std::size_t capacity = 0;
  std::size_t floor = 0;  ///< what a shuffle keeps back; its fill is of capacity - floor
  std::size_t samples = 0;
  double mean_fill = 0;    ///< mean of what a consumer could take over the most it could, 0..1
  double p95_fill = 0;     ///< 95th percentile of the same
  double empty_pct = 0;    ///< share of samples with nothing a consumer could take, %
  double full_pct = 0;     ///< share of samples with the queue full, %
  double waiting_pct = 0;  ///< share of samples with its producer holding items it had no room for, %
  std::size_t swings = 0;  ///< times it went from empty to full or back
  /// A shuffle's (floor > 0): the seconds it had nothing to give after the epochs' starts, until
  /// it held its floor again, summed over the epochs the log marks (sampled: each refill ends
  /// halfway between its last empty sample and the next one).
  double refill_s = 0;
  std::size_t refills = 0;  ///< the epoch starts that refill counts
};

/// A stage's counters as shares of the run.
struct StageSummary {
  StageCounters counters;
  double busy_pct = 0;       ///< busy time over threads x run length, %
  double starved_pct = 0;    ///< of the run length, %
  double blocked_pct = 0;    ///< of the run length, %
  double pool_wait_pct = 0;  ///< of the run length, % (part of blocked_pct)
};

/// The training loop's figures.
struct ConsumerSummary {
  bool recorded = false;    ///< from the log's consumer record; else estimated from the last queue
  std::uint64_t items = 0;  ///< items it took (0 when not recorded)
  double run_s = 0;         ///< the length of the run
  double waited_s = 0;      ///< time it waited for its input
  double waited_pct = 0;    ///< the same, of the run, %
  /// Time it waited for other ranks in a collective exchange (the log's `exchange_wait_ns`
  /// counter: stoker-train's gradient allreduce), of the run, %; none when not counted.
  std::optional<double> exchange_wait_pct;
};

/// What holds the run back.
enum class Bottleneck {
  training,  ///< the training loop: it rarely waits, the input keeps ahead
  stage,     ///< one stage of the pipeline (not the source)
  source,    ///< the source: a stage one thread at a time calls, which waits for its data or computes
  threads,   ///< the pipeline as a whole: its stages share too few threads, or the machine too few cores
  shuffle,   ///< a shuffle whose floor (min_after_dequeue) makes the loop wait at every epoch's start
  balanced,  ///< no clear bottleneck: the training loop and the input are about as fast, or no picture fits
};

/// "training", "stage", "source", "threads", "shuffle", "balanced": the name in the JSON.
const char* name(Bottleneck kind);

struct Verdict {
  Bottleneck kind = Bottleneck::balanced;
  /// The part: "consumer" (the training loop), a stage's name, "pipeline" (threads or cores), a
  /// shuffle's queue name, "none" (balanced).
  std::string part;
  std::string headline;               ///< what it is, for people: "stage 'decode'", "the pipeline's threads"
  double fit = 0;                     ///< 0..1: how well the run fits the picture of that bottleneck
  std::vector<std::string> evidence;  ///< the observations behind it, the training loop's wait first
  std::string suggestion;             ///< the change that should help most, in the program's terms
  /// Every picture tried and how well the run fits it ("consumer", each stage, "threads",
  /// "balanced"), in that order; those the training loop's wait ruled out are absent.
  std::vector<std::pair<std::string, double>> fits;
};

/// A run summed up, and its verdict.
struct Report {
  std::string source, program, job, rank, role;
  std::string data;       ///< what stoker-train read: "images" for --images, else empty
  double duration_s = 0;  ///< from the first sample to the last
  std::vector<QueueSummary> queues;
  std::vector<StageSummary> stages;                             ///< empty when the log has no stage records
  std::vector<std::pair<std::string, std::uint64_t>> counters;  ///< empty when the log has none
  ConsumerSummary consumer;
  PipelineFigures pipeline;
  std::vector<TuningMove> moves;  ///< the autotuner's, from the log
  Verdict verdict;
};

/// The training loop's share of the run spent waiting for input above which the training loop is
/// never the verdict (it waited more than it worked), and below which no part of the input is
/// (it held the training loop back too little for one).
constexpr double kTrainingMaxWait = 0.5;
constexpr double kInputMinWait = 0.2;
/// Below this fit no picture is clear, and the verdict says so (balanced).
constexpr double kConfidentFit = 0.6;

/// Sums up the log and judges it. The log must hold at least one queue.
Report analyze(const OccupancyLog& log);

}  // namespace stoker::inspect
