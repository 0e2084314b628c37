// The pipeline builder and the pipeline the training loop iterates.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "stoker/core/detail/stages.h"
#include "stoker/core/random_shuffle_queue.h"
#include "stoker/core/stage_error.h"
#include "stoker/core/stage_stats.h"

namespace stoker {

/// Options of a `map` or `flat_map` stage.
struct StageOptions {
  int threads = 1;         ///< bodies of this stage that may run at once
  std::size_t queue = 64;  ///< capacity of the queue this stage's outputs go into
};

/// Options of the source stage.
struct SourceOptions {
  std::size_t queue = 64;  ///< capacity of the queue after the source
};

/// Options of a `batch` stage.
struct BatchOptions {
  bool drop_remainder = false;  ///< drop, rather than deliver, a short last batch of an epoch
  std::size_t queue = 8;        ///< capacity, in batches, of the queue after the batcher
};

/// Options of the whole pipeline.
struct PipelineOptions {
  int threads = 0;                ///< oneTBB threads shared by all stages; 0 = one per core
  std::uint64_t seed = 0;         ///< given to every stage function through StageContext
  bool deterministic = false;     ///< same output order on every run, whatever the threads
  std::uint32_t epochs = 0;       ///< epochs to run; 0 = until stopped
  std::string occupancy_log;      ///< JSON Lines file of queue samples; empty = none
  std::chrono::milliseconds sample_interval{50};
  /// Counters kept outside the graph, reported in summary() and at the end of the occupancy
  /// log, e.g. stoker::gpu::transfer_counters(device).
  CounterSource counters;
};

template <class T>
class Pipeline;
template <class T>
class Builder;

namespace detail {

/// What the builder has assembled so far, handed from one typed builder to the next.
struct Assembly {
  PipelineOptions options;
  std::unique_ptr<PipelineCore> core = std::make_unique<PipelineCore>(CoreOptions{});
  StageBase* last = nullptr;        // the stage whose output is not yet connected
  std::size_t last_queue = 64;      // capacity asked for that output
  std::optional<std::pair<std::string, ShuffleOptions>> shuffle;  // asked for that output
};

/// Option setters shared by every builder.
template <class Self>
class BuilderOptions {
 public:
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
  Self& counters(CounterSource source) & { return set([&](auto& o) { o.counters = std::move(source); }); }
  Self&& counters(CounterSource source) && { return std::move(counters(std::move(source))); }
  Self& options(PipelineOptions o) & { return set([&](auto& x) { x = std::move(o); }); }
  Self&& options(PipelineOptions o) && { return std::move(options(std::move(o))); }

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
    return static_cast<Self&>(*this);
  }
  std::unique_ptr<Assembly> a_;
};

inline void check_capacity(const std::string& stage, const char* option, std::size_t n) {
  if (n == 0) throw std::invalid_argument("stage '" + stage + "': " + option + " must be at least 1");
}

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
///       .flat_map("crops", five_crops, {.threads = 2})
///       .shuffle("shuffle", {.capacity = 10000, .min_after_dequeue = 2000, .seed = 7})
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
    static_assert(requires(R r) { r.has_value(); *r; }, "a source returns std::optional<T>");
    using T = std::remove_cvref_t<decltype(*std::declval<R>())>;
    detail::check_capacity(name, "queue", options.queue);
    auto a = take();
    auto& stage = a->core->add_stage(
        std::make_unique<detail::SourceStage<T, F>>(*a->core, std::move(name), std::move(fn)));
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
  /// called once per epoch after the last call for that epoch, on one thread, and what it
  /// emits comes before the end of the epoch: for a function that holds outputs back.
  template <class U, class F>
  auto flat_map(std::string name, F fn, StageOptions options = {}) {
    return transform<U, F, true>(std::move(name), std::move(fn), options);
  }

  /// Makes the queue after the last stage a RandomShuffleQueue, reseeded every epoch.
  Builder& shuffle(std::string name, ShuffleOptions options) & {
    auto& a = this->assembly();
    if (a.shuffle) throw std::invalid_argument("shuffle '" + name + "' directly follows shuffle '" + a.shuffle->first + "'");
    if (options.min_after_dequeue >= options.capacity)
      throw std::invalid_argument("shuffle '" + name + "': min_after_dequeue (" +
                                  std::to_string(options.min_after_dequeue) + ") must be less than capacity (" +
                                  std::to_string(options.capacity) + ")");
    a.shuffle.emplace(std::move(name), options);
    return *this;
  }
  Builder&& shuffle(std::string name, ShuffleOptions options) && { return std::move(shuffle(std::move(name), options)); }

  /// Groups `size` consecutive items into a std::vector<T>.
  auto batch(std::string name, std::size_t size, BatchOptions options = {}) {
    detail::check_capacity(name, "batch size", size);
    detail::check_capacity(name, "queue", options.queue);
    if (auto& a = this->assembly(); a.shuffle && size > a.shuffle->second.capacity - a.shuffle->second.min_after_dequeue)
      throw std::invalid_argument("batch '" + name + "' of " + std::to_string(size) +
                                  " cannot be filled from shuffle '" + a.shuffle->first +
                                  "': it holds at most capacity - min_after_dequeue poppable items");
    auto a = this->take();
    auto stage = std::make_unique<detail::BatchStage<T>>(*a->core, name, size, options.drop_remainder);
    connect(*a, *stage);
    a->last = &a->core->add_stage(std::move(stage));
    a->last_queue = options.queue;
    return Builder<std::vector<T>>(std::move(a));
  }

  /// Starts the pipeline: stages begin filling their queues at once.
  Pipeline<T> build() {
    auto a = this->take();
    auto& o = a->options;
    a->core->options() = {o.threads, o.seed, o.occupancy_log, o.sample_interval, o.counters};
    if (a->shuffle)
      throw std::invalid_argument("shuffle '" + a->shuffle->first + "' must be followed by a stage, such as batch");
    auto& final_edge = static_cast<detail::QueueEdge<T>&>(make_edge(*a, "consumer"));
    static_cast<detail::Producer<T>*>(a->last)->connect_output(&final_edge, nullptr);
    return Pipeline<T>(std::move(a->core), final_edge, *a->last, o.epochs);
  }

 private:
  template <class U, class F, bool Flat>
  auto transform(std::string name, F fn, StageOptions options) {
    detail::check_capacity(name, "queue", options.queue);
    auto a = this->take();
    auto stage = std::make_unique<detail::TransformStage<T, U, F, Flat>>(*a->core, name, options.threads, std::move(fn),
                                                                         a->options.deterministic);
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
      return a.core->add_edge(std::make_unique<detail::ShuffleEdge<T>>(name, options, producer, consumer));
    }
    return a.core->add_edge(std::make_unique<detail::QueueEdge<T>>(producer + "->" + consumer, a.last_queue,
                                                                   a.options.deterministic, producer, consumer));
  }
};

/// A running pipeline. The thread that iterates it is its consumer; one thread only.
template <class T>
class Pipeline {
 public:
  Pipeline(Pipeline&&) noexcept = default;
  Pipeline& operator=(Pipeline&&) noexcept = default;
  ~Pipeline() {
    if (core_) core_->stop();
  }

  /// The next item of the current epoch, waiting for it if need be; nullopt at the end of
  /// the epoch (the next call starts on the next one) and once the run is over.
  /// Rethrows, as a StageError, an exception thrown by any stage.
  std::optional<T> next() {
    core_->rethrow_if_failed();
    while (!finished_) {
      if (arrivals_.complete()) {
        end_epoch();
        return std::nullopt;
      }
      detail::Envelope<T> e;
      // Whatever a pop takes out of the queue (in deterministic mode, perhaps only to hold it
      // back), the last stage may have been waiting for that room.
      const auto try_pop = [&] {
        const bool got = final_->try_pop(e) == detail::Pop::item;
        last_->wake_if_blocked();
        return got;
      };
      bool got = try_pop();
      if (!got) {
        const auto t0 = std::chrono::steady_clock::now();
        // Poll a while before sleeping: when items come fast, going to sleep and being woken
        // (a futex call on each side and two context switches) would cost more than they do.
        // Each poll yields the core first, so that a stage thread waiting for one runs:
        // the consumer is a thread beside the stages' budget, and often one too many.
        for (auto until = t0 + kPoll; !got && std::chrono::steady_clock::now() < until;) {
          std::this_thread::yield();
          got = try_pop();
        }
        if (!got) {
          got = final_->pop_wait(e, [&] { last_->wake_if_blocked(); });
          last_->wake_if_blocked();
        }
        core_->add_consumer_wait(std::chrono::steady_clock::now() - t0);
      }
      if (!got) {  // stopped
        core_->rethrow_if_failed();
        finished_ = true;
        break;
      }
      if (e.value) {
        arrivals_.item();
        core_->count_consumed();
        return std::move(e.value);
      }
      arrivals_.marker(e.seq);
    }
    return std::nullopt;
  }

  /// The rest of the current epoch as an input range: `for (auto& x : pipe.epoch())`.
  class EpochRange;
  EpochRange epoch() { return EpochRange(*this); }

  /// The epoch that next() is in.
  std::uint32_t current_epoch() const { return epoch_; }
  /// True once every epoch asked for has been delivered, or the pipeline was stopped.
  bool finished() const { return finished_; }

  /// Stops every stage and waits until all of their bodies have returned. Idempotent;
  /// the destructor calls it.
  void stop() {
    finished_ = true;
    core_->stop();
  }

  /// Counters of every stage and queue so far.
  PipelineSummary summary() const { return core_->summary(); }

 private:
  friend class Builder<T>;
  Pipeline(std::unique_ptr<detail::PipelineCore> core, detail::QueueEdge<T>& final_edge, detail::StageBase& last,
           std::uint32_t epochs)
      : core_(std::move(core)), final_(&final_edge), last_(&last), epochs_(epochs) {
    core_->start();
    start_epoch();
  }

  void start_epoch() {
    arrivals_.reset();
    core_->begin_epoch(epoch_);
    core_->stages().front()->wake();
  }

  // Epochs do not overlap: the next one starts once this one has fully left the graph,
  // so a shuffle never mixes two epochs and every queue restarts empty.
  void end_epoch() {
    ++epoch_;
    if (epochs_ != 0 && epoch_ >= epochs_) {
      finished_ = true;
      core_->stop();
      return;
    }
    core_->wait_idle();
    start_epoch();
  }

  std::unique_ptr<detail::PipelineCore> core_;
  detail::QueueEdge<T>* final_;
  detail::StageBase* last_;
  std::uint32_t epochs_;
  std::uint32_t epoch_ = 0;
  bool finished_ = false;
  static constexpr std::chrono::microseconds kPoll{50};
  detail::ArrivalCount arrivals_;
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
      current_ = p_->next();
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

}  // namespace stoker
