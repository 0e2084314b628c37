// SPDX-License-Identifier: Apache-2.0
// The parts of a pipeline that do not depend on item types, as the typed stages and
// Pipeline<T> see them: a stage's bodies, slots and wake-ups, and the pipeline's core. What
// runs them (oneTBB), the monitor, the tuner, the trace and the record of taken items are the
// library's own (core/src). Internal.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "stoker/core/autotune.h"
#include "stoker/core/detail/spin_lock.h"
#include "stoker/core/stage.h"
#include "stoker/core/stage_stats.h"
#include "stoker/core/state.h"
#include "stoker/core/thread_budget.h"
#include "stoker/core/timeline.h"

namespace stoker::detail {

class EdgeBase;
class PipelineCore;
class TraceFile;
class TraceTrack;
class TakenItems;

/// The consumer took the item of `origin` (TakenItems::took); the consumer's thread.
void took(TakenItems& taken, std::uint64_t origin);
/// The batch stage sent batch `batch` of items with `origins` (TakenItems::batched).
void batched(TakenItems& taken, std::uint64_t batch, std::vector<std::uint64_t> origins);

/// Throws the logic_error of a flat_map whose input `index` gave `made` outputs, not `fanout`.
[[noreturn]] void throw_fanout(std::uint64_t index, std::size_t made, std::size_t fanout);

/// An exception from the runtime's own work inside a stage function's call (pushing what an
/// emit completed): not the item's fault, so OnError::skip does not apply; the pipeline fails.
struct RuntimeFailure {
  std::exception_ptr cause;
};

/// A clock cheap enough to read after every item (a few ns): coarse, a tick of a few
/// milliseconds on Linux. A body reads the precise clock only once it has ticked, to tell a
/// chunk that takes far longer than it should.
inline std::int64_t coarse_ticks() noexcept {
#if defined(CLOCK_MONOTONIC_COARSE)
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
#else
  return std::chrono::steady_clock::now().time_since_epoch().count();
#endif
}

/// One stage: up to `threads` bodies run at once, each a task that the pipeline enqueues in its
/// oneTBB arena, each under a slot of its own (StageContext::body). A body moves chunks of items from
/// its input to its output and returns as soon as it cannot go on without waiting: input
/// empty, or output full (its finished chunk then waits in the stage's output, see Output).
///
/// No lost wake-up. Work for a stage appears only through a change to one of its queues or to
/// its output; whoever makes the change then calls wake(), which issues a sequentially
/// consistent fence and then reads the stage's slots. A body that stops looking for work frees
/// its slot, issues the same fence, and then looks once more (has_work()). By the fence rule one
/// of the two sees the other's write: either the waker sees a free slot and starts a body, or
/// the leaving body sees the work and stays. has_work() reads only atomics that the changes
/// write (EdgeBase's held_, ended_, closed_; the output's need).
class StageBase {
 public:
  /// At most kMaxThreads bodies per stage.
  static constexpr int kMaxThreads = 64;

  StageBase(std::string name, int threads, OnError on_error);
  virtual ~StageBase();
  StageBase(const StageBase&) = delete;
  StageBase& operator=(const StageBase&) = delete;

  const std::string& name() const { return name_; }
  /// Bodies that may run at once now: the stage's threads, or what the autotuner set.
  int threads() const { return limit_.load(std::memory_order_relaxed); }
  /// Body slots made at start(): threads() never exceeds it.
  int slots() const { return static_cast<int>(bodies_.size()); }
  /// Whether the autotuner may move threads to and from this stage (map and flat_map).
  virtual bool tunable() const { return false; }
  /// The autotuner's: `n` bodies may run at once from now on, 1 to slots(). Bodies beyond it
  /// finish their chunk; the stage's own wake-ups start new ones up to it.
  void set_threads(int n) noexcept { limit_.store(n, std::memory_order_relaxed); }
  /// Time its bodies ran so far, waits for pools excluded, summed over its threads; counted
  /// after every chunk.
  std::chrono::nanoseconds busy() const noexcept {
    return std::chrono::nanoseconds(busy_ns_.load(std::memory_order_relaxed));
  }
  std::size_t position() const { return position_; }  ///< in the pipeline, from the source

  /// Makes sure a body will look for work, if the stage has some and a free slot. Any thread.
  void wake() noexcept;
  /// Takes a free slot and runs bodies while there is work. False when every slot was taken.
  /// For the pipeline's tasks, and for a thread that waits and helps (PipelineCore::help_after).
  bool run() noexcept;
  /// What a task of the pipeline runs.
  void run_task() noexcept;
  /// StageContext::help_downstream() of this stage's bodies.
  bool help_downstream() const noexcept;

  StageStats stats() const;

  /// Called by build(), in pipeline order.
  virtual void start(PipelineCore& core, std::size_t position);
  /// Called before epoch `epoch`, while no body runs.
  virtual void begin_epoch(std::uint32_t epoch);
  virtual bool has_work() const = 0;

  // Exact resume (PipelineState).
  /// What decides what the stage yields: "map", "flat_map fanout 5", "batch 255".
  virtual std::string describe() const = 0;
  /// A source's data set, as its function's fingerprint() describes it; empty for the others.
  virtual std::string fingerprint() const { return {}; }
  /// Why the stage cannot be resumed exactly; empty when it can.
  virtual std::string resume_problem() const { return {}; }
  /// Items skipped (OnError::skip) in the current epoch.
  std::uint64_t skipped_this_epoch() const { return skipped_.load() - skipped_before_epoch_; }
  /// Whether it can make the items of any origins of its output again (Producer::remake).
  virtual bool remakes() const = 0;
  /// Whether it groups items into batches (a batch stage).
  virtual bool batches() const { return false; }
  /// After begin_epoch(), while no body runs: sets the stage and its output queue up to go on
  /// from where the queue's consumer had taken `taken` items of the epoch. Returns how many
  /// items of its own input had been taken then.
  virtual std::uint64_t resume(std::uint64_t taken, const PipelineState& state) = 0;

 protected:
  enum class Step {
    progressed,  ///< did something; call again
    starved,     ///< input empty
    blocked,     ///< output full
    done,        ///< nothing more this epoch, or stopping
  };
  /// A body slot's own: the context its calls get, and what BlockedTime counted in its
  /// current run. On a cache line of its own: ctx.index is written for every item.
  struct alignas(64) Body {
    StageContext ctx;
    std::chrono::nanoseconds blocked{0};  ///< through BlockedTime(ctx)
    TraceTrack* track = nullptr;          ///< the slot's track when the run is traced
  };
  /// Moves one chunk. Never waits for a queue, except inside a flat_map call (Emitter).
  virtual Step step(Body& body) = 0;

  PipelineCore& core() const { return *core_; }
  bool stopping() const noexcept;
  /// The context a call for the epoch's `index`-th input gets, outside any body.
  StageContext context_at(std::uint64_t index) const {
    StageContext ctx = bodies_.front().ctx;
    ctx.index = index;
    ctx.body = 0;
    return ctx;
  }
  void count_in(std::uint64_t n) { items_in_.fetch_add(n, std::memory_order_relaxed); }
  void count_out(std::uint64_t n) { items_out_.fetch_add(n, std::memory_order_relaxed); }

  bool skips() const noexcept { return on_error_ == OnError::skip; }
  /// Calls `f()` for the item at `index` under the stage's error policy: with OnError::skip, an
  /// exception (other than PipelineStopped) is counted, logged the first few times, and false
  /// returned; with OnError::fail it propagates and stops the pipeline.
  template <class F>
  bool guarded(std::uint64_t index, F&& f) {
    if (on_error_ == OnError::fail) {
      f();
      return true;
    }
    try {
      f();
      return true;
    } catch (const PipelineStopped&) {
      throw;
    } catch (const RuntimeFailure&) {
      throw;
    } catch (const std::exception& e) {
      skipped(index, e.what());
    } catch (...) {
      skipped(index, "unknown exception");
    }
    return false;
  }

  /// Chunks are sized so that each is about kChunkTime of the stage's work: hand-offs then cost
  /// little against the work, and a chunk is still small enough to keep the stages downstream
  /// fed. A chunk that takes longer than this (the function got slower) hands on what it made.
  static constexpr std::chrono::nanoseconds kChunkTime = std::chrono::microseconds(100);
  /// Inputs for the next chunk: kChunkTime of work at the measured cost per input, 1 to `cap`.
  std::size_t chunk_size(std::size_t cap) const {
    const auto per_item = std::max<std::int64_t>(item_ns_.load(std::memory_order_relaxed), 1);
    return std::clamp<std::size_t>(static_cast<std::size_t>(kChunkTime.count() / per_item), 1,
                                   std::max<std::size_t>(cap, 1));
  }
  /// Records that `items` inputs took `work` (waits excluded).
  void measured(std::size_t items, std::chrono::nanoseconds work) {
    if (items == 0) return;
    const auto per_item = work.count() / static_cast<std::int64_t>(items);
    item_ns_.store((item_ns_.load(std::memory_order_relaxed) + per_item) / 2, std::memory_order_relaxed);
  }

 private:
  int claim() noexcept;
  void run_body(int slot) noexcept;
  void skipped(std::uint64_t index, const char* what);
  void body_started();
  // `blocked_inside`: through BlockedTime (a pool's wait); `turn_wait`: for a ThreadBudget's turn.
  void body_left(Step why, std::chrono::nanoseconds blocked_inside, std::chrono::nanoseconds turn_wait);

  PipelineCore* core_ = nullptr;
  std::size_t position_ = 0;
  const std::string name_;
  const int threads_;       // as built
  std::atomic<int> limit_;  // threads(): threads_, or what the autotuner set
  const OnError on_error_;
  std::vector<Body> bodies_;  // one per slot; set up by start() and begin_epoch()

  std::atomic<std::uint64_t> slots_{0};  // bit i set: body slot i is taken
  std::atomic<int> queued_{0};           // tasks spawned that have not started
  // The function's cost per input, averaged over recent chunks. Starts at kChunkTime, so
  // that the first chunk is of one input.
  std::atomic<std::int64_t> item_ns_{kChunkTime.count()};

  std::atomic<std::uint64_t> items_in_{0}, items_out_{0}, skipped_{0};
  std::uint64_t skipped_before_epoch_ = 0;
  std::atomic<std::int64_t> busy_ns_{0};
  mutable SpinLock idle_mutex_;  // taken once per body start and end, not per item
  int running_ = 0;
  std::optional<Step> idle_reason_;
  std::chrono::steady_clock::time_point idle_since_;
  std::chrono::nanoseconds starved_{0}, blocked_{0};
  std::chrono::nanoseconds pool_wait_{0};  // the part of blocked_ its function waited for a pool
};

struct CoreOptions {
  int threads = 0;  ///< threads for all stages; 0 = one per core
  std::uint64_t seed = 0;
  bool deterministic = false;
  std::string occupancy_log;
  std::map<std::string, std::string> log_labels;
  std::string trace;
  std::vector<std::shared_ptr<TimelineSource>> timelines;
  std::chrono::milliseconds sample_interval{50};
  std::optional<AutotuneOptions> autotune;
  CounterSource counters;
  std::function<void(std::uint32_t)> on_epoch_start;
  std::shared_ptr<ThreadBudget> budget;
};

/// Owns the threads, the stages and queues, the monitor, the tuner and the first error.
///
/// Threads. The stages run on `threads` threads of the pipeline's own, which wait in a oneTBB
/// arena whose every slot is reserved for them, and there run the stage bodies that the
/// pipeline enqueues as tasks. The pipeline neither changes oneTBB's process-wide settings nor
/// depends on them: a host's tbb::global_control limits oneTBB's workers, none of which the
/// pipeline uses.
class PipelineCore {
 public:
  PipelineCore();
  ~PipelineCore();
  PipelineCore(const PipelineCore&) = delete;
  PipelineCore& operator=(const PipelineCore&) = delete;

  StageBase& add_stage(std::unique_ptr<StageBase> stage);
  EdgeBase& add_edge(std::unique_ptr<EdgeBase> edge);
  const std::vector<std::unique_ptr<StageBase>>& stages() const { return stages_; }
  const CoreOptions& options() const { return options_; }

  /// Validates `options`, starts the threads and the monitor.
  void start(CoreOptions options);
  /// Prepares every queue and stage for epoch `epoch`, then calls the on_epoch_start hook; no
  /// body may run. With `resume`, for going on from where the consumer stood in it
  /// (check_state() first).
  void begin_epoch(std::uint32_t epoch, const PipelineState* resume = nullptr);
  /// The consumer has taken the epoch's last item (whether another epoch follows or not).
  void end_epoch();

  // Exact resume (PipelineState).
  /// The run's state once the consumer has taken `consumed` items of epoch `epoch`; throws
  /// StateError saying why when it cannot be resumed.
  PipelineState state(std::uint32_t epoch, std::uint64_t consumed) const;
  /// Throws StateError, naming what differs or what cannot be resumed, unless this pipeline
  /// can resume from `state`.
  void check_state(const PipelineState& state) const;
  /// In free order, when the pipeline can be resumed: what its consumer has taken. Null
  /// otherwise (in deterministic mode, how many says which).
  TakenItems* taken_items() const noexcept { return taken_.get(); }
  /// Waits, asleep, until every body has returned and no task is pending. Bodies only ever
  /// wait for a chunk's work, so this is brief.
  void wait_idle() const;

  /// Enqueues a task that runs bodies of `stage` on one of the pipeline's threads; false when
  /// the pipeline is stopping, or (and the pipeline failed) if no task could be made.
  bool enqueue(StageBase& stage) noexcept;
  /// Runs one body of a stage after `from` that has work and a free slot, on this thread,
  /// nearest the consumer first: those are what make room for `from`, or give back what it
  /// waits for. False when none could run.
  bool help_after(const StageBase& from) const noexcept;
  /// Until `done()`: help_after(from), or back off. Throws PipelineStopped when stopping.
  void wait_for(const StageBase& from, const std::function<bool()>& done) const;

  /// Records the first error and stops everything. Safe from any thread.
  void fail(const std::string& stage, std::exception_ptr error) noexcept;
  /// Throws the first error, if any, as a StageError naming its stage.
  void rethrow_if_failed() const;
  bool stopping() const noexcept { return stopping_.load(std::memory_order_acquire); }
  std::stop_token stop_token() const noexcept { return stop_.get_token(); }
  /// Idempotent, and safe from any thread: stops every stage, waits until every body has
  /// returned and the monitor has written its last records (its errors are logged, not
  /// thrown). A later or concurrent call waits for the same. On one of the pipeline's own
  /// threads (a stage function, or oneTBB work a stage function waits for), which such a wait
  /// would deadlock, it stops the stages and returns. The threads go with the destructor.
  void stop() noexcept;
  /// The last epoch was delivered: stops every stage and waits as stop() does, and ends the
  /// occupancy log's sampling; its counters record and the trace's last device spans wait for
  /// stop() or the destructor, so that they count what the consumer does after the last item.
  /// From the consumer's thread.
  void end_run() noexcept;

  /// The consumer's thread waited for the last queue from `begin` to `end`.
  void consumer_waited(std::chrono::steady_clock::time_point begin, std::chrono::steady_clock::time_point end);
  void count_consumed(std::uint64_t n = 1) { add(consumed_, n); }
  /// The budget's turns (ThreadBudget), on a thread that runs a body. take_turn(): this thread
  /// holds one (as it did, or after waiting for it, the wait added to `waited`), or there is no
  /// budget; false when the pipeline stops first. give_turn(): true when it gave back one it held.
  bool take_turn(std::chrono::nanoseconds* waited = nullptr) const noexcept;
  bool give_turn() const noexcept;
  /// Passes this thread's turn on to a body that waits for one, if any, and takes one again.
  bool pass_turn(std::chrono::nanoseconds* waited) const noexcept;
  /// Without `counters`, leaves PipelineOptions::counters uncalled (and the field empty).
  PipelineSummary summary(bool counters = true) const;

 private:
  friend class StageBase;
  void describe_for_resume();
  void fit_to_budget(int budget);
  void request_stop() noexcept;
  /// stop()'s waiting part: the stop phase's state machine, after request_stop().
  void finish_stop() noexcept;
  /// Whether a body may be waiting for this thread (runtime.cpp): stop() then only asks.
  bool may_be_waited_for() const noexcept;

  struct Engine;
  class Monitor;
  class Tuner;

  // Destroyed bottom-up: the monitor reads edges and stages and writes the trace; the engine's
  // tasks run stages, whose bodies write the trace's tracks.
  CoreOptions options_;
  std::unique_ptr<TraceFile> trace_;
  TraceTrack* consumer_track_ = nullptr;
  std::vector<std::unique_ptr<EdgeBase>> edges_;
  std::vector<std::unique_ptr<StageBase>> stages_;
  // Exact resume, set by start(): a state's fields that never change, and why there can be none.
  PipelineState resume_shape_;
  std::string cannot_resume_;
  std::unique_ptr<TakenItems> taken_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Monitor> monitor_;
  std::unique_ptr<Tuner> tuner_;
  std::stop_source stop_;
  // stop_.stop_requested(), on a line of its own that only a stop writes: bodies read it for
  // every item, and stop tokens' reference counts live beside the stop_source's flag.
  alignas(64) std::atomic<bool> stopping_{false};
  // One state machine for the end of a run and a stop. end_run() takes running to ending (the
  // consumer waits for the bodies and ends the monitor's sampling) and then to ended; stop()
  // takes running or ended to stopping (one caller waits for the bodies and finishes the
  // monitor) and then to stopped. Whoever finds another's phase (ending, stopping) waits for
  // its end, so no two of them touch the monitor at once; end_run() after a stop began does
  // nothing.
  enum class StopPhase : int { running, ending, ended, stopping, stopped };
  alignas(64) std::atomic<StopPhase> stop_phase_{StopPhase::running};
  // Tasks enqueued and not yet returned (wait_idle()). The waiter sleeps on it, and the task
  // that takes it to 0 wakes it.
  std::atomic<int> tasks_{0};
  int threads_ = 0;
  mutable std::mutex error_mutex_;
  std::exception_ptr error_;
  std::string error_stage_;
  std::chrono::steady_clock::time_point started_;
  // The consumer's counters: it alone writes them, and summary() may read them from any thread.
  std::atomic<std::uint64_t> consumer_wait_ns_{0};
  std::atomic<std::uint64_t> consumed_{0};
  static void add(std::atomic<std::uint64_t>& counter, std::uint64_t n) {
    counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
};

inline bool StageBase::stopping() const noexcept { return core_->stopping(); }

}  // namespace stoker::detail
