// The communicator of one process: what code written for many ranks gets when run alone.
#include <doctest/doctest.h>

#include <vector>

#include "stoker/dist/communicator.h"

using namespace stoker::dist;

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
  CHECK_THROWS_WITH_AS(comm->gather("record", 1), doctest::Contains("root 1 is not a rank of a world of 1"), DistError);
}

TEST_CASE("run_world: a world of one passes an exception on to its caller") {
  if (built_with_mpi()) return;  // there, run_world initializes MPI: the mpirun tests cover it
  int argc = 1;
  char name[] = "test_dist";
  char* argv[] = {name, nullptr};
  CHECK(run_world(argc, argv, [](Communicator& c) { return c.size() == 1 ? 7 : 0; }) == 7);
  CHECK_THROWS_AS(run_world(argc, argv, [](Communicator&) -> int { throw std::runtime_error("x"); }),
                  std::runtime_error);
}
