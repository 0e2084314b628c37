// Run by `mpirun -np N mpi_ranks MODE` (tests/dist/mpi_test.sh); exits 0 when every check of
// MODE passes on every rank, and names the failed check otherwise.
//   collectives   barrier, broadcast, allreduce and gather give what they promise
//   shards        every rank's ShuffledShard pipeline over two epochs, gathered at rank 0:
//                 each id exactly once per epoch, a new order every epoch, the same run again
//   throw         rank 1 throws while the others wait at a barrier: all must end, promptly
//   straggler DIR a data-parallel loop (an allreduce per batch) whose rank 1 has a slow input
//                 stage; each rank writes DIR/run.rank<r>.jsonl for stoker-inspect to read
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "stoker/core/pipeline.h"
#include "stoker/dist/communicator.h"
#include "stoker/stages/shard.h"
#include "stoker/stages/synthetic.h"

namespace {

using stoker::dist::Communicator;

struct Failed : std::runtime_error {
  using std::runtime_error::runtime_error;
};
void require(bool ok, const std::string& what) {
  if (!ok) throw Failed("check failed: " + what);
}

void collectives(Communicator& comm) {
  const int n = comm.size(), r = comm.rank();
  comm.barrier();
  std::vector<float> v{static_cast<float>(r), 1.0f, static_cast<float>(r * r)};
  comm.allreduce_sum(v);
  require(v[0] == static_cast<float>(n * (n - 1) / 2) && v[1] == static_cast<float>(n) &&
              v[2] == static_cast<float>((n - 1) * n * (2 * n - 1) / 6),
          "allreduce_sum");
  std::vector<float> m{static_cast<float>(2 * r)};
  comm.allreduce_mean(m);
  require(m[0] == static_cast<float>(n - 1), "allreduce_mean");
  std::string word = r == n - 1 ? "from the last rank" : "overwritten.......";
  comm.broadcast(std::as_writable_bytes(std::span(word.data(), word.size())), n - 1);
  require(word == "from the last rank", "broadcast from the last rank");
  const auto records = comm.gather(std::string(static_cast<std::size_t>(r), 'x') + std::to_string(r));
  if (r == 0) {
    require(records.size() == static_cast<std::size_t>(n), "gather: one record per rank");
    for (int i = 0; i < n; ++i)
      require(records[static_cast<std::size_t>(i)] == std::string(static_cast<std::size_t>(i), 'x') + std::to_string(i),
              "gather: records in rank order");
  } else {
    require(records.empty(), "gather: nothing at the other ranks");
  }
}

// This rank's ids, epoch by epoch, as text: "e0 id id ...;e1 id ...".
std::string rank_ids(Communicator& comm, std::uint64_t seed) {
  const auto reader =
      std::make_shared<stoker::SyntheticSource>(stoker::SyntheticOptions{.shape = {1, 1, 2, 2, false}, .count = 1003});
  auto pipe = stoker::PipelineBuilder{}
                  .seed(seed)
                  .deterministic()
                  .epochs(2)
                  .threads(2)
                  .source("read", stoker::ShuffledShard(reader, {.rank = static_cast<std::uint32_t>(comm.rank()),
                                                                 .world = static_cast<std::uint32_t>(comm.size())}))
                  .map("id", [](stoker::Sample s) { return s.id; })
                  .build();
  std::ostringstream out;
  for (auto epoch : pipe.epochs()) {
    out << 'e';
    for (const auto id : epoch) out << ' ' << id;
    out << ';';
  }
  return out.str();
}

void shards(Communicator& comm) {
  const auto first = comm.gather(rank_ids(comm, 5));
  const auto again = comm.gather(rank_ids(comm, 5));
  if (comm.rank() != 0) return;
  require(first == again, "the same seed gives the same ids on every rank");
  std::vector<std::map<std::uint64_t, int>> seen(2);
  std::vector<std::string> rank0_epochs;
  std::size_t per_rank = 0;
  for (std::size_t r = 0; r < first.size(); ++r) {
    std::istringstream in(first[r]);
    std::string epoch_text;
    for (std::size_t e = 0; std::getline(in, epoch_text, ';'); ++e) {
      require(e < 2, "two epochs");
      if (r == 0) rank0_epochs.push_back(epoch_text);
      std::istringstream ids(epoch_text.substr(1));
      std::size_t count = 0;
      for (std::uint64_t id; ids >> id; ++count) ++seen[e][id];
      if (r == 0 && e == 0) per_rank = count;
      require(count == per_rank, "every rank gets as many ids as rank 0");
    }
  }
  const std::size_t n = 1003, world = first.size();
  for (const auto& epoch : seen) {
    require(epoch.size() == n - n % world, "every id but the epoch's remainder is delivered");
    for (const auto& [id, times] : epoch) require(times == 1, "no id twice in an epoch");
  }
  require(rank0_epochs.size() == 2 && rank0_epochs[0] != rank0_epochs[1], "a new order every epoch");
  std::printf("shards: %zu ranks, %zu ids each per epoch, each delivered once per epoch\n", world, per_rank);
}

// Rank 1's input stage takes 1 ms an item, the others' 20 us: every step waits for rank 1.
void straggler(Communicator& comm, const std::string& dir) {
  const auto reader =
      std::make_shared<stoker::SyntheticSource>(stoker::SyntheticOptions{.shape = {1, 1, 2, 2, false}, .count = 1800});
  const auto rank = std::to_string(comm.rank());
  const auto work = std::chrono::microseconds(comm.rank() == 1 ? 1000 : 20);
  auto pipe = stoker::PipelineBuilder{}
                  .epochs(1)
                  .threads(1)
                  .occupancy_log(dir + "/run.rank" + rank + ".jsonl", std::chrono::milliseconds(10))
                  .log_label("rank", rank)
                  .source("read", stoker::ShuffledShard(reader, {.rank = static_cast<std::uint32_t>(comm.rank()),
                                                                 .world = static_cast<std::uint32_t>(comm.size())}))
                  .map("decode",
                       [work](stoker::Sample s) {
                         std::this_thread::sleep_for(work);
                         return s.id;
                       })
                  .batch("batch", 10)
                  .build();
  std::vector<float> gradients(1000, 1.0f);
  for (auto& batch : pipe.epoch()) {
    (void)batch;
    comm.allreduce_sum(gradients);  // the step: every rank waits for the slowest
  }
}

void throws(Communicator& comm) {
  if (comm.size() < 2) throw Failed("mode throw needs at least 2 ranks");
  if (comm.rank() == 1) throw std::runtime_error("stage 'read' failed: a deliberate failure of rank 1");
  comm.barrier();  // rank 1 never comes: only the abort ends this
  throw Failed("a barrier returned without rank 1");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  return stoker::dist::run_world(argc, argv, [&](Communicator& comm) {
    if (mode == "collectives") {
      collectives(comm);
    } else if (mode == "shards") {
      shards(comm);
    } else if (mode == "throw") {
      throws(comm);
    } else if (mode == "straggler" && argc > 2) {
      straggler(comm, argv[2]);
    } else {
      throw Failed("unknown mode '" + mode + "' (collectives, shards, throw, straggler DIR)");
    }
    if (comm.rank() == 0)
      std::printf("%s: passed on %d ranks (%s)\n", mode.c_str(), comm.size(), comm.engine().c_str());
    return 0;
  });
}
