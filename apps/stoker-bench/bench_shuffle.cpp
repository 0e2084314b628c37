// SPDX-License-Identifier: Apache-2.0
// The `shuffle` suite: what RandomShuffleQueue's two draw rules cost per item, one thread.
#include <array>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <vector>

#include "app_main.h"
#include "bench_suite.h"
#include "stoker/core/random_shuffle_queue.h"

namespace stoker::bench {
namespace {

using apps::fixed;

// 56 bytes, as the deferred crops the reference job shuffles.
struct Item {
  std::array<std::uint64_t, 7> word{};
};

struct ShuffleBench {
  std::uint64_t items = 2'000'000;
  std::size_t capacity = 10'000;
  std::size_t min_after_dequeue = 2'000;
};

// ns per item of a pop and a push on a full queue, the steady state in which the consumer is
// the slower side. Every item popped is summed, so that the work cannot be optimized away.
double shuffle_ns(const ShuffleBench& opt, ShuffleRule rule, std::uint64_t& checksum) {
  RandomShuffleQueue<Item> q("shuffle",
                             {.capacity = opt.capacity, .min_after_dequeue = opt.min_after_dequeue, .seed = 1}, rule);
  std::uint64_t pushed = 0;
  for (; pushed < opt.capacity; ++pushed) q.try_push(Item{{pushed}});
  Item out{};
  const auto t0 = std::chrono::steady_clock::now();
  for (std::uint64_t i = 0; i < opt.items; ++i) {
    if (!q.try_pop(out)) throw std::runtime_error("shuffle: try_pop failed on a full queue");
    checksum += out.word[0];
    if (!q.try_push(Item{{pushed++}})) throw std::runtime_error("shuffle: try_push failed after a pop");
  }
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  return ns / static_cast<double>(opt.items);
}

Json run_shuffle(const ShuffleBench& opt, const CommonOptions& common) {
  // The rules alternate per repeat, so that a slow moment of a shared machine is split between them.
  std::vector<double> all_held, oldest_window;
  std::uint64_t checksum = 0;
  for (int r = 0; r < common.repeats; ++r) {
    if (r % 2 == 0) all_held.push_back(shuffle_ns(opt, ShuffleRule::all_held, checksum));
    oldest_window.push_back(shuffle_ns(opt, ShuffleRule::oldest_window, checksum));
    if (r % 2 != 0) all_held.push_back(shuffle_ns(opt, ShuffleRule::all_held, checksum));
  }
  const Spread held = spread(all_held), window = spread(oldest_window);
  std::cout << "RandomShuffleQueue " << opt.capacity << "/" << opt.min_after_dequeue
            << ", full, pop + push of 56-byte items, one thread, median of " << common.repeats << ":\n"
            << "  all_held       " << fixed(held.median, 1) << " ns per item\n"
            << "  oldest_window  " << fixed(window.median, 1) << " ns per item\n"
            << "  ratio          x" << fixed(held.median / window.median, 2) << "\n";
  if (checksum == 42) std::cout << "";  // keeps the popped items' reads

  Json config;
  config["items"] = opt.items;
  config["capacity"] = opt.capacity;
  config["min_after_dequeue"] = opt.min_after_dequeue;
  config["repeats"] = common.repeats;
  config["item_bytes"] = sizeof(Item);
  Json out;
  out["config"] = std::move(config);
  out["results"] = {{"all_held_ns_per_item", held.median},
                    {"oldest_window_ns_per_item", window.median},
                    {"ratio", held.median / window.median}};
  return out;
}

}  // namespace

SuiteRun setup_shuffle(CLI::App& command) {
  auto opt = std::make_shared<ShuffleBench>();
  command.add_option("--items", opt->items, "Items popped and pushed per repeat")
      ->check(apps::in_range<std::uint64_t>(1, 1'000'000'000'000))
      ->capture_default_str();
  command.add_option("--capacity", opt->capacity, "The queue's capacity")
      ->check(apps::in_range<std::size_t>(2, std::size_t{1} << 24))
      ->capture_default_str();
  command.add_option("--min-after-dequeue", opt->min_after_dequeue, "The queue's min_after_dequeue")
      ->check(apps::in_range<std::size_t>(0, std::size_t{1} << 24))
      ->capture_default_str();
  return [opt](const CommonOptions& common) { return run_shuffle(*opt, common); };
}

}  // namespace stoker::bench
