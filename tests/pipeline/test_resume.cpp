// SPDX-License-Identifier: Apache-2.0
// Exact resume: Pipeline::state() and PipelineBuilder::resume_from().
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "pipeline/pipeline_support.h"
#include "stoker/core/pipeline.h"
#include "stoker/core/random.h"
#include "stoker/core/state.h"

using namespace stoker;
using namespace stoker::test;

namespace {

// What crosses the pipeline: which input it came from, which of its outputs, and draws that
// depend on the context each stage's call got (a wrong index or epoch changes them).
struct Item {
  std::uint64_t source = 0, mapped = 0, draw = 0;
  std::uint32_t part = 0;
  bool operator==(const Item&) const = default;
};

// A source of 0 .. n-1 per epoch that can start anywhere, counting its seeks, and holding the
// pipeline to seek()'s contract (docs/resume.md): an index at most the epoch's size.
struct Numbers {
  std::uint64_t n = 0;
  std::shared_ptr<std::atomic<int>> seeks = std::make_shared<std::atomic<int>>(0);
  std::uint64_t next = 0;
  std::optional<std::uint64_t> operator()() {
    if (next >= n) {
      next = 0;
      return std::nullopt;
    }
    return next++;
  }
  void seek(std::uint64_t k) {
    ++*seeks;
    if (k > n) throw std::out_of_range("seek(" + std::to_string(k) + ") in an epoch of " + std::to_string(n));
    next = k;
  }
  std::string fingerprint() const { return "numbers below " + std::to_string(n); }
};

struct Shape {
  std::uint64_t items = 1000;  // per epoch, from the source
  std::size_t fanout = 3;
  std::size_t capacity = 200, min_after_dequeue = 100;  // capacity 0: no shuffle
  std::size_t batch = 16;
  bool drop_remainder = false;
  std::uint32_t epochs = 2;
  bool deterministic = true;
  bool mark_batches = true;    // the check stage marks each batch with its index
  bool after_shuffle = false;  // a flat_map (fanout 2) and a map between the shuffle and the batch
};

using Batch = std::vector<Item>;

// A source whose data cannot be read even to describe it.
struct Unreadable : Numbers {
  std::string fingerprint() const { throw std::runtime_error("data/x.idx: truncated"); }
};

// A map whose output depends on what it saw before: no resume can rebuild that.
struct RunningSum {
  static constexpr bool resumable = false;
  std::uint64_t sum = 0;
  std::uint64_t operator()(std::uint64_t x) { return sum += x; }
};

Pipeline<Batch> build(const Shape& s, int threads, const std::optional<PipelineState>& resume = std::nullopt,
                      Numbers source = {}) {
  source.n = s.items;
  auto b =
      PipelineBuilder{}
          .threads(threads)
          .seed(7)
          .deterministic(s.deterministic)
          .epochs(s.epochs)
          .source("numbers", source, {.queue = 32})
          .map("map",
               [](std::uint64_t x, const StageContext& ctx) {
                 return Item{x, x * 7 + 1, derive_seed(ctx.seed, ctx.epoch, ctx.index), 0};
               },
               {.threads = threads, .queue = 32})
          .flat_map<Item>("parts",
                          [fanout = s.fanout](Item x, Emitter<Item>& emit, const StageContext& ctx) {
                            for (std::uint32_t j = 0; j < fanout; ++j)
                              emit(Item{x.source, x.mapped, derive_seed(x.draw, ctx.index, j), j});
                          },
                          {.threads = threads, .queue = std::max<std::size_t>(s.capacity, 32), .fanout = s.fanout});
  if (s.capacity != 0) b.shuffle("shuffle", {.capacity = s.capacity, .min_after_dequeue = s.min_after_dequeue});
  if (s.after_shuffle)
    b = b.flat_map<Item>("halves",
                         [](Item x, Emitter<Item>& emit, const StageContext& ctx) {
                           for (std::uint32_t j = 0; j < 2; ++j)
                             emit(Item{x.source, x.mapped, derive_seed(x.draw, ctx.index, j), x.part * 2 + j});
                         },
                         {.threads = threads, .queue = 32, .fanout = 2})
            .map("touch",
                 [](Item x, const StageContext& ctx) {
                   x.mapped ^= ctx.index;
                   return x;
                 },
                 {.threads = threads, .queue = 32});
  auto batched = b.batch("batch", s.batch, {.drop_remainder = s.drop_remainder, .queue = 4})
                     .map("check",
                          [mark = s.mark_batches](Batch v, const StageContext& ctx) {
                            if (mark && !v.empty()) v.front().draw ^= ctx.index;  // the batch's index counts too
                            return v;
                          },
                          {.threads = threads, .queue = 4});
  if (resume) batched.resume_from(*resume);
  return batched.build();
}

// Every batch of the run, epoch by epoch.
std::vector<std::vector<Batch>> whole_run(Pipeline<Batch>& pipe) {
  std::vector<std::vector<Batch>> run;
  for (auto epoch : pipe.epochs()) {
    run.emplace_back();
    for (auto& batch : epoch) run.back().push_back(std::move(batch));
  }
  return run;
}

// Takes `cut` batches of epoch `epoch` (after the epochs before it) with `threads_before`
// threads, then resumes from a state read back from its JSON with `threads_after` threads, and
// checks that the rest equals `reference`'s. Returns the items the rebuild made again.
int check_resume(const Shape& s, const std::vector<std::vector<Batch>>& reference, std::uint32_t epoch, std::size_t cut,
                 int threads_before, int threads_after) {
  CAPTURE(epoch);
  CAPTURE(cut);
  CAPTURE(threads_before);
  CAPTURE(threads_after);
  PipelineState state;
  {
    auto pipe = build(s, threads_before);
    for (std::uint32_t e = 0; e < epoch; ++e) drain_epoch(pipe);
    for (std::size_t i = 0; i < cut; ++i) REQUIRE(pipe.next().has_value());
    state = pipe.state();
  }
  CHECK(state.epoch == epoch);
  CHECK(state.consumed == cut);
  const auto read_back = PipelineState::from_json(state.to_json());
  CHECK(read_back == state);

  Numbers source;
  auto resumed = build(s, threads_after, read_back, source);
  const int remade = *source.seeks - 1;  // one seek per item made again, and one to start
  std::vector<std::vector<Batch>> rest = whole_run(resumed);
  REQUIRE(rest.size() == reference.size() - epoch);
  for (std::size_t e = 0; e < rest.size(); ++e) {
    const auto& want = reference[epoch + e];
    const std::size_t skip = e == 0 ? cut : 0;
    REQUIRE(rest[e].size() == want.size() - skip);
    for (std::size_t i = 0; i < rest[e].size(); ++i) {
      CAPTURE(i);
      REQUIRE(rest[e][i] == want[skip + i]);
    }
  }
  return remade;
}

void check_shape(const Shape& s) {
  auto pipe = build(s, 2);
  const auto reference = whole_run(pipe);
  REQUIRE(reference.size() == s.epochs);
  const std::size_t batches = reference[0].size();
  for (const std::size_t cut : {std::size_t{0}, std::size_t{1}, batches / 2, batches - 1, batches}) {
    const int remade = check_resume(s, reference, 0, cut, 2, 1);
    // The shuffle held at most min_after_dequeue items, each from one source item; a FIFO none.
    CHECK(remade <= static_cast<int>(s.capacity == 0 ? 0 : s.min_after_dequeue));
  }
  check_resume(s, reference, 1, batches / 3, 1, 4);
}

// Free order promises the items, not their order: an epoch's items, sorted.
std::vector<Item> items_of(const std::vector<Batch>& batches) {
  std::vector<Item> items;
  for (const auto& b : batches) items.insert(items.end(), b.begin(), b.end());
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return std::tie(a.source, a.part, a.draw) < std::tie(b.source, b.part, b.draw);
  });
  return items;
}

// Free order: takes `cut` batches of epoch `epoch`, resumes from the state read back from JSON
// (from `resume` when given: a resumed run taken again), and checks that the batches taken and
// the rest of the run hold every item of each epoch of `reference` exactly once. Returns the
// state, so that a test can resume it again.
PipelineState check_free_resume(const Shape& s, const std::vector<std::vector<Item>>& reference, std::uint32_t epoch,
                                std::size_t cut, int threads_before, int threads_after,
                                const std::optional<PipelineState>& resume = std::nullopt,
                                std::vector<Batch> taken_before = {}) {
  CAPTURE(epoch);
  CAPTURE(cut);
  CAPTURE(threads_before);
  CAPTURE(threads_after);
  std::vector<Batch> taken = std::move(taken_before);
  PipelineState state;
  {
    auto pipe = build(s, threads_before, resume);
    if (!resume)
      for (std::uint32_t e = 0; e < epoch; ++e) drain_epoch(pipe);
    for (std::size_t i = 0; i < cut; ++i) taken.push_back(*pipe.next());
    state = pipe.state();
  }
  REQUIRE(!state.deterministic);
  REQUIRE(state.taken);
  CHECK(state.epoch == epoch);
  const auto read_back = PipelineState::from_json(state.to_json());
  CHECK(read_back == state);

  auto resumed = build(s, threads_after, read_back);
  auto rest = whole_run(resumed);
  REQUIRE(rest.size() == reference.size() - epoch);
  rest.front().insert(rest.front().end(), taken.begin(), taken.end());
  for (std::size_t e = 0; e < rest.size(); ++e) {
    CAPTURE(e);
    const auto got = items_of(rest[e]);
    const auto& want = reference[epoch + e];
    if (!s.drop_remainder) {
      REQUIRE(got == want);
      continue;
    }
    // A short last batch is dropped: which items it held is free order's choice.
    REQUIRE(got.size() == want.size() / s.batch * s.batch);
    REQUIRE(std::adjacent_find(got.begin(), got.end()) == got.end());
    REQUIRE(std::includes(want.begin(), want.end(), got.begin(), got.end(), [](const Item& a, const Item& b) {
      return std::tie(a.source, a.part, a.draw) < std::tie(b.source, b.part, b.draw);
    }));
  }
  return state;
}

// The items of every epoch: the same in free order as in deterministic mode, only their order
// differs (every stage function sees the same StageContext::index for the same item).
// In free order a batch's index does not name the same items on every run: the check stage
// leaves the items alone.
void check_free_shape(Shape shape) {
  shape.mark_batches = false;
  Shape s = shape;
  s.drop_remainder = false;  // the reference holds every item
  std::vector<std::vector<Item>> reference;
  {
    auto pipe = build(s, 2);
    for (const auto& epoch : whole_run(pipe)) reference.push_back(items_of(epoch));
  }
  s = shape;
  s.deterministic = false;
  if (!s.drop_remainder) {
    auto pipe = build(s, 2);
    const auto run = whole_run(pipe);
    REQUIRE(run.size() == reference.size());
    for (std::size_t e = 0; e < run.size(); ++e) CHECK(items_of(run[e]) == reference[e]);
  }
  const std::size_t batches = reference[0].size() / s.batch;
  for (const std::size_t cut : {std::size_t{0}, std::size_t{1}, batches / 2, batches - 1}) {
    check_free_resume(s, reference, 0, cut, 2, 1);
    check_free_resume(s, reference, 0, cut, 1, 3);
  }
  check_free_resume(s, reference, 1, batches / 3, 3, 2);
}

}  // namespace

TEST_SUITE("Resume") {
  TEST_CASE("a resumed pipeline yields exactly the rest of the run, at any cut and thread counts" *
            doctest::timeout(120)) {
    SUBCASE("the usual shape") { check_shape({}); }
    SUBCASE("min_after_dequeue next to the capacity") { check_shape({.capacity = 100, .min_after_dequeue = 99}); }
    SUBCASE("no shuffle minimum") { check_shape({.capacity = 50, .min_after_dequeue = 0}); }
    SUBCASE("a window larger than the epoch") {
      check_shape({.items = 40, .capacity = 500, .min_after_dequeue = 400, .batch = 7});
    }
    SUBCASE("no shuffle, batches of one, one output per input") {
      check_shape({.items = 300, .fanout = 1, .capacity = 0, .batch = 1});
    }
    SUBCASE("remainders dropped") { check_shape({.items = 997, .batch = 10, .drop_remainder = true}); }
    // A cut after the short last batch (30 = 4 x 7 + 2): 5 batches are not 35 items.
    SUBCASE("a short last batch, no shuffle") {
      check_shape({.items = 30, .fanout = 1, .capacity = 0, .batch = 7});
      check_shape({.items = 1000, .fanout = 3, .capacity = 0, .batch = 16});
    }
    SUBCASE("a flat_map and a map between the shuffle and the batch") { check_shape({.after_shuffle = true}); }
  }

  TEST_CASE("rebuilding a shuffle makes again only the items it held, not the epoch so far" * doctest::timeout(60)) {
    const Shape s{.items = 20'000, .fanout = 5, .capacity = 4000, .min_after_dequeue = 2000, .batch = 64, .epochs = 1};
    auto pipe = build(s, 2);
    const auto reference = whole_run(pipe);
    const std::size_t cut = reference[0].size() * 3 / 4;  // 75'000 items into the epoch
    const int remade = check_resume(s, reference, 0, cut, 2, 2);
    CHECK(remade > 0);
    CHECK(remade <= 2000);
    MESSAGE("items of the source made again: ", remade, " for a shuffle that held 2000 of its outputs");
  }

  TEST_CASE("a state taken after the last epoch resumes a run that is over") {
    const Shape s{.items = 50, .epochs = 1};
    auto pipe = build(s, 1);
    drain_epoch(pipe);
    REQUIRE(pipe.finished());
    auto resumed = build(s, 1, pipe.state());
    CHECK(resumed.finished());
    CHECK(!resumed.next());
  }

  TEST_CASE("a state taken after the last epoch resumes a longer run with every item of the next epoch") {
    for (const bool deterministic : {true, false}) {
      CAPTURE(deterministic);
      Shape s{.items = 50, .epochs = 1, .deterministic = deterministic, .mark_batches = deterministic};
      auto pipe = build(s, 1);
      drain_epoch(pipe);
      REQUIRE(pipe.finished());
      const auto state = PipelineState::from_json(pipe.state().to_json());
      s.epochs = 2;
      auto longer = build(s, 1);
      const auto reference = whole_run(longer);
      auto resumed = build(s, 1, state);
      const auto rest = whole_run(resumed);
      REQUIRE(rest.size() == 1);
      if (deterministic)
        CHECK(rest[0] == reference[1]);
      else
        CHECK(items_of(rest[0]) == items_of(reference[1]));
    }
  }

  TEST_CASE("state() refuses, naming why, what a resume could not reproduce") {
    SUBCASE("free order, two batch stages") {
      auto pipe = PipelineBuilder{}.source("numbers", Numbers{.n = 10}).batch("pairs", 2).batch("batch", 2).build();
      CHECK_THROWS_WITH_AS(pipe.state(),
                           doctest::Contains("one batch stage, and this pipeline has two: 'pairs' and 'batch'"),
                           StateError);
    }
    SUBCASE("free order, a flat_map after the batch") {
      auto pipe = PipelineBuilder{}
                      .source("numbers", Numbers{.n = 10})
                      .batch("batch", 2)
                      .flat_map<std::uint64_t>(
                          "unbatch", [](std::vector<std::uint64_t> v, Emitter<std::uint64_t>& e) { e(v[0]), e(v[1]); },
                          {.fanout = 2})
                      .build();
      CHECK_THROWS_WITH_AS(pipe.state(), doctest::Contains("only maps may follow, not 'unbatch' (flat_map fanout 2)"),
                           StateError);
    }
    SUBCASE("a source that cannot seek") {
      auto pipe = PipelineBuilder{}.deterministic().source("count", CountUpTo{10}).batch("batch", 2).build();
      CHECK_THROWS_WITH_AS(pipe.state(), doctest::Contains("source 'count' cannot be resumed"), StateError);
    }
    SUBCASE("a flat_map without a fanout") {
      auto pipe = PipelineBuilder{}
                      .deterministic()
                      .source("numbers", Numbers{.n = 10})
                      .flat_map<std::uint64_t>("twice", [](std::uint64_t x, Emitter<std::uint64_t>& e) { e(x), e(x); })
                      .build();
      CHECK_THROWS_WITH_AS(pipe.state(), doctest::Contains("flat_map 'twice' cannot be resumed: give it"), StateError);
    }
    SUBCASE("a function that says it cannot be resumed") {
      auto pipe =
          PipelineBuilder{}.deterministic().source("numbers", Numbers{.n = 10}).map("sum", RunningSum{}).build();
      CHECK_THROWS_WITH_AS(pipe.state(), doctest::Contains("stage 'sum' cannot be resumed: its function says so"),
                           StateError);
    }
    SUBCASE("a source whose data cannot be described: the pipeline is built, state() says why") {
      auto pipe = PipelineBuilder{}.deterministic().source("numbers", Unreadable{{.n = 10}}).build();
      CHECK_THROWS_WITH_AS(pipe.state(),
                           doctest::Contains("source 'numbers': its fingerprint() failed: data/x.idx: truncated"),
                           StateError);
    }
    SUBCASE("a stage that skipped items this epoch") {
      auto pipe = PipelineBuilder{}
                      .deterministic()
                      .source("numbers", Numbers{.n = 10})
                      .map("odd",
                           [](std::uint64_t x) {
                             if (x % 2 == 1) throw std::runtime_error("odd");
                             return x;
                           },
                           {.on_error = OnError::skip})
                      .build();
      REQUIRE(pipe.next() == 0u);
      REQUIRE(pipe.next() == 2u);  // item 1 was skipped
      CHECK_THROWS_WITH_AS(pipe.state(), doctest::Contains("stage 'odd' skipped"), StateError);
    }
    SUBCASE("a shuffle after a batch") {
      auto pipe = PipelineBuilder{}
                      .deterministic()
                      .source("numbers", Numbers{.n = 10})
                      .batch("pairs", 2)
                      .shuffle("shuffle", {.capacity = 4, .min_after_dequeue = 1})
                      .batch("batch", 2)
                      .build();
      CHECK_THROWS_WITH_AS(pipe.state(), doctest::Contains("stage 'pairs' (batch 2) before it cannot make"),
                           StateError);
    }
  }

  TEST_CASE("a flat_map that breaks its fanout fails with the stage's name") {
    auto pipe = PipelineBuilder{}
                    .source("numbers", Numbers{.n = 10})
                    .flat_map<std::uint64_t>("parts",
                                             [](std::uint64_t x, Emitter<std::uint64_t>& emit) {
                                               emit(x);
                                               if (x != 4) emit(x);
                                             },
                                             {.fanout = 2})
                    .build();
    CHECK_THROWS_WITH_AS(drain_epoch(pipe), doctest::Contains("input 4 gave 1 outputs, but the stage's fanout is 2"),
                         StageError);
  }

  TEST_CASE("a state of another pipeline is refused, naming what differs") {
    const Shape s{.items = 100, .epochs = 1};
    PipelineState state;
    {
      auto pipe = build(s, 1);
      REQUIRE(pipe.next());
      state = pipe.state();
    }
    SUBCASE("seed") {
      auto other = state;
      other.seed = 8;
      CHECK_THROWS_WITH_AS(build(s, 1, other), doctest::Contains("its seed is 8, this pipeline's 7"), StateError);
    }
    SUBCASE("data") {
      auto more = s;
      more.items = 101;
      CHECK_THROWS_WITH_AS(
          build(more, 1, state),
          doctest::Contains("its data set is 'numbers below 100', this pipeline's 'numbers below 101'"), StateError);
    }
    SUBCASE("a stage") {
      auto other = s;
      other.fanout = 2;
      CHECK_THROWS_WITH_AS(build(other, 1, state),
                           doctest::Contains("its stage 3 is 'parts' (flat_map fanout 3), this pipeline's 'parts' "
                                             "(flat_map fanout 2)"),
                           StateError);
    }
    SUBCASE("the shuffle's window") {
      auto other = s;
      other.min_after_dequeue = 50;
      CHECK_THROWS_WITH_AS(build(other, 1, state), doctest::Contains("'shuffle' (shuffle window 101"), StateError);
    }
    SUBCASE("but not its capacity, which does not change the order") {
      auto other = s;
      other.capacity = 300;
      CHECK_NOTHROW(build(other, 1, state));
    }
  }

  TEST_CASE("a truncated, corrupt or foreign state file is refused with the file's name") {
    const auto dir = std::filesystem::temp_directory_path() / "stoker_test_resume";
    std::filesystem::create_directories(dir);
    const auto path = dir / "state.json";
    PipelineState state;
    {
      auto pipe = build({.items = 100, .epochs = 1}, 1);
      REQUIRE(pipe.next());
      state = pipe.state();
    }
    state.save(path);
    CHECK(PipelineState::load(path) == state);
    CHECK(!std::filesystem::exists(path.string() + ".partial"));
    const std::string text = state.to_json();

    auto refused = [&](const std::string& content, const std::string& why) {
      CAPTURE(content);
      std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
      CHECK_THROWS_WITH_AS(PipelineState::load(path), doctest::Contains((path.string() + ": " + why).c_str()),
                           StateError);
    };
    refused(text.substr(0, text.size() / 2), "not a pipeline state");
    refused("", "not a pipeline state");
    refused("{\"format\": \"something else\"}", "not a pipeline state");
    std::string bad = text;
    bad.replace(bad.find("\"consumed\":"), 11, "\"consumed\":-");
    refused(bad, "the field 'consumed' has the wrong type");
    bad = text;
    bad.replace(bad.find("\"version\":3"), 11, "\"version\":9");
    refused(bad, "version 9 of the pipeline state, but this stoker reads 1 to 3");
    bad = text;
    bad.replace(bad.find("\"deterministic\""), 15, "\"sorted\"");
    refused(bad, "the field 'order' is 'sorted'");
    bad = text;
    bad.replace(bad.find("\"seed\""), 6, "\"sead\"");
    refused(bad, "the field 'seed' is missing");
    CHECK_THROWS_WITH_AS(PipelineState::load(dir / "absent.json"), doctest::Contains("absent.json: cannot open"),
                         StateError);
    std::filesystem::remove_all(dir);
  }

  TEST_CASE("free order: a resumed pipeline yields every item the consumer had not taken, once each" *
            doctest::timeout(120)) {
    SUBCASE("the usual shape") { check_free_shape({}); }
    SUBCASE("min_after_dequeue next to the capacity") { check_free_shape({.capacity = 100, .min_after_dequeue = 99}); }
    SUBCASE("no shuffle minimum") { check_free_shape({.capacity = 50, .min_after_dequeue = 0}); }
    SUBCASE("a window larger than the epoch") {
      check_free_shape({.items = 40, .capacity = 500, .min_after_dequeue = 400, .batch = 7});
    }
    SUBCASE("no shuffle, batches of one, one output per input") {
      check_free_shape({.items = 300, .fanout = 1, .capacity = 0, .batch = 1});
    }
    SUBCASE("remainders dropped") { check_free_shape({.items = 997, .batch = 10, .drop_remainder = true}); }
    SUBCASE("a flat_map and a map between the shuffle and the batch") { check_free_shape({.after_shuffle = true}); }
  }

  TEST_CASE("free order: a state of a resumed run resumes again, and the state holds only what was in flight" *
            doctest::timeout(120)) {
    Shape s{.items = 20'000,
            .fanout = 5,
            .capacity = 4000,
            .min_after_dequeue = 2000,
            .batch = 64,
            .epochs = 1,
            .mark_batches = false};
    std::vector<std::vector<Item>> reference;
    {
      auto pipe = build(s, 2);
      for (const auto& epoch : whole_run(pipe)) reference.push_back(items_of(epoch));
    }
    s.deterministic = false;
    std::vector<Batch> taken;
    PipelineState first;
    {
      auto pipe = build(s, 2);
      for (int i = 0; i < 500; ++i) taken.push_back(*pipe.next());  // 32,000 of 100,000 items
      first = pipe.state();
    }
    // What had been made and not taken: at most the shuffle, the queues and a chunk per body.
    const std::size_t in_flight = s.capacity + 32 * s.fanout + std::max<std::size_t>(s.capacity, 32) + 8 * s.batch;
    CHECK(first.taken->except.size() <= in_flight);
    CHECK(first.taken->below - first.taken->except.size() == 500 * s.batch);
    MESSAGE("free-order state after 32,000 of 100,000 items: ", first.to_json().size(), " bytes, ",
            first.taken->except.size(), " items in flight");
    // Resumed, 300 batches more, then taken again and resumed again: every item once.
    check_free_resume(s, reference, 0, 300, 1, 2, first, taken);
  }

  TEST_CASE("free order: what a resume gives back to a queue after the shuffle comes back shuffled" *
            doctest::timeout(60)) {
    // The FIFO after "touch" is the traced queue: everything the shuffle held goes back there.
    const Shape s{.items = 3000,
                  .capacity = 600,
                  .min_after_dequeue = 300,
                  .epochs = 1,
                  .deterministic = false,
                  .after_shuffle = true};
    PipelineState state;
    {
      auto pipe = build(s, 2);
      for (int i = 0; i < 40; ++i) REQUIRE(pipe.next());
      state = pipe.state();
    }
    const std::size_t given_back = state.taken->except.size();
    REQUIRE(given_back >= s.min_after_dequeue);
    auto pipe = build(s, 2, state);
    std::vector<Item> first;  // the items given back, which the batch stage takes first
    while (first.size() < given_back) {
      auto batch = pipe.next();
      REQUIRE(batch);
      first.insert(first.end(), batch->begin(), batch->end());
    }
    first.resize(given_back);
    // In the order they were made, most neighbours would be parts of one input (6 to an input).
    std::size_t same = 0;
    for (std::size_t i = 1; i < first.size(); ++i) same += first[i].source == first[i - 1].source;
    CAPTURE(given_back);
    CHECK(same * 10 < given_back);
  }

  TEST_CASE("free order: a map on several threads reorders a FIFO, and the resume still finds every item") {
    auto build_free = [](int threads, const std::optional<PipelineState>& resume) {
      auto b = PipelineBuilder{}
                   .threads(threads)
                   .source("numbers", Numbers{.n = 5000}, {.queue = 16})
                   .map("slow",
                        [](std::uint64_t x) {
                          if (x % 7 == 0) spin_for(std::chrono::microseconds(20));  // uneven: chunks overtake
                          return x;
                        },
                        {.threads = threads, .queue = 16})
                   // Its input arrives out of order; the index still names the item.
                   .map("index", [](std::uint64_t x, const StageContext& ctx) { return x * 1000 + ctx.index; });
      if (resume) b.resume_from(*resume);
      return b.build();
    };
    std::vector<std::uint64_t> got;
    PipelineState state;
    {
      auto pipe = build_free(3, std::nullopt);
      for (int i = 0; i < 2500; ++i) got.push_back(*pipe.next());
      state = pipe.state();
    }
    CHECK(state.taken->queue == "index->consumer");
    auto resumed = build_free(2, PipelineState::from_json(state.to_json()));
    for (auto x : drain_epoch(resumed)) got.push_back(x);
    std::sort(got.begin(), got.end());
    REQUIRE(got.size() == 5000);
    for (std::uint64_t i = 0; i < 5000; ++i) REQUIRE(got[i] == i * 1000 + i);  // the index is the item's
  }

  TEST_CASE("free order: a queue given back more than it holds starts its consumer" * doctest::timeout(30)) {
    // The consumer took items 50 to 99 of the batch stage's input: 0 to 49 go back into that
    // queue, twelve times its capacity, so that its producer waits until the batch stage takes
    // them. Nothing but the start of the epoch wakes the batch stage then.
    auto build_free = [](const std::optional<PipelineState>& resume) {
      auto b = PipelineBuilder{}
                   .threads(2)
                   .source("numbers", Numbers{.n = 300})
                   .map("id", [](std::uint64_t x) { return x; }, {.threads = 2, .queue = 4});
      if (resume) b.resume_from(*resume);
      return b.batch("batch", 3, {.queue = 2}).build();
    };
    PipelineState state = build_free(std::nullopt).state();
    REQUIRE(state.taken);
    CHECK(state.taken->queue == "id->batch");
    state.taken->below = 100;
    for (std::uint64_t i = 0; i < 50; ++i) state.taken->except.push_back(i);
    auto resumed = build_free(state);
    std::vector<std::uint64_t> got;
    for (const auto& batch : drain_epoch(resumed)) got.insert(got.end(), batch.begin(), batch.end());
    std::sort(got.begin(), got.end());
    std::vector<std::uint64_t> want;
    for (std::uint64_t i = 0; i < 300; ++i)
      if (i < 50 || i >= 100) want.push_back(i);
    CHECK(got == want);
  }

  TEST_CASE("a state is resumed only in the mode it was taken in") {
    const Shape s{.items = 100, .epochs = 1};
    auto pipe = build(s, 1);
    REQUIRE(pipe.next());
    auto free = s;
    free.deterministic = false;
    CHECK_THROWS_WITH_AS(build(free, 1, pipe.state()),
                         doctest::Contains("it was taken in deterministic, and this pipeline runs in free order"),
                         StateError);
    auto free_pipe = build(free, 1);
    REQUIRE(free_pipe.next());
    CHECK_THROWS_WITH_AS(build(s, 1, free_pipe.state()),
                         doctest::Contains("it was taken in free order, and this pipeline runs in deterministic"),
                         StateError);
  }

  TEST_CASE("a state made in code with its mode and its list of taken items at odds is refused") {
    Shape s{.items = 50};
    s.deterministic = false;
    auto pipe = build(s, 1);
    (void)pipe.next();
    auto state = pipe.state();
    state.taken.reset();
    CHECK_THROWS_WITH_AS(build(s, 1, state), doctest::Contains("does not list the items the consumer took"),
                         StateError);
    s.deterministic = true;
    auto det = build(s, 1);
    auto det_state = det.state();
    det_state.taken = PipelineState::Taken{"x", 0, {}};
    CHECK_THROWS_WITH_AS(build(s, 1, det_state), doctest::Contains("lists the items the consumer took"), StateError);
  }

  TEST_CASE("version 1 and 2 states still read; a free-order state's list is checked") {
    const Shape s{.items = 100, .epochs = 1};
    auto pipe = build(s, 1);
    REQUIRE(pipe.next());
    const auto state = pipe.state();
    std::string v2 = state.to_json();
    v2.replace(v2.find("\"version\":3"), 11, "\"version\":2");
    v2.replace(v2.find("\"inputs\""), 8, "\"shuffle_inputs\"");  // shuffles only, as version 2 wrote it
    CHECK(PipelineState::from_json(v2) == state);
    std::string v1 = v2;
    v1.replace(v1.find("\"version\":2"), 11, "\"version\":1");
    v1.erase(v1.find("\"order\":\"deterministic\","), 24);
    CHECK(PipelineState::from_json(v1) == state);

    auto free = s;
    free.deterministic = false;
    auto free_pipe = build(free, 1);
    REQUIRE(free_pipe.next());
    const auto taken = free_pipe.state();
    REQUIRE(taken.taken);
    const std::string text = taken.to_json();
    CHECK(PipelineState::from_json(text) == taken);
    auto refused = [](std::string bad, const char* why) {
      CAPTURE(bad);
      CHECK_THROWS_WITH_AS(PipelineState::from_json(bad, "f.json"), doctest::Contains(why), StateError);
    };
    std::string bad = text;
    bad.replace(bad.find("\"except\":["), 10, "\"except\":[0,0,");
    refused(bad, "f.json: taken.except is not ascending");
    bad = text;
    bad.replace(bad.find("\"except\":["), 10, "\"except\":[99999999,");
    refused(bad, "f.json: taken.except is not ascending below");
    bad = text;
    const auto at = bad.find("\"taken\":");
    bad.erase(at, bad.find('}', at) + 2 - at);  // the object and the comma after it
    refused(bad, "f.json: the field 'taken' is missing");
  }
}
