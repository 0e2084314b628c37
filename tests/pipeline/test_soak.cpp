// SPDX-License-Identifier: Apache-2.0
// Randomized soak of the pipeline runtime: random chains of maps and flat_maps (fan-out 0 to
// 8), an optional shuffle of any min_after_dequeue / capacity up to 0.99, an optional batch;
// random threads, queues, chunk limits, modes; per-item spins and sleeps, oneTBB inside stage
// functions, a tbb::global_control held now and then; exceptions (fail or skip) and stops at
// random times; now and then, a state taken mid-epoch and the run resumed from it with other
// thread counts (the flat_maps then have a fixed fan-out, which a resume needs). Every run must
// deliver each item exactly once per epoch (or end in a clean StageError or stop), stay within
// the documented bound on what is in flight, and end in time.
//
// It runs for STOKER_SOAK_SECONDS (default 10) from STOKER_SOAK_SEED (default: from the clock)
// and prints the seed of a run that fails, which STOKER_SOAK_SEED then replays first.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/parallel_for.h>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "pipeline/pipeline_support.h"
#include "stoker/core/log.h"

using namespace stoker;
using namespace stoker::test;

namespace {

std::atomic<long> live{0}, max_live{0};

void note_live(long n) {
  long m = max_live.load();
  while (n > m && !max_live.compare_exchange_weak(m, n)) {
  }
}

// An item: the source id it came from and the path of flat_map outputs that led to it.
struct Item {
  std::uint32_t id = 0;
  std::uint64_t path = 0;
  bool owns = false;

  Item(std::uint32_t id_, std::uint64_t path_) : id(id_), path(path_), owns(true) { note_live(live.fetch_add(1) + 1); }
  Item(Item&& o) noexcept : id(o.id), path(o.path), owns(std::exchange(o.owns, false)) {}
  Item& operator=(Item&& o) noexcept {
    if (owns) live.fetch_sub(1);
    id = o.id;
    path = o.path;
    owns = std::exchange(o.owns, false);
    return *this;
  }
  ~Item() {
    if (owns) live.fetch_sub(1);
  }
};

enum class Fault { none, fail, skip };

struct StageSpec {
  bool flat = false;
  int max_fanout = 1;  // flat: outputs of an item are fanout(id, path) in [0, max_fanout]...
  bool fixed = false;  // ...or always max_fanout, given as StageOptions::fanout
  int threads = 1;
  std::size_t queue = 8;
  std::size_t max_chunk = 0;
  bool copy_per_body = false;
  int spin_us = 0;        // spin this long on some items
  bool sleeps = false;    // sleep 200 us on some items
  bool uses_tbb = false;  // a parallel_for inside the function
  Fault fault = Fault::none;
  std::uint32_t fault_id = 0;
};

struct Spec {
  std::uint64_t seed = 0;
  std::uint32_t items = 0;
  std::uint32_t epochs = 1;
  int threads = 1;
  bool deterministic = false;
  std::optional<std::size_t> host_limit;  // a tbb::global_control the host holds
  std::size_t source_queue = 8;
  std::vector<StageSpec> stages;
  std::optional<ShuffleOptions> shuffle;  // after the last stage
  std::size_t batch = 0;                  // 0: no batch stage
  std::size_t batch_queue = 4;
  std::optional<std::uint64_t> stop_after;  // items consumed before stop()
  bool resume = false;                      // at stop_after, take a state and resume from it

  std::string str() const {
    std::ostringstream s;
    s << "seed " << seed << ": " << items << " items x " << epochs << " epochs, threads " << threads
      << (deterministic ? ", deterministic" : "") << (host_limit ? ", host limit " + std::to_string(*host_limit) : "")
      << ", source queue " << source_queue;
    for (std::size_t i = 0; i < stages.size(); ++i) {
      const auto& st = stages[i];
      s << " | s" << i
        << (st.flat ? std::string(st.fixed ? " flat(=" : " flat(") + std::to_string(st.max_fanout) + ")" : " map")
        << " t" << st.threads << " q" << st.queue << " c" << st.max_chunk << (st.copy_per_body ? " copies" : "")
        << (st.spin_us ? " spin" : "") << (st.sleeps ? " sleep" : "") << (st.uses_tbb ? " tbb" : "")
        << (st.fault == Fault::fail   ? " fail@" + std::to_string(st.fault_id)
            : st.fault == Fault::skip ? " skip@" + std::to_string(st.fault_id)
                                      : "");
    }
    if (shuffle) s << " | shuffle " << shuffle->capacity << "/" << shuffle->min_after_dequeue;
    if (batch) s << " | batch " << batch << " q" << batch_queue;
    if (stop_after) s << (resume ? " | resume after " : " | stop after ") << *stop_after;
    return s.str();
  }
};

std::uint64_t hash(std::uint64_t a, std::uint64_t b) { return derive_seed(a, b); }
std::string stage_name(std::size_t i) {
  std::string name = "s";  // appended, not "s" + ...: GCC 12 warns falsely about that (-Wrestrict)
  name += std::to_string(i);
  return name;
}
int fanout(const StageSpec& st, std::size_t stage, const Item& x) {
  if (st.fixed) return st.max_fanout;
  return static_cast<int>(hash(x.id, x.path ^ (stage << 56)) % static_cast<std::uint64_t>(st.max_fanout + 1));
}

Spec random_spec(std::uint64_t seed) {
  Rng r(seed);
  Spec s;
  s.seed = seed;
  s.items = static_cast<std::uint32_t>(1 + r.below(r.bernoulli(0.2) ? 3000 : 400));
  s.epochs = static_cast<std::uint32_t>(1 + r.below(2));
  s.threads = static_cast<int>(1 + r.below(4));
  s.deterministic = r.bernoulli(0.4);
  if (r.bernoulli(0.15)) s.host_limit = 1 + r.below(2);
  s.source_queue = 1 + r.below(r.bernoulli(0.5) ? 4 : 64);
  const std::size_t n = 1 + r.below(5);
  int big_fanouts = 0;
  for (std::size_t i = 0; i < n; ++i) {
    StageSpec st;
    st.flat = r.bernoulli(0.5);
    // Mostly fan-outs averaging about 1; now and then one of up to 8, which grows the total.
    st.max_fanout = st.flat ? (r.bernoulli(0.2) && big_fanouts++ == 0 ? 8 : static_cast<int>(r.below(3))) : 1;
    st.threads = static_cast<int>(1 + r.below(4));
    st.queue = 1 + r.below(r.bernoulli(0.5) ? 4 : 64);
    st.max_chunk = r.bernoulli(0.7) ? 0 : 1 + r.below(8);
    st.copy_per_body = r.bernoulli(0.2);
    st.spin_us = r.bernoulli(0.3) ? static_cast<int>(1 + r.below(20)) : 0;
    st.sleeps = r.bernoulli(0.1);
    st.uses_tbb = r.bernoulli(0.15);
    if (r.bernoulli(0.15)) {
      st.fault = r.bernoulli(0.5) ? Fault::fail : Fault::skip;
      st.fault_id = static_cast<std::uint32_t>(r.below(s.items));
    }
    s.stages.push_back(st);
  }
  if (r.bernoulli(0.5)) {
    const std::size_t capacity = 1 + r.below(r.bernoulli(0.5) ? 16 : 600);
    const double ratio = r.bernoulli(0.3) ? 0.99 : static_cast<double>(r.below(100)) / 100.0;
    const auto min = std::min(capacity - 1, static_cast<std::size_t>(ratio * static_cast<double>(capacity)));
    s.shuffle = ShuffleOptions{.capacity = capacity, .min_after_dequeue = min, .seed = r()};
  }
  if (s.shuffle || r.bernoulli(0.6)) {  // a shuffle must be followed by a stage
    s.batch = 1 + r.below(20);
    s.batch_queue = 1 + r.below(8);
  }
  if (r.bernoulli(0.2)) s.stop_after = r.below(s.items);
  // A resume: fixed fan-outs of at least 1, no faults (a skip makes state() refuse).
  if (r.bernoulli(0.25)) {
    s.resume = true;
    s.stop_after = r.below(s.items);
    for (auto& st : s.stages) {
      st.fault = Fault::none;
      if (st.flat) st.fixed = true, st.max_fanout = std::max(st.max_fanout, 1);
    }
  }
  return s;
}

// What each epoch must deliver: every (id, path) that survives the chain's fan-outs and skips.
// Also whether a `fail` fault is reached, and by which stage first (in chain order, an item
// reaching a failing stage makes the run end in that stage's StageError, unless an earlier
// stage's fault ended it first; several may race, so any reached failing stage is accepted).
struct Expected {
  std::vector<std::pair<std::uint32_t, std::uint64_t>> items;  // sorted
  std::vector<std::string> failing;                            // stages whose fail fault is reached
};

Expected expected(const Spec& s) {
  Expected e;
  std::vector<Item> current;
  for (std::uint32_t id = 0; id < s.items; ++id) current.emplace_back(id, 0);
  for (std::size_t i = 0; i < s.stages.size(); ++i) {
    const auto& st = s.stages[i];
    std::vector<Item> next;
    for (auto& x : current) {
      if (st.fault != Fault::none && x.id == st.fault_id) {
        if (st.fault == Fault::fail) e.failing.push_back(stage_name(i));
        continue;  // skipped (or the run failed)
      }
      if (!st.flat) {
        next.push_back(std::move(x));
        continue;
      }
      const int k = fanout(st, i, x);
      for (int j = 0; j < k; ++j) next.emplace_back(x.id, hash(x.path, static_cast<std::uint64_t>(j) + 1));
    }
    current = std::move(next);
  }
  for (const auto& x : current) e.items.emplace_back(x.id, x.path);
  std::sort(e.items.begin(), e.items.end());
  e.failing.erase(std::unique(e.failing.begin(), e.failing.end()), e.failing.end());
  return e;
}

// 0 .. items - 1 per epoch, from anywhere (a resume seeks).
struct Source {
  std::uint32_t items = 0;
  std::uint32_t n = 0;
  std::optional<Item> operator()() {
    if (n >= items) {  // a resume may seek past the end: to the start of a short last batch's next
      n = 0;
      return std::nullopt;
    }
    return Item(n++, 0);
  }
  void seek(std::uint64_t k) { n = static_cast<std::uint32_t>(std::min<std::uint64_t>(k, items)); }
};

// The stage function of spec `st` at position `i`.
struct StageFn {
  StageSpec st;
  std::size_t i = 0;
  bool busy = false;  // with copy_per_body, a copy must never be called twice at once

  void work(const Item& x) {
    if (st.copy_per_body) {
      if (busy) throw std::logic_error("copy_per_body: two calls at once on one copy");
      busy = true;
    }
    if (st.spin_us && x.id % 7 == 0) spin_for(std::chrono::microseconds(st.spin_us));
    if (st.sleeps && x.id % 31 == 0) std::this_thread::sleep_for(200us);
    if (st.uses_tbb && x.id % 5 == 0) {
      std::atomic<int> n{0};
      tbb::parallel_for(0, 4, [&](int) { n.fetch_add(1); });
      if (n.load() != 4) throw std::logic_error("parallel_for lost work");
    }
    if (st.copy_per_body) busy = false;
    if (st.fault != Fault::none && x.id == st.fault_id) throw std::runtime_error("injected fault in " + stage_name(i));
  }
  Item operator()(Item x) {
    work(x);
    return x;
  }
  void operator()(Item x, Emitter<Item>& emit) {
    work(x);
    const int k = fanout(st, i, x);
    for (int j = 0; j < k; ++j) emit(Item(x.id, hash(x.path, static_cast<std::uint64_t>(j) + 1)));
  }
};

// The documented bound: the queues' capacities plus, for every body, a chunk of inputs and two
// of outputs (one on its way, one being made), plus the consumer's chunk; a chunk is at most
// half of the room its queue can ever have. Counted in items (a batch counts its items).
long bound(const Spec& s) {
  const auto chunk = [](std::size_t capacity, std::size_t floor) {
    return static_cast<long>(std::max<std::size_t>(1, (capacity - floor) / 2));
  };
  long total = 0;
  // Queues after the source and each stage; the one after the last stage may be the shuffle.
  std::vector<std::pair<long, long>> edges;  // capacity, max chunk
  edges.emplace_back(static_cast<long>(s.source_queue), chunk(s.source_queue, 0));
  for (std::size_t i = 0; i < s.stages.size(); ++i) {
    const bool last = i + 1 == s.stages.size();
    if (last && s.shuffle)
      edges.emplace_back(static_cast<long>(s.shuffle->capacity),
                         chunk(s.shuffle->capacity, s.shuffle->min_after_dequeue));
    else
      edges.emplace_back(static_cast<long>(s.stages[i].queue), chunk(s.stages[i].queue, 0));
  }
  for (const auto& [capacity, c] : edges) total += capacity;
  total += edges[0].second;  // the source's body
  for (std::size_t i = 0; i < s.stages.size(); ++i)
    total += s.stages[i].threads * (edges[i].second + 2 * edges[i + 1].second);
  const long b = static_cast<long>(s.batch);
  if (s.batch) {
    total += static_cast<long>(s.batch_queue) * b;  // its queue, in items
    total += edges.back().second + b + b;           // its input chunk, the batch it fills, its output
    total += chunk(s.batch_queue, 0) * b;           // the consumer's chunk
  } else {
    total += edges.back().second;  // the consumer's chunk
  }
  return total;
}

template <class T>
void add_item(std::vector<std::pair<std::uint32_t, std::uint64_t>>& got, const T& x) {
  if constexpr (std::is_same_v<T, Item>)
    got.emplace_back(x.id, x.path);
  else
    for (const auto& y : x) got.emplace_back(y.id, y.path);
}

struct Outcome {
  std::vector<std::vector<std::pair<std::uint32_t, std::uint64_t>>> epochs;  // in delivery order
  std::optional<std::string> failed_stage;
  bool stopped = false;
};

// Builds the pipeline of `s` (resumed from `resume` when given) and hands it to `use`.
template <class Use>
Outcome with_pipeline(const Spec& s, const std::optional<PipelineState>& resume, Use&& use) {
  auto b = PipelineBuilder{}
               .threads(s.threads)
               .epochs(s.epochs)
               .deterministic(s.deterministic)
               .seed(s.seed)
               .source("read", Source{s.items}, {.queue = s.source_queue});
  Builder<Item> chain = std::move(b);
  for (std::size_t i = 0; i < s.stages.size(); ++i) {
    const auto& st = s.stages[i];
    const StageOptions o{.threads = st.threads,
                         .queue = st.queue,
                         .max_chunk = st.max_chunk,
                         .on_error = st.fault == Fault::skip ? OnError::skip : OnError::fail,
                         .copy_per_body = st.copy_per_body,
                         .fanout = st.fixed ? static_cast<std::size_t>(st.max_fanout) : 0};
    const std::string name = stage_name(i);
    if (st.flat)
      chain = std::move(chain).flat_map<Item>(name, StageFn{st, i}, o);
    else
      chain = std::move(chain).map(name, StageFn{st, i}, o);
  }
  if (s.shuffle) chain.shuffle("shuffle", *s.shuffle);
  if (resume) chain.resume_from(*resume);
  if (s.batch) return use(std::move(chain).batch("batch", s.batch, {.queue = s.batch_queue}).build());
  return use(std::move(chain).build());
}

// The same pipeline with other thread counts.
Spec other_threads(const Spec& s) {
  Spec other = s;
  other.threads = s.threads % 4 + 1;
  for (auto& st : other.stages) st.threads = st.threads % 3 + 1;
  return other;
}

template <class P>
Outcome consume(P&& pipe, const Spec& s) {
  Outcome out;
  std::uint64_t consumed = 0;
  try {
    for (std::uint32_t e = 0; e < s.epochs && !out.stopped; ++e) {
      auto& got = out.epochs.emplace_back();
      while (auto x = pipe.next()) {
        add_item(got, *x);
        if (!s.stop_after || ++consumed != *s.stop_after + 1) continue;
        if (s.resume) {  // the rest from a new pipeline, with other threads
          const auto state = PipelineState::from_json(pipe.state().to_json());
          pipe.stop();
          with_pipeline(other_threads(s), state, [&](auto&& resumed) {
            // The same spec has the same stages: only the branch of this pipeline's type runs.
            if constexpr (std::is_same_v<std::remove_cvref_t<decltype(resumed)>, std::remove_cvref_t<P>>)
              pipe = std::move(resumed);
            return Outcome{};
          });
          continue;
        }
        const auto t0 = Clock::now();
        pipe.stop();
        CHECK_MESSAGE(ms_since(t0) < 3000.0, s.str());
        out.stopped = true;
        break;
      }
    }
  } catch (const StageError& e) {
    out.failed_stage = e.stage();
  }
  return out;
}

Outcome run(const Spec& s) {
  return with_pipeline(s, std::nullopt, [&](auto&& pipe) { return consume(pipe, s); });
}

void check(const Spec& s) {
  CAPTURE(s.str());
  const Expected want = expected(s);
  live = 0;
  max_live = 0;
  std::optional<tbb::global_control> host;
  if (s.host_limit) host.emplace(tbb::global_control::max_allowed_parallelism, *s.host_limit);
  const Outcome got = run(s);
  CHECK(live.load() == 0);
  // A resumed run's first queue gets back, beyond its capacity, what the stopped run had in
  // flight, while the pipeline it stopped may still hold it: twice the bound at most.
  CHECK(max_live.load() <= (s.resume ? 2 : 1) * bound(s));
  if (got.failed_stage) {
    CHECK(std::find(want.failing.begin(), want.failing.end(), *got.failed_stage) != want.failing.end());
    return;
  }
  // A run with a reachable failing stage must fail, unless it was stopped first.
  if (!got.stopped) CHECK(want.failing.empty());
  for (std::size_t e = 0; e < got.epochs.size(); ++e) {
    auto items = got.epochs[e];
    std::sort(items.begin(), items.end());
    const bool complete = !(got.stopped && e + 1 == got.epochs.size());
    if (complete) {
      CHECK(items == want.items);
    } else {  // stopped: no item twice, none that should not exist
      CHECK(std::adjacent_find(items.begin(), items.end()) == items.end());
      CHECK(std::includes(want.items.begin(), want.items.end(), items.begin(), items.end()));
    }
  }
  if (!got.stopped) CHECK(got.epochs.size() == s.epochs);
  // Deterministic mode: another run, with other threads, gives the same sequence.
  if (s.deterministic && !got.stopped && want.failing.empty() && s.seed % 4 == 0) {
    const Outcome again = run(other_threads(s));
    CHECK(again.epochs == got.epochs);
  }
}

std::uint64_t env_or(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

}  // namespace

TEST_CASE("soak: random pipelines deliver exactly once, within the bound, and end in time") {
  const auto seconds = env_or("STOKER_SOAK_SECONDS", 10);
  const auto first = env_or("STOKER_SOAK_SEED", static_cast<std::uint64_t>(Clock::now().time_since_epoch().count()));
  MESSAGE("soak: " << seconds << " s from seed " << first << " (set STOKER_SOAK_SEED to replay)");
  stoker::set_log_level(stoker::LogLevel::error);  // skips are expected by the thousand
  // A run that hangs is reported with its seed, then the process ends: a hang is a failure.
  constexpr auto kRunLimit = std::chrono::seconds(60);
  std::atomic<std::uint64_t> current{first};
  std::atomic<Clock::rep> started{Clock::now().time_since_epoch().count()};
  std::atomic<bool> done{false};
  std::jthread watchdog([&] {
    while (!done.load()) {
      std::this_thread::sleep_for(100ms);
      if (Clock::now().time_since_epoch() - Clock::duration(started.load()) > kRunLimit) {
        std::fprintf(stderr, "soak: a run has taken over %lld s: %s\n", static_cast<long long>(kRunLimit.count()),
                     random_spec(current.load()).str().c_str());
        std::fflush(stderr);
        std::_Exit(3);
      }
    }
  });
  const auto until = Clock::now() + std::chrono::seconds(seconds);
  int runs = 0;
  for (std::uint64_t seed = first; Clock::now() < until || runs == 0; ++seed, ++runs) {
    current = seed;
    started = Clock::now().time_since_epoch().count();
    check(random_spec(seed));
  }
  done = true;
  MESSAGE("soak: " << runs << " runs");
}
