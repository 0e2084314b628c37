// SPDX-License-Identifier: Apache-2.0
// The `resume` suite: resuming the reference job (Fashion-MNIST, 5 random 24x24 crops per image,
// a 10,000-crop shuffle buffer, batches of 255, collate), stopped halfway through an epoch.
// Deterministic, in the same run:
//   - the time from build() to the first batch: fresh (at an epoch's start), resumed from the
//     state (PipelineBuilder::resume_from), and fast-forwarded, the way to get there without a
//     state: a fresh pipeline whose first batches up to the stop are taken and thrown away;
//   - the items the resume read again, and the state's size;
//   - what state() costs: per call while the pipeline runs, and on an epoch's throughput when
//     called once per `--every` batches, against the same epoch without it.
// And in free order: the state's size, the time to the first batch resumed against fresh, and
// what state() costs (free_order_figures() below).
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_suite.h"
#include "stoker/core/pipeline.h"
#include "stoker/stages/batch.h"
#include "stoker/stages/idx.h"
#include "stoker/stages/transforms.h"

namespace stoker::bench {
namespace {

using Clock = std::chrono::steady_clock;


struct ResumeOptions {
  std::string data = kFashionMnistDir;
  std::uint64_t seed = 0;
  std::size_t every = 100;  // batches between state() calls
};

// The reader, counting the items it is asked to start at: a resume seeks once per item it
// makes again, and once to start.
struct CountingReader {
  IdxReader reader;
  std::shared_ptr<std::uint64_t> seeks = std::make_shared<std::uint64_t>(0);
  std::optional<Sample> operator()() { return reader(); }
  void seek(std::uint64_t k) {
    ++*seeks;
    reader.seek(k);
  }
  std::string fingerprint() const { return reader.fingerprint(); }
};

class ReferenceJob {
 public:
  explicit ReferenceJob(const ResumeOptions& o)
      : o_(o), data_(std::make_shared<const IdxDataset>(fashion_mnist(o.data, "train"))) {}

  std::uint64_t batches_per_epoch() const { return (data_->size() * 5 + 254) / 255; }

  /// `seeks`: where the reader counts its seeks.
  Pipeline<Batch> build(bool deterministic = true, const std::optional<PipelineState>& resume = std::nullopt,
                        std::shared_ptr<std::uint64_t> seeks = std::make_shared<std::uint64_t>(0)) {
    CountingReader source{IdxReader(data_, {.pool = image_pool_}), std::move(seeks)};
    auto builder =
        PipelineBuilder{}
            .seed(o_.seed)
            .deterministic(deterministic)
            .epochs(1)
            .source("read", std::move(source))
            .flat_map<DeferredCrop>(
                "crops",
                RandomCrops({.size = {24, 24}, .count = 5, .mirror = MirrorOptions{.axis = Axis::width, .p = 0.5}}),
                {.threads = 2, .fanout = 5})
            .shuffle("shuffle", {.capacity = 10'000, .min_after_dequeue = 2'000, .seed = o_.seed})
            .batch("batch", 255, {.queue = 8})
            .map("collate", Collate{.pool = batch_pool_, .normalize = Normalizer({255.0f, {0.2860f}, {0.3530f}})},
                 {.threads = 2});
    if (resume) builder.resume_from(*resume);
    return builder.build();
  }

 private:
  const ResumeOptions& o_;
  std::shared_ptr<const IdxDataset> data_;
  std::shared_ptr<BufferPool> image_pool_ = BufferPool::create(), batch_pool_ = BufferPool::create();
};

// Seconds from the start of `make` to the first batch of the pipeline it builds.
template <class Make>
double to_first_batch(Make&& make) {
  const auto t0 = Clock::now();
  auto pipe = make();
  if (!pipe.next()) throw std::runtime_error("resume: the pipeline yielded no batch");
  return seconds_since(t0);
}

// Seconds of an epoch with a call of state() every `every` batches, and without, pushed to
// `with` and `without`. Which goes first alternates with `repeat`: the second of two runs in a
// row is not slowed or sped up by its place.
void time_state_calls(ReferenceJob& job, bool deterministic, int repeat, std::size_t every, std::vector<double>& with,
                      std::vector<double>& without) {
  for (const bool call : {repeat % 2 == 1, repeat % 2 == 0}) {
    auto pipe = job.build(deterministic);
    std::uint64_t n = 0;
    PipelineState taken;
    const auto t0 = Clock::now();
    for (auto& b : pipe.epoch()) {
      (void)b;
      if (call && ++n % every == 0) taken = pipe.state();
    }
    (call ? with : without).push_back(seconds_since(t0));
  }
}

// Nanoseconds per state() call once `at` batches were taken, while the pipeline runs.
double state_call_ns(ReferenceJob& job, bool deterministic, std::uint64_t at, int calls) {
  auto pipe = job.build(deterministic);
  for (std::uint64_t i = 0; i < at; ++i) pipe.next();
  PipelineState taken;
  const auto t0 = Clock::now();
  for (int i = 0; i < calls; ++i) taken = pipe.state();
  return seconds_since(t0) * 1e9 / calls;
}

// A free-order state after `stop` batches, and what resuming from it costs: the state's size
// and the items in flight it lists, the time to the first batch against a fresh free-order
// start, the images read again, and what state() costs in free order (it lists what is in
// flight, so it costs more than in deterministic mode).
Json free_order_figures(ReferenceJob& job, std::uint64_t stop, const ResumeOptions& o, const CommonOptions& common) {
  PipelineState state;
  {
    auto pipe = job.build(false);
    for (std::uint64_t i = 0; i < stop; ++i) pipe.next();
    state = pipe.state();
  }
  const std::size_t bytes = state.to_json().size(), in_flight = state.taken->except.size();
  std::cout << "free order, stopped after batch " << stop << ": the state is " << bytes << " bytes of JSON, listing "
            << in_flight << " crops in flight\n";
  std::vector<double> fresh, resumed, per_call_ns, with_state, without_state;
  std::uint64_t remade = 0;
  for (int r = 0; r < common.repeats; ++r) {
    fresh.push_back(to_first_batch([&] { return job.build(false); }));
    const auto seeks = std::make_shared<std::uint64_t>(0);
    resumed.push_back(to_first_batch([&] { return job.build(false, state, seeks); }));
    remade = *seeks - 1;
    time_state_calls(job, false, r, o.every, with_state, without_state);
    per_call_ns.push_back(state_call_ns(job, false, stop, 200));
  }
  std::vector<double> cost;
  for (std::size_t i = 0; i < with_state.size(); ++i) cost.push_back(without_state[i] / with_state[i]);
  const Spread f = spread(fresh), re = spread(resumed), pc = spread(per_call_ns), c = spread(cost);
  std::cout << "  time to the first batch: fresh " << f.median * 1e3 << " ms, resumed " << re.median * 1e3
            << " ms (resumed / fresh " << re.median / f.median << "); the resume read " << remade << " images again\n"
            << "  state(): " << pc.median / 1e3 << " us per call mid-epoch; an epoch with a call every " << o.every
            << " batches runs at " << c.median << " of its speed without (min " << c.min << ", max " << c.max << ")\n";
  return {{"state_bytes", bytes},
          {"crops_in_flight", in_flight},
          {"images_read_again", remade},
          {"first_batch_fresh_ms", f.median * 1e3},
          {"first_batch_resumed_ms", re.median * 1e3},
          {"resumed_over_fresh", re.median / f.median},
          {"state_call_ns", pc.median},
          {"speed_with_state_calls", c.median},
          {"speed_with_state_calls_min", c.min},
          {"speed_with_state_calls_max", c.max}};
}

Json run(const ResumeOptions& o, const CommonOptions& common) {
  ReferenceJob job(o);
  const std::uint64_t stop = job.batches_per_epoch() / 2;

  PipelineState state;
  Batch first_after_stop;
  {
    auto pipe = job.build();
    for (std::uint64_t i = 0; i < stop; ++i) pipe.next();
    state = pipe.state();
    first_after_stop = *pipe.next();
  }
  const std::size_t state_bytes = state.to_json().size();
  std::cout << "reference job, deterministic, stopped after batch " << stop << " of " << job.batches_per_epoch()
            << "; the state is " << state_bytes << " bytes of JSON\n";

  std::vector<double> fresh, resumed, forwarded, per_call_ns, with_state, without_state, free_order;
  std::uint64_t remade = 0;
  for (int r = 0; r < common.repeats; ++r) {
    fresh.push_back(to_first_batch([&] { return job.build(); }));
    const auto seeks = std::make_shared<std::uint64_t>(0);
    resumed.push_back(to_first_batch([&] { return job.build(true, state, seeks); }));
    remade = *seeks - 1;
    forwarded.push_back(to_first_batch([&] {
      auto pipe = job.build();
      for (std::uint64_t i = 0; i < stop; ++i) pipe.next();
      return pipe;
    }));
    // The batch after the stop, resumed, is the one the uninterrupted run yielded.
    {
      auto pipe = job.build(true, state);
      const auto b = pipe.next();
      if (!b || b->payload_bytes() != first_after_stop.payload_bytes() ||
          std::memcmp(b->data(), first_after_stop.data(), b->payload_bytes()) != 0)
        throw std::runtime_error("resume: the first batch after the resume is not the uninterrupted run's");
    }
    // An epoch in free order, and deterministic with and without a call of state() per `every`
    // batches; and state() while the pipeline runs.
    {
      auto pipe = job.build(false);
      const auto t0 = Clock::now();
      for (auto& b : pipe.epoch()) (void)b;
      free_order.push_back(seconds_since(t0));
    }
    time_state_calls(job, true, r, o.every, with_state, without_state);
    per_call_ns.push_back(state_call_ns(job, true, 50, 10'000));
  }
  const Spread f = spread(fresh), re = spread(resumed), fw = spread(forwarded), pc = spread(per_call_ns);
  std::vector<double> cost, determinism;
  for (std::size_t i = 0; i < with_state.size(); ++i) {
    cost.push_back(without_state[i] / with_state[i]);
    determinism.push_back(free_order[i] / without_state[i]);
  }
  const Spread c = spread(cost), d = spread(determinism);
  std::cout << "time to the first batch (median of " << common.repeats << "): fresh " << f.median * 1e3
            << " ms, resumed " << re.median * 1e3 << " ms, fast-forwarded " << fw.median * 1e3 << " ms\n"
            << "  resumed / fresh " << re.median / f.median << ", fast-forwarded / resumed " << fw.median / re.median
            << "\n"
            << "the resume read " << remade << " images again (the shuffle held 2000 crops)\n"
            << "state(): " << pc.median << " ns per call while the pipeline runs; an epoch with a call every "
            << o.every << " batches runs at " << c.median << " of its speed without (min " << c.min << ", max " << c.max
            << ")\n"
            << "an epoch in deterministic mode runs at " << d.median << " of its speed in free order (min " << d.min
            << ", max " << d.max << ")\n";
  return {{"config",
           {{"job", "fashion-mnist train, 5 crops 24x24 per image, shuffle 10000/2000, batch 255, collate"},
            {"stop_after_batches", stop},
            {"batches_per_epoch", job.batches_per_epoch()},
            {"every", o.every},
            {"seed", o.seed},
            {"repeats", common.repeats}}},
          {"results",
           {{"state_bytes", state_bytes},
            {"images_read_again", remade},
            {"first_batch_fresh_ms", f.median * 1e3},
            {"first_batch_resumed_ms", re.median * 1e3},
            {"first_batch_fast_forwarded_ms", fw.median * 1e3},
            {"resumed_over_fresh", re.median / f.median},
            {"fast_forwarded_over_resumed", fw.median / re.median},
            {"state_call_ns", pc.median},
            {"speed_with_state_calls", c.median},
            {"speed_with_state_calls_min", c.min},
            {"speed_with_state_calls_max", c.max},
            {"deterministic_over_free_order", d.median},
            {"deterministic_over_free_order_min", d.min},
            {"deterministic_over_free_order_max", d.max},
            {"free_order", free_order_figures(job, stop, o, common)}}}};
}

}  // namespace

SuiteRun setup_resume(CLI::App& command) {
  auto o = std::make_shared<ResumeOptions>();
  command.add_option("--data", o->data, "Directory with Fashion-MNIST's IDX files")->capture_default_str();
  command.add_option("--seed", o->seed, "Seed of the crops and the shuffle")
      ->check(apps::at_least<std::uint64_t>(0))
      ->capture_default_str();
  command.add_option("--every", o->every, "Batches between state() calls in the cost figure")
      ->check(apps::in_range<std::size_t>(1, std::size_t{1} << 20))
      ->capture_default_str();
  return [o](const CommonOptions& common) { return run(*o, common); };
}

}  // namespace stoker::bench
