// SPDX-License-Identifier: Apache-2.0
#include "stoker/core/detail/runtime.h"

#include <spdlog/async.h>
#include <spdlog/async_logger.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>

#include <pthread.h>
#include <unistd.h>  // gettid

#include <algorithm>
#include <atomic>
#include <bit>
#include <condition_variable>
#include <nlohmann/json.hpp>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/task.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_group.h>
#include <oneapi/tbb/task_scheduler_observer.h>
#include <stdexcept>
#include <thread>
#include <utility>

#include "run_context.h"
#include "stoker/core/body_tracer.h"
#include "stoker/core/detail/edges.h"
#include "stoker/core/detail/tsan.h"  // a task runs after the enqueue that made it
#include "stoker/core/stage_error.h"
#include "stoker_log.h"
#include "taken.h"
#include "trace.h"
#include "turns.h"

namespace stoker {

namespace {
std::atomic<void (*)(const char*)> trace_begin{nullptr};
std::atomic<void (*)()> trace_end{nullptr};
}  // namespace

void set_body_tracer(BodyTracer tracer) noexcept {
  trace_end.store(tracer.end);
  trace_begin.store(tracer.begin);
}

namespace {
// The call a body is making on this thread, which StageContext's ties to the pipeline read. Set
// for the length of a body's run and restored after it: a body may run inside another's call
// (help_downstream()).
struct RunningCall {
  const detail::StageBase* stage = nullptr;
  const detail::PipelineCore* core = nullptr;  // the stage's
  const StageContext* ctx = nullptr;
  std::chrono::nanoseconds* blocked = nullptr;
};
thread_local RunningCall running_call;
}  // namespace

bool StageContext::in_pipeline() const noexcept { return running_call.ctx == this; }
bool StageContext::help_downstream() const { return in_pipeline() && running_call.stage->help_downstream(); }

namespace detail {
std::chrono::nanoseconds* blocked_time_of(const StageContext& ctx) noexcept {
  return ctx.in_pipeline() ? running_call.blocked : nullptr;
}
bool give_turn() noexcept { return running_call.core != nullptr && running_call.core->give_turn(); }
void take_turn() noexcept {
  if (running_call.core != nullptr) running_call.core->take_turn();
}
}  // namespace detail

}  // namespace stoker

namespace stoker::detail {

using Clock = std::chrono::steady_clock;

namespace {
// stop() on a thread that a body may wait for cannot wait for every body to return. Those are
// the threads in the pipeline's arena, where its bodies and the oneTBB work they wait for (a
// stage function's parallel_for, whose iterations any of them may steal) run: an observer of
// the arena marks them as they enter and leave it. The thread of a running body, also while it
// works in another arena: its task marks it. And any thread running a oneTBB task, in any arena:
// a worker of an arena a stage function runs its own work in is one its body waits for, and
// nothing tells it from a worker of unrelated work (which oneTBB forbids to block anyway).
thread_local const PipelineCore* in_arena_of = nullptr;
thread_local const PipelineCore* task_of = nullptr;
}  // namespace

// Whether this thread holds a turn of its pipeline's ThreadBudget. A thread runs the bodies of
// one pipeline (its own), so one flag serves.
thread_local bool holds_turn = false;

bool PipelineCore::take_turn(std::chrono::nanoseconds* waited) const noexcept {
  if (!options_.budget || holds_turn) return true;
  const auto begin = waited ? Clock::now() : Clock::time_point{};
  holds_turn = options_.budget->turns_->take(this, stopping_);
  if (waited) *waited += Clock::now() - begin;
  return holds_turn;
}

bool PipelineCore::pass_turn(std::chrono::nanoseconds* waited) const noexcept {
  if (!holds_turn || !options_.budget || !options_.budget->turns_->wanted()) return true;
  give_turn();
  return take_turn(waited);
}

bool PipelineCore::give_turn() const noexcept {
  if (!holds_turn || !options_.budget) return false;
  options_.budget->turns_->give();
  holds_turn = false;
  return true;
}

bool PipelineCore::may_be_waited_for() const noexcept {
  return in_arena_of == this || task_of == this || tbb::task::current_context() != nullptr;
}

// ---------------------------------------------------------------------------------------
// Engine: the pipeline's threads and the arena they run the stage bodies in.

struct PipelineCore::Engine {
  // Every slot of the arena is reserved for the pipeline's own threads: no oneTBB worker joins,
  // so the pipeline has its threads whatever the process allows oneTBB (tbb::global_control)
  // and whatever else keeps oneTBB's workers busy. An arena of one reserved slot would get a
  // worker all the same (oneTBB lends one to such an arena when a task is enqueued there), and
  // a pipeline of one thread would run two bodies at once: it gets two slots, one left empty.
  // (The observer marks every thread that joins the arena as the pipeline's own.)
  Engine(int threads, const PipelineCore& core)
      : arena(std::max(threads, 2), /*reserved_for_masters=*/static_cast<unsigned>(std::max(threads, 2))),
        own(arena, core),
        tids(static_cast<std::size_t>(threads)),
        bodies(static_cast<std::size_t>(threads)) {
    arena.initialize();
    own.observe(true);
    arena.execute([&] { gate.emplace(group.defer([] {})); });  // keeps group.wait() from returning
    try {
      // A thread that waits in the arena runs its tasks, and sleeps when there are none.
      for (std::size_t i = 0; i < tids.size(); ++i)
        pool.emplace_back([this, i] {
          tids[i].store(static_cast<int>(::gettid()), std::memory_order_relaxed);
          slot_of_this_thread = {this, i};
          arena.execute([this] { group.wait(); });
        });
    } catch (...) {
      release();
      throw;
    }
  }
  ~Engine() { release(); }

  // Marks the threads in the arena (in_arena_of) while they are in it.
  class Own final : public tbb::task_scheduler_observer {
   public:
    Own(tbb::task_arena& arena, const PipelineCore& core) : task_scheduler_observer(arena), core_(core) {}
    ~Own() override { observe(false); }
    void on_scheduler_entry(bool) override { in_arena_of = &core_; }
    void on_scheduler_exit(bool) override {
      if (in_arena_of == &core_) in_arena_of = nullptr;
    }

   private:
    const PipelineCore& core_;
  };

  /// The CPU time the pipeline's threads have spent, all of them together; empty where the
  /// system does not say.
  std::optional<double> cpu_seconds() const noexcept {
    double sum = 0;
    for (auto& t : pool) {
      clockid_t clock{};
      timespec ts{};
      if (pthread_getcpuclockid(const_cast<std::thread&>(t).native_handle(), &clock) != 0 ||
          clock_gettime(clock, &ts) != 0)
        return std::nullopt;
      sum += static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
    }
    return sum;
  }

  /// A stage body starts (+1) or ends (-1) on the calling thread, if it is one of the pool's.
  void body_on_this_thread(int delta) noexcept {
    if (slot_of_this_thread.engine == this)
      bodies[slot_of_this_thread.index].fetch_add(delta, std::memory_order_relaxed);
  }

  /// How many of the pipeline's threads run a stage body and are runnable now (on a core, or
  /// waiting for one) rather than asleep in it (a function that sleeps, or waits for I/O or a
  /// device); empty where the system does not say. Any thread.
  std::optional<int> runnable() const noexcept {
    int n = 0;
    for (std::size_t i = 0; i < tids.size(); ++i) {
      const int id = tids[i].load(std::memory_order_relaxed);
      if (id == 0 || bodies[i].load(std::memory_order_relaxed) <= 0) continue;  // idle: its state says nothing
      const auto r = thread_runnable(id);
      if (!r) return std::nullopt;
      n += *r;
    }
    return n;
  }

  // Bodies are enqueued rather than spawned: an enqueued task belongs to no isolated region, so
  // a stage function waiting for oneTBB work of its own (isolated, run_body) never runs a body
  // that some body asked for, nested on its stack. A spawned task would inherit the isolation
  // of the body that spawned it.
  void enqueue(StageBase& stage) {
    STOKER_TSAN_RELEASE(&stage);
    arena.enqueue([&stage] {
      STOKER_TSAN_ACQUIRE(&stage);
      stage.run_task();
    });
  }

 private:
  void release() noexcept {
    // All slots are the pool's: libtbb may hand this closure to a pool thread (annotated).
    STOKER_TSAN_RELEASE(this);
    arena.execute([&] {
      STOKER_TSAN_ACQUIRE(this);
      group.run(std::move(*gate));
      STOKER_TSAN_RELEASE(this);
    });
    STOKER_TSAN_ACQUIRE(this);
    for (auto& t : pool) t.join();
  }

  tbb::task_arena arena;
  Own own;
  tbb::task_group group;
  std::optional<tbb::task_handle> gate;
  std::vector<std::atomic<int>> tids;    // of the pool's threads, once each has started
  std::vector<std::atomic<int>> bodies;  // per pool thread: stage bodies running on it (nested ones too)
  struct Slot {
    const Engine* engine = nullptr;
    std::size_t index = 0;
  };
  static thread_local Slot slot_of_this_thread;
  std::vector<std::thread> pool;
};

void throw_fanout(std::uint64_t index, std::size_t made, std::size_t fanout) {
  throw std::logic_error("input " + std::to_string(index) + " gave " + std::to_string(made) +
                         " outputs, but the stage's fanout is " + std::to_string(fanout));
}

thread_local PipelineCore::Engine::Slot PipelineCore::Engine::slot_of_this_thread;

// ---------------------------------------------------------------------------------------
// StageBase

StageBase::StageBase(std::string name, int threads, OnError on_error)
    : name_(std::move(name)), threads_(threads), limit_(threads), on_error_(on_error) {
  if (threads < 1 || threads > kMaxThreads)
    throw std::invalid_argument("stage '" + name_ + "': threads must be between 1 and " + std::to_string(kMaxThreads) +
                                ", not " + std::to_string(threads));
}

StageBase::~StageBase() = default;

void StageBase::start(PipelineCore& core, std::size_t position) {
  core_ = &core;
  position_ = position;
  // Under autotune a tunable stage gets a slot for every thread of the budget.
  const auto& tune = core.options().autotune;
  const int slots = tune && tunable() ? std::max(threads_, tune->threads) : threads_;
  if (slots > kMaxThreads)
    throw std::invalid_argument("autotune: a budget of " + std::to_string(slots) + " threads is more than a stage's " +
                                std::to_string(kMaxThreads));
  bodies_ = std::vector<Body>(static_cast<std::size_t>(slots));  // never resized: ctx.blocked points in
  for (std::size_t i = 0; i < bodies_.size(); ++i) {
    auto& ctx = bodies_[i].ctx;
    ctx.seed = core.options().seed;
    ctx.body = static_cast<int>(i);
    ctx.stop = core.stop_token();
    if (core.trace_)
      bodies_[i].track = &core.trace_->add_track(slots > 1 ? name_ + " #" + std::to_string(i) : name_, name_);
  }
}

void StageBase::begin_epoch(std::uint32_t epoch) {
  for (auto& b : bodies_) b.ctx.epoch = epoch;
  skipped_before_epoch_ = skipped_.load();
}

int StageBase::claim() noexcept {
  auto s = slots_.load();
  for (;;) {
    if (std::popcount(s) >= threads()) return -1;
    const int i = std::countr_one(s);  // the lowest free slot: below threads() <= slots()
    if (slots_.compare_exchange_weak(s, s | (std::uint64_t{1} << i))) return i;
  }
}

void StageBase::wake() noexcept {
  std::atomic_thread_fence(std::memory_order_seq_cst);  // see the class comment
  int queued = queued_.load(std::memory_order_relaxed);
  do {
    if (std::popcount(slots_.load(std::memory_order_relaxed)) + queued >= threads()) return;
    if (core_->stopping() || !has_work()) return;
  } while (!queued_.compare_exchange_weak(queued, queued + 1));
  if (!core_->enqueue(*this)) queued_.fetch_sub(1);
}

void StageBase::run_task() noexcept {
  queued_.fetch_sub(1);
  PipelineCore& core = *core_;
  const PipelineCore* outer = std::exchange(task_of, &core);
  run();
  task_of = outer;
  // The task's last use of the stage: see PipelineCore::enqueue(). The wake-up after it touches
  // only the core, which outlives the pipeline's threads.
  if (core.tasks_.fetch_sub(1) == 1) core.tasks_.notify_all();
}

bool StageBase::help_downstream() const noexcept { return core_->help_after(*this); }

bool StageBase::run() noexcept {
  int slot = claim();
  if (slot < 0) return false;
  for (;;) {
    run_body(slot);
    slots_.fetch_and(~(std::uint64_t{1} << slot));
    std::atomic_thread_fence(std::memory_order_seq_cst);  // see the class comment
    if (core_->stopping() || !has_work() || (slot = claim()) < 0) return true;
  }
}

void StageBase::run_body(int slot) noexcept {
  Body& body = bodies_[static_cast<std::size_t>(slot)];
  body.blocked = {};
  // Busy time is counted after every chunk, not when the body leaves (which may be seconds
  // later): the autotuner reads it as the stage runs.
  auto mark = Clock::now();
  std::chrono::nanoseconds turn_wait{0};  // waits for a turn of the ThreadBudget, outside BlockedTime
  std::chrono::nanoseconds waited_mark{0};
  auto count_busy = [&] {
    const auto now = Clock::now();
    const auto waited = body.blocked + turn_wait;
    const auto busy = std::chrono::duration_cast<std::chrono::nanoseconds>(now - mark) - (waited - waited_mark);
    busy_ns_.fetch_add(busy.count(), std::memory_order_relaxed);
    mark = now;
    waited_mark = waited;
  };
  Step last = Step::done;
  const RunningCall outer = std::exchange(running_call, RunningCall{this, core_, &body.ctx, &body.blocked});
  core_->engine_->body_on_this_thread(+1);
  // Under a ThreadBudget: a turn for the body (unless the body it runs inside holds one), passed
  // on after a chunk while others wait, and given back at the end. The waits count as blocked.
  const bool own_turn = !holds_turn;
  try {
    body_started();
    struct Trace {
      void (*end)() = nullptr;
      explicit Trace(const char* stage) {
        if (auto* begin = trace_begin.load(std::memory_order_relaxed)) {
          end = trace_end.load(std::memory_order_relaxed);
          begin(stage);
        }
      }
      ~Trace() {
        if (end) end();
      }
    } trace(name_.c_str());
    // Isolated: a stage function that waits for oneTBB work of its own (parallel_for, a
    // task_group) runs only that work meanwhile, never another body on the same thread.
    if (core_->take_turn(&turn_wait))
      tbb::this_task_arena::isolate([&] {
        do {
          const auto begin = mark;
          last = step(body);
          count_busy();
          if (body.track != nullptr && last == Step::progressed) body.track->span(begin, mark);  // a span per chunk
        } while (last == Step::progressed && core_->pass_turn(&turn_wait) && !core_->stopping());
      });
  } catch (const RuntimeFailure& f) {
    last = Step::done;
    core_->fail(name_, f.cause);
  } catch (...) {
    last = Step::done;
    core_->fail(name_, std::current_exception());
  }
  count_busy();  // what a step that threw had done
  if (own_turn) core_->give_turn();
  core_->engine_->body_on_this_thread(-1);
  body_left(last, body.blocked, turn_wait);
  running_call = outer;
}

void StageBase::skipped(std::uint64_t index, const char* what) {
  constexpr std::uint64_t kLogged = 5;
  const auto n = skipped_.fetch_add(1) + 1;
  if (n <= kLogged)
    log::warn("stage '{}': skipped item {} of epoch {}: {}{}", name_, index, bodies_.front().ctx.epoch + 1, what,
              n == kLogged ? " (further skips are only counted)" : "");
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

void StageBase::body_left(Step why, std::chrono::nanoseconds blocked_inside, std::chrono::nanoseconds turn_wait) {
  std::lock_guard lock(idle_mutex_);
  blocked_ += (blocked_inside + turn_wait) / threads();  // thread-averaged, as busy % is
  pool_wait_ += blocked_inside / threads();
  if (--running_ == 0) {
    idle_since_ = Clock::now();
    idle_reason_ = why;
  }
}

StageStats StageBase::stats() const {
  StageStats s;
  s.name = name_;
  s.threads = threads();
  s.items_in = items_in_.load();
  s.items_out = items_out_.load();
  s.skipped = skipped_.load();
  s.busy = std::chrono::nanoseconds(busy_ns_.load());
  std::lock_guard lock(idle_mutex_);
  s.starved = starved_;
  s.blocked = blocked_;
  s.pool_wait = pool_wait_;
  if (running_ == 0 && idle_reason_) {  // still idle: count up to now
    const auto idle = Clock::now() - idle_since_;
    if (*idle_reason_ == Step::starved) s.starved += idle;
    if (*idle_reason_ == Step::blocked) s.blocked += idle;
  }
  return s;
}

// ---------------------------------------------------------------------------------------
// Ticker: the monitor's and the tuner's thread.

// A thread that calls `tick` every `interval` (the first time at once when `at_start`) until
// stop(); what a tick throws is logged under `what`, and the ticks go on.
class Ticker {
 public:
  Ticker(std::chrono::milliseconds interval, bool at_start, const char* what, std::function<void()> tick)
      : interval_(interval), what_(what), tick_(std::move(tick)), thread_([this, at_start] { loop(at_start); }) {}
  ~Ticker() { stop(); }
  Ticker(const Ticker&) = delete;
  Ticker& operator=(const Ticker&) = delete;

  /// Returns once the thread has ended, after the tick in progress. False if it had already.
  bool stop() noexcept {
    {
      std::lock_guard lock(mutex_);
      if (done_) return false;
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
    return true;
  }

 private:
  void loop(bool at_start) {
    std::unique_lock lock(mutex_);
    auto next = Clock::now() + (at_start ? Clock::duration::zero() : Clock::duration(interval_));
    while (!wake_.wait_until(lock, next, [&] { return done_; })) {
      lock.unlock();
      try {
        tick_();
      } catch (const std::exception& e) {
        log::error("{}: {}", what_, e.what());
      } catch (...) {
        log::error("{}: an unknown error", what_);
      }
      lock.lock();
      next += interval_;
    }
  }

  const std::chrono::milliseconds interval_;
  const char* const what_;
  const std::function<void()> tick_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;  // last: starts once the rest is made
};

// ---------------------------------------------------------------------------------------
// Monitor: samples every queue at a fixed interval into the occupancy log, a JSON Lines file
// written through an spdlog asynchronous logger so that the sampling thread never waits on the
// disk, and into the trace, whose tracks it also writes out.

class PipelineCore::Monitor {
 public:
  /// Writes the occupancy log to `path` (none if empty) and the trace to `trace` (none if null).
  Monitor(const PipelineCore& core, const std::string& path, TraceFile* trace, std::chrono::milliseconds interval)
      : core_(core), trace_(trace) {
    if (!path.empty()) {
      open_log(path);
      // First, whose log it is: the program, the job and rank, the pipeline's threads and the
      // machine's cores; the labels (PipelineOptions::log_labels) go here, not in every record.
      nlohmann::json run = run_identity(core.options().log_labels);
      run["type"] = "run";
      run["t"] = 0.0;
      run["threads"] = core.threads_;
      run["cores"] = std::thread::hardware_concurrency();
      write(std::move(run));
    }
    if (trace_) start_timelines();
    try {
      ticker_.emplace(interval, /*at_start=*/true, "occupancy log or trace: a sample could not be written",
                      [this] { sample(); });
    } catch (...) {
      stop_timelines();
      throw;
    }
  }
  ~Monitor() { finish(); }

  /// Writes `record` to the occupancy log, with the time ("t") added. Any thread.
  void note(nlohmann::json record) {
    std::lock_guard lock(closing_);
    if (!logger_) return;
    record["t"] = seconds();
    write(std::move(record));
  }

  // The run is over: takes a last sample and writes the records of the run (its stages and its
  // consumer). The counters record waits for finish(): the consumer may still move them after
  // the last batch (a final evaluation's read-back), and the log counts that too. Idempotent.
  void end_run() noexcept {
    if (!ticker_->stop()) return;
    try {
      sample();
      if (logger_) write_run_totals();
    } catch (const std::exception& e) {
      log::error("occupancy log or trace: the final records could not be written: {}", e.what());
    } catch (...) {
      log::error("occupancy log or trace: the final records could not be written");
    }
  }

  // Ends the run if it is not over yet, writes the counters as they stand and the device work
  // the timelines recorded since, and closes the files. Called from stop() and the destructor:
  // what fails is logged, not thrown. Idempotent.
  void finish() noexcept {
    end_run();
    if (finished_.exchange(true)) return;
    try {
      if (trace_) write_trace(Clock::now());
      if (logger_) write_counters();
    } catch (const std::exception& e) {
      log::error("occupancy log or trace: the final records could not be written: {}", e.what());
    } catch (...) {
      log::error("occupancy log or trace: the final records could not be written");
    }
    stop_timelines();
    try {
      if (trace_) trace_->close();
    } catch (const std::exception& e) {
      log::error("{}", e.what());
    }
    {
      std::lock_guard lock(closing_);
      logger_.reset();
    }
    pool_.reset();  // joins the logging thread after it has written everything
  }

 private:
  static double to_s(std::chrono::nanoseconds d) { return std::chrono::duration<double>(d).count(); }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - born_).count(); }

  void open_log(const std::string& path) {
    try {
      pool_ = std::make_shared<spdlog::details::thread_pool>(8192, 1);
      auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/true);
      logger_ = std::make_shared<spdlog::async_logger>("stoker-occupancy", std::move(sink), pool_,
                                                       spdlog::async_overflow_policy::block);
      logger_->set_pattern("%v");
    } catch (const std::exception& e) {
      throw std::runtime_error("occupancy log '" + path + "': cannot open for writing: " + e.what());
    }
  }

  // Every timeline source starts, or none stays started.
  void start_timelines() {
    try {
      for (const auto& t : core_.options().timelines) {
        if (!t) throw std::invalid_argument("timeline: a null TimelineSource");
        t->start();
        timelines_.push_back(t.get());
      }
    } catch (...) {
      stop_timelines();
      throw;
    }
  }
  void stop_timelines() noexcept {
    for (auto* t : timelines_) t->stop();
    timelines_.clear();
  }

  void sample() {
    const auto now = Clock::now();
    const double t = std::chrono::duration<double>(now - born_).count();
    if (logger_ && now >= next_state_read_) {  // a file read per thread: at most every kStateInterval
      next_state_read_ = now + kStateInterval;
      if (const auto n = core_.engine_->runnable()) {
        runnable_sum_ += *n;
        ++state_reads_;
      } else {
        state_reads_ = -1;  // not told: none written
      }
    }
    fills_.clear();
    for (const auto& e : core_.edges_) {
      // What the consumer could take now; what the producer holds waiting for room beside it.
      const std::size_t size = e->takeable();
      fills_.emplace_back(e->name(), size);
      if (logger_) {
        nlohmann::json record{{"type", "sample"},          {"t", t},
                              {"queue", e->name()},        {"size", size},
                              {"capacity", e->capacity()}, {"waiting", e->waiting()},
                              {"producer", e->producer()}, {"consumer", e->consumer()}};
        if (e->floor() != 0) record["floor"] = e->floor();
        write(std::move(record));
      }
    }
    if (trace_) write_trace(now);
  }

  // The queues' fills as last sampled, and what the timelines recorded since the last call.
  void write_trace(Clock::time_point now) {
    timed_.clear();
    for (auto* t : timelines_) t->take(timed_);
    trace_->write(now, fills_, timed_);
  }

  void write_run_totals() {
    const auto summary = core_.summary(/*counters=*/false);
    // What the stages' threads share: the pipeline's threads, and the machine's cores; the CPU
    // time its threads, the process and the machine spent, which tells stages that compute
    // from stages that wait, and a machine other processes kept busy.
    nlohmann::json pipeline{{"type", "pipeline"},
                            {"t", seconds()},
                            {"threads", summary.threads},
                            {"cores", std::thread::hardware_concurrency()}};
    if (const auto cpu = core_.engine_->cpu_seconds()) pipeline["cpu_s"] = *cpu;
    // Thread-seconds its threads were runnable (on a core or waiting for one): against busy_s,
    // whether the stages compute or wait; against cpu_s, how long they waited for a core.
    if (state_reads_ > 0) pipeline["runnable_s"] = runnable_sum_ / state_reads_ * seconds();
    add_cpu_fields(pipeline, cpu_at_start_, CpuTimes::now());
    write(std::move(pipeline));
    for (const auto& s : summary.stages) {
      write({{"type", "stage"},
             {"t", seconds()},
             {"stage", s.name},
             {"threads", s.threads},
             {"items_in", s.items_in},
             {"items_out", s.items_out},
             {"skipped", s.skipped},
             {"busy_s", to_s(s.busy)},
             {"starved_s", to_s(s.starved)},
             {"blocked_s", to_s(s.blocked)},
             {"pool_wait_s", to_s(s.pool_wait)}});
    }
    // The training loop: how long it waited for its input.
    write({{"type", "consumer"},
           {"t", seconds()},
           {"items", summary.consumed},
           {"waited_s", to_s(summary.consumer_wait)}});
    logger_->flush();
  }

  void write_counters() {
    if (!core_.options().counters) return;
    const auto counters = core_.options().counters();
    if (counters.empty()) return;
    nlohmann::json j{{"type", "counters"}, {"t", seconds()}};
    for (const auto& c : counters) j["counters"][c.name] = c.value;
    write(std::move(j));
    logger_->flush();
  }

  void write(const nlohmann::json& record) { logger_->info(record.dump()); }

  const PipelineCore& core_;
  TraceFile* const trace_;
  const Clock::time_point born_ = Clock::now();
  const CpuTimes cpu_at_start_ = CpuTimes::now();
  static constexpr auto kStateInterval = std::chrono::milliseconds(20);
  Clock::time_point next_state_read_{};                     // the sampling thread's, as the two below
  double runnable_sum_ = 0;                                 // runnable threads, summed over the reads
  int state_reads_ = 0;                                     // -1 once a read failed
  std::vector<std::pair<std::string, std::size_t>> fills_;  // the sampling thread's
  std::vector<TimelineSource*> timelines_;                  // started; owned by the options
  std::vector<TimedSpan> timed_;                            // the sampling thread's
  std::shared_ptr<spdlog::details::thread_pool> pool_;
  std::shared_ptr<spdlog::async_logger> logger_;
  std::atomic<bool> finished_{false};
  std::mutex closing_;            // note(), from the consumer's thread, against finish() on a stopping one
  std::optional<Ticker> ticker_;  // started once the log is open
};

// ---------------------------------------------------------------------------------------
// Tuner: moves threads between the tunable stages (AutotuneOptions has the rule).

class PipelineCore::Tuner {
 public:
  Tuner(PipelineCore& core, AutotuneOptions options) : core_(core), options_(options) {
    for (auto& s : core.stages_)
      if (s->tunable()) stages_.push_back({s.get(), s->busy()});
    last_ = Clock::now();
    ticker_.emplace(options_.interval, /*at_start=*/false, "autotune", [this] { decide(); });
  }

  void finish() noexcept { ticker_->stop(); }

 private:
  static constexpr double kBusy = 0.85;   // a stage this busy gets a thread...
  static constexpr double kSpare = 0.70;  // ...from one that stays at most this busy without it

  struct Watched {
    StageBase* stage;
    std::chrono::nanoseconds ran{0};  // busy() at the last decision
    double busy = 0;                  // its threads' busy share since then
  };

  void decide() {
    const auto now = Clock::now();
    const double dt = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    int used = 0;
    for (Watched& w : stages_) {
      const auto ran = w.stage->busy();
      w.busy = std::chrono::duration<double>(ran - w.ran).count() / (dt * w.stage->threads());
      w.ran = ran;
      used += w.stage->threads();
    }
    if (rest_) {  // the first measurement after a move straddles it
      rest_ = false;
      return;
    }
    Watched* need = nullptr;
    for (Watched& w : stages_)
      if (w.stage->threads() < w.stage->slots() && (need == nullptr || w.busy > need->busy)) need = &w;
    Watched* spare = nullptr;  // none: a thread of the budget not in use
    if (need != nullptr && used >= options_.threads) {
      double least = kSpare;
      for (Watched& w : stages_) {
        const int t = w.stage->threads();
        if (&w == need || t < 2) continue;
        const double without_one = w.busy * t / (t - 1);
        if (without_one <= least) least = without_one, spare = &w;
      }
    }
    if (need == nullptr || need->busy < kBusy || (spare == nullptr && used >= options_.threads)) {
      pending_ = {};
      return;
    }
    const std::pair<StageBase*, StageBase*> move{need->stage, spare != nullptr ? spare->stage : nullptr};
    if (pending_ != move) {  // the same move at two decisions in a row, or none
      pending_ = move;
      return;
    }
    pending_ = {};
    rest_ = true;
    apply(*need, spare, used);
  }

  void apply(Watched& need, Watched* spare, int used) {
    auto busy = [](const Watched& w) {
      return w.stage->name() + " " + std::to_string(static_cast<int>(100 * w.busy + 0.5)) + "% busy on " +
             std::to_string(w.stage->threads()) + (w.stage->threads() == 1 ? " thread" : " threads");
    };
    std::string evidence = busy(need);
    nlohmann::json changes = nlohmann::json::array();
    changes.push_back(
        {{"stage", need.stage->name()}, {"from", need.stage->threads()}, {"to", need.stage->threads() + 1}});
    if (spare != nullptr) {
      evidence += "; " + busy(*spare);
      changes.push_back(
          {{"stage", spare->stage->name()}, {"from", spare->stage->threads()}, {"to", spare->stage->threads() - 1}});
      spare->stage->set_threads(spare->stage->threads() - 1);
    } else {
      evidence += "; " + std::to_string(options_.threads - used) + " of the budget's " +
                  std::to_string(options_.threads) + " threads unused";
    }
    need.stage->set_threads(need.stage->threads() + 1);
    std::string what = need.stage->name() + " " + std::to_string(need.stage->threads() - 1) + " -> " +
                       std::to_string(need.stage->threads()) + " threads";
    if (spare != nullptr)
      what += ", " + spare->stage->name() + " " + std::to_string(spare->stage->threads() + 1) + " -> " +
              std::to_string(spare->stage->threads());
    log::info("autotune: {} ({})", what, evidence);
    if (core_.monitor_) core_.monitor_->note({{"type", "autotune"}, {"changes", changes}, {"evidence", evidence}});
  }

  PipelineCore& core_;
  const AutotuneOptions options_;
  std::vector<Watched> stages_;
  Clock::time_point last_;
  std::pair<StageBase*, StageBase*> pending_{};  // the move the last decision called for
  bool rest_ = false;
  std::optional<Ticker> ticker_;  // last: started once the rest is made
};

// ---------------------------------------------------------------------------------------
// PipelineCore

PipelineCore::PipelineCore() = default;

PipelineCore::~PipelineCore() {
  // Whatever thread it is on (a destructor must wait): as the stop() of a thread that waits.
  request_stop();
  finish_stop();
  wait_idle();  // a wake-up from another thread may have raced a stop() made there
  engine_.reset();
}

EdgeBase& PipelineCore::add_edge(std::unique_ptr<EdgeBase> edge) {
  edges_.push_back(std::move(edge));
  return *edges_.back();
}

void PipelineCore::consumer_waited(Clock::time_point begin, Clock::time_point end) {
  add(consumer_wait_ns_,
      static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(end - begin).count()));
  if (consumer_track_) consumer_track_->span(begin, end);
}

StageBase& PipelineCore::add_stage(std::unique_ptr<StageBase> stage) {
  for (const auto& s : stages_)
    if (s->name() == stage->name())
      throw std::invalid_argument("stage name '" + stage->name() + "' is used twice; names must be unique");
  stages_.push_back(std::move(stage));
  return *stages_.back();
}

void PipelineCore::start(CoreOptions options) {
  options_ = std::move(options);
  if (options_.threads < 0) throw std::invalid_argument("pipeline threads must be at least 1 (or 0 for one per core)");
  if (options_.sample_interval.count() <= 0) throw std::invalid_argument("occupancy sample interval must be positive");
  // Threads of its own: one per turn of a shared budget, or one per core.
  const int by_default = options_.budget ? options_.budget->threads() : tbb::info::default_concurrency();
  if (options_.autotune) {
    AutotuneOptions& tune = *options_.autotune;
    if (tune.threads < 0) throw std::invalid_argument("autotune: threads must be at least 1 (or 0 for the pipeline's)");
    if (tune.threads > 0 && options_.threads > 0 && options_.threads != tune.threads)
      throw std::invalid_argument("autotune: its budget of " + std::to_string(tune.threads) +
                                  " threads is the pipeline's threads, which are set to " +
                                  std::to_string(options_.threads) + "; set one of them");
    if (tune.interval.count() <= 0) throw std::invalid_argument("autotune: the interval must be positive");
    if (tune.threads == 0) tune.threads = options_.threads > 0 ? options_.threads : by_default;
    fit_to_budget(tune.threads);
    options_.threads = tune.threads;
  }
  if (!options_.trace.empty()) trace_ = std::make_unique<TraceFile>(options_.trace, Clock::now());
  for (std::size_t i = 0; i < stages_.size(); ++i) stages_[i]->start(*this, i);  // their tracks, in order
  if (trace_) consumer_track_ = &trace_->add_track("consumer (waiting)", "wait");
  for (auto& e : edges_) e->start(options_.deterministic, options_.seed);
  describe_for_resume();
  threads_ = options_.threads != 0 ? options_.threads : by_default;
  engine_ = std::make_unique<Engine>(threads_, *this);  // before the monitor, which reads its threads' states
  if (!options_.occupancy_log.empty() || trace_)
    monitor_ = std::make_unique<Monitor>(*this, options_.occupancy_log, trace_.get(), options_.sample_interval);
  started_ = Clock::now();
  if (options_.autotune) tuner_ = std::make_unique<Tuner>(*this, *options_.autotune);
}

// A budget that depends on the machine (one thread per core by default) must not make a
// pipeline that runs without the autotuner fail with it: the tuned stages start with their
// threads scaled down to the budget, each keeping at least one, and the log says so.
void PipelineCore::fit_to_budget(int budget) {
  std::vector<StageBase*> tuned;
  int asked = 0;
  for (const auto& s : stages_)
    if (s->tunable()) tuned.push_back(s.get()), asked += s->threads();
  if (asked <= budget) return;
  const int n = static_cast<int>(tuned.size());
  const int total = std::max(budget, n);  // one each at least, even past the budget
  std::vector<int> share(tuned.size());
  int given = 0;
  for (std::size_t i = 0; i < tuned.size(); ++i) given += share[i] = std::max(1, tuned[i]->threads() * total / asked);
  // What rounding left over or took, to and from the stages it moved furthest from their part.
  auto off = [&](std::size_t i) { return tuned[i]->threads() * total - share[i] * asked; };  // > 0: short
  while (given != total) {
    std::size_t pick = tuned.size();
    for (std::size_t i = 0; i < tuned.size(); ++i) {
      if (given > total && share[i] == 1) continue;
      if (pick == tuned.size() || (given < total ? off(i) > off(pick) : off(i) < off(pick))) pick = i;
    }
    const int step = given < total ? 1 : -1;
    share[pick] += step;
    given += step;
  }
  std::string split;
  for (std::size_t i = 0; i < tuned.size(); ++i) {
    split += (i == 0 ? "" : ", ") + tuned[i]->name() + " " + std::to_string(share[i]);
    tuned[i]->set_threads(share[i]);
  }
  log::info(
      "autotune: the stages it tunes ask for {} threads in all, more than its budget of {}; they start with "
      "{}{}",
      asked, budget, split, total > budget ? " (one each, which is over the budget)" : "");
}

bool PipelineCore::enqueue(StageBase& stage) noexcept {
  // Counted until the task's very last use of the stage (run_task()): wait_idle() means every
  // body has returned. Counted before the stop is checked, and both sequentially consistent, as
  // stop() sets stopping_ before it reads the count: either it sees this task and waits for it,
  // or this sees the stop and enqueues nothing. (A wake-up that saw no stop a moment ago would
  // otherwise start a body after a stop() that had found none running returned.)
  tasks_.fetch_add(1);
  if (stopping_.load()) {
    if (tasks_.fetch_sub(1) == 1) tasks_.notify_all();
    return false;
  }
  try {
    engine_->enqueue(stage);
    return true;
  } catch (...) {  // no memory for a task: the pipeline cannot go on
    if (tasks_.fetch_sub(1) == 1) tasks_.notify_all();
    fail(stage.name(), std::current_exception());
    return false;
  }
}

// Asleep, not spinning: tasks_ is only ever decremented by a task as it ends, and the task that
// takes it to 0 notifies after its decrement. atomic::wait(n) sleeps only while the count still
// reads n, checked against the futex in the kernel, so a decrement between the load and the
// sleep makes the wait return at once: no wake-up is lost.
void PipelineCore::wait_idle() const {
  for (int n = tasks_.load(); n != 0; n = tasks_.load()) tasks_.wait(n);
}

bool PipelineCore::help_after(const StageBase& from) const noexcept {
  for (std::size_t i = stages_.size(); i-- > from.position() + 1;)
    if (stages_[i]->has_work() && stages_[i]->run()) return true;
  return false;
}

void PipelineCore::wait_for(const StageBase& from, const std::function<bool()>& done) const {
  for (int idle = 0; !done();) {
    if (stopping()) throw PipelineStopped();
    if (help_after(from)) {
      idle = 0;
    } else if (idle < 64) {
      ++idle;
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

void PipelineCore::begin_epoch(std::uint32_t epoch, const PipelineState* resume) {
  // First: what it changes holds for every item of the epoch, those a resume makes again too.
  if (options_.on_epoch_start) options_.on_epoch_start(epoch);
  for (auto& e : edges_) e->begin_epoch(epoch);
  for (auto& s : stages_) s->begin_epoch(epoch);
  // From the consumer up: each stage learns how far its output had been taken, and tells how
  // far its input had (Producer::resume); never past what its input queue got in the epoch,
  // where the state knows it (a short last batch took less than a full one).
  if (resume) {
    std::uint64_t taken = resume->consumed;
    for (std::size_t i = stages_.size(); i-- > 0;) {
      taken = stages_[i]->resume(taken, *resume);
      if (i == 0) break;
      if (const auto got = resume->inputs.find(edges_[i - 1]->name()); got != resume->inputs.end())
        taken = std::min(taken, got->second);
    }
    if (taken_) taken_->restore(resume->taken->below, resume->taken->except);
  }
  if (consumer_track_) consumer_track_->epoch(Clock::now(), epoch);
  if (monitor_) monitor_->note({{"type", "epoch"}, {"epoch", epoch}});
}

// What a state records of the pipeline's shape, and whether it can be resumed at all: what does
// not change as it runs.
void PipelineCore::describe_for_resume() {
  resume_shape_.seed = options_.seed;
  // Bad data is the pipeline's to report, as a StageError when it is read; here it only rules
  // out a state.
  std::string unknown_data;
  try {
    resume_shape_.data = stages_.front()->fingerprint();
  } catch (const std::exception& e) {
    unknown_data = "source '" + stages_.front()->name() + "': its fingerprint() failed: " + e.what();
  }
  for (std::size_t i = 0; i < stages_.size(); ++i) {  // edges_[i] is stages_[i]'s output
    resume_shape_.stages.emplace_back(stages_[i]->name(), stages_[i]->describe());
    if (auto what = edges_[i]->describe(); !what.empty())
      resume_shape_.stages.emplace_back(edges_[i]->name(), std::move(what));
  }
  auto& why = cannot_resume_;
  why = unknown_data;
  for (std::size_t i = 0; i < stages_.size() && why.empty(); ++i) why = stages_[i]->resume_problem();
  if (!options_.deterministic) {
    // Free order: the consumer's items are traced, by their origins, to the items of the queue
    // the batch stage takes from (or of the last queue), which the stages before it can make
    // again. So one batch stage at most, and after it only maps, which keep a batch's number.
    std::size_t batch = stages_.size();
    for (std::size_t i = 0; i < stages_.size() && why.empty(); ++i) {
      if (stages_[i]->batches() && batch != stages_.size())
        why =
            "in free order a resume traces the consumer's items through one batch stage, and this pipeline has "
            "two: '" +
            stages_[batch]->name() + "' and '" + stages_[i]->name() + "'";
      else if (stages_[i]->batches())
        batch = i;
      else if (batch != stages_.size() && stages_[i]->describe() != "map")
        why = "in free order a resume traces the consumer's items through batch '" + stages_[batch]->name() +
              "', which only maps may follow, not '" + stages_[i]->name() + "' (" + stages_[i]->describe() + ")";
    }
    const std::size_t traced = batch == stages_.size() ? stages_.size() - 1 : batch - 1;  // the queue's producer
    for (std::size_t j = 0; j <= traced && why.empty(); ++j)
      if (!stages_[j]->remakes())
        why = "stage '" + stages_[j]->name() + "' (" + stages_[j]->describe() + ") cannot make its items again";
    if (!why.empty()) return;
    taken_ = std::make_unique<TakenItems>(edges_[traced]->name(), batch != stages_.size());
    for (std::size_t j = 0; j < traced; ++j)
      if (!edges_[j]->describe().empty() && edges_[traced]->describe().empty()) edges_[traced]->put_back_shuffled();
    return;
  }
  // A shuffle is rebuilt by the stages before it making its items again: each must be able to,
  // with no other shuffle between.
  for (std::size_t i = 0; i < edges_.size() && why.empty(); ++i) {
    if (edges_[i]->describe().empty()) continue;
    for (std::size_t j = 0; j <= i && why.empty(); ++j) {
      if (j < i && !edges_[j]->describe().empty())
        why = "shuffle '" + edges_[i]->name() + "' cannot be rebuilt: it follows shuffle '" + edges_[j]->name() +
              "', and a resume rebuilds one shuffle only";
      else if (!stages_[j]->remakes())
        why = "shuffle '" + edges_[i]->name() + "' cannot be rebuilt: stage '" + stages_[j]->name() + "' (" +
              stages_[j]->describe() + ") before it cannot make its items again";
    }
  }
}

void PipelineCore::end_epoch() {
  if (taken_) taken_->reset();  // the consumer has taken nothing of the next epoch, or of none
}

PipelineState PipelineCore::state(std::uint32_t epoch, std::uint64_t consumed) const {
  if (!cannot_resume_.empty()) throw StateError("no pipeline state: " + cannot_resume_);
  for (const auto& s : stages_)
    if (const auto skipped = s->skipped_this_epoch())
      throw StateError("no pipeline state: stage '" + s->name() + "' skipped " + std::to_string(skipped) +
                       " items of this epoch (on_error = skip), which moves every item after them: a resume cannot "
                       "know where");
  PipelineState st = resume_shape_;
  st.epoch = epoch;
  st.consumed = consumed;
  st.deterministic = options_.deterministic;
  if (taken_)
    st.taken = PipelineState::Taken{taken_->queue(), taken_->below(), taken_->except()};
  else
    for (auto& e : edges_)
      if (const auto total = e->input_total()) st.inputs[e->name()] = *total;
  return st;
}

void PipelineCore::check_state(const PipelineState& state) const {
  const auto mine = this->state(state.epoch, state.consumed);  // throws when it cannot resume
  const std::string refused = "cannot resume from a state of another pipeline: ";
  const auto mode = [](bool deterministic) { return deterministic ? "deterministic" : "free order"; };
  if (mine.deterministic != state.deterministic)
    throw StateError(refused + "it was taken in " + mode(state.deterministic) + ", and this pipeline runs in " +
                     mode(mine.deterministic));
  if (state.taken.has_value() == state.deterministic)
    throw StateError(std::string("cannot resume from this state: it is in ") + mode(state.deterministic) + " and " +
                     (state.taken ? "lists" : "does not list") +
                     " the items the consumer took (PipelineState::taken), " +
                     "which a state lists in free order only");
  if (state.taken && state.taken->queue != mine.taken->queue)
    throw StateError(refused + "its consumer's items are traced to queue '" + state.taken->queue +
                     "', this pipeline's to '" + mine.taken->queue + "'");
  if (mine.seed != state.seed)
    throw StateError(refused + "its seed is " + std::to_string(state.seed) + ", this pipeline's " +
                     std::to_string(mine.seed));
  if (mine.data != state.data)
    throw StateError(refused + "its data set is '" + state.data + "', this pipeline's '" + mine.data + "'");
  const auto show = [](const auto& stage) { return "'" + stage.first + "' (" + stage.second + ")"; };
  for (std::size_t i = 0; i < std::max(mine.stages.size(), state.stages.size()); ++i) {
    if (i < mine.stages.size() && i < state.stages.size() && mine.stages[i] == state.stages[i]) continue;
    throw StateError(refused + "its stage " + std::to_string(i + 1) + " is " +
                     (i < state.stages.size() ? show(state.stages[i]) : "missing") + ", this pipeline's " +
                     (i < mine.stages.size() ? show(mine.stages[i]) : "missing"));
  }
  for (const auto& [name, total] : state.inputs)
    if (std::none_of(edges_.begin(), edges_.end(), [&](const auto& e) { return e->name() == name; }))
      throw StateError(refused + "it has a queue '" + name + "', which this pipeline has not");
}

void PipelineCore::fail(const std::string& stage, std::exception_ptr error) noexcept {
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
      try {
        error_stage_ = stage;
      } catch (...) {  // no memory for the name: the error itself is kept
      }
    }
  }
  request_stop();
}

void PipelineCore::request_stop() noexcept {
  stopping_.store(true);
  if (options_.budget) options_.budget->turns_->wake(this);  // its bodies waiting for a turn
  stop_.request_stop();
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

// One caller does the stopping and every other waits for it to be done, so that every stop()
// that returns, from any thread, returns after the bodies and the monitor, whose last records
// call the counters() callback. A thread a body may wait for (may_be_waited_for(): the
// pipeline's own, or one running oneTBB work) only asks: the waiting would wait for it. The end of the run
// (end_run(), on the consumer's thread) is a phase of the same machine (StopPhase).
void PipelineCore::stop() noexcept {
  request_stop();
  if (!may_be_waited_for()) finish_stop();
}

void PipelineCore::finish_stop() noexcept {
  for (auto phase = stop_phase_.load();;) {
    if (phase == StopPhase::stopped) return;
    if (phase == StopPhase::ending || phase == StopPhase::stopping) {  // another's: wait for its end
      stop_phase_.wait(phase);
      phase = stop_phase_.load();
      continue;
    }
    if (stop_phase_.compare_exchange_strong(phase, StopPhase::stopping)) {  // running or ended: ours
      if (tuner_) tuner_->finish();
      wait_idle();
      if (monitor_) monitor_->finish();
      stop_phase_.store(StopPhase::stopped);
      stop_phase_.notify_all();
      return;
    }
  }
}

void PipelineCore::end_run() noexcept {
  auto phase = StopPhase::running;
  if (!stop_phase_.compare_exchange_strong(phase, StopPhase::ending)) return;  // a stop does the rest
  if (tuner_) tuner_->finish();
  request_stop();
  wait_idle();
  if (monitor_) monitor_->end_run();
  stop_phase_.store(StopPhase::ended);
  stop_phase_.notify_all();
}

PipelineSummary PipelineCore::summary(bool counters) const {
  PipelineSummary out;
  out.wall = started_ == Clock::time_point{} ? std::chrono::nanoseconds{0} : Clock::now() - started_;
  out.consumer_wait = std::chrono::nanoseconds(consumer_wait_ns_.load(std::memory_order_relaxed));
  out.consumed = consumed_.load(std::memory_order_relaxed);
  out.threads = threads_;
  for (const auto& s : stages_) out.stages.push_back(s->stats());
  if (counters && options_.counters) out.counters = options_.counters();
  for (const auto& e : edges_) {
    const auto st = e->stats();
    out.queues.push_back({std::string(st.name), e->producer(), e->consumer(), st.capacity, st.size, st.waiting,
                          st.time_empty, st.time_full, st.lifetime});
  }
  return out;
}

}  // namespace stoker::detail
