// The communicator of one process: what code written for many ranks gets when run alone.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "stoker/cluster/communicator.h"
#include "stoker/cluster/remote.h"

using namespace stoker::cluster;

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
