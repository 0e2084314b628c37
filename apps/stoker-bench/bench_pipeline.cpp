// SPDX-License-Identifier: Apache-2.0
// The `pipeline` suite: how close a stoker pipeline comes to its slowest stage, and what the
// framework costs per item against tbb::parallel_pipeline, both measured in the same run.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/parallel_pipeline.h>
#include <oneapi/tbb/task_arena.h>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench_suite.h"
#include "stoker/core/pipeline.h"

namespace stoker::bench {
namespace {

using Clock = std::chrono::steady_clock;


struct StageSpec {
  double us;
  int threads;
};

std::vector<StageSpec> parse_stages(const std::string& text) {
  std::vector<StageSpec> out;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    StageSpec s{};
    char colon = 0;
    std::stringstream p(part);
    if (!(p >> s.us >> colon >> s.threads) || colon != ':' || s.us < 0 || s.threads < 1)
      throw std::invalid_argument("'" + part + "' is not US:THREADS (e.g. 20:1)");
    out.push_back(s);
  }
  if (out.empty()) throw std::invalid_argument("no stage given");
  return out;
}

// A chain: a source of `items` items, then one map stage per spec doing that much work.
double run_stoker(const std::vector<StageSpec>& specs, const Work& work, std::uint64_t items, int threads,
                  std::size_t queue) {
  std::vector<std::uint64_t> iters;
  for (const auto& s : specs) iters.push_back(work.iterations(s.us));
  auto b = PipelineBuilder{}.threads(threads).epochs(1).source(
      "source",
      [n = std::uint64_t{0}, items]() mutable { return n < items ? std::optional<std::uint64_t>(n++) : std::nullopt; },
      {.queue = queue});
  // Stages are added at run time here, so build the chain as map stages of one type.
  auto add = [&](auto builder, std::size_t k) {
    const auto n = iters[k];
    return std::move(builder).map("stage" + std::to_string(k), [n](std::uint64_t x) { return x + (Work::spin(n) & 1); },
                                  {.threads = specs[k].threads, .queue = queue});
  };
  auto chain = add(std::move(b), 0);
  for (std::size_t k = 1; k < specs.size(); ++k) chain = add(std::move(chain), k);
  const auto t0 = Clock::now();
  auto pipe = std::move(chain).build();
  std::uint64_t received = 0;
  while (pipe.next()) ++received;
  const double s = seconds_since(t0);
  if (received != items) throw std::runtime_error("pipeline lost items: " + std::to_string(received));
  return static_cast<double>(items) / s;
}

// The same chain with tbb::parallel_pipeline: serial_in_order for 1-thread stages,
// parallel otherwise, with as many tokens as the stoker chain has queue slots.
double run_tbb(const std::vector<StageSpec>& specs, const Work& work, std::uint64_t items, int threads,
               std::size_t tokens) {
  tbb::global_control control(tbb::global_control::max_allowed_parallelism,
                              static_cast<std::size_t>(std::max(threads + 1, tbb::info::default_concurrency())));
  tbb::task_arena arena(threads, 0);
  std::atomic<std::uint64_t> received{0};
  const auto t0 = Clock::now();
  arena.execute([&] {
    std::uint64_t n = 0;
    auto chain = tbb::make_filter<void, std::uint64_t>(tbb::filter_mode::serial_in_order, [&](tbb::flow_control& fc) {
      if (n == items) {
        fc.stop();
        return std::uint64_t{0};
      }
      return n++;
    });
    for (const auto& s : specs) {
      const auto iters = work.iterations(s.us);
      chain = chain & tbb::make_filter<std::uint64_t, std::uint64_t>(
                          s.threads > 1 ? tbb::filter_mode::parallel : tbb::filter_mode::serial_in_order,
                          [iters](std::uint64_t x) { return x + (Work::spin(iters) & 1); });
    }
    auto sink = tbb::make_filter<std::uint64_t, void>(tbb::filter_mode::serial_in_order,
                                                      [&](std::uint64_t) { received.fetch_add(1); });
    tbb::parallel_pipeline(tokens, chain & sink);
  });
  const double s = seconds_since(t0);
  if (received != items) throw std::runtime_error("parallel_pipeline lost items");
  return static_cast<double>(items) / s;
}

// The slowest stage's own throughput: its work in a plain loop on as many threads as it has.
double slowest_alone(const StageSpec& s, const Work& work, std::uint64_t items) {
  const auto iters = work.iterations(s.us);
  std::atomic<std::uint64_t> next{0};
  const auto t0 = Clock::now();
  std::vector<std::jthread> threads;
  for (int t = 0; t < s.threads; ++t)
    threads.emplace_back([&] {
      std::uint64_t sink = 0;
      while (next.fetch_add(1) < items) sink += Work::spin(iters);
      if (sink == 42) std::puts("");
    });
  threads.clear();
  return static_cast<double>(items) / seconds_since(t0);
}

struct Config {
  std::string stages;
  std::uint64_t items = 0;  // 0: about two seconds of the slowest stage
  std::uint64_t overhead_items = 1'000'000;
  int threads = 0;
  std::size_t queue = 64;
};

Json run_suite(const Config& cfg, const CommonOptions& common) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // The reference chain (20 us serial, 40 us on 2 threads, 10 us serial) needs 70 us of CPU
  // per item: on fewer than 5 cores the machine, not its slowest stage, is the limit. Scale
  // the other stages down there, so the slowest stage is the one limit being measured.
  const std::string stages_text = !cfg.stages.empty() ? cfg.stages : cores >= 5 ? "20:1,40:2,10:1" : "20:1,4:2,2:1";
  const auto specs = parse_stages(stages_text);
  const int threads = cfg.threads > 0 ? cfg.threads : cores;
  const Work work;

  auto slowest = *std::max_element(specs.begin(), specs.end(), [](const StageSpec& a, const StageSpec& b) {
    return a.us / a.threads < b.us / b.threads;
  });
  double cpu_us = 0;
  for (const auto& s : specs) cpu_us += s.us;
  const std::uint64_t items = cfg.items ? cfg.items : static_cast<std::uint64_t>(2e6 / (slowest.us / slowest.threads));

  std::printf("pipeline: stages %s (us:threads), %llu items, %d oneTBB threads, queues of %zu\n", stages_text.c_str(),
              static_cast<unsigned long long>(items), threads, cfg.queue);
  std::printf("  the slowest stage is %.0f us on %d thread(s); all stages need %.0f us of CPU per item on %d cores\n",
              slowest.us, slowest.threads, cpu_us, cores);

  std::vector<double> eff, pipe_rate, alone_rate, stoker_ns, tbb_ns, ratio;
  std::vector<StageSpec> empty_specs;
  for (const auto& s : specs) empty_specs.push_back({0, s.threads});
  for (int r = 0; r < common.repeats; ++r) {
    const double alone = slowest_alone(slowest, work, items);
    const double rate = run_stoker(specs, work, items, threads, cfg.queue);
    // Framework cost: the same chain with empty bodies. Tokens = queue slots in the chain.
    const auto tokens = cfg.queue * (specs.size() + 1);
    const double s_rate = run_stoker(empty_specs, work, cfg.overhead_items, threads, cfg.queue);
    const double t_rate = run_tbb(empty_specs, work, cfg.overhead_items, threads, tokens);
    alone_rate.push_back(alone);
    pipe_rate.push_back(rate);
    eff.push_back(rate / alone);
    stoker_ns.push_back(1e9 / s_rate);
    tbb_ns.push_back(1e9 / t_rate);
    ratio.push_back(t_rate / s_rate);
    std::printf(
        "  repeat %d: efficiency %.3f (%.0f items/s, slowest stage alone %.0f/s); empty stages: stoker %.0f ns/item, "
        "parallel_pipeline %.0f ns/item (x%.2f)\n",
        r + 1, rate / alone, rate, alone, 1e9 / s_rate, 1e9 / t_rate, t_rate / s_rate);
  }
  const auto e = spread(eff), pr = spread(pipe_rate), ar = spread(alone_rate), sn = spread(stoker_ns),
             tn = spread(tbb_ns), q = spread(ratio);
  std::printf(
      "\nmedian of %d: efficiency %.3f (goal >= 0.95); overhead per item stoker %.0f ns vs parallel_pipeline "
      "%.0f ns: x%.2f (goal <= 1.0)\n",
      common.repeats, e.median, sn.median, tn.median, q.median);
  auto js = [](const Spread& s) { return Json{{"median", s.median}, {"min", s.min}, {"max", s.max}}; };
  Json stage_list = Json::array();
  for (const auto& s : specs) stage_list.push_back({{"us", s.us}, {"threads", s.threads}});
  return {{"config",
           {{"stages", stage_list},
            {"items", items},
            {"overhead_items", cfg.overhead_items},
            {"threads", threads},
            {"queue", cfg.queue}}},
          {"efficiency", js(e)},
          {"pipeline_items_per_s", js(pr)},
          {"slowest_stage_alone_items_per_s", js(ar)},
          {"overhead_ns_per_item", {{"stoker", js(sn)}, {"tbb_parallel_pipeline", js(tn)}, {"ratio", js(q)}}}};
}

}  // namespace

SuiteRun setup_pipeline(CLI::App& command) {
  auto cfg = std::make_shared<Config>();
  command
      .add_option("--stages", cfg->stages,
                  "Stages as US:THREADS,... (default 20:1,40:2,10:1 on 5+ cores, else 20:1,4:2,2:1)")
      ->check(CLI::Validator(
          [](std::string& text) {
            try {  // while parsing, so that a bad list is a bad argument (exit status 2)
              parse_stages(text);
              return std::string();
            } catch (const std::invalid_argument& e) {
              return std::string(e.what());
            }
          },
          ""));
  command.add_option("--items", cfg->items, "Items per run (default: about 2 s of the slowest stage)")
      ->check(apps::at_least<std::uint64_t>(0));
  command.add_option("--overhead-items", cfg->overhead_items, "Items through the empty-stage chain")
      ->check(apps::at_least<std::uint64_t>(1))
      ->capture_default_str();
  command.add_option("--threads", cfg->threads, "oneTBB threads (0, the default: one per core)")
      ->check(apps::in_range(0, 1024));
  command.add_option("--queue", cfg->queue, "Capacity of every queue")
      ->check(apps::in_range<std::size_t>(1, std::size_t{1} << 20))
      ->capture_default_str();
  return [cfg](const CommonOptions& common) { return run_suite(*cfg, common); };
}

}  // namespace stoker::bench
