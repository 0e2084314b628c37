// SPDX-License-Identifier: Apache-2.0
// The `queues` suite: items/s through stoker::BoundedQueue, tbb::concurrent_bounded_queue and
// a plain mutex + condition_variable ring, P producers x P consumers, all in one run.
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <latch>
#include <memory>
#include <mutex>
#include <oneapi/tbb/concurrent_queue.h>
#include <sstream>
#include <stdexcept>
#include <string>
#include <sys/resource.h>
#include <thread>
#include <vector>

#include "app_main.h"
#include "bench_suite.h"
#include "stoker/core/bounded_queue.h"
#include "stoker/core/random_shuffle_queue.h"

namespace stoker::bench {
namespace {

using Clock = std::chrono::steady_clock;

// A trial that takes longer than this has lost an item or deadlocked; its threads cannot be
// joined, so the process ends instead of hanging (2,000,000 items take about a second).
constexpr auto kTrialDeadline = std::chrono::seconds(120);

// ---------------------------------------------------------------------------------------------
// Items. word[0] carries the item's sequence number; the other words are derived from it so
// that a consumer can tell a torn or half-copied item from a whole one.

template <std::size_t Bytes>
struct Item {
  static_assert(Bytes % sizeof(std::uint64_t) == 0);
  static constexpr std::size_t kWords = Bytes / sizeof(std::uint64_t);
  std::array<std::uint64_t, kWords> word{};
};
static_assert(sizeof(Item<8>) == 8 && sizeof(Item<64>) == 64);

constexpr std::uint64_t derived_word(std::uint64_t sequence, std::size_t k) {
  return sequence * 0x9E3779B97F4A7C15ull + k;
}

template <std::size_t Bytes>
Item<Bytes> make_item(std::uint64_t sequence) {
  Item<Bytes> item;
  item.word[0] = sequence;
  for (std::size_t k = 1; k < Item<Bytes>::kWords; ++k) item.word[k] = derived_word(sequence, k);
  return item;
}

// What the consumers saw; compared with what the producers sent before any figure is kept.
struct alignas(64) Tally {
  std::uint64_t count = 0;
  std::uint64_t sum = 0;     // of sequence numbers, mod 2^64
  std::uint64_t sum_sq = 0;  // of their squares: catches a loss and a duplicate whose sums cancel
  std::uint64_t torn = 0;    // items whose words do not belong together

  template <std::size_t Bytes>
  void add(const Item<Bytes>& item) {
    const std::uint64_t s = item.word[0];
    ++count;
    sum += s;
    sum_sq += s * s;
    if constexpr (Item<Bytes>::kWords > 1)
      torn += item.word[Item<Bytes>::kWords - 1] != derived_word(s, Item<Bytes>::kWords - 1);
  }
  void merge(const Tally& o) {
    count += o.count;
    sum += o.sum;
    sum_sq += o.sum_sq;
    torn += o.torn;
  }
};

Tally expected_tally(std::uint64_t items) {
  Tally t;
  for (std::uint64_t s = 0; s < items; ++s) {
    ++t.count;
    t.sum += s;
    t.sum_sq += s * s;
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// The three queues behind one interface: construct with a capacity, blocking push and pop.

template <class T>
class StokerQueue {
 public:
  explicit StokerQueue(std::size_t capacity) : queue_("bench", capacity) {}
  void push(const T& item) {
    if (!queue_.push(item)) throw std::runtime_error("BoundedQueue::push failed on an open queue");
  }
  void pop(T& item) {
    if (!queue_.pop(item)) throw std::runtime_error("BoundedQueue::pop failed on an open queue");
  }

 private:
  stoker::BoundedQueue<T> queue_;
};

template <class T>
class TbbQueue {
 public:
  explicit TbbQueue(std::size_t capacity) { queue_.set_capacity(static_cast<std::ptrdiff_t>(capacity)); }
  void push(const T& item) { queue_.push(item); }
  void pop(T& item) { queue_.pop(item); }

 private:
  tbb::concurrent_bounded_queue<T> queue_;
};

// The baseline any concurrent queue must beat: a ring buffer under one mutex, one condition
// variable per direction, notified after unlocking.
template <class T>
class MutexQueue {
 public:
  explicit MutexQueue(std::size_t capacity) : ring_(capacity) {}
  void push(const T& item) {
    std::unique_lock lock(mutex_);
    not_full_.wait(lock, [&] { return size_ < ring_.size(); });
    ring_[tail_] = item;
    tail_ = tail_ + 1 == ring_.size() ? 0 : tail_ + 1;
    ++size_;
    lock.unlock();
    not_empty_.notify_one();
  }
  void pop(T& item) {
    std::unique_lock lock(mutex_);
    not_empty_.wait(lock, [&] { return size_ > 0; });
    item = ring_[head_];
    head_ = head_ + 1 == ring_.size() ? 0 : head_ + 1;
    --size_;
    lock.unlock();
    not_full_.notify_one();
  }

 private:
  std::mutex mutex_;
  std::condition_variable not_full_, not_empty_;
  std::vector<T> ring_;
  std::size_t head_ = 0, tail_ = 0, size_ = 0;
};

// ---------------------------------------------------------------------------------------------
// One trial: move `items` items from `producers` threads to `consumers` threads.
//
// Each consumer pops a fixed share of the items, so the stream needs no end marker at all and
// the three queues do exactly the same work. The alternatives are not neutral:
// BoundedQueue::close() drains, tbb's abort() throws at every waiter and drops what is queued,
// and the mutex ring has no end at all. Sentinel items (one per consumer, pushed once every
// producer is done) look neutral but are wrong for BoundedQueue: moodycamel orders items per
// producer only, so a consumer can take the last sentinel while an earlier item of another
// producer is still queued, and that item is never popped (seen here: 199,999 of 200,000 at
// 4x4). A broken run would then go unnoticed, or hang.

struct TrialSpec {
  std::uint64_t items;
  std::size_t capacity;
  int producers;
  int consumers;
  const Tally* expected;
};

// What one trial measured. CPU time and context switches are for the whole process while the
// trial runs: they tell a queue that spins (CPU time up) from one that sleeps (switches up).
struct TrialResult {
  double items_per_s = 0;
  double cpu_ns_per_item = 0;
  double switches_per_kitem = 0;  // voluntary + involuntary, per 1000 items
};

struct Usage {
  double cpu_s;
  long switches;
};

Usage usage_now() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto seconds = [](timeval t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return {seconds(u.ru_utime) + seconds(u.ru_stime), u.ru_nvcsw + u.ru_nivcsw};
}

struct alignas(64) ThreadTimes {
  Clock::time_point start, end;
};

// Lets the main thread wait for the workers with a deadline, which join() cannot.
class Countdown {
 public:
  explicit Countdown(int n) : left_(n) {}
  void done() {
    {
      std::lock_guard lock(mutex_);
      --left_;
    }
    cv_.notify_all();
  }
  bool wait_for(Clock::duration timeout) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return left_ == 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int left_;
};

std::string describe(const char* queue, std::size_t bytes, const TrialSpec& t) {
  std::ostringstream s;
  s << queue << ", " << bytes << " B, " << t.producers << "x" << t.consumers;
  return s.str();
}

// The clock runs from the first worker released to the last worker done, both read by the
// workers themselves, so a main thread that is descheduled on a busy machine does not stretch
// or shrink the interval.
template <template <class> class Queue, std::size_t Bytes>
TrialResult measure(const char* queue_name, const TrialSpec& t) {
  using T = Item<Bytes>;
  Queue<T> queue(t.capacity);
  const Usage usage_before = usage_now();
  const int workers = t.producers + t.consumers;
  std::latch start(workers);
  Countdown finished(workers);
  std::vector<ThreadTimes> times(static_cast<std::size_t>(workers));
  std::vector<Tally> tallies(static_cast<std::size_t>(t.consumers));
  std::atomic<bool> failed{false};
  std::string failure;
  std::mutex failure_mutex;
  auto fail = [&](const std::exception& e) {
    std::lock_guard lock(failure_mutex);
    if (!failed.exchange(true)) failure = e.what();
  };

  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(workers));
  for (int p = 0; p < t.producers; ++p) {
    threads.emplace_back([&, p] {
      const std::uint64_t first = t.items * static_cast<std::uint64_t>(p) / t.producers;
      const std::uint64_t last = t.items * static_cast<std::uint64_t>(p + 1) / t.producers;
      start.arrive_and_wait();
      times[p].start = Clock::now();
      try {
        for (std::uint64_t s = first; s < last; ++s) queue.push(make_item<Bytes>(s));
      } catch (const std::exception& e) {
        fail(e);
      }
      times[p].end = Clock::now();
      finished.done();
    });
  }
  for (int c = 0; c < t.consumers; ++c) {
    threads.emplace_back([&, c] {
      const std::size_t slot = static_cast<std::size_t>(t.producers + c);
      const std::uint64_t share = t.items * static_cast<std::uint64_t>(c + 1) / t.consumers -
                                  t.items * static_cast<std::uint64_t>(c) / t.consumers;
      Tally tally;
      start.arrive_and_wait();
      times[slot].start = Clock::now();
      try {
        T item;
        for (std::uint64_t i = 0; i < share; ++i) {
          queue.pop(item);
          tally.add(item);
        }
      } catch (const std::exception& e) {
        fail(e);
      }
      times[slot].end = Clock::now();
      tallies[c] = tally;
      finished.done();
    });
  }

  if (!finished.wait_for(kTrialDeadline)) {
    std::cout.flush();
    std::lock_guard lock(failure_mutex);
    std::cerr << "stoker-bench: error: queues: " << describe(queue_name, Bytes, t) << " did not finish within "
              << kTrialDeadline.count() << " s (" << (failed ? failure : "an item was lost, or the queue deadlocked")
              << ")\n";
    std::_Exit(1);
  }
  for (auto& thread : threads) thread.join();
  const Usage usage_after = usage_now();
  if (failed) throw std::runtime_error(describe(queue_name, Bytes, t) + ": " + failure);

  Tally seen;
  for (const Tally& tally : tallies) seen.merge(tally);
  const Tally& want = *t.expected;
  if (seen.count != want.count || seen.sum != want.sum || seen.sum_sq != want.sum_sq || seen.torn) {
    std::ostringstream s;
    s << "queues: broken run, " << describe(queue_name, Bytes, t) << ": popped " << seen.count << " of " << want.count
      << " items, checksum " << (seen.sum == want.sum ? "ok" : "wrong") << ", sum of squares "
      << (seen.sum_sq == want.sum_sq ? "ok" : "wrong") << ", " << seen.torn << " torn items";
    throw std::runtime_error(s.str());
  }

  Clock::time_point begin = times.front().start, end = times.front().end;
  for (const ThreadTimes& tt : times) {
    begin = std::min(begin, tt.start);
    end = std::max(end, tt.end);
  }
  const double seconds = std::chrono::duration<double>(end - begin).count();
  const double items = static_cast<double>(t.items);
  return {items / seconds, (usage_after.cpu_s - usage_before.cpu_s) * 1e9 / items,
          static_cast<double>(usage_after.switches - usage_before.switches) * 1e3 / items};
}

struct QueueKind {
  const char* name;   // in the JSON
  const char* label;  // in the table
  TrialResult (*run8)(const char*, const TrialSpec&);
  TrialResult (*run64)(const char*, const TrialSpec&);
};

constexpr std::size_t kItemBytes[] = {8, 64};

// The first one is the queue under test; the ratios divide it by each of the others.
constexpr QueueKind kQueueKinds[] = {
    {"stoker::BoundedQueue", "BoundedQueue", &measure<StokerQueue, 8>, &measure<StokerQueue, 64>},
    {"tbb::concurrent_bounded_queue", "tbb::cbq", &measure<TbbQueue, 8>, &measure<TbbQueue, 64>},
    {"std::mutex+condition_variable", "mutex+cv", &measure<MutexQueue, 8>, &measure<MutexQueue, 64>},
};
constexpr std::size_t kKinds = std::size(kQueueKinds);

struct QueuesOptions {
  std::uint64_t items = 2'000'000;
  std::size_t capacity = 1024;
  std::vector<int> threads{1, 2, 4};
};

std::string rate(double items_per_s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", items_per_s / 1e6);
  return buf;
}

using apps::fixed;

Json run_queues(const QueuesOptions& opt, const CommonOptions& common) {
  const std::size_t n_sizes = std::size(kItemBytes), n_threads = opt.threads.size();
  auto run = [](const QueueKind& q, std::size_t bytes, const TrialSpec& spec) {
    return bytes == 8 ? q.run8(q.name, spec) : q.run64(q.name, spec);
  };

  // Threads, allocator arenas and page tables are cold on the first trials of a process; a
  // short untimed round of every queue keeps that out of the first repeat.
  {
    const std::uint64_t items = std::min<std::uint64_t>(opt.items, 200'000);
    const Tally expected = expected_tally(items);
    for (const QueueKind& q : kQueueKinds)
      for (std::size_t bytes : kItemBytes)
        for (int pc : opt.threads) run(q, bytes, {items, opt.capacity, pc, pc, &expected});
  }

  const Tally expected = expected_tally(opt.items);
  // trials[size][threads][kind]: one TrialResult per repeat
  std::vector<std::vector<std::array<std::vector<TrialResult>, kKinds>>> trials(
      n_sizes, std::vector<std::array<std::vector<TrialResult>, kKinds>>(n_threads));

  // Interleaved: every repeat runs every queue on every configuration, and the queue that goes
  // first rotates, so that slow phases of a noisy machine are shared out evenly.
  for (int rep = 0; rep < common.repeats; ++rep) {
    std::cerr << "queues: repeat " << rep + 1 << "/" << common.repeats << "\n";
    for (std::size_t b = 0; b < n_sizes; ++b) {
      for (std::size_t p = 0; p < n_threads; ++p) {
        const TrialSpec spec{opt.items, opt.capacity, opt.threads[p], opt.threads[p], &expected};
        for (std::size_t k = 0; k < kKinds; ++k) {
          const std::size_t kind = (k + static_cast<std::size_t>(rep)) % kKinds;
          trials[b][p][kind].push_back(run(kQueueKinds[kind], kItemBytes[b], spec));
        }
      }
    }
  }

  auto pick = [](const std::vector<TrialResult>& rs, double TrialResult::*field) {
    std::vector<double> v;
    for (const TrialResult& r : rs) v.push_back(r.*field);
    return v;
  };
  auto row_head = [&](std::size_t b, std::size_t p) {
    const std::string pc = std::to_string(opt.threads[p]);
    std::cout << std::setw(7) << kItemBytes[b] << std::setw(7) << (pc + "x" + pc);
  };

  Json results = Json::array(), ratios = Json::array();
  std::cout << "queues: Mitems/s, median (min-max) of " << common.repeats << " repeats; " << opt.items
            << " items, capacity " << opt.capacity << "\n\n"
            << std::left << std::setw(7) << "bytes" << std::setw(7) << "PxC";
  for (const QueueKind& q : kQueueKinds) std::cout << std::setw(22) << q.label;
  std::cout << std::setw(9) << "vs tbb"
            << "vs mutex\n";
  for (std::size_t b = 0; b < n_sizes; ++b) {
    for (std::size_t p = 0; p < n_threads; ++p) {
      const int pc = opt.threads[p];
      row_head(b, p);
      std::array<Spread, kKinds> s;
      for (std::size_t k = 0; k < kKinds; ++k) {
        const auto& rs = trials[b][p][k];
        const std::vector<double> rates = pick(rs, &TrialResult::items_per_s);
        s[k] = spread(rates);
        std::cout << std::setw(22) << (rate(s[k].median) + " (" + rate(s[k].min) + "-" + rate(s[k].max) + ")");
        results.push_back(
            {{"queue", kQueueKinds[k].name},
             {"item_bytes", kItemBytes[b]},
             {"producers", pc},
             {"consumers", pc},
             {"items_per_s_median", s[k].median},
             {"min", s[k].min},
             {"max", s[k].max},
             {"samples", rates},
             {"cpu_ns_per_item_median", spread(pick(rs, &TrialResult::cpu_ns_per_item)).median},
             {"context_switches_per_kitem_median", spread(pick(rs, &TrialResult::switches_per_kitem)).median}});
      }
      const double vs_tbb = s[0].median / s[1].median, vs_mutex = s[0].median / s[2].median;
      std::cout << std::setw(9) << fixed(vs_tbb, 2) << fixed(vs_mutex, 2) << "\n";
      ratios.push_back({{"item_bytes", kItemBytes[b]},
                        {"producers", pc},
                        {"consumers", pc},
                        {"vs_tbb", vs_tbb},
                        {"vs_mutex", vs_mutex}});
    }
  }
  std::cout << "\nvs tbb, vs mutex: BoundedQueue's median divided by the other queue's median\n";

  // Where the time goes: a queue that spins burns CPU per item, one that sleeps switches.
  std::cout << "\nCPU ns per item / context switches per 1000 items (process-wide, medians)\n\n"
            << std::setw(7) << "bytes" << std::setw(7) << "PxC";
  for (const QueueKind& q : kQueueKinds) std::cout << std::setw(22) << q.label;
  std::cout << "\n";
  for (std::size_t b = 0; b < n_sizes; ++b) {
    for (std::size_t p = 0; p < n_threads; ++p) {
      row_head(b, p);
      for (std::size_t k = 0; k < kKinds; ++k) {
        const auto& rs = trials[b][p][k];
        std::cout << std::setw(22)
                  << (fixed(spread(pick(rs, &TrialResult::cpu_ns_per_item)).median, 0) + " / " +
                      fixed(spread(pick(rs, &TrialResult::switches_per_kitem)).median, 1));
      }
      std::cout << "\n";
    }
  }

  // The shuffle's two rules: what drawing from everything held (TensorFlow's rule, a window as
  // large as the capacity) costs against drawing from the oldest min_after_dequeue + 1, in a
  // steady state with the queue full (the consumer the slower side), one thread. Items of 56
  // bytes, as the deferred crops the reference job shuffles; the rules alternate per repeat.
  const std::uint64_t shuffle_items = std::min<std::uint64_t>(opt.items, 2'000'000);
  auto shuffle_ns = [&](ShuffleRule rule) {
    RandomShuffleQueue<Item<56>> q("shuffle", {.capacity = 10'000, .min_after_dequeue = 2'000, .seed = 1}, rule);
    std::uint64_t pushed = 0, sum = 0;
    for (; pushed < 10'000; ++pushed) q.try_push(make_item<56>(pushed));
    Item<56> out{};
    const auto t0 = std::chrono::steady_clock::now();
    for (std::uint64_t i = 0; i < shuffle_items; ++i) {
      q.try_pop(out);
      sum += out.word[0];
      q.try_push(make_item<56>(pushed++));
    }
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    if (sum == 42) std::cout << "";
    return ns / static_cast<double>(shuffle_items);
  };
  std::vector<double> all_held, oldest_window;
  for (int r = 0; r < common.repeats; ++r) {
    if (r % 2 == 0) all_held.push_back(shuffle_ns(ShuffleRule::all_held));
    oldest_window.push_back(shuffle_ns(ShuffleRule::oldest_window));
    if (r % 2 != 0) all_held.push_back(shuffle_ns(ShuffleRule::all_held));
  }
  const double held_ns = spread(all_held).median, window_ns = spread(oldest_window).median;
  std::cout << "\nRandomShuffleQueue 10000/2000, full, pop + push of 56-byte items, one thread: all_held "
            << fixed(held_ns, 1) << " ns, oldest_window " << fixed(window_ns, 1) << " ns per item (x"
            << fixed(held_ns / window_ns, 2) << ")\n";

  Json config;
  config["items"] = opt.items;
  config["capacity"] = opt.capacity;
  config["repeats"] = common.repeats;
  config["item_bytes"] = kItemBytes;
  config["producers_x_consumers"] = opt.threads;
  config["queues"] = Json::array();
  for (const QueueKind& q : kQueueKinds) config["queues"].push_back(q.name);
  config["operations"] = "blocking push and pop";
  config["end_of_stream"] = "none: each consumer pops a fixed share of the items";
  config["figure"] = "items / (last consumer done - first worker released); median over repeats";
  Json out;
  out["config"] = std::move(config);
  out["results"] = std::move(results);
  out["ratios"] = std::move(ratios);
  out["shuffle_rule"] = {{"items", shuffle_items},
                         {"all_held_ns_per_item", held_ns},
                         {"oldest_window_ns_per_item", window_ns},
                         {"ratio", held_ns / window_ns}};
  return out;
}

}  // namespace

SuiteRun setup_queues(CLI::App& command) {
  auto opt = std::make_shared<QueuesOptions>();
  command.add_option("--items", opt->items, "Items moved per trial, over all producers")
      ->check(apps::in_range<std::uint64_t>(1, 1'000'000'000'000))
      ->capture_default_str();
  command.add_option("--capacity", opt->capacity, "Capacity of every queue")
      ->check(apps::in_range<std::size_t>(1, std::size_t{1} << 24))
      ->capture_default_str();
  command.add_option("--threads", opt->threads, "Values of P for P producers x P consumers")
      ->delimiter(',')
      ->check(apps::in_range(1, 256))
      ->capture_default_str();
  return [opt](const CommonOptions& common) { return run_queues(*opt, common); };
}

}  // namespace stoker::bench
