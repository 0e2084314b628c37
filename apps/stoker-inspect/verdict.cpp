// SPDX-License-Identifier: Apache-2.0
#include "verdict.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "text.h"
#include "vocabulary.h"

namespace stoker::inspect {

const char* name(Bottleneck kind) {
  switch (kind) {
    case Bottleneck::training:
      return "training";
    case Bottleneck::stage:
      return "stage";
    case Bottleneck::source:
      return "source";
    case Bottleneck::threads:
      return "threads";
    case Bottleneck::shuffle:
      return "shuffle";
    case Bottleneck::balanced:
      return "balanced";
  }
  return "balanced";
}

namespace {

// How long a shuffle had nothing to give after each epoch's start: the samples from the mark on
// that read empty, the refill taken to end halfway to the first that does not.
void refills(QueueSummary& s, const QueueSeries& q, const std::vector<EpochMark>& epochs) {
  if (q.floor == 0) return;
  for (const EpochMark& e : epochs) {
    auto it = std::lower_bound(q.samples.begin(), q.samples.end(), e.t,
                               [](const FillSample& x, double t) { return x.t < t; });
    std::optional<double> last_empty;
    for (; it != q.samples.end() && it->size == 0; ++it) last_empty = it->t;
    if (!last_empty) continue;  // it had items at the first sample after the mark
    const double end = it != q.samples.end() ? (*last_empty + it->t) / 2 : *last_empty;
    s.refill_s += std::max(0.0, end - e.t);
    ++s.refills;
  }
}

QueueSummary summarize(const QueueSeries& q, const std::vector<EpochMark>& epochs) {
  QueueSummary s{q.name, q.producer, q.consumer, q.capacity, q.floor, q.samples.size()};
  if (q.samples.empty()) return s;
  refills(s, q, epochs);
  std::vector<double> fills;
  double empty = 0, full = 0, waiting = 0;
  enum class Extreme { none, empty, full } last = Extreme::none;
  for (const FillSample& x : q.samples) {
    fills.push_back(x.fill);
    empty += x.size == 0;
    full += x.fill >= 1.0;
    waiting += x.waiting > 0;
    const Extreme now = x.size == 0 ? Extreme::empty : x.fill >= 1.0 ? Extreme::full : Extreme::none;
    if (now == Extreme::none) continue;
    if (last != Extreme::none && now != last) ++s.swings;
    last = now;
  }
  const double n = static_cast<double>(fills.size());
  std::sort(fills.begin(), fills.end());
  for (double f : fills) s.mean_fill += f / n;
  // Nearest rank: the smallest fill that at least 95% of the samples do not exceed.
  const auto rank = static_cast<std::size_t>(std::ceil(0.95 * n));
  s.p95_fill = fills[std::max<std::size_t>(rank, 1) - 1];
  s.empty_pct = 100.0 * empty / n;
  s.full_pct = 100.0 * full / n;
  s.waiting_pct = 100.0 * waiting / n;
  return s;
}

double pct_of(double part, double whole) { return whole > 0 ? std::clamp(100.0 * part / whole, 0.0, 100.0) : 0.0; }

StageSummary shares(const StageCounters& c, double fallback_run_s) {
  StageSummary s{c};
  const double run = c.t > 0 ? c.t : fallback_run_s;
  s.busy_pct = pct_of(c.busy_s, run * c.threads);
  s.starved_pct = pct_of(c.starved_s, run);
  s.blocked_pct = pct_of(c.blocked_s, run);
  s.pool_wait_pct = pct_of(c.pool_wait_s, run);
  return s;
}

// A stage held back by its pool rather than by its own work.
bool waits_for_pool(const StageSummary& s) { return s.pool_wait_pct > 0 && s.pool_wait_pct >= s.busy_pct; }

std::string threads_of(int n) { return std::to_string(n) + (n == 1 ? " thread" : " threads"); }

// A queue that is often empty and often full is in the way of a pipeline whose stages run
// in bursts: it cannot hold a burst's output, so the producer waits, and then it cannot
// cover the next lull, so the consumer waits. But every run fills its queues at the start
// and drains them after the last item, and in a short run the drain alone can be 10% of
// the samples; that is two swings, so a queue must swing more often than that as well.
constexpr double kSwingPct = 10.0;
constexpr std::size_t kSwings = 4;

// The pipeline's threads were runnable (on a core, or waiting for one) at least this share of the
// time they were busy: its stages compute. Below it they sleep in their functions (waiting for
// I/O, a device, a timer), which more threads than cores can overlap. Without the threads' states
// in the log, their CPU time stands in, unless the machine was kMachineBusyPct busy, when a
// thread that did not run may as well have been waiting for a core.
constexpr double kComputes = 0.5;
constexpr double kMachineBusyPct = 90;
// The share of their runnable time the pipeline's threads waited for a core, above which the
// machine's cores are short.
constexpr double kCoreWait = 0.3;
// Other processes used at least this share of the machine's CPU: worth saying.
constexpr double kOthersPct = 20;
// A stage busy (or waiting for its pool) less than this share of the run holds nothing back.
constexpr double kBusy = 0.5;

// THE VERDICT
//
// Every part of a run either works or waits for another: the training loop waits for its input;
// a stage waits for its input (starved), for room in its output (blocked), for a buffer a later
// part gives back (a pool wait), for one of the pipeline's threads, which all its stages share,
// or for a core. The bottleneck is the part that waits for nothing, and it shows in a picture:
//
// - the training loop: it rarely waits for input, the queue before it holds items, and the
//   input's stages have time to spare;
// - one stage (the source being a stage of its own kind, called by one thread at a time): the
//   training loop waits, the stage is busy (or waits for its pool) all the time, the stages
//   before it are blocked and their queues hold items, the stages after it are starved and their
//   queues run dry;
// - the pipeline's threads: the training loop waits, and the stages hold every one of the
//   pipeline's threads, no stage standing out;
// - the machine's cores: the training loop waits, and the stages' threads, runnable, wait for a
//   core on a busy machine, no stage standing out;
// - balanced: the training loop and the busiest part of the input are both nearly always at
//   work, so that neither holds the other back by much.
//
// Each picture is scored by how well the run fits it, from 0 to 1: the mean of its terms, each
// a share of the run or of the samples that the picture says should be 1. The best fit wins,
// but the run's own figures decide first which pictures may: a training loop that waited more
// than kTrainingMaxWait of the run is never the bottleneck, one that waited less than
// kInputMinWait is never held back by its input, a stage busy less than kBusy of the run holds
// nothing back, and the threads' picture needs them held kBusy of the run. Below kConfidentFit
// no picture is clear, and the verdict says so.
class Model {
 public:
  explicit Model(const Report& r) : r_(r) {
    for (const QueueSummary& q : r.queues) chain_.push_back(q.producer);
    for (const std::string& name : chain_) {
      const auto it = std::find_if(r.stages.begin(), r.stages.end(),
                                   [&](const StageSummary& s) { return s.counters.name == name; });
      stage_.push_back(it == r.stages.end() ? nullptr : &*it);
    }
    wait_ = r.consumer.waited_pct / 100;
    for (std::size_t k = 0; k < chain_.size(); ++k)
      if (stage_[k]) {
        counted_ = true;
        busiest_ = std::max(busiest_, stage_[k]->busy_pct / 100);
        held_s_ += held_s(*stage_[k]);
        busy_s_ += stage_[k]->counters.busy_s;
        top_held_s_ = std::max(top_held_s_, held_s(*stage_[k]));
        threads_given_ += stage_[k]->counters.threads;
        ++stages_counted_;
      }
  }

  std::size_t stages() const { return chain_.size(); }
  const std::string& stage_name(std::size_t k) const { return chain_[k]; }
  const StageSummary* counters(std::size_t k) const { return stage_[k]; }
  double wait() const { return wait_; }
  bool counted() const { return counted_; }
  int threads_given() const { return threads_given_; }

  // A stage's own share of the run: busy on its threads, or waiting for its pool. (Its pool's
  // buffers come back from later parts: the device's copies when the training loop waits for
  // input, the training loop's steps when it does not, which the pictures that use this rule out.)
  double saturation(std::size_t k) const {
    const StageSummary* s = stage_[k];
    return s ? std::min(1.0, (s->busy_pct + s->pool_wait_pct) / 100) : 0.0;
  }
  // The chain stage with the highest saturation (the first of equals).
  std::size_t busiest() const {
    std::size_t top = 0;
    for (std::size_t j = 1; j < chain_.size(); ++j)
      if (saturation(j) > saturation(top)) top = j;
    return top;
  }
  // The share of the pipeline's threads x run its stages worked (busy, not waiting for a pool).
  std::optional<double> threads_working() const { return of_threads(busy_s_); }
  // How much of its time the busiest part of the input worked: a stage, or the pipeline's
  // threads together; pool waits, which wait for the training loop as often as not, left out.
  double input_saturation() const { return std::max(busiest_, threads_working().value_or(0)); }

  // The seconds a stage held one of the pipeline's threads: busy, or waiting inside its function.
  static double held_s(const StageSummary& s) {
    return s.counters.busy_s + s.counters.pool_wait_s * s.counters.threads;
  }
  // The share of the pipeline's threads x run its stages held (busy, or waiting in a function).
  std::optional<double> threads_busy() const { return of_threads(held_s_); }
  // The share of the stages' thread time the busiest stage held: 1 when one stage holds it all.
  double top_share() const { return held_s_ > 0 ? top_held_s_ / held_s_ : 1.0; }
  // The busiest part of the input's work, its sleep inside stage functions left out when the
  // log shows the stages wait rather than compute: a stage asleep on a lock the training loop
  // holds is busy by its counters, and has time to spare.
  double input_working() const {
    const double s = input_saturation();
    return stages_wait() ? s * *computes() : s;
  }
  // The share of the pipeline's threads' busy time they were runnable (or, without their states
  // in the log, on a CPU): low when its stages wait.
  std::optional<double> computes() const {
    const auto& p = r_.pipeline;
    if (held_s_ <= 0) return std::nullopt;
    if (p.runnable_s) return std::min(1.0, *p.runnable_s / held_s_);
    if (p.cpu_s) return std::min(1.0, *p.cpu_s / held_s_);
    return std::nullopt;
  }
  // Whether its stages evidently wait rather than compute.
  bool stages_wait() const {
    const auto c = computes();
    if (!c || *c >= kComputes) return false;
    return r_.pipeline.runnable_s || (r_.pipeline.machine_busy_pct && *r_.pipeline.machine_busy_pct < kMachineBusyPct);
  }
  // The share of their runnable time the pipeline's threads waited for a core; none unknown.
  std::optional<double> core_wait() const {
    const auto& p = r_.pipeline;
    if (!p.runnable_s || !p.cpu_s || *p.runnable_s <= 0) return std::nullopt;
    return std::clamp(1 - *p.cpu_s / *p.runnable_s, 0.0, 1.0);
  }

  double fit_training() const {
    std::vector<double> terms{1 - wait_};
    // The loop always had input, and the input was held back by it: its last queue's producer
    // waited for room (which a pipeline only as fast as the loop never does).
    if (!r_.queues.empty()) {
      terms.push_back(1 - r_.queues.back().empty_pct / 100);
      terms.push_back(r_.queues.back().waiting_pct / 100);
    }
    if (counted_) terms.push_back(1 - input_working());
    return mean(terms);
  }

  // The training loop waits, and what it waits for is shuffle `i` refilling to its floor after
  // each epoch's start: the share of its wait those refills explain.
  std::optional<double> fit_shuffle(std::size_t i) const {
    const QueueSummary& q = r_.queues[i];
    if (q.floor == 0 || q.refills == 0 || wait_ <= 0 || r_.consumer.run_s <= 0) return std::nullopt;
    return std::min(1.0, q.refill_s / r_.consumer.run_s / wait_);
  }

  double fit_stage(std::size_t k) const {
    std::vector<double> terms{wait_};
    if (stage_[k]) terms.push_back(saturation(k));
    std::vector<double> others, queues;
    for (std::size_t j = 0; j < chain_.size(); ++j)
      if (j != k && stage_[j]) others.push_back((j < k ? stage_[j]->blocked_pct : stage_[j]->starved_pct) / 100);
    // Queue i feeds chain stage i + 1: before k it holds items for the stages up to k (or its
    // producer waits for room), after it it runs dry.
    for (std::size_t i = 0; i < r_.queues.size(); ++i) {
      const QueueSummary& q = r_.queues[i];
      queues.push_back(i < k ? std::max(q.mean_fill, q.waiting_pct / 100) : q.empty_pct / 100);
    }
    if (!others.empty()) terms.push_back(mean(others));
    if (!queues.empty()) terms.push_back(mean(queues));
    return mean(terms);
  }

  // 1 when the stages' thread time is spread evenly over them, 0 when one stage holds it all.
  double spread() const {
    const double even = 1.0 / stages_counted_;
    return std::clamp((1 - top_share()) / (1 - even), 0.0, 1.0);
  }

  // The pipeline's threads all held by its stages, none standing out. With one stage, or the
  // pipeline's threads unknown, there is no such picture.
  std::optional<double> fit_threads() const {
    const auto busy = threads_busy();
    if (!busy || *busy < kBusy || stages_counted_ < 2) return std::nullopt;
    return mean({wait_, *busy, spread()});
  }

  // The stages' threads, when they had work, mostly waited for a core on a busy machine, none
  // standing out. Only where the log has their states, and they were runnable (computing) at
  // least half the time they were busy.
  std::optional<double> fit_cores() const {
    const auto waited = core_wait();
    const auto c = computes();
    if (!waited || !c || *c < kComputes || stages_counted_ < 2) return std::nullopt;
    return mean({wait_, *waited, r_.pipeline.machine_busy_pct.value_or(0) / 100, spread()});
  }

  // Neither waits for the other much: the loop for its input, the input for room before the loop.
  std::optional<double> fit_balanced() const {
    if (!counted_) return std::nullopt;
    const double held_back = r_.queues.empty() ? 0 : r_.queues.back().waiting_pct / 100;
    return std::min({1 - wait_, input_saturation(), 1 - held_back});
  }

 private:
  // `thread_s` as a share of the pipeline's threads x run; none without its threads or stages.
  std::optional<double> of_threads(double thread_s) const {
    if (!counted_ || r_.pipeline.threads <= 0 || r_.consumer.run_s <= 0) return std::nullopt;
    return std::min(1.0, thread_s / (r_.pipeline.threads * r_.consumer.run_s));
  }
  static double mean(const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return v.empty() ? 0 : sum / static_cast<double>(v.size());
  }

  const Report& r_;
  std::vector<std::string> chain_;          // the stages in pipeline order, source first
  std::vector<const StageSummary*> stage_;  // per chain stage; null without a record
  double wait_ = 0;                         // the training loop's waited share
  bool counted_ = false;                    // any stage has counters
  int stages_counted_ = 0, threads_given_ = 0;
  double busiest_ = 0;                  // the highest busy share of a stage
  double held_s_ = 0, top_held_s_ = 0;  // thread time held by all stages, by the top one
  double busy_s_ = 0;                   // of it, busy
};

// ---------------------------------------------------------------------------------------
// Evidence: observations, each a sentence of figures.

std::string waited_line(const Report& r) {
  const ConsumerSummary& c = r.consumer;
  std::string line = "the training loop waited for its input " + percent(c.waited_pct) + " of the run";
  line += c.recorded
              ? " (" + fixed(c.waited_s, 2) + " of " + fixed(c.run_s, 2) + " s, " + std::to_string(c.items) +
                    " items taken)"
              : " (estimated: the log has no consumer record; the last queue was empty in that share of samples)";
  if (c.exchange_wait_pct)
    line += ", and for the other ranks in the gradient exchange " + percent(*c.exchange_wait_pct);
  return line;
}

std::string stage_line(const StageSummary& s) {
  std::string out = "'" + s.counters.name + "' was busy " + percent(s.busy_pct) + " of the time of its " +
                    threads_of(s.counters.threads) + ", starved " + percent(s.starved_pct) + ", blocked " +
                    percent(s.blocked_pct);
  if (s.pool_wait_pct >= 1) out += " (of which waiting for its pool's buffers " + percent(s.pool_wait_pct) + ")";
  return out;
}

std::string queue_full_line(const QueueSummary& q) {
  std::string out = q.name + ": mean fill " + fixed(q.mean_fill, 2);
  if (q.waiting_pct >= 1) out += ", its producer waiting for room in " + percent(q.waiting_pct) + " of samples";
  return out;
}
std::string queue_empty_line(const QueueSummary& q) {
  return q.name + ": mean fill " + fixed(q.mean_fill, 2) + ", empty in " + percent(q.empty_pct) + " of samples";
}

std::string cores_line(const Report& r, const Model& m) {
  const PipelineFigures& p = r.pipeline;
  std::string out = "the machine has " + std::to_string(p.cores) + (p.cores == 1 ? " core" : " cores");
  std::vector<std::string> cpu;
  if (const auto c = m.computes())
    cpu.push_back("the pipeline's threads were " + std::string(r.pipeline.runnable_s ? "runnable" : "on a CPU") + " " +
                  share(*c) + " of the time they were busy (the rest asleep in their functions)");
  if (const auto w = m.core_wait()) cpu.push_back("of that, waiting for a core " + share(*w));
  if (p.machine_busy_pct) {
    std::string busy = "the machine's CPU was busy " + percent(*p.machine_busy_pct) + " of the run";
    if (p.process_cpu_s && p.cores > 0 && r.consumer.run_s > 0)
      busy += ", this process's share " + percent(pct_of(*p.process_cpu_s, p.cores * r.consumer.run_s));
    cpu.push_back(busy);
  }
  return cpu.empty() ? out : out + "; " + join(cpu, "; ");
}

// The share of the machine's CPU other processes used, when the log says.
std::optional<double> others_pct(const Report& r) {
  const PipelineFigures& p = r.pipeline;
  if (!p.machine_busy_pct || !p.process_cpu_s || p.cores <= 0 || r.consumer.run_s <= 0) return std::nullopt;
  return std::max(0.0, *p.machine_busy_pct - pct_of(*p.process_cpu_s, p.cores * r.consumer.run_s));
}

// ---------------------------------------------------------------------------------------
// Suggestions, in the terms of the program that wrote the log.

// More threads for the pipeline, `want` in all: what to ask for, and why when it is more than
// the machine's cores; or, when the stages compute on all of them already, what to do instead.
std::string more_pipeline_threads(const Report& r, const Model& m, const Vocabulary& words, int want) {
  const int cores = r.pipeline.cores;
  const int have = r.pipeline.threads;
  if (cores <= 0 || want <= cores)
    return "give the pipeline " + std::to_string(want) + " threads (" + words.pipeline_threads(want) + ")";
  if (m.stages_wait())
    return "give the pipeline " + std::to_string(want) + " threads (" + words.pipeline_threads(want) +
           "): more than the machine's " + std::to_string(cores) +
           " cores, which helps here because its stages wait more than they compute (their threads were asleep " +
           share(1 - *m.computes()) + " of the time they were busy)";
  std::string out;
  if (have < cores)
    out = "give the pipeline " + std::to_string(cores) + " threads (" + words.pipeline_threads(cores) +
          "), as many as the machine's cores; the stages would use " + std::to_string(want) +
          ", but beyond the cores threads only help stages that wait, not stages that compute";
  else
    out = "the pipeline already has " + std::string(have > cores ? "more threads than" : "as many threads as") +
          " the machine has cores (" + std::to_string(cores) +
          "), and more help only stages that wait, not stages that compute";
  const std::string device = words.device_work();
  out += ": add cores, " + (device.empty() ? "" : "move work to the GPU (" + device + "), ") +
         "or make the stages cheaper";
  return out;
}

std::string suggest_training(const Report& r, const Model& m) {
  std::string out = "speed up the training step: the input pipeline keeps ahead of it";
  if (const auto work = m.threads_working())
    out += " (its stages worked " + share(*work) + " of the time of the pipeline's " + threads_of(r.pipeline.threads) +
           (*work < kBusy ? "; fewer would do)" : ")");
  if (r.consumer.exchange_wait_pct && *r.consumer.exchange_wait_pct >= 5)
    out += "; of the run, " + percent(*r.consumer.exchange_wait_pct) +
           " went waiting for the other ranks in the gradient exchange: read the job's verdict (stoker-inspect "
           "run.rank*.jsonl) for the rank they wait for";
  return out;
}

std::string suggest_stage(const Report& r, const Model& m, const Vocabulary& words, std::size_t k) {
  const std::string& name = m.stage_name(k);
  const StageSummary* s = m.counters(k);
  if (s && waits_for_pool(*s))
    return "'" + name + "' waits for its pool's buffers (" + percent(s->pool_wait_pct) +
           " of the run), which come back only as the parts after it, the device's copies and the training steps "
           "that use them, give them back: more threads would wait as well; move fewer bytes per batch" +
           (words.device_work().empty() ? "" : ", or do more of the work on the device (" + words.device_work() + ")");
  if (!s) return "give '" + name + "' more threads, or make its function cheaper";
  const int threads = s->counters.threads;
  const int cores = r.pipeline.cores;
  // Twice as many; more than the machine's cores only for a stage that waits rather than computes.
  const bool beyond = cores > 0 && threads * 2 > cores && !m.stages_wait();
  const int more = beyond ? cores : threads * 2;
  if (more <= threads)
    return "'" + name + "' has " + threads_of(threads) + ", at least as many as the machine's " +
           std::to_string(cores) +
           " cores, and computes: more threads would only share them; make its function cheaper" +
           (words.device_work().empty() ? std::string(", or add cores")
                                        : ", add cores, or move its work to the GPU (" + words.device_work() + ")");
  const std::string how = words.stage_threads(name, more);
  if (how.empty())
    return words.program() + " gives '" + name + "' " + threads_of(threads) +
           " and no option for more: make its work cheaper, or move it to a stage that has threads";
  std::string out = "give '" + name + "' more threads (it has " + std::to_string(threads) + "; try " + how +
                    (beyond ? ", as many as the machine's cores" : "") + "), or make its function cheaper";
  if (cores > 0 && more > cores)
    out += " (more threads than the machine's " + std::to_string(cores) +
           " cores help here because its stages wait more than they compute)";
  // The stages' bodies run on the pipeline's threads: more for one stage than the pipeline has
  // to spare would only queue its bodies behind the others'.
  const int given = m.threads_given();
  const int budget = r.pipeline.threads;
  if (budget > 0 && given + (more - threads) > budget)
    out += "; the pipeline's " + threads_of(budget) +
           (given >= budget ? (budget == 1 ? " is" : " are") + std::string(" all given to its stages (") +
                                  std::to_string(given) + " in all)"
                            : " have " + std::to_string(budget - given) + " to spare (" + std::to_string(given) +
                                  " given to its stages)") +
           ", so also " + more_pipeline_threads(r, m, words, given + (more - threads));
  return out;
}

// A stage busy by its counters but asleep in its function, while the training loop worked: it
// waits for something the loop holds (a lock, a device, a file) rather than for work of its own.
std::string asleep_while_training(const Report& r, const Model& m) {
  if (!m.stages_wait() || m.input_saturation() < kBusy) return {};
  const StageSummary* s = m.counters(m.busiest());
  if (!s || s->busy_pct < 100 * kBusy) return {};
  return "yet '" + s->counters.name + "' was busy " + percent(s->busy_pct) + " of the time of its " +
         threads_of(s->counters.threads) + " while the pipeline's threads were " +
         (r.pipeline.runnable_s ? "runnable " : "on a CPU ") + share(*m.computes()) +
         " of the time they were busy: it sleeps in its function, waiting for something while the training loop "
         "works (a lock or a resource they share, I/O), not for work of its own";
}

std::string suggest_source(const Model& m, std::size_t k) {
  std::string out =
      "the source '" + m.stage_name(k) + "' is called by one thread at a time, so more threads cannot help it: ";
  if (m.stages_wait())
    return out +
           "it waits more than it computes, so have more reads in flight at once (read ahead, or several "
           "files or shards at once inside the source)";
  return out +
         "make each call cheaper, for example by moving decoding or parsing into a map stage, which can have "
         "several threads, or read several shards in parallel";
}

std::string suggest_threads(const Report& r, const Model& m, const Vocabulary& words) {
  // To keep the training loop busy the input must go 1 / (1 - wait) times as fast: that many
  // times the threads, up to as many as the stages could ever run at once.
  const int have = r.pipeline.threads;
  const double scale = m.wait() < 0.99 ? 1 / (1 - m.wait()) : 100;
  const double held = m.threads_busy().value_or(1) * have;
  int want = static_cast<int>(std::ceil(held * scale - 1e-9));
  want = std::clamp(want, have + 1, std::max(have + 1, m.threads_given()));
  return "its stages would run on " + std::to_string(want) + " threads at once; " +
         more_pipeline_threads(r, m, words, want);
}

// Queues that swing; a shuffle the verdict names swings with its refills, which room would not change.
std::string suggest_swings(const Report& r, const Vocabulary& words) {
  std::string out;
  for (const QueueSummary& q : r.queues)
    if (q.empty_pct >= kSwingPct && q.full_pct >= kSwingPct && q.swings >= kSwings &&
        !(r.verdict.kind == Bottleneck::shuffle && r.verdict.part == q.name)) {
      const std::string how = words.queue_capacity(q.name, q.producer, q.floor > 0, q.capacity * 2);
      out += "; queue '" + q.name + "' swings between empty (" + percent(q.empty_pct) + " of samples) and full (" +
             percent(q.full_pct) + "): a larger capacity (" + std::to_string(q.capacity) + " now" +
             (how.empty() ? "" : "; try " + how) + ") would absorb the bursts";
    }
  return out;
}

// ---------------------------------------------------------------------------------------

void judge(Report& r) {
  const Model m(r);
  const Vocabulary words(r.program, r.data);
  Verdict& v = r.verdict;
  v.evidence.push_back(waited_line(r));
  // A loop that waits while its queue holds items waits to be run: for a core, on a machine
  // others keep busy.
  if (r.consumer.recorded && !r.queues.empty()) {
    const double held = 100 - r.queues.back().empty_pct;
    if (held >= 50 && r.consumer.waited_pct - r.queues.back().empty_pct >= 30)
      v.evidence.push_back("yet the queue before it held items in " + percent(held) +
                           " of samples: its thread often waited to be run, not for input");
  }

  // The pictures the training loop's wait allows, and their fits.
  const bool training_allowed = m.wait() <= kTrainingMaxWait;
  const bool input_allowed = m.wait() >= kInputMinWait;
  struct Candidate {
    Bottleneck kind;
    std::size_t stage = 0;
    double fit = 0;
  };
  std::vector<Candidate> tried;
  if (training_allowed) tried.push_back({Bottleneck::training, 0, m.fit_training()});
  if (input_allowed) {
    // A stage that was not busy holds nothing back, whatever waits around it.
    for (std::size_t k = 0; k < m.stages(); ++k)
      if (!m.counters(k) || m.saturation(k) >= kBusy)
        tried.push_back({k == 0 ? Bottleneck::source : Bottleneck::stage, k, m.fit_stage(k)});
    if (const auto f = m.fit_threads()) tried.push_back({Bottleneck::threads, 0, *f});
    if (const auto f = m.fit_cores()) tried.push_back({Bottleneck::threads, 1, *f});
    for (std::size_t i = 0; i < r.queues.size(); ++i)
      if (const auto f = m.fit_shuffle(i)) tried.push_back({Bottleneck::shuffle, i, *f});
  }
  if (const auto f = m.fit_balanced()) tried.push_back({Bottleneck::balanced, 0, *f});
  for (const Candidate& c : tried)
    v.fits.emplace_back(c.kind == Bottleneck::training   ? "consumer"
                        : c.kind == Bottleneck::threads  ? (c.stage == 0 ? "threads" : "cores")
                        : c.kind == Bottleneck::balanced ? "balanced"
                        : c.kind == Bottleneck::shuffle  ? r.queues[c.stage].name
                                                         : m.stage_name(c.stage),
                        c.fit);

  std::size_t top = 0;
  for (std::size_t i = 1; i < tried.size(); ++i)
    if (tried[i].fit > tried[top].fit) top = i;
  Candidate best = tried.empty() ? Candidate{Bottleneck::balanced, 0, 0} : tried[top];
  if (best.fit < kConfidentFit) {  // no picture fits: that fits as well as the best one does not
    if (!tried.empty())
      v.evidence.push_back("no picture fits well: the best, " + v.fits[top].first + ", fits " + fixed(best.fit, 2));
    best = {Bottleneck::balanced, 0, 1 - std::max(0.0, best.fit)};
  }
  v.kind = best.kind;
  v.fit = best.fit;
  const std::size_t k = best.stage;

  auto add_stages = [&](auto&& keep, const char* intro, double StageSummary::*field) {
    std::vector<std::string> parts;
    for (std::size_t j = 0; j < m.stages(); ++j)
      if (const StageSummary* s = m.counters(j); s && keep(j))
        parts.push_back(s->counters.name + " " + percent(s->*field));
    if (!parts.empty()) v.evidence.push_back(intro + join(parts, ", "));
  };
  auto add_queues = [&](auto&& keep, const char* intro, bool full) {
    std::vector<std::string> parts;
    for (std::size_t i = 0; i < r.queues.size(); ++i)
      if (keep(i)) parts.push_back(full ? queue_full_line(r.queues[i]) : queue_empty_line(r.queues[i]));
    if (!parts.empty()) v.evidence.push_back(intro + join(parts, "; "));
  };

  switch (v.kind) {
    case Bottleneck::training: {
      v.part = "consumer";
      v.headline = "the training loop";
      if (!r.queues.empty())
        v.evidence.push_back("the queue before it, " + r.queues.back().name + ", held items for it in " +
                             percent(100 - r.queues.back().empty_pct) + " of samples");
      add_stages([](std::size_t) { return true; },
                 "the stages were blocked on full outputs: ", &StageSummary::blocked_pct);
      v.suggestion = suggest_training(r, m);
      if (const std::string asleep = asleep_while_training(r, m); !asleep.empty()) {
        v.evidence.push_back(asleep);
        v.suggestion +=
            "; and the busy stage sleeps in its function while the training step runs: if they share a lock or "
            "another resource, the step holds it for the stage's every call, so hold it for less of the step, or give "
            "the stage its own";
      }
      break;
    }
    case Bottleneck::shuffle: {
      const QueueSummary& q = r.queues[k];
      v.part = q.name;
      v.headline = "the shuffle '" + q.name + "': the training loop waits at every epoch's start until it holds the " +
                   std::to_string(q.floor) + " items it keeps back";
      const double refill_pct = pct_of(q.refill_s, r.consumer.run_s);
      v.evidence.push_back(
          "after " + std::to_string(q.refills) + (q.refills == 1 ? " epoch start" : " epoch starts") + ", '" + q.name +
          "' had nothing to give for " + fixed(q.refill_s * 1e3 / static_cast<double>(q.refills), 1) +
          " ms each, refilling to its floor of " + std::to_string(q.floor) + " (min_after_dequeue, of a " +
          "capacity of " + std::to_string(q.capacity) + "): " + percent(refill_pct) + " of the run, " +
          share(std::min(1.0, refill_pct / r.consumer.waited_pct)) + " of the training loop's wait");
      const std::size_t fewer = std::max<std::size_t>(1, q.floor / 10);
      const std::string how = words.min_after_dequeue(q.name, q.capacity, fewer);
      v.suggestion = "keep fewer items back in '" + q.name + "' (" + std::to_string(q.floor) + " now" +
                     (how.empty() ? "" : "; try " + how) +
                     "): each epoch's start waits for them to be made, and a tenth of them takes about a tenth of "
                     "the wait; a larger capacity would not help, as the wait is for the floor, not for room";
      break;
    }
    case Bottleneck::stage:
    case Bottleneck::source: {
      const std::string& name = m.stage_name(k);
      v.part = name;
      v.headline = (v.kind == Bottleneck::source ? "the source '" : "stage '") + name + "'";
      if (const StageSummary* s = m.counters(k)) {
        // The pools that make a stage wait are a device's: pinned buffers come back as its copies
        // finish, device buffers as the work on them does.
        if (waits_for_pool(*s)) v.headline += ", waiting for buffers the device gives back";
        v.evidence.push_back(stage_line(*s));
      }
      add_stages([&](std::size_t j) { return j < k; },
                 "the stages before it were blocked: ", &StageSummary::blocked_pct);
      add_stages([&](std::size_t j) { return j > k; },
                 "the stages after it were starved: ", &StageSummary::starved_pct);
      add_queues([&](std::size_t i) { return i < k; }, "the queues before it held items: ", true);
      add_queues([&](std::size_t i) { return i >= k; }, "the queues after it ran dry: ", false);
      if (m.stages_wait() || (m.computes() && r.pipeline.cores > 0)) v.evidence.push_back(cores_line(r, m));
      v.suggestion = v.kind == Bottleneck::source ? suggest_source(m, k) : suggest_stage(r, m, words, k);
      break;
    }
    case Bottleneck::threads: {
      v.part = "pipeline";
      // The cores' picture, or the threads' on a machine whose cores they all have.
      const bool cores_bound =
          k == 1 || (!m.stages_wait() && ((r.pipeline.cores > 0 && r.pipeline.threads >= r.pipeline.cores) ||
                                          m.core_wait().value_or(0) >= kCoreWait));
      v.headline = cores_bound ? "the machine's cores: the pipeline's stages keep every one busy"
                               : "the pipeline's threads: its stages share too few";
      std::vector<std::string> parts;
      for (std::size_t j = 0; j < m.stages(); ++j)
        if (const StageSummary* s = m.counters(j)) parts.push_back(s->counters.name + " " + percent(s->busy_pct));
      v.evidence.push_back("its stages held the pipeline's " + threads_of(r.pipeline.threads) + " " +
                           share(m.threads_busy().value_or(0)) +
                           " of the run, none standing out (busy, of their own threads: " + join(parts, ", ") + ")");
      if (r.pipeline.cores > 0) v.evidence.push_back(cores_line(r, m));
      v.suggestion = suggest_threads(r, m, words);
      break;
    }
    case Bottleneck::balanced: {
      v.part = "none";
      if (const StageSummary* s = m.counters(m.busiest())) v.evidence.push_back("the busiest stage: " + stage_line(*s));
      if (m.wait() > kTrainingMaxWait && m.counted() && m.input_saturation() < kBusy) {
        v.headline = "none clear: the training loop waits, but no part of the input is busy";
        v.suggestion =
            "every part waited most of the run for another: the hand-offs between the pipeline's threads and the "
            "training loop, not any part's work, set the pace; fewer stages, more work per item (larger batches), or "
            "larger queues make fewer hand-offs";
      } else {
        v.headline = "none clear: the training loop and the input are about as fast";
        v.suggestion =
            "no single part holds the run back: a faster training step would soon wait for the input, and a faster "
            "input for the training step; speed both up, or look at the plot for where the run changes";
      }
      break;
    }
  }
  v.suggestion += suggest_swings(r, words);
  if (const auto others = others_pct(r); others && *others >= kOthersPct)
    v.suggestion += "; other processes used " + percent(*others) +
                    " of the machine's CPU during the run: give it cores of its own, and measure again";
}

}  // namespace

Report analyze(const OccupancyLog& log) {
  if (log.queues.empty()) throw LogError(log.source + ": no queues to analyze");
  Report r;
  r.source = log.source;
  r.program = log.program;
  r.job = log.job;
  r.rank = log.rank;
  r.role = log.role;
  r.data = log.data;
  double first = INFINITY, last = -INFINITY;
  for (const QueueSeries& q : log.queues) {
    r.queues.push_back(summarize(q, log.epochs));
    for (const FillSample& x : q.samples) {
      first = std::min(first, x.t);
      last = std::max(last, x.t);
    }
  }
  r.duration_s = last >= first ? last - first : 0;
  for (const StageCounters& c : log.stages) r.stages.push_back(shares(c, last > 0 ? last : 0));
  r.counters = log.counters;
  r.pipeline = log.pipeline;
  r.moves = log.moves;

  ConsumerSummary& c = r.consumer;
  if (log.consumer && log.consumer->t > 0) {
    c.recorded = true;
    c.items = log.consumer->items;
    c.run_s = log.consumer->t;
    c.waited_s = std::min(log.consumer->waited_s, c.run_s);
  } else {  // a log without the record: its last queue's empty share stands for the wait
    c.run_s = !log.stages.empty() && log.stages.front().t > 0 ? log.stages.front().t : std::max(last, 0.0);
    c.waited_s = c.run_s * r.queues.back().empty_pct / 100;
  }
  c.waited_pct = pct_of(c.waited_s, c.run_s);
  if (const auto exchange = log.counter("exchange_wait_ns"); exchange && c.run_s > 0)
    c.exchange_wait_pct = pct_of(static_cast<double>(*exchange) * 1e-9, c.run_s);
  if (c.run_s <= 0) c.waited_pct = r.queues.back().empty_pct;

  judge(r);
  return r;
}

}  // namespace stoker::inspect
