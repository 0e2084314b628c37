// SPDX-License-Identifier: Apache-2.0
// A run's timeline as Chrome trace events (the JSON that Perfetto's UI and chrome://tracing
// open). Internal to the library: PipelineBuilder::trace() turns it on.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "stoker/core/detail/spin_lock.h"
#include "stoker/core/timeline.h"

namespace stoker::detail {

/// One track of a TraceFile: a stage body slot, or the consumer.
class TraceTrack {
 public:
  using Clock = std::chrono::steady_clock;

  /// A span of work, e.g. one chunk: [begin, end).
  void span(Clock::time_point begin, Clock::time_point end) { add({begin, end, Kind::span, 0}); }
  /// A mark at `t` for the start of epoch `epoch` (drawn across every track).
  void epoch(Clock::time_point t, std::uint32_t epoch) { add({t, t, Kind::epoch, epoch}); }

 private:
  friend class TraceFile;
  enum class Kind : std::uint8_t { span, epoch };
  struct Event {
    Clock::time_point begin, end;
    Kind kind;
    std::uint32_t value;
  };
  void add(const Event& e) {
    std::lock_guard lock(mutex_);
    events_.push_back(e);
  }

  std::string span_name_;  // the stage's name, or "wait"
  std::string span_head_;  // a span's JSON up to its "ts" value, made once
  int tid_ = 0;
  SpinLock mutex_;
  std::vector<Event> events_;  // under mutex_
};

/// The file, and one track per stage body slot and one for the consumer.
///
/// Each track is written by one thread at a time (the body that holds its slot, or the
/// consumer's thread), once per chunk of work, into a buffer of its own under a lock of its
/// own, which only the writer also takes. The writer (the pipeline's sampling thread) takes
/// every track's buffer at each sample and appends it to the file, so a track's events reach
/// the file in the order they happened, and memory holds at most one sample interval of them.
class TraceFile {
 public:
  using Clock = std::chrono::steady_clock;
  using Track = TraceTrack;

  /// Opens `path` for writing; throws std::runtime_error naming it if it cannot.
  TraceFile(const std::string& path, Clock::time_point origin);
  ~TraceFile();
  TraceFile(const TraceFile&) = delete;
  TraceFile& operator=(const TraceFile&) = delete;

  /// A track named `name` whose spans are called `span_name`; tracks are listed in the order
  /// they are added. Before the first write().
  Track& add_track(const std::string& name, std::string span_name);

  /// Writes every track's events so far, the queue fills given as counters at `t`, and `timed`,
  /// spans from timeline sources, on tracks of a second process ("devices") by their names.
  /// Writer thread only.
  void write(Clock::time_point t, const std::vector<std::pair<std::string, std::size_t>>& fills,
             const std::vector<TimedSpan>& timed);
  /// Ends the JSON and closes the file. Throws std::runtime_error naming the file if writing failed.
  void close();

 private:
  double micros(Clock::time_point t) const;
  /// Appends one event, `head` then `tail`, to the array.
  void emit(const std::string& head, const char* tail = "");

  std::string path_;
  Clock::time_point origin_;
  std::FILE* file_ = nullptr;
  bool first_ = true;
  std::deque<Track> tracks_;  // stable addresses
  std::vector<Track::Event> taken_;
  std::vector<std::string> counter_heads_;                // per queue, a counter's JSON up to its "ts" value
  std::map<std::string, int, std::less<>> timed_tracks_;  // a timeline's track -> its tid
};

}  // namespace stoker::detail
