// SPDX-License-Identifier: Apache-2.0
// The pipeline builder and the pipeline the training loop iterates.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "stoker/core/autotune.h"
#include "stoker/core/detail/stages.h"
#include "stoker/core/random_shuffle_queue.h"
#include "stoker/core/stage.h"
#include "stoker/core/stage_error.h"
#include "stoker/core/stage_stats.h"
#include "stoker/core/state.h"
#include "stoker/core/thread_budget.h"
#include "stoker/core/timeline.h"

namespace stoker {

/// Options of a `map` or `flat_map` stage.
struct StageOptions {
  int threads = 1;         ///< bodies of this stage that may run at once, 1 to 64
  std::size_t queue = 64;  ///< capacity, in items, of the queue this stage's outputs go into
  /// Most inputs a body takes at once. 0: as many as make about 100 us of the function's work
  /// (measured as it runs), within what the queue takes. 1: one at a time, for a function that
  /// waits for buffers its outputs hold (a pool): its body then holds none of its outputs while
  /// it calls it. A function with a member `max_chunk()` sets this itself.
  std::size_t max_chunk = 0;
  OnError on_error = OnError::fail;  ///< what an exception from the function does
  /// Each body calls a copy of its own, made at build(). Otherwise all bodies call the one
  /// function object, at the same time when threads > 1 or the autotuner tunes the stage: it
  /// must then be safe to call concurrently.
  bool copy_per_body = false;
  /// Whether the autotuner (PipelineBuilder::autotune) may change this stage's threads (up to
  /// its budget, whatever `threads` says). Off for a stage whose speed is not its threads' (one
  /// that waits for a device, say), and for a function that is not safe to call concurrently
  /// and has no copy per body.
  bool autotune = true;
  /// flat_map: the number of outputs of every input, or 0 when it varies. Given, a call that
  /// emits another number is the item's error; exact resume (Pipeline::state) needs it.
  std::size_t fanout = 0;
};

/// Options of the source stage.
struct SourceOptions {
  std::size_t queue = 64;  ///< capacity of the queue after the source
  /// As for StageOptions. 1 for a source whose calls may wait for data (a socket, a live
  /// feed): items are made in chunks, and those made before a call that waits would wait too.
  std::size_t max_chunk = 0;
  OnError on_error = OnError::fail;  ///< skip: a call that throws is counted and the next one made
};

/// Options of a `batch` stage.
struct BatchOptions {
  bool drop_remainder = false;  ///< drop, rather than deliver, a short last batch of an epoch
  std::size_t queue = 8;        ///< capacity, in batches, of the queue after the batcher
};

/// Options of the whole pipeline, read when build() is called, whenever they were set.
struct PipelineOptions {
  /// Threads of the pipeline's own for all stages; 0 = one per core. They run the stage bodies
  /// as tasks in a oneTBB arena of their own (its work stealing and isolation), whatever
  /// tbb::global_control the host holds.
  int threads = 0;
  std::uint64_t seed = 0;      ///< given to every stage function through StageContext
  bool deterministic = false;  ///< same output, in the same order, whatever the threads
  std::uint32_t epochs = 0;    ///< epochs to run; 0 = until stopped, or until an epoch yields nothing
  std::string occupancy_log;   ///< JSON Lines file of queue samples; empty = none
  /// Fields added to the occupancy log's `run` record, e.g. {"rank", "1"} for one rank of a
  /// job whose logs stoker-inspect reads together.
  std::map<std::string, std::string> log_labels;
  /// Chrome trace event file (Perfetto's UI, chrome://tracing) of the run; empty = none. A
  /// track per stage body with a span per chunk of work, the consumer's waits, queue fills
  /// as counters at every sample_interval, and epoch marks.
  std::string trace;
  /// Work timed outside the pipeline, drawn in the trace on tracks of its own, e.g.
  /// stoker::gpu::device_timeline(device) for a device's copies and kernels on its streams.
  /// Only with a trace.
  std::vector<std::shared_ptr<TimelineSource>> timelines;
  std::chrono::milliseconds sample_interval{50};
  /// Moves threads between the map and flat_map stages as the pipeline runs (AutotuneOptions);
  /// none = off.
  std::optional<AutotuneOptions> autotune;
  /// Counters kept outside the graph, reported in summary() and at the end of the occupancy
  /// log, e.g. stoker::gpu::transfer_counters(device).
  CounterSource counters;
  /// Go on from where a run stood (Pipeline::state()) rather than from the first epoch's start.
  std::optional<PipelineState> resume;
  /// The epoch the run starts at (its epoch numbers, as every stage function sees them): for a
  /// run that goes on from an epoch's start by a count its caller keeps (a loader's state, with
  /// ImageSourceOptions::resume_at for the middle of one) rather than from a state. `epochs`
  /// still counts from 0: the run ends before epoch `epochs`. Not with `resume`, whose state
  /// says where the run starts.
  std::uint32_t first_epoch = 0;
  /// Called with each epoch's number before any item of it is made, on the consumer's thread
  /// while no stage body runs: the place to change what the stages read for an epoch (a
  /// curriculum, a sampler's weights), with no lock, as every body of the epoch comes after it.
  /// The first epoch's (or a resumed one's) runs in build(), each next one's inside the next()
  /// that returns the end of the epoch before (Pipeline::next() says why then). An exception
  /// from it propagates from build(), and from next() as a StageError naming "on_epoch_start".
  std::function<void(std::uint32_t epoch)> on_epoch_start;
  /// A thread budget shared with other pipelines (ThreadBudget): together they run at most its
  /// threads' stage bodies at once. `threads` then defaults to the budget's. None = this
  /// pipeline's threads are its own budget.
  std::shared_ptr<ThreadBudget> budget;
};

template <class T>
class Pipeline;
template <class T>
class Builder;

namespace detail {

/// What the builder has assembled so far, handed from one typed builder to the next.
struct Assembly {
  PipelineOptions options;
  std::unique_ptr<PipelineCore> core = std::make_unique<PipelineCore>();
  StageBase* last = nullptr;                                      // the stage whose output is not yet connected
  std::size_t last_queue = 64;                                    // capacity asked for that output
  std::optional<std::pair<std::string, ShuffleOptions>> shuffle;  // asked for that output
  bool options_set = false;                                       // a setter ran: options() would undo it
};

/// Option setters shared by every builder.
template <class Self>
class BuilderOptions {
 public:
  // One line per setter: clang-format 14 splits those that hold a lambda.
  // clang-format off
  Self& threads(int n) & { return set([&](auto& o) { o.threads = n; }); }
  Self&& threads(int n) && { return std::move(threads(n)); }
  Self& seed(std::uint64_t s) & { return set([&](auto& o) { o.seed = s; }); }
  Self&& seed(std::uint64_t s) && { return std::move(seed(s)); }
  Self& deterministic(bool on = true) & { return set([&](auto& o) { o.deterministic = on; }); }
  Self&& deterministic(bool on = true) && { return std::move(deterministic(on)); }
  Self& epochs(std::uint32_t n) & { return set([&](auto& o) { o.epochs = n; }); }
  Self&& epochs(std::uint32_t n) && { return std::move(epochs(n)); }
  Self& occupancy_log(std::string path, std::chrono::milliseconds interval = std::chrono::milliseconds(50)) & {
    return set([&](auto& o) {
      o.occupancy_log = std::move(path);
      o.sample_interval = interval;
    });
  }
  Self&& occupancy_log(std::string path, std::chrono::milliseconds interval = std::chrono::milliseconds(50)) && {
    return std::move(occupancy_log(std::move(path), interval));
  }
  Self& log_label(std::string key, std::string value) & {
    return set([&](auto& o) { o.log_labels[std::move(key)] = std::move(value); });
  }
  Self&& log_label(std::string key, std::string value) && { return std::move(log_label(std::move(key), std::move(value))); }
  Self& autotune(AutotuneOptions a = {}) & { return set([&](auto& o) { o.autotune = a; }); }
  Self&& autotune(AutotuneOptions a = {}) && { return std::move(autotune(a)); }
  Self& trace(std::string path) & { return set([&](auto& o) { o.trace = std::move(path); }); }
  Self&& trace(std::string path) && { return std::move(trace(std::move(path))); }
  Self& timeline(std::shared_ptr<TimelineSource> source) & {
    return set([&](auto& o) { o.timelines.push_back(std::move(source)); });
  }
  Self&& timeline(std::shared_ptr<TimelineSource> source) && { return std::move(timeline(std::move(source))); }
  Self& counters(CounterSource source) & { return set([&](auto& o) { o.counters = std::move(source); }); }
  Self&& counters(CounterSource source) && { return std::move(counters(std::move(source))); }
  Self& resume_from(PipelineState s) & { return set([&](auto& o) { o.resume = std::move(s); }); }
  Self&& resume_from(PipelineState s) && { return std::move(resume_from(std::move(s))); }
  Self& first_epoch(std::uint32_t n) & { return set([&](auto& o) { o.first_epoch = n; }); }
  Self&& first_epoch(std::uint32_t n) && { return std::move(first_epoch(n)); }
  Self& on_epoch_start(std::function<void(std::uint32_t)> f) & { return set([&](auto& o) { o.on_epoch_start = std::move(f); }); }
  Self&& on_epoch_start(std::function<void(std::uint32_t)> f) && { return std::move(on_epoch_start(std::move(f))); }
  Self& budget(std::shared_ptr<ThreadBudget> b) & { return set([&](auto& o) { o.budget = std::move(b); }); }
  Self&& budget(std::shared_ptr<ThreadBudget> b) && { return std::move(budget(std::move(b))); }
  Self& options(PipelineOptions o) & { return replace(std::move(o)); }
  Self&& options(PipelineOptions o) && { return std::move(options(std::move(o))); }
  // clang-format on

 protected:
  explicit BuilderOptions(std::unique_ptr<Assembly> a) : a_(std::move(a)) {}
  Assembly& assembly() {
    if (!a_) throw std::logic_error("this pipeline builder was already used to build the next step");
    return *a_;
  }
  std::unique_ptr<Assembly> take() {
    assembly();
    return std::move(a_);
  }

 private:
  template <class F>
  Self& set(F&& f) {
    f(assembly().options);
    assembly().options_set = true;
    return static_cast<Self&>(*this);
  }
  // options() sets every option at once: after a setter it would silently undo what that set.
  Self& replace(PipelineOptions o) {
    if (assembly().options_set)
      throw std::logic_error(
          "PipelineBuilder::options() sets every pipeline option at once, and would undo the setters called before "
          "it (threads, seed, epochs, ...): call options() first, and the setters after it change what it set");
    return set([&](auto& x) { x = std::move(o); });
  }
  std::unique_ptr<Assembly> a_;
};

inline void check_capacity(const std::string& stage, const char* option, std::size_t n) {
  if (n == 0) throw std::invalid_argument("stage '" + stage + "': " + option + " must be at least 1");
}
inline std::size_t max_chunk_or_any(std::size_t n) { return n == 0 ? std::numeric_limits<std::size_t>::max() : n; }

template <class F, class... Args>
using result_with_context_t =
    std::conditional_t<std::is_invocable_v<F&, Args..., const StageContext&>,
                       std::invoke_result<F&, Args..., const StageContext&>, std::invoke_result<F&, Args...>>;

}  // namespace detail

/// Starts a pipeline: set options, then name its source.
///
///   auto pipe = stoker::PipelineBuilder{}
///       .source("read", reader)
///       .map("decode", decode, {.threads = 2})
///       .flat_map<Crop>("crops", five_crops, {.threads = 2})
///       .shuffle("shuffle", {.capacity = 10000, .min_after_dequeue = 2000})
///       .batch("batch", 255)
///       .build();
///   for (auto& batch : pipe.epoch()) train(batch);
class PipelineBuilder : public detail::BuilderOptions<PipelineBuilder> {
 public:
  PipelineBuilder() : BuilderOptions(std::make_unique<detail::Assembly>()) {}

  /// `fn()` (or `fn(const StageContext&)`) returns std::optional<T>, one item per call,
  /// and nullopt at the end of each epoch; it is called again for the next epoch. Serial.
  template <class F>
  auto source(std::string name, F fn, SourceOptions options = {}) {
    using R = typename detail::result_with_context_t<F>::type;
    // Kept as written: clang-format 14 mangles requires-expressions.
    // clang-format off
    static_assert(requires(R r) { r.has_value(); *r; }, "a source returns std::optional<T>");
    // clang-format on
    using T = std::remove_cvref_t<decltype(*std::declval<R>())>;
    detail::check_capacity(name, "queue", options.queue);
    auto a = take();
    auto& stage = a->core->add_stage(std::make_unique<detail::SourceStage<T, F>>(
        std::move(name), std::move(fn), detail::max_chunk_or_any(options.max_chunk), options.on_error));
    a->last = &stage;
    a->last_queue = options.queue;
    return Builder<T>(std::move(a));
  }
};

/// A pipeline under construction whose last stage produces T.
template <class T>
class Builder : public detail::BuilderOptions<Builder<T>> {
 public:
  explicit Builder(std::unique_ptr<detail::Assembly> a) : detail::BuilderOptions<Builder<T>>(std::move(a)) {}

  /// 1 -> 1: `fn(T)` (or `fn(T, const StageContext&)`) returns the output.
  template <class F>
  auto map(std::string name, F fn, StageOptions options = {}) {
    using U = std::remove_cvref_t<typename detail::result_with_context_t<F, T>::type>;
    return transform<U, F, false>(std::move(name), std::move(fn), options);
  }

  /// 1 -> k: `fn(T, Emitter<U>& emit)` (or with a StageContext last) calls `emit(u)` any
  /// number of times, zero included. Name U explicitly: `flat_map<U>(...)`.
  /// If `fn` has a member `end_epoch(Emitter<U>&)` (or with a StageContext last), it is
  /// called once per epoch (on every copy, with copy_per_body) after the last call for that
  /// epoch, and what it emits comes before the end of the epoch: for a function that holds
  /// outputs back.
  template <class U, class F>
  auto flat_map(std::string name, F fn, StageOptions options = {}) {
    return transform<U, F, true>(std::move(name), std::move(fn), options);
  }

  /// Makes the queue after the last stage a random-shuffle buffer (RandomShuffleQueue's
  /// semantics), reseeded every epoch from its seed, or without one from the pipeline's seed.
  /// A dequeue draws uniformly from everything held, as TensorFlow's does; in deterministic
  /// mode from the oldest min_after_dequeue + 1, which does not depend on how far the
  /// producers ran ahead (ShuffleRule::oldest_window).
  Builder& shuffle(std::string name, ShuffleOptions options) & {
    auto& a = this->assembly();
    if (a.shuffle)
      throw std::invalid_argument("shuffle '" + name + "' directly follows shuffle '" + a.shuffle->first + "'");
    if (options.capacity == 0) throw std::invalid_argument("shuffle '" + name + "': capacity must be at least 1");
    if (options.min_after_dequeue >= options.capacity)
      throw std::invalid_argument("shuffle '" + name + "': min_after_dequeue (" +
                                  std::to_string(options.min_after_dequeue) + ") must be less than capacity (" +
                                  std::to_string(options.capacity) + ")");
    a.shuffle.emplace(std::move(name), options);
    return *this;
  }
  Builder&& shuffle(std::string name, ShuffleOptions options) && {
    return std::move(shuffle(std::move(name), options));
  }

  /// Groups `size` consecutive items into a std::vector<T>.
  auto batch(std::string name, std::size_t size, BatchOptions options = {}) {
    detail::check_capacity(name, "batch size", size);
    detail::check_capacity(name, "queue", options.queue);
    auto a = this->take();
    auto stage = std::make_unique<detail::BatchStage<T>>(name, size, options.drop_remainder);
    connect(*a, *stage);
    a->last = &a->core->add_stage(std::move(stage));
    a->last_queue = options.queue;
    return Builder<std::vector<T>>(std::move(a));
  }

  /// Starts the pipeline: stages begin filling their queues at once.
  Pipeline<T> build() {
    auto a = this->take();
    if (a->shuffle)
      throw std::invalid_argument("shuffle '" + a->shuffle->first + "' must be followed by a stage, such as batch");
    const auto& o = a->options;
    if (o.resume && o.first_epoch != 0)
      throw std::invalid_argument("first_epoch and resume_from both say where the run starts: give one of them");
    auto& final_edge = make_edge(*a, "consumer");
    static_cast<detail::Producer<T>*>(a->last)->connect_output(&final_edge, nullptr);
    a->core->start({o.threads, o.seed, o.deterministic, o.occupancy_log, o.log_labels, o.trace, o.timelines,
                    o.sample_interval, o.autotune, o.counters, o.on_epoch_start, o.budget});
    return Pipeline<T>(std::move(a->core), final_edge, *a->last, o.epochs, o.resume, o.first_epoch);
  }

 private:
  template <class U, class F, bool Flat>
  auto transform(std::string name, F fn, StageOptions options) {
    detail::check_capacity(name, "queue", options.queue);
    auto a = this->take();
    if (!Flat && options.fanout > 1)
      throw std::invalid_argument("stage '" + name + "': fanout " + std::to_string(options.fanout) +
                                  " is for a flat_map; a map has one output per input");
    using Stage = detail::TransformStage<T, U, F, Flat>;
    auto stage = std::make_unique<Stage>(
        name, std::move(fn),
        typename Stage::Options{options.threads, detail::max_chunk_or_any(options.max_chunk), options.on_error,
                                options.copy_per_body, options.autotune, options.fanout});
    connect(*a, *stage);
    a->last = &a->core->add_stage(std::move(stage));
    a->last_queue = options.queue;
    return Builder<U>(std::move(a));
  }

  // Connects the last stage to `next` through a new edge.
  template <class Stage>
  static void connect(detail::Assembly& a, Stage& next) {
    auto& edge = make_edge(a, next.name());
    static_cast<detail::Producer<T>*>(a.last)->connect_output(&edge, &next);
    next.connect_input(&edge, a.last);
  }

  static detail::Edge<T>& make_edge(detail::Assembly& a, const std::string& consumer) {
    const auto& producer = a.last->name();
    if (a.shuffle) {
      auto [name, options] = std::move(*a.shuffle);
      a.shuffle.reset();
      return static_cast<detail::Edge<T>&>(
          a.core->add_edge(std::make_unique<detail::Edge<T>>(name, options, producer, consumer)));
    }
    return static_cast<detail::Edge<T>&>(a.core->add_edge(
        std::make_unique<detail::Edge<T>>(producer + "->" + consumer, a.last_queue, producer, consumer)));
  }
};

/// A running pipeline. The thread that iterates it is its consumer; one thread at a time:
/// next() called while another thread is in it throws std::logic_error.
///
///   for (auto epoch : pipe.epochs())      // until the run is over
///     for (auto& batch : epoch) train(batch);
///
/// Epochs are prefetched: the next one starts as soon as the last item of this one has left
/// the stages, inside the next() that returns this one's end, so that the stages fill their
/// queues again while the training loop finishes the epoch (evaluates, saves). Whatever the
/// loop changes after that next() reaches the next epoch late, for the items already made; to
/// change what the stages read for an epoch, do it in PipelineOptions::on_epoch_start.
template <class T>
class Pipeline {
 public:
  Pipeline(Pipeline&& o) noexcept { *this = std::move(o); }
  /// Not while another thread calls stop().
  Pipeline& operator=(Pipeline&& o) noexcept {
    core_ = std::move(o.core_);
    final_ = o.final_;
    last_ = o.last_;
    epochs_ = o.epochs_;
    epoch_ = o.epoch_;
    finished_ = o.finished_.load();
    chunk_ = std::move(o.chunk_);
    origin_ = o.origin_;
    taken_ = o.taken_;
    consumed_ = o.consumed_;
    return *this;
  }
  ~Pipeline() = default;  // PipelineCore's destructor stops everything

  /// The next item of the current epoch, waiting for it if need be; nullopt at the end of
  /// the epoch (the next call starts on the next one) and once the run is over (finished()).
  /// Rethrows, as a StageError, an exception thrown by any stage. An item whose move throws as
  /// it is taken ends the run too, as a StageError naming "consumer". At the end of an epoch,
  /// the next one starts (on_epoch_start, then its stages) before this returns: see the class.
  std::optional<T> next() {
    const OneConsumer one(in_next_);
    rethrow_if_failed();
    try {
      return take();
    } catch (const StageError&) {
      throw;
    } catch (...) {  // the runtime's own moves of an item, as between stages: the run fails
      core_->fail("consumer", std::current_exception());
    }
    rethrow_if_failed();
    return std::nullopt;  // not reached: the run has failed
  }

  /// Waits until next() would return without waiting, at most `timeout`: true when it would (an
  /// item, the end of an epoch or of the run, or a stage's error is there), false when the time
  /// ran out. Takes nothing, so that a consumer that must do something else now and then while it
  /// waits (a Python loop that checks for Ctrl-C) waits in slices and then calls next(). The
  /// time waited counts as the consumer's wait in the summary, as next()'s does.
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> timeout) {
    detail::PipelineCore& c = core();  // a moved-from pipeline's edge is its new owner's
    if (finished_ || taken_ < chunk_.size() || final_->ready()) return true;
    const auto t0 = std::chrono::steady_clock::now();
    const bool ready =
        final_->wait_until(t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout));
    c.consumer_waited(t0, std::chrono::steady_clock::now());
    return ready;
  }

  /// The rest of the current epoch as an input range: `for (auto& x : pipe.epoch())`.
  class EpochRange;
  EpochRange epoch() { return EpochRange(*this); }
  /// The epochs until the run is over, each the rest of the current epoch (epoch()). Each next
  /// epoch is under way before the loop over the last one ends: see the class.
  class Epochs;
  Epochs epochs() { return Epochs(*this); }

  /// The epoch that next() is in.
  std::uint32_t current_epoch() const { return epoch_; }
  /// True once every epoch asked for has been delivered, the pipeline was stopped, or a stage
  /// failed (next() threw its StageError).
  bool finished() const { return finished_.load(); }

  /// Stops every stage and waits until all of their bodies have returned; next() then returns
  /// nullopt. Idempotent, and safe from any thread: every call waits, a second one made while
  /// the first waits too. The destructor calls it. From a stage function (or oneTBB work it
  /// waits for, such as a parallel_for's) it cannot wait for its own body: it stops the stages
  /// and returns, and the consumer's next stop() (or the destructor) waits.
  void stop() {
    if (!core_) return;
    finished_ = true;
    core_->stop();
  }

  /// Counters of every stage and queue so far.
  PipelineSummary summary() const { return core().summary(); }

  /// Where the run stands: after the items next() has returned so far. A pipeline built with
  /// the same stages, seed and data and `.resume_from(state)` goes on from there, with any thread
  /// counts: in deterministic mode it yields, from its first next(), exactly what this one yields
  /// from its next one; in free order, every item of the epoch this one has not returned yet,
  /// once each, in another order. Needs a source function with `seek(index)` and a fanout for
  /// every flat_map (and in free order at most one batch stage, followed by maps only); throws
  /// StateError naming what prevents it otherwise. From the consumer's thread; costs a fraction
  /// of a microsecond in deterministic mode, and in free order about a nanosecond for each item
  /// in flight.
  PipelineState state() const { return core().state(epoch_, consumed_); }

 private:
  detail::PipelineCore& core() const {
    if (!core_) throw std::logic_error("stoker::Pipeline: used after it was moved from");
    return *core_;
  }
  void rethrow_if_failed() {
    try {
      core().rethrow_if_failed();
    } catch (...) {
      finished_ = true;  // a loop over epochs() that catches the error ends
      throw;
    }
  }

  std::optional<T> take() {
    while (!finished_) {
      if (taken_ < chunk_.size()) {
        core_->count_consumed();
        if (auto* taken = core_->taken_items()) detail::took(*taken, origin_.next(chunk_.runs));
        ++consumed_;
        return std::move(chunk_.items[taken_++]);
      }
      chunk_.clear();
      taken_ = 0;
      origin_ = {};
      std::uint64_t first = 0;
      // The last stage may wait for the room a pop makes: wake it, whatever the pop did.
      struct WakeLast {
        detail::StageBase* last;
        ~WakeLast() { last->wake(); }
      } wake_last{last_};
      detail::Pop r = final_->pop(chunk_, final_->max_chunk(), first);
      if (r == detail::Pop::empty) {
        const auto t0 = std::chrono::steady_clock::now();
        r = final_->pop_wait(chunk_, final_->max_chunk(), first);
        core_->consumer_waited(t0, std::chrono::steady_clock::now());
      }
      if (r == detail::Pop::items) {
        continue;
      } else if (r == detail::Pop::ended) {
        end_epoch();
        return std::nullopt;
      } else {  // closed: stopped or failed
        rethrow_if_failed();
        finished_ = true;
      }
    }
    return std::nullopt;
  }

  friend class Builder<T>;
  Pipeline(std::unique_ptr<detail::PipelineCore> core, detail::Edge<T>& final_edge, detail::StageBase& last,
           std::uint32_t epochs, const std::optional<PipelineState>& resume, std::uint32_t first_epoch)
      : core_(std::move(core)), final_(&final_edge), last_(&last), epochs_(epochs), epoch_(first_epoch) {
    if (resume) {
      core_->check_state(*resume);
      epoch_ = resume->epoch;
      consumed_ = resume->consumed;
    }
    if (epochs_ != 0 && epoch_ >= epochs_) {  // the run was over, or starts past its last epoch
      stop();
      return;
    }
    start_epoch(resume ? &*resume : nullptr);
  }

  // Every stage that has work starts: the source, and after a resume any stage whose queue was
  // given items back (a free-order resume may give its queue more than it takes, so that its
  // producer waits for this stage).
  void start_epoch(const PipelineState* resume = nullptr) {
    core_->begin_epoch(epoch_, resume);
    for (const auto& stage : core_->stages()) stage->wake();
  }

  // Epochs do not overlap: the next one starts once this one has fully left the graph,
  // so a shuffle never mixes two epochs and every queue restarts empty. A run of endless
  // epochs ends at one that yields nothing (an empty source, every item filtered out), as
  // tf.data's repeat() does, rather than spin through empty epochs.
  void end_epoch() {
    const bool empty = consumed_ == 0;
    ++epoch_;
    consumed_ = 0;
    core_->end_epoch();
    if (epochs_ != 0 ? epoch_ >= epochs_ : empty) {
      finished_ = true;
      core_->end_run();
      return;
    }
    core_->wait_idle();
    try {
      start_epoch();
    } catch (...) {  // from on_epoch_start
      core_->fail("on_epoch_start", std::current_exception());
      rethrow_if_failed();
    }
  }

  // Marks a call of next() in progress: a second thread's call while it is refused.
  class OneConsumer {
   public:
    explicit OneConsumer(std::atomic<bool>& in) : in_(in) {
      if (in_.exchange(true, std::memory_order_acquire))
        throw std::logic_error(
            "stoker::Pipeline::next(): called while another thread is in it; a pipeline has one consumer "
            "(hand its items on to other threads, or give each its own pipeline)");
    }
    ~OneConsumer() { in_.store(false, std::memory_order_release); }
    OneConsumer(const OneConsumer&) = delete;
    OneConsumer& operator=(const OneConsumer&) = delete;

   private:
    std::atomic<bool>& in_;
  };

  std::unique_ptr<detail::PipelineCore> core_;
  std::atomic<bool> in_next_{false};
  detail::Edge<T>* final_ = nullptr;
  detail::StageBase* last_ = nullptr;
  std::uint32_t epochs_ = 0;
  std::uint32_t epoch_ = 0;
  std::atomic<bool> finished_{false};
  detail::Chunk<T> chunk_;       // taken from the last queue at once, handed out one by one
  detail::OriginCursor origin_;  // the origin of chunk_'s next item
  std::size_t taken_ = 0;
  std::uint64_t consumed_ = 0;  // items next() returned in this epoch
};

template <class T>
class Pipeline<T>::EpochRange {
 public:
  class iterator {
   public:
    using value_type = T;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    explicit iterator(Pipeline* p) : p_(p) { ++*this; }
    T& operator*() const { return *current_; }
    T* operator->() const { return &*current_; }
    iterator& operator++() {
      current_.reset();                                                // the item goes before the next is asked for
      if (auto item = p_->next()) current_.emplace(std::move(*item));  // T need not be assignable
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) { return !it.current_; }

   private:
    Pipeline* p_ = nullptr;
    mutable std::optional<T> current_;
  };
  explicit EpochRange(Pipeline& p) : p_(&p) {}
  iterator begin() { return iterator(p_); }
  std::default_sentinel_t end() { return {}; }

 private:
  Pipeline* p_;
};

template <class T>
class Pipeline<T>::Epochs {
 public:
  class iterator {
   public:
    using value_type = EpochRange;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    explicit iterator(Pipeline* p) : p_(p) {}
    EpochRange operator*() const { return EpochRange(*p_); }
    iterator& operator++() { return *this; }  // the epoch moves on as its range is read
    void operator++(int) {}
    friend bool operator==(const iterator& it, std::default_sentinel_t) { return it.p_->finished(); }

   private:
    Pipeline* p_ = nullptr;
  };
  explicit Epochs(Pipeline& p) : p_(&p) {}
  iterator begin() { return iterator(p_); }
  std::default_sentinel_t end() { return {}; }

 private:
  Pipeline* p_;
};

}  // namespace stoker
