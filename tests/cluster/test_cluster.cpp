// SPDX-License-Identifier: Apache-2.0
// The communicator of one process: what code written for many ranks gets when run alone.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "cluster/elastic_pipeline.h"
#include "stoker/cluster/communicator.h"
#include "stoker/cluster/elastic.h"
#include "stoker/cluster/remote.h"

using namespace stoker::cluster;
using stoker::StateError;

TEST_CASE("a world of one: collectives leave the data as it is") {
  const auto comm = single_process();
  CHECK(comm->rank() == 0);
  CHECK(comm->size() == 1);
  comm->barrier();
  std::vector<float> v{1.5f, -2.0f};
  comm->allreduce_sum(v);
  CHECK(v == std::vector<float>{1.5f, -2.0f});
  comm->allreduce_mean(v);
  CHECK(v == std::vector<float>{1.5f, -2.0f});
  CHECK(comm->gather("record") == std::vector<std::string>{"record"});
  CHECK_THROWS_WITH_AS(comm->gather("record", 1), doctest::Contains("root 1 is not a rank of a world of 1"),
                       ClusterError);
}

TEST_CASE("run_world: a world of one passes an exception on to its caller") {
  if (built_with_mpi()) return;  // there, run_world initializes MPI: the mpirun tests cover it
  int argc = 1;
  char name[] = "test_cluster";
  char* argv[] = {name, nullptr};
  CHECK(run_world(argc, argv, [](Communicator& c) { return c.size() == 1 ? 7 : 0; }) == 7);
  CHECK_THROWS_AS(run_world(argc, argv, [](Communicator&) -> int { throw std::runtime_error("x"); }),
                  std::runtime_error);
}

// A world of `size` ranks that has no way to reach them: enough for a remote edge's checks of
// its options, which come before any message.
class Unreachable final : public Communicator {
 public:
  explicit Unreachable(int size) : size_(size) {}
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return size_; }
  std::string engine() const override { return "none"; }
  void barrier() override {}
  void broadcast(std::span<std::byte>, int) override {}
  void allreduce_sum(std::span<float>) override {}
  std::vector<std::string> gather(std::string_view, int) override { return {}; }
  void set_timeout(std::chrono::milliseconds) override {}
  void set_status(std::string_view) override {}
  [[noreturn]] void abort(const std::string&) noexcept override { std::abort(); }

 private:
  int size_;
};

// Rank 0 of a world whose other ranks' records are given: what agree() makes of them.
class Gathered final : public Communicator {
 public:
  explicit Gathered(std::vector<Facts> others) : others_(std::move(others)) {}
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return static_cast<int>(others_.size()) + 1; }
  std::string engine() const override { return "none"; }
  void barrier() override {}
  void broadcast(std::span<std::byte>, int) override {}
  void allreduce_sum(std::span<float>) override {}
  std::vector<std::string> gather(std::string_view record, int) override {
    std::vector<std::string> all{std::string(record)};
    // The others' records as agree() encodes its own: gathered from a world of one each.
    for (const auto& facts : others_) {
      Recorder one;
      try {
        agree(one, facts);
      } catch (...) {
      }
      all.push_back(one.record);
    }
    return all;
  }
  void set_timeout(std::chrono::milliseconds) override {}
  void set_status(std::string_view) override {}
  [[noreturn]] void abort(const std::string&) noexcept override { std::abort(); }

 private:
  // A world of two whose gather keeps this rank's record and stops there.
  struct Recorder final : Communicator {
    std::string record;
    int rank() const noexcept override { return 1; }
    int size() const noexcept override { return 2; }
    std::string engine() const override { return "none"; }
    void barrier() override {}
    void broadcast(std::span<std::byte>, int) override { throw std::runtime_error("recorded"); }
    void allreduce_sum(std::span<float>) override {}
    std::vector<std::string> gather(std::string_view r, int) override {
      record = r;
      return {};
    }
    void set_timeout(std::chrono::milliseconds) override {}
    void set_status(std::string_view) override {}
    [[noreturn]] void abort(const std::string&) noexcept override { std::abort(); }
  };
  std::vector<Facts> others_;
};

TEST_CASE("agree: the facts that differ, each with the ranks that have each value") {
  const Facts mine{{"data", "2000 images"}, {"steps", "40"}, {"model", "676-10"}};
  const auto verdict = [&](std::vector<Facts> others) {
    Gathered comm(std::move(others));
    try {
      agree(comm, mine);
    } catch (const RankMismatch& e) {
      return std::string(e.what());
    }
    return std::string("(agreed)");
  };
  CHECK(verdict({mine, mine}) == "(agreed)");
  CHECK(verdict({{{"data", "1000 images"}, {"steps", "20"}, {"model", "676-10"}}, mine, mine}) ==
        "the ranks differ: data: ranks 0, 2, 3 have '2000 images', rank 1 has '1000 images'; steps: ranks 0, 2, 3 "
        "have '40', rank 1 has '20'");
  CHECK(verdict({mine, {{"data", "2000 images"}, {"model", "676-10"}}}) ==
        "the ranks differ: steps: ranks 0, 1 have '40', rank 2 has nothing");
  CHECK(verdict({mine, {{"data", "2000 images"}, {"steps", "40"}, {"model", "676-10"}, {"extra", "x"}}}) ==
        "the ranks differ: extra: ranks 0, 1 have nothing, rank 2 has 'x'");
  const Facts odd{{"data", "2000 images"}, {"steps", "41"}, {"model", "676-10"}};
  CHECK(verdict({mine, mine, mine, odd, mine}) == "the ranks differ: steps: ranks 0-3, 5 have '40', rank 4 has '41'");
  // One rank alone agrees with itself.
  CHECK_NOTHROW(agree(*single_process(), mine));
}

TEST_CASE("a remote edge names the option that cannot work") {
  using Edge = RemoteEdge<std::vector<float>>;
  const auto refused = [](int world, RemoteOptions o) {
    Unreachable comm(world);
    try {
      Edge edge(comm, std::move(o));
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  CHECK(refused(1, {}) ==
        "remote edge 'remote': it needs at least 2 ranks, a trainer and a worker; this world has 1 (start the "
        "program with mpirun -np N)");
  CHECK(refused(3, {.name = "batches", .trainer = 3}) ==
        "remote edge 'batches': trainer 3 is not a rank of a world of 3");
  CHECK(refused(3, {.workers = {1, 5}}) == "remote edge 'remote': worker 5 is not a rank of a world of 3");
  CHECK(refused(3, {.workers = {0, 1}}) == "remote edge 'remote': rank 0 is both the trainer and a worker");
  CHECK(refused(4, {.workers = {2, 1, 2}}) == "remote edge 'remote': worker 2 is listed twice");
  CHECK(refused(4, {.capacity = 2}) ==
        "remote edge 'remote': capacity 2 is less than its 3 workers: each needs at least one credit");
  CHECK(refused(2, {.shard = 0}) == "remote edge 'remote': shard must be at least 1 sample");
  if (!built_with_mpi()) {  // good options, and no MPI to carry them
    Unreachable comm(2);
    CHECK_THROWS_WITH_AS(Edge(comm, {.name = "batches"}),
                         "remote edge 'batches' needs MPI, and this stoker was built without it (STOKER_MPI)",
                         ClusterError);
  }
}

TEST_CASE("remote edge codecs: what is encoded decodes to the same, and a wrong size is refused") {
  std::vector<float> v{1.5f, -2.0f, 3.25f};
  CHECK(Codec<std::vector<float>>::decode(Codec<std::vector<float>>::encode(std::vector<float>(v))) == v);
  CHECK(Codec<std::vector<float>>::decode(Codec<std::vector<float>>::encode({})).empty());
  CHECK(Codec<std::string>::decode(Codec<std::string>::encode("crops")) == "crops");
  struct Pair {
    int a;
    double b;
  };
  const Pair p = Codec<Pair>::decode(Codec<Pair>::encode(Pair{7, 0.5}));
  CHECK((p.a == 7 && p.b == 0.5));
  Bytes three(3);
  CHECK_THROWS_WITH_AS(Codec<std::vector<float>>::decode(std::move(three)),
                       "an item of 3 bytes is not a whole number of elements of 4 bytes", ClusterError);
  CHECK_THROWS_WITH_AS(Codec<Pair>::decode(Bytes(3)), "an item of 3 bytes arrived where one of 16 was expected",
                       ClusterError);
  Bytes b(600 * 1024);
  const std::byte* at = b.data();
  CHECK(Codec<Bytes>::decode(Codec<Bytes>::encode(std::move(b))).data() == at);  // moved, not copied
}

// Elastic resume in one process: the ranks of a job are pipelines side by side, consumed in
// lockstep as the ranks' training steps would consume them.
namespace {

using elastic_test::Units;

// Takes `steps` batches of each pipeline (all of the epoch when 0), counting its units; returns
// the batches each pipeline gave, and whether every pipeline gave as many.
std::vector<std::size_t> take(std::vector<stoker::Pipeline<Units>>& pipes, std::size_t steps,
                              std::map<std::uint64_t, int>& seen) {
  std::vector<std::size_t> batches(pipes.size(), 0);
  for (std::size_t r = 0; r < pipes.size(); ++r) {
    const std::uint32_t epoch = pipes[r].current_epoch();
    for (std::size_t s = 0; steps == 0 || s < steps; ++s) {
      auto batch = pipes[r].next();
      if (!batch) break;
      ++batches[r];
      for (const auto u : *batch) ++seen[u];
      if (steps == 0 && pipes[r].current_epoch() != epoch) break;
    }
  }
  return batches;
}

std::vector<stoker::PipelineState> states(const std::vector<stoker::Pipeline<Units>>& pipes) {
  std::vector<stoker::PipelineState> out;
  for (const auto& p : pipes) out.push_back(p.state());
  return out;
}

// The units of `plan` that it leaves out of epoch 0, by sample id and output.
std::map<std::uint64_t, int> units_of(const UnitRanges& ranges, std::uint32_t epoch) {
  const stoker::ShuffledShard order(elastic_test::reader(), {});
  std::map<std::uint64_t, int> out;
  for (const auto& [begin, end] : ranges)
    for (std::uint64_t u = begin; u < end; ++u)
      ++out[order.id_at(elastic_test::kSeed, epoch, u / elastic_test::kFanout) * elastic_test::kFanout +
            u % elastic_test::kFanout];
  return out;
}

}  // namespace

TEST_CASE("elastic resume: 3 ranks cut mid-epoch go on at 2, cut again and go on at 4: every unit once" *
          doctest::timeout(60)) {
  using namespace elastic_test;
  std::map<std::uint64_t, int> seen;  // epoch 0's units, by id * 3 + j
  const std::size_t batch3 = 7, batch2 = 10, batch4 = 5;

  std::vector<stoker::Pipeline<Units>> at3;
  for (std::uint32_t r = 0; r < 3; ++r) at3.push_back(pipeline(r, 3, batch3));
  take(at3, 20, seen);
  const auto plan3 = EpochPlan::fresh(0, kSamples, kFanout, 3);
  const UnitRanges rest3 = plan3.rest(states(at3));
  at3.clear();
  CHECK(unit_count(rest3) + 3 * 20 * batch3 == plan3.units());
  const auto left3 = units_of(rest3, 0);
  for (const auto& [u, n] : left3) CHECK(seen.count(u) == 0);  // what is left was not taken

  const auto plan2 = EpochPlan::of_rest(0, kSamples, kFanout, rest3, 2, batch2);
  std::vector<stoker::Pipeline<Units>> at2;
  for (std::uint32_t r = 0; r < 2; ++r)
    at2.push_back(pipeline(r, 2, batch2, std::pair{0u, plan2.share(r)}, resume_state(plan2, r, batch2)));
  take(at2, 15, seen);
  const UnitRanges rest2 = plan2.rest(states(at2));
  at2.clear();
  CHECK(unit_count(rest2) + 2 * 15 * batch2 == plan2.units());

  const auto plan4 = EpochPlan::of_rest(0, kSamples, kFanout, rest2, 4, batch4);
  CHECK(EpochPlan::from_json(plan4.to_json(), "plan") == plan4);
  std::vector<stoker::Pipeline<Units>> at4;
  for (std::uint32_t r = 0; r < 4; ++r)
    at4.push_back(pipeline(r, 4, batch4, std::pair{0u, plan4.share(r)}, resume_state(plan4, r, batch4)));
  const auto last = take(at4, 0, seen);
  for (const auto b : last) CHECK(b == last.front());  // the same steps on every rank

  // Every unit of epoch 0 once, but those the plans left out: the fresh plan's last 1,003 % 3
  // samples, and fewer than 2, then 4, units of the rests.
  std::size_t twice = 0;
  for (const auto& [u, n] : seen) twice += n > 1;
  CHECK(twice == 0);
  const std::uint64_t left_out = plan3.left_out() + plan2.left_out() + plan4.left_out();
  CHECK(plan2.left_out() < 2);
  CHECK(plan4.left_out() < 4);
  CHECK(seen.size() + left_out == kSamples * kFanout);
  MESSAGE("epoch 0: " << seen.size() << " units once each, " << left_out << " left out by the plans");

  // Epoch 1 at 4 ranks, as ShuffledShard shares it.
  std::map<std::uint64_t, int> next;
  take(at4, 0, next);
  for (const auto& [u, n] : next) CHECK(n == 1);
  CHECK(next.size() == kSamples / 4 * 4 * kFanout);
}

TEST_CASE("elastic resume: the plans' rules, and the states they refuse") {
  using namespace elastic_test;
  // 10 units among 4 ranks in steps of 2: 3, 3, 2, 2 would give the first two one step more
  // (2 steps against 1), so each takes 2 and 2 are left out; in steps of 3, 3, 3, 2, 2 is 1 step
  // each, and nothing is left out.
  const UnitRanges ten{{0, 4}, {6, 12}};
  const auto even = EpochPlan::of_rest(0, 4, 3, ten, 4, 2);
  CHECK(even.units() == 8);
  CHECK(even.left_out() == 2);
  const auto uneven = EpochPlan::of_rest(0, 4, 3, ten, 4, 3);
  CHECK(uneven.units() == 10);
  CHECK(uneven.left_out() == 0);
  // Units 0-3 and 6-11 of samples of 3 units: sample 0 whole, 1 partly (its unit 3), 2 and 3
  // whole. Rank 0 takes units 0, 1, 2: sample 0 whole; rank 1 units 3, 6, 7: sample 1's first,
  // sample 2's first two.
  const Share s0 = uneven.share(0), s1 = uneven.share(1);
  CHECK(s0.positions == std::vector<std::uint64_t>{0});
  CHECK(s0.partial == 0);
  CHECK(s1.positions == std::vector<std::uint64_t>{1, 2});
  CHECK(s1.partial == 2);
  CHECK(s1.make == std::vector<std::uint64_t>{0, 3, 4});  // sample 1's unit 0, sample 2's units 0 and 1
  // A deterministic state does not say which items were taken.
  auto det = pipeline(0, 1, 5).state();
  det.deterministic = true;
  det.taken.reset();
  CHECK_THROWS_WITH_AS(EpochPlan::fresh(0, kSamples, kFanout, 1).rest({det}),
                       doctest::Contains("rank 0's pipeline state: a deterministic pipeline state"), StateError);
  CHECK_THROWS_WITH_AS(EpochPlan::fresh(0, kSamples, kFanout, 2).rest({det}),
                       doctest::Contains("for 2 ranks, and there are states of 1"), StateError);
}
