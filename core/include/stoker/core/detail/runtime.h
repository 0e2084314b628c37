// The parts of a pipeline that do not depend on item types. Internal.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "stoker/core/detail/edges.h"
#include "stoker/core/stage_stats.h"

namespace stoker {

/// What a stage's function may ask about the call it is in.
struct StageContext {
  std::uint64_t seed = 0;   ///< the pipeline's seed
  std::uint32_t epoch = 0;  ///< the epoch the item belongs to
};

/// True when called from a stage body of a pipeline that is stopping (stop(), an error, or
/// its destruction). A stage function that waits for something outside the graph, such as a
/// free buffer of a device pool, polls this and gives up by throwing PipelineStopped.
///
/// Calling it also pushes on the outputs that the calling body has made so far and holds
/// back (a map body handles a burst of inputs at once, and pushes their outputs together):
/// a function that waits for something given back downstream, polling this as it must,
/// never waits for what its own body holds. May throw std::bad_alloc from that push.
bool stop_requested();

/// Called from a stage body by a stage function that waited for something outside the graph
/// (a free buffer of a device pool, which comes back when the consumer is done with one): the
/// summary counts the wait as the stage's blocked time, as it counts a full output queue,
/// rather than as busy time. Does nothing outside a stage body.
void note_blocked(std::chrono::nanoseconds waited) noexcept;

/// Ranges a profiler draws around every stage body, named after the stage: stoker::gpu
/// installs NVTX ranges when it opens a CUDA device, so that Nsight Systems shows the stages
/// next to the copies and kernels. Process-wide; null functions turn it off.
struct BodyTracer {
  void (*begin)(const char* stage) = nullptr;
  void (*end)() = nullptr;
};
void set_body_tracer(BodyTracer tracer) noexcept;

/// Thrown by a stage function that gave up waiting because its pipeline is stopping; the
/// pipeline does not report it as an error.
struct PipelineStopped : std::runtime_error {
  PipelineStopped() : std::runtime_error("the pipeline is stopping") {}
};

namespace detail {

class PipelineCore;
class EdgeBase;

/// Outputs that a stage body has made and not yet pushed; see stop_requested().
class HeldOutputs {
 public:
  virtual void push_held() = 0;

 protected:
  ~HeldOutputs() = default;
};
/// Makes `held` what stop_requested() pushes on, on this thread; returns the one before,
/// for the caller to put back when it is done.
HeldOutputs* hold_outputs(HeldOutputs* held) noexcept;

/// Tells the CPU that this is a spin-wait loop.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// One stage: up to `threads` bodies run at once as oneTBB tasks. A body never waits:
/// it returns when its input is empty or its output full, and whoever changes that
/// (the stage upstream after a push, downstream after a pop) wakes the stage again.
class StageBase {
 public:
  StageBase(PipelineCore& core, std::string name, int threads);
  virtual ~StageBase();
  StageBase(const StageBase&) = delete;
  StageBase& operator=(const StageBase&) = delete;

  const std::string& name() const { return name_; }
  int threads() const { return threads_; }

  /// Makes sure a body will look for work, if the stage has any and a thread to spare.
  /// Safe from any thread.
  void wake();
  /// For the stage downstream after it popped: wakes this stage if its output was full
  /// and now has room for a burst.
  void wake_if_blocked() {
    if (output_blocked()) wake();
  }
  bool idle() const { return active_.load() == 0; }

  StageStats stats() const;

  /// Called by the pipeline, with every stage idle, before epoch `epoch` starts.
  virtual void begin_epoch(std::uint32_t epoch);

 protected:
  enum class Step {
    progressed,  ///< did something; call again
    starved,     ///< input empty
    blocked,     ///< output full
    done,        ///< nothing more this epoch
  };
  /// One unit of work. Must not wait.
  virtual Step step() = 0;
  /// True when `step` could make progress now. Read after a body has left, so that a
  /// change made while it was leaving is not missed (see run()).
  virtual bool has_work() const = 0;
  virtual bool output_blocked() const = 0;

  StageContext context() const { return context_; }
  PipelineCore& core() { return core_; }
  void count_in(std::uint64_t n = 1) { items_in_.fetch_add(n, std::memory_order_relaxed); }
  void count_out(std::uint64_t n = 1) { items_out_.fetch_add(n, std::memory_order_relaxed); }
 private:
  friend class PipelineCore;
  void run();  // one body, as a oneTBB task
  bool linger(std::chrono::steady_clock::duration& lingered);
  void body_started();
  void body_left(Step why, std::chrono::nanoseconds blocked_inside);

  PipelineCore& core_;
  const std::string name_;
  const int threads_;
  StageContext context_;
  std::atomic<int> active_{0};  // bodies scheduled or running, at most threads_

  std::atomic<std::uint64_t> items_in_{0}, items_out_{0};
  std::atomic<std::int64_t> busy_ns_{0};
  mutable std::mutex idle_mutex_;  // taken once per body start and end, not per item
  int running_ = 0;
  std::optional<Step> idle_reason_;
  std::chrono::steady_clock::time_point idle_since_;
  std::chrono::nanoseconds starved_{0}, blocked_{0};

  struct Node;
  std::unique_ptr<Node> node_;  // the oneTBB flow-graph node that runs bodies
};

struct CoreOptions {
  int threads = 0;  ///< oneTBB threads for all stages; 0 = one per core
  std::uint64_t seed = 0;
  std::string occupancy_log;
  std::chrono::milliseconds sample_interval{50};
  CounterSource counters;
};

/// Owns the oneTBB arena and flow graph, the stages, the monitor, and the first error.
class PipelineCore {
 public:
  explicit PipelineCore(CoreOptions options);
  ~PipelineCore();

  CoreOptions& options() { return options_; }
  StageBase& add_stage(std::unique_ptr<StageBase> stage);
  /// Takes ownership of an edge; the monitor samples it, stop() closes it.
  template <class E>
  E& add_edge(std::unique_ptr<E> edge) {
    auto& e = *edge;
    edges_.push_back(std::move(edge));
    return e;
  }
  const std::vector<std::unique_ptr<StageBase>>& stages() const { return stages_; }

  /// Creates the arena, the graph and its nodes, and starts the monitor.
  void start();
  /// Resets every stage for epoch `epoch`; every stage must be idle.
  void begin_epoch(std::uint32_t epoch);
  /// Waits (briefly: bodies are leaving) until no stage body is scheduled or running.
  void wait_idle();

  /// Records the first error and stops everything. Safe from any thread.
  void fail(const std::string& stage, std::exception_ptr error);
  /// Throws the first error, if any, as a StageError naming its stage.
  void rethrow_if_failed() const;
  bool stopping() const { return stopping_.load(std::memory_order_relaxed); }
  /// Idempotent: closes every queue, waits for every body to finish, stops the monitor.
  void stop();

  void add_consumer_wait(std::chrono::nanoseconds d) { consumer_wait_ += d; }
  void count_consumed() { ++consumed_; }
  PipelineSummary summary() const;

 private:
  friend class StageBase;
  struct Engine;
  class Monitor;

  // Destroyed bottom-up: the monitor reads edges and stages; the stages' flow-graph nodes
  // belong to the engine's graph and use the edges.
  CoreOptions options_;
  std::unique_ptr<Engine> engine_;
  std::vector<std::unique_ptr<EdgeBase>> edges_;
  std::vector<std::unique_ptr<StageBase>> stages_;
  std::unique_ptr<Monitor> monitor_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stopped_{false};
  mutable std::mutex error_mutex_;
  std::exception_ptr error_;
  std::string error_stage_;
  std::chrono::steady_clock::time_point started_;
  std::chrono::nanoseconds consumer_wait_{0};
  std::uint64_t consumed_ = 0;
};

}  // namespace detail
}  // namespace stoker
