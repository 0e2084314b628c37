// The communicator of one process: what code written for many ranks gets when run alone.
#include <doctest/doctest.h>

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
  CHECK_THROWS_WITH_AS(comm->gather("record", 1), doctest::Contains("root 1 is not a rank of a world of 1"), ClusterError);
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
  [[noreturn]] void abort(const std::string&) noexcept override { std::abort(); }

 private:
  int size_;
};

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
