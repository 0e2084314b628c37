#include "stoker/core/detail/runtime.h"

#include <spdlog/async.h>
#include <spdlog/async_logger.h>
#include <spdlog/sinks/basic_file_sink.h>

#include <condition_variable>
#include <nlohmann/json.hpp>
#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/task_arena.h>
#include <stdexcept>
#include <thread>
#include <utility>

#include "stoker/core/stage_error.h"

// libtbb is not built with ThreadSanitizer, so the ordering it provides (a task runs after
// the try_put that made it; wait_for_all returns after every task) is invisible to TSan.
// These annotations state those edges; they compile to nothing in other builds.
#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#define STOKER_TSAN_ACQUIRE(p) __tsan_acquire(static_cast<void*>(p))
#define STOKER_TSAN_RELEASE(p) __tsan_release(static_cast<void*>(p))
#else
#define STOKER_TSAN_ACQUIRE(p) ((void)0)
#define STOKER_TSAN_RELEASE(p) ((void)0)
#endif

namespace stoker {

namespace {
// The pipeline whose stage body this thread is running, if any.
thread_local const detail::PipelineCore* running_for = nullptr;
// What the stage functions of the body this thread runs reported as blocked (note_blocked).
thread_local std::chrono::nanoseconds blocked_in_body{0};
}  // namespace

namespace {
thread_local detail::HeldOutputs* held_outputs = nullptr;
}  // namespace

detail::HeldOutputs* detail::hold_outputs(HeldOutputs* held) noexcept { return std::exchange(held_outputs, held); }

bool stop_requested() {
  if (held_outputs) held_outputs->push_held();
  return running_for && running_for->stopping();
}

void note_blocked(std::chrono::nanoseconds waited) noexcept {
  if (running_for) blocked_in_body += waited;
}

namespace {
std::atomic<void (*)(const char*)> trace_begin{nullptr};
std::atomic<void (*)()> trace_end{nullptr};
}  // namespace

void set_body_tracer(BodyTracer tracer) noexcept {
  trace_end.store(tracer.end);
  trace_begin.store(tracer.begin);
}

}  // namespace stoker

namespace stoker::detail {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------
// Engine: the arena every stage body runs in, and the flow graph that schedules them.

struct PipelineCore::Engine {
  explicit Engine(int threads)
      // The consumer is the user's own thread and never joins the arena, so no slot is
      // reserved for it, and oneTBB must be allowed one worker per requested thread.
      : control(tbb::global_control::max_allowed_parallelism,
                static_cast<std::size_t>(std::max(threads + 1, tbb::info::default_concurrency()))),
        arena(threads, /*reserved_for_masters=*/0) {
    arena.execute([&] { graph.emplace(); });
  }
  tbb::global_control control;
  tbb::task_arena arena;
  std::optional<tbb::flow::graph> graph;  // built inside `arena`, so it spawns there
};

struct Wake {};

struct StageBase::Node {
  // Unlimited concurrency: StageBase::active_ is what limits a stage to its threads,
  // so a wake-up is never queued behind a busy body.
  Node(tbb::flow::graph& g, StageBase& s)
      : node(g, tbb::flow::unlimited, [&s](Wake) { s.run(); return tbb::flow::continue_msg{}; }) {}
  tbb::flow::function_node<Wake, tbb::flow::continue_msg> node;
};

// ---------------------------------------------------------------------------------------
// StageBase

StageBase::StageBase(PipelineCore& core, std::string name, int threads)
    : core_(core), name_(std::move(name)), threads_(threads) {
  if (threads < 1) throw std::invalid_argument("stage '" + name_ + "': threads must be at least 1");
}

StageBase::~StageBase() = default;

void StageBase::begin_epoch(std::uint32_t epoch) {
  context_.seed = core_.options().seed;  // set by build(), after the stage was made
  context_.epoch = epoch;
}

void StageBase::wake() {
  if (!node_ || core_.stopping()) return;
  int a = active_.load();
  while (a < threads_) {
    if (!has_work()) return;
    if (active_.compare_exchange_weak(a, a + 1)) {
      STOKER_TSAN_RELEASE(this);
      node_->node.try_put(Wake{});
      return;
    }
  }
}

// A body loops while it makes progress, then leaves. Leaving is the delicate part: a
// producer may push just after we found our input empty. Both sides use sequentially
// consistent operations: the body drops `active_` and then looks for work; the other
// side changes a queue and then reads `active_` in wake(). One of the two must see the
// other, so either the body stays or the other side starts a new one.
void StageBase::run() {
  STOKER_TSAN_ACQUIRE(this);
  body_started();
  // Busy time is taken per body, not per item: two clock reads per item per stage would
  // cost more than a cheap stage's work.
  const auto started = Clock::now();
  Clock::duration lingered{};
  Step step_result = Step::done;
  running_for = &core_;
  blocked_in_body = {};
  // Busy time excludes lingering and what the stage function reported as blocked.
  const auto account = [&](Step why) {
    const auto busy = Clock::now() - started - lingered - blocked_in_body;
    busy_ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(busy).count(), std::memory_order_relaxed);
    body_left(why, blocked_in_body);
  };
  auto* const traced = trace_begin.load(std::memory_order_relaxed);
  if (traced) traced(name_.c_str());
  struct Unmark {
    bool traced;
    ~Unmark() {
      running_for = nullptr;
      if (auto* end = trace_end.load(std::memory_order_relaxed); traced && end) end();
    }
  } unmark{traced != nullptr};
  for (;;) {
    try {
      do step_result = step();
      while (step_result == Step::progressed && !core_.stopping());
    } catch (...) {
      active_.fetch_sub(1);
      account(Step::done);
      core_.fail(name_, std::current_exception());
      STOKER_TSAN_RELEASE(&core_);
      return;
    }
    if (step_result == Step::starved && linger(lingered)) continue;
    active_.fetch_sub(1);
    if (core_.stopping() || !has_work()) break;
    int a = active_.load();
    bool rejoined = false;
    while (a < threads_ && !(rejoined = active_.compare_exchange_weak(a, a + 1))) {
    }
    if (!rejoined) break;
  }
  account(step_result);
  STOKER_TSAN_RELEASE(&core_);
}

// A starved body waits a moment for its next input before leaving: when items arrive
// microseconds apart, that saves a task spawn and often a worker wake-up per item. The
// wait is short enough that a stage sharing the thread budget is barely delayed.
bool StageBase::linger(Clock::duration& lingered) {
  constexpr auto kLinger = std::chrono::microseconds(4);
  const auto start = Clock::now();
  auto now = start;
  bool found = false;
  do {
    for (int i = 0; i < 32 && !(found = has_work()); ++i) cpu_relax();
    now = Clock::now();
  } while (!found && !core_.stopping() && now - start < kLinger);
  lingered += now - start;
  return found;
}

void StageBase::body_started() {
  std::lock_guard lock(idle_mutex_);
  if (running_++ == 0 && idle_reason_) {
    const auto idle = Clock::now() - idle_since_;
    if (*idle_reason_ == Step::starved) starved_ += idle;
    if (*idle_reason_ == Step::blocked) blocked_ += idle;
    idle_reason_.reset();
  }
}

void StageBase::body_left(Step why, std::chrono::nanoseconds blocked_inside) {
  std::lock_guard lock(idle_mutex_);
  blocked_ += blocked_inside / threads_;  // thread-averaged, as busy % is
  if (--running_ == 0) {
    idle_since_ = Clock::now();
    idle_reason_ = why;
  }
}

StageStats StageBase::stats() const {
  StageStats s;
  s.name = name_;
  s.threads = threads_;
  s.items_in = items_in_.load();
  s.items_out = items_out_.load();
  s.busy = std::chrono::nanoseconds(busy_ns_.load());
  std::lock_guard lock(idle_mutex_);
  s.starved = starved_;
  s.blocked = blocked_;
  if (running_ == 0 && idle_reason_) {  // still idle: count up to now
    const auto idle = Clock::now() - idle_since_;
    if (*idle_reason_ == Step::starved) s.starved += idle;
    if (*idle_reason_ == Step::blocked) s.blocked += idle;
  }
  return s;
}

// ---------------------------------------------------------------------------------------
// Monitor: samples every queue at a fixed interval into a JSON Lines file, through an
// spdlog asynchronous logger so that the sampling thread never waits on the disk.

class PipelineCore::Monitor {
 public:
  Monitor(const PipelineCore& core, const std::string& path, std::chrono::milliseconds interval)
      : core_(core), interval_(interval) {
    try {
      pool_ = std::make_shared<spdlog::details::thread_pool>(8192, 1);
      auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/true);
      logger_ = std::make_shared<spdlog::async_logger>("stoker-occupancy", std::move(sink), pool_,
                                                       spdlog::async_overflow_policy::block);
      logger_->set_pattern("%v");
    } catch (const std::exception& e) {
      throw std::runtime_error("occupancy log '" + path + "': cannot open for writing: " + e.what());
    }
    thread_ = std::thread([this] { loop(); });
  }
  ~Monitor() { finish(); }

  // Takes a last sample, writes the per-stage counters, and flushes the file.
  void finish() {
    {
      std::lock_guard lock(mutex_);
      if (done_) return;
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
    sample();
    const auto summary = core_.summary();
    for (const auto& s : summary.stages) {
      nlohmann::json j{{"type", "stage"},
                       {"t", seconds()},
                       {"stage", s.name},
                       {"threads", s.threads},
                       {"items_in", s.items_in},
                       {"items_out", s.items_out},
                       {"busy_s", to_s(s.busy)},
                       {"starved_s", to_s(s.starved)},
                       {"blocked_s", to_s(s.blocked)}};
      logger_->info(j.dump());
    }
    if (!summary.counters.empty()) {
      nlohmann::json j{{"type", "counters"}, {"t", seconds()}};
      for (const auto& c : summary.counters) j["counters"][c.name] = c.value;
      logger_->info(j.dump());
    }
    logger_->flush();
    logger_.reset();
    pool_.reset();  // joins the logging thread after it has written everything
  }

 private:
  static double to_s(std::chrono::nanoseconds d) { return std::chrono::duration<double>(d).count(); }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - born_).count(); }

  void loop() {
    std::unique_lock lock(mutex_);
    auto next = Clock::now();
    while (!done_) {
      lock.unlock();
      sample();
      lock.lock();
      next += interval_;
      wake_.wait_until(lock, next, [&] { return done_; });
    }
  }

  void sample() {
    const double t = seconds();
    for (const auto& e : core_.edges_) {
      const auto& m = e->meter();
      nlohmann::json j{{"type", "sample"},      {"t", t},
                       {"queue", m.name()},     {"size", m.size()},
                       {"capacity", m.capacity()}, {"producer", e->producer()},
                       {"consumer", e->consumer()}};
      logger_->info(j.dump());
    }
  }

  const PipelineCore& core_;
  const std::chrono::milliseconds interval_;
  const Clock::time_point born_ = Clock::now();
  std::shared_ptr<spdlog::details::thread_pool> pool_;
  std::shared_ptr<spdlog::async_logger> logger_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;
};

// ---------------------------------------------------------------------------------------
// PipelineCore

PipelineCore::PipelineCore(CoreOptions options) : options_(std::move(options)) {}

PipelineCore::~PipelineCore() { stop(); }

StageBase& PipelineCore::add_stage(std::unique_ptr<StageBase> stage) {
  for (const auto& s : stages_)
    if (s->name() == stage->name())
      throw std::invalid_argument("stage name '" + stage->name() + "' is used twice; names must be unique");
  stages_.push_back(std::move(stage));
  return *stages_.back();
}

void PipelineCore::start() {
  if (options_.threads < 0) throw std::invalid_argument("pipeline threads must be at least 1 (or 0 for one per core)");
  if (options_.sample_interval.count() <= 0)
    throw std::invalid_argument("occupancy sample interval must be positive");
  const int threads = options_.threads == 0 ? tbb::info::default_concurrency() : options_.threads;
  if (!options_.occupancy_log.empty())
    monitor_ = std::make_unique<Monitor>(*this, options_.occupancy_log, options_.sample_interval);
  engine_ = std::make_unique<Engine>(threads);
  engine_->arena.execute([&] {
    for (auto& s : stages_) s->node_ = std::make_unique<StageBase::Node>(*engine_->graph, *s);
  });
  started_ = Clock::now();
}

void PipelineCore::wait_idle() {
  for (const auto& s : stages_)
    while (!s->idle()) std::this_thread::yield();
}

void PipelineCore::begin_epoch(std::uint32_t epoch) {
  for (auto& e : edges_) e->begin_epoch(epoch);
  for (auto& s : stages_) s->begin_epoch(epoch);
}

void PipelineCore::fail(const std::string& stage, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const PipelineStopped&) {
    if (stopping()) return;  // gave up because of the stop, not the cause of one
  } catch (...) {
  }
  {
    std::lock_guard lock(error_mutex_);
    if (!error_) {
      error_ = std::move(error);
      error_stage_ = stage;
    }
  }
  stopping_.store(true);
  for (auto& e : edges_) e->close();  // wakes the consumer
}

void PipelineCore::rethrow_if_failed() const {
  std::lock_guard lock(error_mutex_);
  if (!error_) return;
  std::string message = "unknown exception";
  try {
    std::rethrow_exception(error_);
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
  }
  throw StageError(error_stage_, message, error_);
}

void PipelineCore::stop() {
  if (stopped_.exchange(true)) return;
  stopping_.store(true);
  for (auto& e : edges_) e->close();
  if (engine_) engine_->graph->wait_for_all();  // every body has returned
  STOKER_TSAN_ACQUIRE(this);
  if (monitor_) monitor_->finish();
}

PipelineSummary PipelineCore::summary() const {
  PipelineSummary out;
  out.wall = started_ == Clock::time_point{} ? std::chrono::nanoseconds{0} : Clock::now() - started_;
  out.consumer_wait = consumer_wait_;
  out.consumed = consumed_;
  for (const auto& s : stages_) out.stages.push_back(s->stats());
  if (options_.counters) out.counters = options_.counters();
  for (const auto& e : edges_) {
    const auto st = e->meter().stats();
    out.queues.push_back({std::string(st.name), e->producer(), e->consumer(), st.capacity, st.size, st.time_empty,
                          st.time_full, st.lifetime});
  }
  return out;
}

}  // namespace stoker::detail
