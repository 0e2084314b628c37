// SPDX-License-Identifier: Apache-2.0
// What a pipeline counts about each of its stages.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "stoker/core/queue_meter.h"

namespace stoker {

/// Counters of one stage over the pipeline's life, all epochs together.
struct StageStats {
  std::string name;
  int threads = 1;
  std::uint64_t items_in = 0;
  std::uint64_t items_out = 0;
  std::uint64_t skipped = 0;  ///< items dropped by OnError::skip
  /// Time its bodies ran, summed over its threads, less what BlockedTime counted.
  std::chrono::nanoseconds busy{0};
  std::chrono::nanoseconds starved{0};  ///< time with no body running because its input was empty
  /// Time with no body running because its output was full, plus the time its function waited
  /// for something downstream gives back (BlockedTime: a free buffer of a pool), averaged over
  /// its threads.
  std::chrono::nanoseconds blocked{0};
  /// Of `blocked`, the time its function waited for a pool (BlockedTime), averaged over its
  /// threads: a stage that waits for buffers the consumer or a device gives back, not for room.
  std::chrono::nanoseconds pool_wait{0};
};

/// One queue of a pipeline, with the stages on either side.
struct QueueReport {
  std::string name, producer, consumer;
  std::size_t capacity = 0;
  std::size_t size = 0;     ///< items held when the summary was taken: 0 once the run is over
  std::size_t waiting = 0;  ///< items its producer holds at the entrance, waiting for room
  std::chrono::nanoseconds time_empty{0}, time_full{0}, lifetime{0};
};

/// A named count that something outside the graph keeps, such as a device's copies. A count of
/// bytes is named `..._bytes`: the summary table shows its size in kB, MB or GB beside it.
struct Counter {
  std::string name;
  std::uint64_t value = 0;
};

/// A run's counters, for the summary table and for `stoker-inspect`.
struct PipelineSummary {
  std::chrono::nanoseconds wall{0};
  std::chrono::nanoseconds consumer_wait{0};  ///< time the consumer spent waiting for input
  std::uint64_t consumed = 0;                 ///< items handed to the consumer
  int threads = 0;                            ///< threads the stages run on (PipelineOptions::threads, 0 resolved)
  std::vector<StageStats> stages;
  std::vector<QueueReport> queues;
  std::vector<Counter> counters;  ///< from PipelineOptions::counters
};

/// Reads counters kept outside the graph; called from any thread.
using CounterSource = std::function<std::vector<Counter>()>;

/// A fixed-width table: a row per stage (threads, items, busy, starved and blocked shares of
/// the run), a row per queue (capacity, shares of its life spent empty and full), a row per
/// counter, then the consumer's line.
void print_summary(std::ostream& out, const PipelineSummary& summary);

/// `bytes` for people, in decimal units with three significant digits: "512 B", "1.50 kB",
/// "123 MB", "2.05 GB".
std::string format_bytes(std::uint64_t bytes);

}  // namespace stoker
