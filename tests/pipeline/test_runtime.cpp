// SPDX-License-Identifier: Apache-2.0
// The runtime's promises under the settings users reach for: shuffles of any ratio, a host
// that limits oneTBB, stage functions that use oneTBB themselves, exceptions anywhere, stop at
// any time; and the options of the stage API.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/parallel_for.h>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <unistd.h>

#include "pipeline/pipeline_support.h"
#include "stoker/core/body_tracer.h"

using namespace stoker;
using namespace stoker::test;

namespace {

// Batches of one epoch, flattened.
std::vector<int> flatten(const std::vector<std::vector<int>>& batches) {
  std::vector<int> all;
  for (const auto& b : batches) all.insert(all.end(), b.begin(), b.end());
  return all;
}

// An item whose throw_at-th move throws, when its value is 777: each move counts, whoever
// makes it (a stage's outputs, a queue, the consumer). `live` counts those alive.
struct Fragile {
  static inline int throw_at = 0;
  static inline std::atomic<long> live{0};
  int value;
  int moves = 0;
  explicit Fragile(int v) : value(v) { ++live; }
  Fragile(Fragile&& o) : value(o.value), moves(o.moves + 1) {
    if (value == 777 && moves == throw_at) throw std::runtime_error("cannot move 777");
    ++live;
  }
  ~Fragile() { --live; }
  Fragile& operator=(Fragile&& o) {
    if (o.value == 777 && o.moves + 1 == throw_at) throw std::runtime_error("cannot move 777");
    value = o.value;
    moves = o.moves + 1;
    return *this;
  }
};

}  // namespace

TEST_SUITE("Pipeline runtime") {
  TEST_CASE(
      "a shuffle runs to the end at any min_after_dequeue / capacity, TensorFlow's recipe included, "
      "with a consumer slower than the stages" *
      doctest::timeout(120)) {
    // TensorFlow's recipe: capacity = min_after_dequeue + 3 * batch.
    const std::vector<std::pair<std::size_t, std::size_t>> shapes{{130, 100},  {100, 0}, {100, 50}, {100, 99},
                                                                  {1000, 990}, {10, 9},  {2, 1}};
    for (const auto& [capacity, min] : shapes) {
      CAPTURE(capacity);
      CAPTURE(min);
      auto pipe = PipelineBuilder{}
                      .threads(2)
                      .epochs(2)
                      .source("read", CountUpTo{3000})
                      .map("id", [](int x) { return x; }, {.threads = 2})
                      .shuffle("mix", {.capacity = capacity, .min_after_dequeue = min})
                      .batch("batch", 10)
                      .build();
      for (int e = 0; e < 2; ++e) {
        std::vector<int> all;
        for (auto& b : pipe.epoch()) {
          all.insert(all.end(), b.begin(), b.end());
          std::this_thread::sleep_for(20us);  // slower than the stages: every queue fills up
        }
        CHECK(sorted(all) == iota(3000));
      }
      CHECK(pipe.finished());
    }
  }

  TEST_CASE(
      "a pipeline's shuffle draws from everything it holds in free order, from the oldest window in "
      "deterministic mode" *
      doctest::timeout(60)) {
    // The consumer is slower than the stages, so the shuffle holds 600 to 1,000 (chunks of up
    // to 400 come in). Drawing from all held moves an element over 500 places on average; the
    // window of the oldest 201 about 150 (0.74 of min_after_dequeue).
    const auto mean_move = [](bool deterministic) {
      constexpr int kItems = 20'000;
      auto pipe = PipelineBuilder{}
                      .epochs(1)
                      .deterministic(deterministic)
                      .source("read", CountUpTo{kItems})
                      .shuffle("mix", {.capacity = 1000, .min_after_dequeue = 200, .seed = 3})
                      .batch("one", 1)
                      .build();
      double moved = 0;
      int position = 0;
      for (auto& b : pipe.epoch()) {
        moved += std::abs(b.at(0) - position++);
        if (position % 8 == 0) std::this_thread::sleep_for(50us);
      }
      return moved / kItems;
    };
    const double free_order = mean_move(false), in_order = mean_move(true);
    CAPTURE(free_order);
    CAPTURE(in_order);
    CHECK(in_order < 250);
    CHECK(free_order > 350);  // at least 600 held at each draw: chunks of up to 400 come in
  }

  TEST_CASE("a host that holds tbb::global_control(max_allowed_parallelism, 1) still runs every pipeline" *
            doctest::timeout(120)) {
    for (const std::size_t limit : {1, 2}) {
      const tbb::global_control host(tbb::global_control::max_allowed_parallelism, limit);
      for (const int threads : {1, 2, 4}) {
        CAPTURE(limit);
        CAPTURE(threads);
        auto pipe = PipelineBuilder{}
                        .threads(threads)
                        .epochs(2)
                        .source("read", CountUpTo{2000})
                        .map("sum",
                             [](int x) {
                               // oneTBB inside a stage function, too
                               std::atomic<int> n{0};
                               tbb::parallel_for(0, 8, [&](int) { n.fetch_add(1); });
                               return x + n.load() - 8;
                             },
                             {.threads = 3})
                        .flat_map<int>("twice",
                                       [](int x, Emitter<int>& emit) {
                                         emit(x);
                                         emit(x);
                                       },
                                       {.threads = 2})
                        .shuffle("mix", {.capacity = 100, .min_after_dequeue = 50})
                        .batch("batch", 16)
                        .build();
        for (int e = 0; e < 2; ++e) {
          std::vector<int> all;
          for (auto& b : pipe.epoch()) all.insert(all.end(), b.begin(), b.end());
          std::vector<int> want;
          for (int x = 0; x < 2000; ++x) want.insert(want.end(), {x, x});
          CHECK(sorted(all) == want);
        }
        CHECK(pipe.summary().threads == threads);
      }
    }
  }

  TEST_CASE("a pipeline of N threads runs its stage functions on N threads, no more" * doctest::timeout(120)) {
    // oneTBB lends a worker of its own to an arena of one slot reserved for an external thread
    // when a task is enqueued there: a pipeline of one thread then ran two bodies at once.
    for (const int threads : {1, 2}) {
      CAPTURE(threads);
      std::mutex mutex;
      std::set<std::thread::id> seen;
      auto note = [&] {
        std::lock_guard lock(mutex);
        seen.insert(std::this_thread::get_id());
      };
      auto pipe = PipelineBuilder{}
                      .threads(threads)
                      .epochs(1)
                      .source("read",
                              [&, n = 0]() mutable -> std::optional<int> {
                                note();
                                if (n == 20'000) return std::nullopt;
                                return n++;
                              })
                      .map("work",
                           [&](int x) {
                             note();
                             spin_for(2us);
                             return x;
                           },
                           {.threads = threads})
                      .batch("batch", 100)
                      .build();
      std::size_t items = 0;
      for (auto& b : pipe.epoch()) items += b.size();
      CHECK(items == 20'000);
      CHECK(seen.size() <= static_cast<std::size_t>(threads));
      CHECK(seen.count(std::this_thread::get_id()) == 0);
    }
  }

  TEST_CASE(
      "a stage function that waits for oneTBB work of its own never has another body run on its thread "
      "meanwhile" *
      doctest::timeout(120)) {
    // While a thread waits in parallel_for it runs tasks; without isolation they could be the
    // bodies of other stages (or of the same one), nested on its stack.
    static thread_local int inside = 0;
    std::atomic<int> nested{0};
    const auto work = [&nested](int x) {
      if (inside++ != 0) nested.fetch_add(1);
      tbb::parallel_for(0, 16, [](int) { spin_for(5us); });
      --inside;
      return x;
    };
    auto pipe = PipelineBuilder{}
                    .threads(4)
                    .epochs(1)
                    .source("read", CountUpTo{3000}, {.queue = 16})
                    .map("a", work, {.threads = 4, .queue = 16})
                    .map("b", work, {.threads = 4, .queue = 16})
                    .build();
    CHECK(sorted(drain_epoch(pipe)) == iota(3000));
    CHECK(nested.load() == 0);
  }

  TEST_CASE("many short epochs: each delivers every item once, and every call sees its own epoch" *
            doctest::timeout(120)) {
    // A body of an epoch still running when the next one begins would race with the reset of
    // its stage's state (ThreadSanitizer), or lose or repeat items. Each stage function tags
    // its item with the epoch it was called for; the consumer checks the tags.
    using Tagged = std::pair<int, std::uint32_t>;
    const auto tag = [](Tagged t, const StageContext& ctx) {
      if (t.second != ctx.epoch) t.first = -1;
      return t;
    };
    constexpr int kEpochs = 200;
    auto pipe = PipelineBuilder{}
                    .threads(3)
                    .epochs(kEpochs)
                    .source("read",
                            [n = 0](const StageContext& ctx) mutable -> std::optional<Tagged> {
                              if (n == 50) {
                                n = 0;
                                return std::nullopt;
                              }
                              return Tagged{n++, ctx.epoch};
                            },
                            {.queue = 4})
                    .map("check", tag, {.threads = 3, .queue = 4})
                    .flat_map<Tagged>(
                        "copy", [&](Tagged t, Emitter<Tagged>& emit, const StageContext& ctx) { emit(tag(t, ctx)); },
                        {.threads = 2, .queue = 4})
                    .shuffle("mix", {.capacity = 16, .min_after_dequeue = 8})
                    .batch("batch", 7, {.queue = 2})
                    .map("check again",
                         [&](std::vector<Tagged> b, const StageContext& ctx) {
                           for (auto& t : b) t = tag(t, ctx);
                           return b;
                         })
                    .build();
    std::uint32_t epochs = 0;
    for (auto epoch : pipe.epochs()) {
      std::vector<int> all;
      bool tags_right = true;
      for (auto& b : epoch)
        for (const auto& [x, e] : b) {
          all.push_back(x);
          tags_right = tags_right && e == epochs;
        }
      CHECK(sorted(all) == iota(50));
      CHECK(tags_right);
      ++epochs;
    }
    CHECK(epochs == kEpochs);
  }

  TEST_CASE(
      "a stage function that waits for what a later stage gives back runs that stage meanwhile, even on "
      "one thread" *
      doctest::timeout(60)) {
    // One token: "take" holds it in its output until "give", a later stage, drops it. With as
    // many bodies of "take" as the pipeline has threads, all of them may wait at once, and
    // "give" can only run on a thread that "take" waits on (StageContext::help_downstream).
    struct Tokens {
      std::mutex m;
      int free = 1;
    };
    auto tokens = std::make_shared<Tokens>();
    struct Held {
      int value;
      std::shared_ptr<Tokens> tokens;
      Held(int v, std::shared_ptr<Tokens> t) : value(v), tokens(std::move(t)) {}
      Held(Held&&) noexcept = default;
      Held& operator=(Held&&) noexcept = default;
      ~Held() {
        if (!tokens) return;
        std::lock_guard lock(tokens->m);
        ++tokens->free;
      }
    };
    const auto take = [tokens](int x, const StageContext& ctx) {
      for (;;) {
        {
          std::lock_guard lock(tokens->m);
          if (tokens->free > 0) {
            --tokens->free;
            return Held(x, tokens);
          }
        }
        if (ctx.stop.stop_requested()) throw PipelineStopped();
        if (!ctx.help_downstream()) std::this_thread::yield();
      }
    };
    for (const int threads : {1, 2}) {
      CAPTURE(threads);
      auto pipe = PipelineBuilder{}
                      .threads(threads)
                      .epochs(1)
                      .source("read", CountUpTo{500}, {.queue = 8})
                      .map("take", take, {.threads = threads, .queue = 8, .max_chunk = 1})
                      .map("give", [](Held h) { return h.value; })
                      .build();
      CHECK(sorted(drain_epoch(pipe)) == iota(500));
    }
  }

  TEST_CASE(
      "a failure while pushing what an emit completed fails the run even with on_error = skip, and delivers "
      "no moved-from item" *
      doctest::timeout(60)) {
    // The item's move throws once it has left the function's hands (the queue's push): not the
    // item's fault, so not a skip; the half-pushed chunk must not be sent again.
    static std::atomic<bool> armed{true};
    struct T {
      int v = 0;
      int moves = 0;
      explicit T(int x) : v(x) {}
      T(T&& o) : v(o.v), moves(o.moves + 1) {
        if (v == 5 && moves >= 2 && armed.exchange(false)) throw std::runtime_error("move failed");
        o.v = -1;
      }
      T& operator=(T&& o) {
        v = o.v;
        moves = o.moves + 1;
        o.v = -1;
        return *this;
      }
    };
    armed = true;
    auto pipe = PipelineBuilder{}
                    .threads(2)
                    .epochs(1)
                    .source("read", CountUpTo{3})
                    .flat_map<T>("f",
                                 [](int x, Emitter<T>& emit) {
                                   for (int j = 0; j < 10; ++j) emit(T(x * 100 + j));
                                 },
                                 {.queue = 8, .on_error = OnError::skip})
                    .build();
    int moved_from = 0;
    CHECK_THROWS_WITH_AS(
        [&] {
          while (auto t = pipe.next()) moved_from += t->v == -1;
        }(),
        doctest::Contains("move failed"), StageError);
    CHECK(moved_from == 0);
  }

  TEST_CASE("a body tracer that throws ends the run with a StageError, not a stall" * doctest::timeout(60)) {
    static std::atomic<int> calls{0};
    calls = 0;
    set_body_tracer({[](const char*) {
                       if (calls.fetch_add(1) == 3) throw std::runtime_error("tracer failed");
                     },
                     [] {}});
    {
      auto pipe =
          PipelineBuilder{}.threads(2).source("read", CountUpTo{1'000'000}).map("m", [](int x) { return x; }).build();
      CHECK_THROWS_WITH_AS(drain_epoch(pipe), doctest::Contains("tracer failed"), StageError);
    }
    set_body_tracer({});
  }

  TEST_CASE("stop() from another thread ends a next() that waits, which then returns nullopt" * doctest::timeout(60)) {
    std::atomic<bool> release{false};
    auto pipe = PipelineBuilder{}
                    .threads(2)
                    .source("read",
                            [&, n = 0](const StageContext& ctx) mutable -> std::optional<int> {
                              while (n == 10 && !release.load() && !ctx.stop.stop_requested())
                                std::this_thread::sleep_for(1ms);
                              return n++;
                            },
                            {.max_chunk = 1})  // its 11th call waits: items made before must not wait with it
                    .build();
    for (int i = 0; i < 10; ++i) REQUIRE(pipe.next());
    std::jthread stopper([&] {
      std::this_thread::sleep_for(50ms);
      pipe.stop();
    });
    CHECK_FALSE(pipe.next());  // waits for the 11th item until the stop
    stopper.join();
    CHECK(pipe.finished());
    CHECK_FALSE(pipe.next());
  }

  TEST_CASE("an item whose move constructor throws ends the run with a StageError, not a hang" * doctest::timeout(60)) {
    // The n-th move of item 777 throws: into the function's outputs, into the queue, out of it.
    for (const bool deterministic : {false, true}) {
      for (Fragile::throw_at = 1; Fragile::throw_at <= 3; ++Fragile::throw_at) {
        CAPTURE(deterministic);
        CAPTURE(Fragile::throw_at);
        auto pipe = PipelineBuilder{}
                        .threads(2)
                        .deterministic(deterministic)
                        .source("read", CountUpTo{5000})
                        .map("wrap", [](int x) { return Fragile(x); }, {.threads = 2})
                        .map("unwrap", [](Fragile f) { return f.value; }, {.threads = 2})
                        .build();
        CHECK_THROWS_WITH_AS(drain_epoch(pipe), doctest::Contains("cannot move 777"), StageError);
      }
    }
  }

  TEST_CASE(
      "an item whose move throws as the consumer takes it ends the run with a StageError, every next() after too" *
      doctest::timeout(60)) {
    // Moves of item 777: into the map's outputs (1), into the last queue (2), out of it into the
    // consumer's chunk (3), out of the chunk into what next() returns (4).
    for (const bool deterministic : {false, true}) {
      for (Fragile::throw_at = 3; Fragile::throw_at <= 4; ++Fragile::throw_at) {
        CAPTURE(deterministic);
        CAPTURE(Fragile::throw_at);
        // A source that seeks: in free order the pipeline then records, by origin, what the
        // consumer takes.
        auto pipe = PipelineBuilder{}
                        .threads(2)
                        .deterministic(deterministic)
                        .source("read", SeekableCount{1000})
                        .map("wrap", [](int x) { return Fragile(x); }, {.threads = 2})
                        .build();
        std::vector<int> got;
        CHECK_THROWS_WITH_AS(
            [&] {
              while (auto f = pipe.next()) got.push_back(f->value);
            }(),
            doctest::Contains("stage 'consumer' failed: cannot move 777"), StageError);
        CHECK(pipe.finished());
        CHECK_THROWS_AS(pipe.next(), StageError);  // the run's error again, not what is left
        CHECK_THROWS_AS(pipe.next(), StageError);
        CHECK(std::find(got.begin(), got.end(), 777) == got.end());
        if (deterministic) CHECK(got == iota(static_cast<int>(got.size())));  // in order up to the failure
      }
    }
  }

  TEST_CASE("a shuffle ends the life of every item it held, once, whether the run drains, stops or fails on a move" *
            doctest::timeout(120)) {
    // A shuffle makes and ends its items' lives in slots of its own, moving them in and out
    // with its lock released. Moves of item 777: into the map's outputs (1), into the shuffle
    // (2), out of it into the next stage's inputs (3); 0: none throws. A minimum of capacity - 1
    // holds nearly all it can when the consumer stops after 100, and takes chunks of one item;
    // one of 200 takes chunks of up to 400, so that a move can fail halfway through one.
    for (const bool deterministic : {false, true}) {
      for (const std::size_t min : {999, 200}) {
        for (const int throw_at : {0, 1, 2, 3}) {
          for (const int take : {100, 5000}) {
            CAPTURE(deterministic);
            CAPTURE(min);
            CAPTURE(throw_at);
            CAPTURE(take);
            Fragile::throw_at = throw_at;
            const long alive = Fragile::live.load();
            bool failed = false;
            {
              auto pipe = PipelineBuilder{}
                              .threads(2)
                              .deterministic(deterministic)
                              .epochs(1)
                              .source("read", CountUpTo{5000})
                              .map("wrap", [](int x) { return Fragile(x); }, {.threads = 2})
                              .shuffle("mix", {.capacity = 1000, .min_after_dequeue = min})
                              .map("unwrap", [](Fragile f) { return f.value; }, {.threads = 2})
                              .build();
              std::vector<int> got;
              try {
                while (got.size() < static_cast<std::size_t>(take))
                  if (auto x = pipe.next())
                    got.push_back(*x);
                  else
                    break;
              } catch (const StageError& e) {
                failed = true;
                CHECK(std::string(e.what()).find("cannot move 777") != std::string::npos);
              }
              if (throw_at == 0) {
                CHECK_FALSE(failed);
                CHECK(got.size() == static_cast<std::size_t>(take));
                if (take == 5000) CHECK(sorted(got) == iota(5000));
              } else {
                if (take == 5000) CHECK(failed);
                CHECK(std::find(got.begin(), got.end(), 777) == got.end());
              }
            }  // stopped, if it still ran, and destroyed
            CHECK(Fragile::live.load() == alive);
          }
        }
      }
    }
    Fragile::throw_at = 0;
  }

  TEST_CASE("a shuffle resumed exactly ends the life of every item it put back, when a move throws too" *
            doctest::timeout(120)) {
    // A deterministic resume makes again the items the shuffle held (777 among them) and moves
    // them into its slots; whichever move of 777 throws, no item outlives the pipeline.
    auto make = [](const std::optional<PipelineState>& from) {
      auto b = PipelineBuilder{}
                   .threads(2)
                   .deterministic(true)
                   .epochs(1)
                   .source("read", SeekableCount{3000})
                   .map("wrap", [](int x) { return Fragile(x); })
                   .shuffle("mix", {.capacity = 1000, .min_after_dequeue = 999})
                   .map("unwrap", [](Fragile f) { return f.value; });
      if (from) b.resume_from(*from);
      return b.build();
    };
    Fragile::throw_at = 0;
    std::optional<PipelineState> state;
    {
      auto pipe = make(std::nullopt);
      for (int i = 0; i < 100; ++i) REQUIRE(pipe.next() != 777);
      state = pipe.state();
    }
    int failed = 0;
    for (int throw_at = 1; throw_at <= 4; ++throw_at) {
      CAPTURE(throw_at);
      Fragile::throw_at = throw_at;
      const long alive = Fragile::live.load();
      try {
        auto pipe = make(state);
        while (pipe.next()) {
        }
      } catch (const std::exception& e) {
        ++failed;
        CHECK(std::string(e.what()).find("cannot move 777") != std::string::npos);
      }
      CHECK(Fragile::live.load() == alive);
    }
    CHECK(failed == 4);
    Fragile::throw_at = 0;
  }

  TEST_CASE("on_error = skip drops every output of a flat_map call that fails, those emitted before the error too" *
            doctest::timeout(60)) {
    // Input x % 7 == 3 emits one past its fanout of 3; x % 7 == 5 throws after its 3 outputs.
    for (const bool deterministic : {false, true}) {
      CAPTURE(deterministic);
      std::mutex m;
      std::vector<std::uint64_t> indices;  // what the stage after saw, StageContext::index
      std::vector<int> got;
      PipelineSummary summary;
      {
        // One epoch: an endless pipeline makes the next epoch's first items (the same indices,
        // more skips) while the consumer drains this one.
        auto pipe = PipelineBuilder{}
                        .threads(2)
                        .deterministic(deterministic)
                        .epochs(1)
                        .source("read", CountUpTo{700})
                        .flat_map<int>("triple",
                                       [](int x, Emitter<int>& emit) {
                                         for (int j = 0; j < 3; ++j) emit(x * 10 + j);
                                         if (x % 7 == 3) emit(x * 10 + 3);
                                         if (x % 7 == 5) throw std::runtime_error("after its outputs");
                                       },
                                       {.threads = 2, .queue = 16, .on_error = OnError::skip, .fanout = 3})
                        .map("seen",
                             [&](int v, const StageContext& ctx) {
                               std::lock_guard lock(m);
                               indices.push_back(ctx.index);
                               return v;
                             },
                             {.threads = 2})
                        .build();
        got = drain_epoch(pipe);
        summary = pipe.summary();
      }
      std::vector<int> want;
      for (int x = 0; x < 700; ++x)
        if (x % 7 != 3 && x % 7 != 5)
          for (int j = 0; j < 3; ++j) want.push_back(x * 10 + j);
      CHECK(sorted(got) == want);
      if (deterministic) CHECK(got == want);
      std::sort(indices.begin(), indices.end());
      CHECK(std::adjacent_find(indices.begin(), indices.end()) == indices.end());  // each index once
      CHECK(indices.size() == want.size());
      CHECK(summary.stages[1].skipped == 200);
      CHECK(summary.stages[1].items_out == want.size());
    }
  }

  TEST_CASE("on_error = skip: a flat_map call that fails after a chunk of its own has gone on ends the run, saying so" *
            doctest::timeout(60)) {
    // A queue of 8 takes chunks of 4: the call's first 8 outputs have gone on when it throws.
    auto pipe = PipelineBuilder{}
                    .source("read", CountUpTo{100})
                    .flat_map<int>("many",
                                   [](int x, Emitter<int>& emit) {
                                     for (int j = 0; j < 10; ++j) emit(x * 100 + j);
                                     if (x == 50) throw std::runtime_error("late failure");
                                   },
                                   {.queue = 8, .on_error = OnError::skip})
                    .build();
    std::string what;
    try {
      drain_epoch(pipe);
    } catch (const StageError& e) {
      what = e.what();
    }
    CHECK(what.find("stage 'many' failed: input 50 of epoch 0 failed after") != std::string::npos);
    CHECK(what.find("on_error = skip cannot take back") != std::string::npos);
    CHECK(what.find("late failure") != std::string::npos);
  }

  TEST_CASE("on_epoch_start runs before any item of its epoch is made, and what it sets holds for the whole epoch" *
            doctest::timeout(60)) {
    int weight = -1;  // not atomic: the hook writes it while no body runs (ThreadSanitizer checks that)
    std::vector<std::uint32_t> started;
    std::atomic<int> wrong{0};
    auto pipe = PipelineBuilder{}
                    .threads(2)
                    .epochs(3)
                    .on_epoch_start([&](std::uint32_t epoch) {
                      started.push_back(epoch);
                      weight = static_cast<int>(epoch) * 1000;
                    })
                    .source("read", CountUpTo{500}, {.queue = 8})
                    .map("weigh",
                         [&](int x, const StageContext& ctx) {
                           if (weight != static_cast<int>(ctx.epoch) * 1000) ++wrong;
                           return x + weight;
                         },
                         {.threads = 2, .queue = 8})
                    .build();
    CHECK(started == std::vector<std::uint32_t>{0});  // in build()
    for (int e = 0; e < 3; ++e) {
      CAPTURE(e);
      std::vector<int> want = iota(500);
      for (int& x : want) x += e * 1000;
      CHECK(sorted(drain_epoch(pipe)) == want);
    }
    CHECK(started == std::vector<std::uint32_t>{0, 1, 2});
    CHECK(wrong.load() == 0);
    CHECK(pipe.finished());
  }

  TEST_CASE("an exception from on_epoch_start leaves build(), or ends the run as a StageError naming it") {
    auto build = [](std::uint32_t failing) {
      return PipelineBuilder{}
          .epochs(3)
          .on_epoch_start([failing](std::uint32_t epoch) {
            if (epoch == failing) throw std::runtime_error("no curriculum for epoch " + std::to_string(epoch));
          })
          .source("read", CountUpTo{10})
          .build();
    };
    CHECK_THROWS_WITH_AS(build(0), "no curriculum for epoch 0", std::runtime_error);
    auto pipe = build(1);
    std::vector<int> got;
    // The next() that would return the first epoch's end starts the next epoch, which fails.
    CHECK_THROWS_WITH_AS(
        [&] {
          while (auto x = pipe.next()) got.push_back(*x);
        }(),
        doctest::Contains("stage 'on_epoch_start' failed: no curriculum for epoch 1"), StageError);
    CHECK(got == iota(10));
    CHECK(pipe.finished());
    CHECK_THROWS_AS(pipe.next(), StageError);
  }

  TEST_CASE("a counters() callback that throws while the pipeline is destroyed is logged, not fatal" *
            doctest::timeout(60)) {
    const TempDir dir("runtime");
    const auto log = dir / "throwing-counters.jsonl";
    {
      auto pipe = PipelineBuilder{}
                      .epochs(1)
                      .occupancy_log(log.string(), 5ms)
                      .counters([]() -> std::vector<Counter> { throw std::runtime_error("device lost"); })
                      .source("read", CountUpTo{100})
                      .build();
      CHECK(drain_epoch(pipe).size() == 100);
    }  // ~Pipeline writes the log's last records, which calls counters()
    CHECK(std::filesystem::exists(log));
  }

  TEST_CASE("stop() returns within one item's time even when a body holds a chunk of slow items" *
            doctest::timeout(60)) {
    // Thousands of cheap items make chunks long; then every item takes 20 ms. A body that
    // finished its chunk before looking at stop would hold stop() for up to a chunk of them.
    std::atomic<bool> slow{false};
    auto pipe = PipelineBuilder{}
                    .threads(2)
                    .source("read", [n = 0]() mutable { return std::optional<int>(n++); })
                    .map("work",
                         [&](int x) {
                           if (slow.load()) std::this_thread::sleep_for(20ms);
                           return x;
                         },
                         {.threads = 2})
                    .build();
    for (int i = 0; i < 20'000; ++i) REQUIRE(pipe.next());
    slow = true;
    std::this_thread::sleep_for(30ms);  // both bodies are inside chunks of items that turned slow
    const auto t0 = Clock::now();
    pipe.stop();
    CHECK(ms_since(t0) < 100.0);
  }

  TEST_CASE(
      "a producer waiting with a chunk that does not fit is reported beside its queue, whose size is what it "
      "holds" *
      doctest::timeout(60)) {
    // Capacity 9: chunks of up to 4 leave room for 1 once two are in; a producer then waits
    // with its next chunk while the queue holds 8 of 9. A consumer can take those 8, not the
    // chunk, which the log reports as waiting: the queue is full for its producer all the same.
    const TempDir dir("runtime");
    const auto log = dir / "waiting-producer.jsonl";
    std::size_t waiting_samples = 0;
    {
      auto pipe = PipelineBuilder{}
                      .epochs(1)
                      .occupancy_log(log.string(), 2ms)
                      .source("read", CountUpTo{200'000}, {.queue = 9})
                      .build();
      for (int i = 0; i < 100'000; ++i) REQUIRE(pipe.next());
      std::this_thread::sleep_for(200ms);  // the consumer pauses: the source waits
      const auto s = pipe.summary();
      REQUIRE(s.queues.size() == 1);
      CHECK(s.queues[0].size <= 9);
      CHECK(s.queues[0].waiting > 0);
      CHECK(s.queues[0].size + s.queues[0].waiting > 9);
      while (pipe.next()) {
      }
    }
    std::ifstream in(log);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.at("type") != "sample") continue;
      const auto size = j.at("size").get<std::size_t>(), waiting = j.at("waiting").get<std::size_t>();
      CHECK(size <= 9);
      if (waiting > 0 && size + waiting > 9) ++waiting_samples;
    }
    CHECK(waiting_samples >= 50);  // about 100 samples during the pause
  }

  TEST_CASE("pipeline options set after the stages take effect: deterministic, seed, threads") {
    const auto run = [](std::uint64_t seed) {
      auto pipe = PipelineBuilder{}
                      .source("read", CountUpTo{2000})
                      .map("jitter",
                           [](int x, const StageContext& ctx) {
                             spin_for(std::chrono::microseconds(derive_seed(ctx.seed, x) % 20));
                             return x;
                           },
                           {.threads = 4})
                      .shuffle("mix", {.capacity = 300, .min_after_dequeue = 100})  // no seed of its own
                      .batch("batch", 10)
                      .deterministic()  // late
                      .seed(seed)       // late
                      .threads(3)       // late
                      .epochs(1)
                      .build();
      CHECK(pipe.summary().threads == 3);
      std::vector<std::vector<int>> batches;
      for (auto& b : pipe.epoch()) batches.push_back(b);
      return flatten(batches);
    };
    const auto a = run(1), b = run(1), c = run(2);
    CHECK(sorted(a) == iota(2000));
    CHECK(a == b);  // deterministic, though the map's threads finish out of order
    CHECK(a != c);  // the shuffle's seed follows the pipeline's
  }

  TEST_CASE("items and functions that compile: a move-only map function, an item with a const member, bool") {
    // A lambda owning a unique_ptr: the stage keeps the one function, and copy_per_body says it cannot copy it.
    auto offset = std::make_unique<int>(100);
    auto moved = PipelineBuilder{}
                     .epochs(1)
                     .source("read", CountUpTo{5})
                     .map("add", [o = std::move(offset)](int x) { return x + *o; }, {.threads = 2})
                     .build();
    CHECK(sorted(drain_epoch(moved)) == std::vector<int>{100, 101, 102, 103, 104});
    CHECK_THROWS_WITH_AS(
        PipelineBuilder{}
            .source("read", CountUpTo{5})
            .map("add", [o = std::make_unique<int>(1)](int x) { return x + *o; }, {.copy_per_body = true}),
        doctest::Contains("copy_per_body needs a function that can be copied"), std::invalid_argument);

    struct Named {  // not assignable
      const int id;
      std::string name;
    };
    auto named = PipelineBuilder{}
                     .epochs(1)
                     .deterministic()
                     .source("read",
                             [n = 0]() mutable -> std::optional<Named> {
                               if (n == 20) return std::nullopt;
                               const int id = n++;
                               return Named{id, std::to_string(id)};
                             })
                     .map("same", [](Named x) { return x; }, {.threads = 2})
                     .shuffle("mix", {.capacity = 8, .min_after_dequeue = 4})
                     .batch("batch", 6)
                     .build();
    std::vector<int> ids;
    for (auto& batch : named.epoch())
      for (const Named& x : batch) {
        CHECK(x.name == std::to_string(x.id));
        ids.push_back(x.id);
      }
    CHECK(sorted(ids) == iota(20));
    // ...and reaches the consumer's loop unbatched.
    auto unbatched = PipelineBuilder{}
                         .epochs(1)
                         .source("read",
                                 [n = 0]() mutable -> std::optional<Named> {
                                   if (n == 5) return std::nullopt;
                                   const int id = n++;
                                   return Named{id, std::to_string(id)};
                                 })
                         .build();
    ids.clear();
    for (const Named& x : unbatched.epoch()) ids.push_back(x.id);
    CHECK(sorted(ids) == iota(5));

    // bool items, whose chunks are std::vector<bool> (proxies, not bool&), through every kind of
    // queue, a stop and a resume. 7 of 20 are true (n % 3 == 0); the map flips them.
    struct Bools {
      std::uint64_t n = 0;
      std::optional<bool> operator()() {
        if (n == 20) return std::nullopt;
        return n++ % 3 == 0;
      }
      void seek(std::uint64_t i) { n = i; }
    };
    auto bools = [] {
      return PipelineBuilder{}
          .epochs(1)
          .deterministic()
          .source("read", Bools{})
          .shuffle("mix", {.capacity = 8, .min_after_dequeue = 4})
          .map("not", [](bool b) { return !b; }, {.threads = 2});
    };
    auto flipped = bools().build();
    int trues = 0, count = 0;
    for (bool b : flipped.epoch()) trues += b, ++count;
    CHECK(count == 20);
    CHECK(trues == 13);
    auto batched = bools().batch("batch", 6).build();
    const std::optional<std::vector<bool>> first = batched.next();
    REQUIRE(first);
    CHECK(first->size() == 6);
    const PipelineState state = batched.state();
    batched.stop();
    auto resumed = bools().batch("batch", 6).resume_from(state).build();
    trues = static_cast<int>(std::count(first->begin(), first->end(), true));
    count = 6;
    for (auto& batch : resumed.epoch()) {
      trues += static_cast<int>(std::count(batch.begin(), batch.end(), true));
      count += static_cast<int>(batch.size());
    }
    CHECK(count == 20);
    CHECK(trues == 13);
  }

  TEST_CASE("next() while another thread is in it is refused: a pipeline has one consumer" * doctest::timeout(30)) {
    std::atomic<bool> release{false};
    auto pipe = PipelineBuilder{}
                    .epochs(1)
                    .source("read",
                            [n = 0, &release]() mutable -> std::optional<int> {
                              while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
                              if (n == 3) return std::nullopt;
                              return n++;
                            })
                    .build();
    std::optional<int> first;
    std::thread consumer([&] { first = pipe.next(); });  // waits in next() until the source is released
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    std::thread watchdog([&] {  // should the consumer not be in next() yet, the call below ends anyway
      for (int i = 0; i < 500 && !release; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      release = true;
    });
    CHECK_THROWS_WITH_AS(pipe.next(), doctest::Contains("called while another thread is in it"), std::logic_error);
    release = true;
    consumer.join();
    watchdog.join();
    CHECK(first == 0);
    // One at a time, any thread may consume.
    std::thread([&] { CHECK(pipe.next() == 1); }).join();
    CHECK(pipe.next() == 2);
    CHECK(pipe.next() == std::nullopt);
  }

  TEST_CASE("StageContext is a plain aggregate; its ties to the pipeline hold on the call's thread, during the call") {
    static_assert(std::is_aggregate_v<StageContext>);
    const StageContext made{.seed = 7, .epoch = 2};  // outside a pipeline, as the docs show
    CHECK(made.seed == 7);
    CHECK_FALSE(made.in_pipeline());
    CHECK_FALSE(made.help_downstream());
    std::atomic<int> inside{0}, copies{0}, other_threads{0};
    auto pipe = PipelineBuilder{}
                    .epochs(1)
                    .threads(2)
                    .source("read", CountUpTo{8})
                    .map("wait",
                         [&](int x, const StageContext& ctx) {
                           inside += ctx.in_pipeline();
                           const StageContext copy = ctx;
                           copies += copy.in_pipeline();
                           std::thread([&] { other_threads += ctx.in_pipeline(); }).join();
                           const BlockedTime waiting(ctx);  // counted: the call's own thread
                           std::this_thread::sleep_for(std::chrono::milliseconds(5));
                           return x;
                         })
                    .build();
    CHECK(drain_epoch(pipe).size() == 8);
    CHECK(inside == 8);
    CHECK(copies == 0);
    CHECK(other_threads == 0);
    const PipelineSummary s = pipe.summary();
    const auto wait =
        std::find_if(s.stages.begin(), s.stages.end(), [](const StageStats& st) { return st.name == "wait"; });
    REQUIRE(wait != s.stages.end());
    CHECK(wait->pool_wait >= std::chrono::milliseconds(8 * 5 / 2));  // 40 ms of sleep, averaged over 2 threads at most
    CHECK(wait->busy < std::chrono::milliseconds(8 * 5));
  }

  TEST_CASE("options() sets every option at once: first, then setters change it; after a setter, an error") {
    // After setters it undid them silently (.threads(1).epochs(1).options({.seed = 3}) ran 2 epochs on 2 threads).
    PipelineOptions seed3;
    seed3.seed = 3;
    CHECK_THROWS_WITH_AS(PipelineBuilder{}.threads(1).epochs(1).options(seed3),
                         doctest::Contains("would undo the setters called before it"), std::logic_error);
    CHECK_THROWS_AS(PipelineBuilder{}.source("read", CountUpTo{5}).seed(2).options(seed3), std::logic_error);
    PipelineOptions first = seed3;
    first.threads = 2;
    first.epochs = 5;
    auto pipe = PipelineBuilder{}
                    .options(first)
                    .threads(1)
                    .epochs(1)
                    .source("read", CountUpTo{5})
                    .map("seed", [](int, const StageContext& ctx) { return ctx.seed; })
                    .build();
    CHECK(pipe.summary().threads == 1);
    std::vector<std::uint64_t> seeds;
    for (auto epoch : pipe.epochs())
      for (auto s : epoch) seeds.push_back(s);
    CHECK(seeds == std::vector<std::uint64_t>(5, 3));  // one epoch, the seed options() set
  }

  TEST_CASE("epochs() ends with the run; next() is nullopt at each epoch's end and after the run") {
    auto pipe = PipelineBuilder{}.epochs(3).source("read", CountUpTo{10}).build();
    int epochs = 0;
    for (auto epoch : pipe.epochs()) {
      std::vector<int> items;
      for (int x : epoch) items.push_back(x);
      CHECK(items == iota(10));
      ++epochs;
    }
    CHECK(epochs == 3);
    CHECK(pipe.finished());
    CHECK_FALSE(pipe.next());
    int after = 0;
    for ([[maybe_unused]] auto epoch : pipe.epochs()) ++after;
    CHECK(after == 0);
  }

  TEST_CASE("StageContext: each item has its own index in the epoch, each running call its own body" *
            doctest::timeout(60)) {
    for (const bool deterministic : {false, true}) {
      CAPTURE(deterministic);
      std::mutex m;
      std::vector<std::set<std::uint64_t>> seen(2);
      std::vector<std::atomic<int>> in_body(4);
      std::atomic<int> clash{0}, bad_body{0};
      auto pipe = PipelineBuilder{}
                      .epochs(2)
                      .threads(4)
                      .deterministic(deterministic)
                      .source("read", CountUpTo{3000})
                      .map("look",
                           [&](int x, const StageContext& ctx) {
                             if (ctx.body < 0 || ctx.body >= 4) {
                               bad_body.fetch_add(1);
                               return x;
                             }
                             auto& here = in_body[static_cast<std::size_t>(ctx.body)];
                             if (here.fetch_add(1) != 0) clash.fetch_add(1);
                             spin_for(2us);
                             {
                               std::lock_guard lock(m);
                               seen[ctx.epoch].insert(ctx.index);
                             }
                             here.fetch_sub(1);
                             return x;
                           },
                           {.threads = 4})
                      .build();
      for (int e = 0; e < 2; ++e) CHECK(drain_epoch(pipe).size() == 3000);
      for (const auto& s : seen) {
        CHECK(s.size() == 3000);
        CHECK(*s.rbegin() == 2999);
      }
      CHECK(clash.load() == 0);
      CHECK(bad_body.load() == 0);
    }
  }

  TEST_CASE("copy_per_body: every body calls a copy of its own, so a function that is not thread-safe works") {
    struct Counting {
      std::shared_ptr<std::atomic<int>> copies = std::make_shared<std::atomic<int>>(0);
      std::shared_ptr<std::mutex> m = std::make_shared<std::mutex>();
      std::shared_ptr<std::set<const void*>> callers = std::make_shared<std::set<const void*>>();
      bool busy = false;  // not thread-safe on purpose
      int operator()(int x) {
        if (busy) throw std::logic_error("two calls at once on one copy");
        busy = true;
        spin_for(3us);
        {
          std::lock_guard lock(*m);
          callers->insert(this);
        }
        busy = false;
        return x;
      }
    };
    Counting f;
    auto pipe = PipelineBuilder{}
                    .epochs(1)
                    .threads(4)
                    .source("read", CountUpTo{5000})
                    .map("own", f, {.threads = 4, .copy_per_body = true})
                    .build();
    CHECK(sorted(drain_epoch(pipe)) == iota(5000));
    CHECK(f.callers->size() >= 1);
    CHECK(f.callers->size() <= 4);
  }

  TEST_CASE("on_error = skip drops the items whose function throws, counts them, and goes on" * doctest::timeout(60)) {
    const TempDir dir("runtime");
    const auto log = dir / "skips.jsonl";
    std::vector<int> got;
    PipelineSummary summary;
    {
      auto pipe = PipelineBuilder{}
                      .epochs(1)
                      .occupancy_log(log.string())
                      .source("read",
                              [n = 0]() mutable -> std::optional<int> {
                                if (n == 1000) return std::nullopt;
                                if (++n % 100 == 0) throw std::runtime_error("unreadable record");
                                return n;
                              },
                              {.on_error = OnError::skip})
                      .map("decode",
                           [](int x) {
                             if (x % 7 == 0) throw std::invalid_argument("bad record " + std::to_string(x));
                             return x;
                           },
                           {.threads = 2, .on_error = OnError::skip})
                      .build();
      for (int x : pipe.epoch()) got.push_back(x);
      summary = pipe.summary();
    }
    std::vector<int> want;
    for (int n = 1; n <= 1000; ++n)
      if (n % 100 != 0 && n % 7 != 0) want.push_back(n);
    CHECK(sorted(got) == want);
    REQUIRE(summary.stages.size() == 2);
    CHECK(summary.stages[0].skipped == 10);
    CHECK(summary.stages[1].skipped == 990 - want.size());  // of the 990 read, the multiples of 7
    std::ifstream in(log);
    bool logged = false;
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.at("type") == "stage" && j.at("stage") == "decode") logged = j.at("skipped") == summary.stages[1].skipped;
    }
    CHECK(logged);
  }

  TEST_CASE("a stage's threads are limited to 1..64, named in the error") {
    auto src = [] { return PipelineBuilder{}.source("read", CountUpTo{1}); };
    CHECK_THROWS_WITH(src().map("m", [](int x) { return x; }, {.threads = 65}), doctest::Contains("'m'"));
    CHECK_THROWS_WITH(src().map("m", [](int x) { return x; }, {.threads = 0}), doctest::Contains("threads"));
  }
}
