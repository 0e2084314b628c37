// SPDX-License-Identifier: Apache-2.0
// Run by `mpirun -np N mpi_ranks MODE` (tests/cluster/mpi_test.sh); exits 0 when every check of
// MODE passes on every rank, and names the failed check otherwise.
//   collectives   barrier, broadcast, allreduce and gather give what they promise
//   shards        every rank's ShuffledShard pipeline over two epochs, gathered at rank 0:
//                 each id exactly once per epoch, a new order every epoch, the same run again
//   throw         rank 1 throws while the others wait at a barrier: all must end, promptly
//   agree         rank 1 has another value of one fact: every rank refuses, naming it
//   idle_wait     rank 1 comes to an allreduce 2 s late: the others wait asleep (CPU time)
//   stopped       rank 1 stops itself (SIGSTOP) before a collective; the others give up after
//                 the 2 s timeout, naming it as not answering (mpi_test.sh checks the message)
//   stopped_first the same with rank 0 stopped: the lowest rank that waits, rank 1, reports
//   stuck         rank 1 never comes to a collective, its main thread asleep; the others give
//                 up after 2 s, naming it and what it said it was doing
//   setup_stopped rank 1 stops itself (SIGSTOP) before MPI starts; the others wait in
//                 MPI_Init_thread until the setup timeout ends them (mpi_test.sh checks it)
//   elastic_save DIR    the ranks take 20 batches of epoch 0 of a 3-unit-per-sample pipeline and
//                       rank 0 writes their states, the epoch's plan and the units taken to DIR
//   elastic_resume DIR  the ranks (any number) resume what DIR says is left of epoch 0, and
//                       epoch 1: every unit of epoch 0 once (taken before or now), but the few
//                       the plans leave out, and every unit of epoch 1 once
//   straggler DIR SLOW  a data-parallel loop (an allreduce per batch, its wait counted) whose rank 1
//                 has a slow training step (SLOW = step) or input stage (SLOW = input); each rank
//                 writes DIR/run.rank<r>.jsonl for stoker-inspect to read
//   straggler_remote DIR  a trainer and its remote workers, of which rank 1 is slow; each rank
//                 writes DIR/run.rank<r>.jsonl
//   remote        rank 0 trains on batches its workers (the other ranks) make from shards they
//                 ask for: every id once per epoch, the capacity held, the slow worker helped
//   remote_throw  the last worker's stage throws: the trainer's pipeline names its rank and stage
//   remote_stop   the trainer stops mid-epoch; the workers, set to run forever, stop with it
//   remote_trainer_stopped  the trainer stops (SIGSTOP) mid-epoch: its workers end the job
//                 at twice the lease after its last message, naming it
//   remote_epochs the workers run 1 epoch, the trainer wants 2: it fails, naming a worker
//   remote_sizes  the last worker reads a data set of another size: refused, naming both ranks
//   remote_stuck, remote_stopped, remote_killed
//                 the last worker stops answering (a stage that sleeps for ever, SIGSTOP, SIGKILL):
//                 its lease runs out, the others make its work, every id of each epoch once
//   remote_save DIR, remote_resume DIR
//                 the trainer checkpoints mid-epoch; a job of any number of workers goes on from
//                 there, every id of the epoch once
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cluster/elastic_pipeline.h"
#include "stoker/cluster/communicator.h"
#include "stoker/cluster/elastic.h"
#include "stoker/cluster/remote.h"
#include "stoker/core/pipeline.h"
#include "stoker/stages/shard.h"
#include "stoker/stages/synthetic.h"

namespace {

using stoker::cluster::Communicator;

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
  // Records of more than 2 GiB in all: every rank refuses, before anything is sent (so the
  // records' pages, never written, are never touched either).
  if (n > 1) {
    const std::size_t each = (std::size_t{1} << 31) / static_cast<std::size_t>(n) + 1;
    const auto big = std::make_unique_for_overwrite<char[]>(each);
    std::string error;
    try {
      comm.gather(std::string_view(big.get(), each));
    } catch (const stoker::cluster::ClusterError& e) {
      error = e.what();
    }
    require(error.find("gather: the records come to " + std::to_string(each * static_cast<std::size_t>(n)) +
                       " bytes, more than MPI's int displacements reach") != std::string::npos,
            "gather of more than 2 GiB refused on every rank: " + error);
    comm.barrier();  // the world goes on
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
// A data-parallel loop: every step ends in an allreduce that waits for every rank, and each rank
// counts its time there in its log (exchange_wait_ns), as stoker-train does. Rank 1 is slow in
// its training step (`slow` = "step": it sleeps before the exchange) or in its input ("input").
void straggler(Communicator& comm, const std::string& dir, const std::string& slow) {
  if (slow != "step" && slow != "input") throw Failed("straggler: SLOW must be step or input, not '" + slow + "'");
  const auto reader =
      std::make_shared<stoker::SyntheticSource>(stoker::SyntheticOptions{.shape = {1, 1, 2, 2, false}, .count = 1800});
  const auto rank = std::to_string(comm.rank());
  const bool slow_rank = comm.rank() == 1;
  const auto work = std::chrono::microseconds(slow_rank && slow == "input" ? 3000 : 20);
  std::atomic<std::uint64_t> exchange_ns{0};
  auto pipe = stoker::PipelineBuilder{}
                  .epochs(1)
                  .threads(1)
                  .occupancy_log(dir + "/run.rank" + rank + ".jsonl", std::chrono::milliseconds(10))
                  .log_label("rank", rank)
                  .counters([&exchange_ns] {
                    return std::vector<stoker::Counter>{{"exchange_wait_ns", exchange_ns.load()}};
                  })
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
    if (slow_rank && slow == "step") std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto t0 = std::chrono::steady_clock::now();
    comm.allreduce_sum(gradients);  // every rank waits for the slowest
    exchange_ns += static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  }
}

void throws(Communicator& comm) {
  if (comm.size() < 2) throw Failed("mode throw needs at least 2 ranks");
  if (comm.rank() == 1) throw std::runtime_error("stage 'read' failed: a deliberate failure of rank 1");
  comm.barrier();  // rank 1 never comes: only the abort ends this
  throw Failed("a barrier returned without rank 1");
}

void agreement(Communicator& comm) {
  if (comm.size() < 3) throw Failed("mode agree needs at least 3 ranks");
  stoker::cluster::agree(comm, {{"data set", "1003 samples"}, {"steps", "7"}});  // the same: returns
  const std::string steps = comm.rank() == 1 ? "8" : "7";
  try {
    stoker::cluster::agree(comm, {{"data set", "1003 samples"}, {"steps", steps}});
    throw Failed("agree() returned though rank 1 differs");
  } catch (const stoker::cluster::RankMismatch& e) {
    const std::string want =
        "the ranks differ: steps: " + std::string(comm.size() == 3 ? "ranks 0, 2" : "ranks 0, 2, 3") +
        " have '7', rank 1 has '8'";
    require(e.what() == want,
            "every rank's error names the fact, the ranks and their values: " + std::string(e.what()));
  }
  if (comm.rank() == 0) std::printf("agree: every rank refused, naming rank 1's steps\n");
}

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// A rank that waits 2 s for a late one must not spin: Open MPI's blocking collectives do.
void idle_wait(Communicator& comm) {
  if (comm.size() < 2) throw Failed("mode idle_wait needs at least 2 ranks");
  comm.barrier();
  std::vector<float> gradients(200'000, 1.0f);
  if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(2));
  const double cpu = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  comm.allreduce_sum(gradients);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double used = cpu_seconds() - cpu;
  require(gradients[0] == static_cast<float>(comm.size()), "the late allreduce sums");
  std::printf("idle_wait: rank %d waited %.2f s in the allreduce and used %.3f s of CPU\n", comm.rank(), wall, used);
  if (comm.rank() != 1) require(wall > 1.5 && used < 0.1 * wall, "a waiting rank sleeps rather than spins");
}

// Rank `who` stops (SIGSTOP) or sleeps, saying where, before the collective its peers give up on.
void stopped_or_stuck(Communicator& comm, bool stop, int who) {
  if (comm.size() < 2) throw Failed("modes stopped and stuck need at least 2 ranks");
  comm.set_timeout(std::chrono::seconds(2));
  comm.barrier();
  if (comm.rank() == who) {
    comm.set_status("epoch 1, step 34: waiting for its pipeline's next batch");
    if (stop) std::raise(SIGSTOP);
    std::this_thread::sleep_for(std::chrono::seconds(60));
  }
  std::vector<float> gradients(1000, 1.0f);
  comm.set_status("epoch 1, step 35: in the gradient allreduce");
  comm.allreduce_sum(gradients);
  throw Failed("an allreduce returned without rank " + std::to_string(who));
}

// Elastic resume over MPI: the pipeline of tests/cluster/elastic_pipeline.h, 3 units a sample.
// A batch of 24 units per step in all, whatever the ranks (1,003 samples: 3,009 units).
constexpr std::size_t kElasticStep = 24;

std::string units_text(const std::vector<std::uint64_t>& units) {
  std::ostringstream out;
  for (const auto u : units) out << u << ' ';
  return out.str();
}
std::vector<std::uint64_t> units_from(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::uint64_t> units;
  for (std::uint64_t u; in >> u;) units.push_back(u);
  return units;
}

void elastic_save(Communicator& comm, const std::string& dir) {
  const auto world = static_cast<std::uint32_t>(comm.size()), rank = static_cast<std::uint32_t>(comm.rank());
  auto pipe = elastic_test::pipeline(rank, world, kElasticStep / world);
  std::vector<std::uint64_t> taken;
  for (int step = 0; step < 20; ++step) {
    auto batch = pipe.next();
    require(batch.has_value(), "20 batches of epoch 0");
    taken.insert(taken.end(), batch->begin(), batch->end());
  }
  const auto states = comm.gather(pipe.state().to_json());
  const auto units = comm.gather(units_text(taken));
  if (rank != 0) return;
  std::ofstream out(dir + "/elastic");
  out << stoker::cluster::EpochPlan::fresh(0, elastic_test::kSamples, elastic_test::kFanout, world).to_json() << '\n';
  for (const auto& s : states) out << s << '\n';
  for (const auto& u : units) out << u;
  out << '\n';
  require(static_cast<bool>(out), "the checkpoint written");
  std::printf("elastic_save: %u ranks took 20 batches each, %zu units in all\n", world, 20 * kElasticStep);
}

void elastic_resume(Communicator& comm, const std::string& dir) {
  const auto world = static_cast<std::uint32_t>(comm.size()), rank = static_cast<std::uint32_t>(comm.rank());
  std::ifstream in(dir + "/elastic");
  std::string line;
  std::getline(in, line);
  const auto then = stoker::cluster::EpochPlan::from_json(line, "checkpoint");
  std::vector<stoker::PipelineState> states;
  for (std::uint32_t r = 0; r < then.world(); ++r) {
    std::getline(in, line);
    states.push_back(stoker::PipelineState::from_json(line));
  }
  std::getline(in, line);
  const auto before = units_from(line);
  const std::size_t batch = kElasticStep / world;
  const auto plan = stoker::cluster::EpochPlan::of_rest(0, elastic_test::kSamples, elastic_test::kFanout,
                                                        then.rest(states), world, batch);
  auto pipe = elastic_test::pipeline(rank, world, batch, std::pair{0u, plan.share(rank)},
                                     elastic_test::resume_state(plan, rank, batch));
  std::vector<std::uint64_t> epochs[2];
  std::size_t steps = 0;
  for (auto epoch : pipe.epochs())
    for (const auto& b : epoch) {
      epochs[pipe.current_epoch()].insert(epochs[pipe.current_epoch()].end(), b.begin(), b.end());
      steps += pipe.current_epoch() == 0;
    }
  const auto rest = comm.gather(units_text(epochs[0]));
  const auto next = comm.gather(units_text(epochs[1]));
  const auto step_counts = comm.gather(std::to_string(steps));
  if (rank != 0) return;
  for (const auto& s : step_counts) require(s == step_counts.front(), "every rank took as many steps of epoch 0");
  std::map<std::uint64_t, int> seen;
  for (const auto u : before) ++seen[u];
  for (const auto& r : rest)
    for (const auto u : units_from(r)) ++seen[u];
  for (const auto& [u, n] : seen) require(n == 1, "no unit of epoch 0 twice");
  const std::uint64_t left_out = then.left_out() + plan.left_out();
  require(seen.size() + left_out == elastic_test::kSamples * elastic_test::kFanout,
          "every unit of epoch 0 once, but those the plans leave out");
  require(plan.left_out() < world, "fewer than a unit per rank left out of the rest");
  std::map<std::uint64_t, int> after;
  for (const auto& r : next)
    for (const auto u : units_from(r)) ++after[u];
  for (const auto& [u, n] : after) require(n == 1, "no unit of epoch 1 twice");
  require(after.size() == elastic_test::kSamples / world * world * elastic_test::kFanout, "every unit of epoch 1");
  std::printf(
      "elastic_resume: %u ranks went on from %u: %zu units of epoch 0 once each (%zu before, %llu left out), "
      "%s steps each; epoch 1 whole\n",
      world, then.world(), seen.size(), before.size(), static_cast<unsigned long long>(left_out),
      step_counts.front().c_str());
}

// Remote edges: rank 0 is the trainer, the other ranks its workers. Items are batches of ids.
using Ids = std::vector<std::uint64_t>;
using stoker::cluster::RemoteEdge;
using stoker::cluster::RemoteRole;
constexpr std::uint64_t kRemoteSamples = 1003;

std::shared_ptr<const stoker::Reader> remote_reader(std::uint64_t samples = kRemoteSamples) {
  return std::make_shared<stoker::SyntheticSource>(
      stoker::SyntheticOptions{.shape = {1, 1, 2, 2, false}, .count = samples});
}

// A worker's pipelines: a stage that takes `work` per sample and calls `check(id)`, 3 units of
// each sample (id * 3 + j, as crops of an image), a shuffle that mixes the units of many samples
// (so that a lost worker has sent some units of a sample and not others), batches of 7;
// `epochs` 0: until stopped. Short queues: a fast worker whose credits are out holds few
// samples, and leaves shards of the epoch to the others.
constexpr std::uint64_t kUnits = 3;
// Padding a batch may carry after its units (`pad` of them), to make it large: MPI sends a large
// message by rendezvous (the receiver pulls the bytes after matching it), a small one eagerly.
constexpr std::uint64_t kPad = ~std::uint64_t{0};
template <class Check>
auto worker_pipeline(std::uint32_t epochs, std::chrono::microseconds work, Check check, std::size_t pad = 0) {
  return [=](stoker::cluster::RemoteShards shards, std::optional<stoker::PipelineState> resume) {
    stoker::PipelineBuilder b;
    b.seed(11).epochs(epochs).threads(2);
    if (resume) b.resume_from(std::move(*resume));
    return std::move(b)
        .source("read", std::move(shards), {.queue = 4})
        .map("work",
             [work, check](stoker::Sample s) {
               std::this_thread::sleep_for(work);
               check(s.id);
               return s.id;
             },
             {.queue = 4})
        .template flat_map<std::uint64_t>(
            "units",
            [](std::uint64_t id, stoker::Emitter<std::uint64_t>& emit, const stoker::StageContext&) {
              for (std::uint64_t j = 0; j < kUnits; ++j) emit(id * kUnits + j);
            },
            {.fanout = kUnits})
        .shuffle("shuffle", {.capacity = 64, .min_after_dequeue = 40})
        .batch("batch", 7, {.queue = 2})
        .map("ids",
             [pad](Ids ids) {
               ids.resize(ids.size() + pad, kPad);
               return ids;
             },
             {.queue = 2})
        .build();
  };
}

// The trainer's epochs: every unit of each exactly once. Returns the epochs taken.
std::size_t take_every_id(stoker::Pipeline<Ids>& pipe) {
  std::size_t epochs = 0;
  for (auto epoch : pipe.epochs()) {
    std::vector<int> seen(kRemoteSamples * kUnits, 0);
    for (const auto& batch : epoch)
      for (const auto u : batch) {
        if (u == kPad) continue;
        require(u < seen.size(), "units of the data set");
        ++seen[u];
      }
    for (std::uint64_t u = 0; u < seen.size(); ++u)
      require(seen[u] == 1, "unit " + std::to_string(u) + " exactly once in epoch " + std::to_string(epochs) +
                                ", not " + std::to_string(seen[u]) + " times");
    ++epochs;
  }
  return epochs;
}

void remote(Communicator& comm) {
  if (comm.size() < 3) throw Failed("mode remote needs at least 3 ranks");
  const std::size_t workers = static_cast<std::size_t>(comm.size() - 1), capacity = 2 * workers;
  RemoteEdge<Ids> edge(comm, {.name = "batches", .capacity = capacity, .shard = 16});
  if (edge.role() == RemoteRole::worker) {
    // The last worker is 100 times slower than the others.
    const auto work = std::chrono::microseconds(comm.rank() == comm.size() - 1 ? 2000 : 20);
    edge.serve(remote_reader(), worker_pipeline(2, work, [](std::uint64_t) {}));
    require(edge.stats().peak_in_flight <= capacity / workers, "a worker never has more items out than its credits");
    require(edge.stats().shards > 0 || comm.rank() == comm.size() - 1, "a fast worker counts the shards it got");
    return;
  }
  // The trainer starts late: meanwhile the workers fill every credit, and must stop there.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (edge.stats().peak_in_flight < capacity && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // time to send more, were it allowed
  {
    const auto stats = edge.stats();
    std::string handed;
    for (const auto n : stats.worker_samples) (handed += ' ') += std::to_string(n);
    require(stats.peak_in_flight == capacity,
            "the workers filled the capacity, and no more, while the trainer waited (peak " +
                std::to_string(stats.peak_in_flight) + ", samples handed to each worker:" + handed + ")");
  }
  auto pipe = stoker::PipelineBuilder{}.epochs(2).source("batches", edge.receiver(), {.queue = 1}).build();
  require(take_every_id(pipe) == 2, "two epochs");
  const auto stats = edge.stats();
  std::printf("remote: %zu workers, capacity %zu: peak in flight %zu, %llu items, %llu shards\n", workers, capacity,
              stats.peak_in_flight, static_cast<unsigned long long>(stats.items),
              static_cast<unsigned long long>(stats.shards));
  require(stats.peak_in_flight == capacity, "no more items in flight than the capacity while the trainer trained");
  require(stats.lost.empty(), "no worker lost");
  std::printf("samples per worker:");
  for (const auto n : stats.worker_samples) std::printf(" %llu", static_cast<unsigned long long>(n));
  std::printf("\n");
  // Handed out on demand, the shards go to whoever asks: the slow worker gets fewer than every
  // fast one (a fixed split would give each a third). How many fewer depends on the machine's
  // load: under ThreadSanitizer, with 4 ranks on 2 cores, the fast ones lose most of their lead.
  for (std::size_t w = 0; w + 1 < stats.worker_samples.size(); ++w)
    require(stats.worker_samples[w] > stats.worker_samples.back(), "the slow worker took fewer shards than a fast one");
}

// A trainer (rank 0) and its remote workers, each rank writing its occupancy log labelled with
// its rank and role; worker rank 1 takes 100 times as long per sample as the others.
void straggler_remote(Communicator& comm, const std::string& dir) {
  if (comm.size() < 3) throw Failed("mode straggler_remote needs at least 3 ranks");
  const std::size_t workers = static_cast<std::size_t>(comm.size() - 1);
  RemoteEdge<Ids> edge(comm, {.name = "batches", .capacity = 2 * workers, .shard = 16});
  const bool worker = edge.role() == RemoteRole::worker;
  const auto log = [&comm, dir, worker](stoker::PipelineBuilder& b) {
    b.occupancy_log(dir + "/run.rank" + std::to_string(comm.rank()) + ".jsonl", std::chrono::milliseconds(10))
        .log_label("rank", std::to_string(comm.rank()))
        .log_label("role", worker ? "worker" : "trainer");
  };
  if (worker) {
    const auto work = std::chrono::microseconds(comm.rank() == 1 ? 2000 : 20);
    edge.serve(remote_reader(), [&, work](stoker::cluster::RemoteShards shards, std::optional<stoker::PipelineState> resume) {
      stoker::PipelineBuilder b;
      b.epochs(1).threads(2);
      log(b);
      if (resume) b.resume_from(std::move(*resume));
      return std::move(b)
          .source("read", std::move(shards))
          .map("work",
               [work](stoker::Sample s) {
                 std::this_thread::sleep_for(work);
                 return s.id;
               })
          .batch("batch", 7)
          .map("ids", [](Ids ids) { return ids; })
          .build();
    });
    return;
  }
  stoker::PipelineBuilder b;
  b.epochs(1).threads(2);
  log(b);
  auto pipe = std::move(b).source("batches", edge.receiver(), {.queue = 1}).build();
  std::uint64_t samples = 0;
  for (const auto& batch : pipe.epoch()) samples += batch.size();
  require(samples == kRemoteSamples, "every sample of the epoch");
}

// The last worker stops answering at its 100th sample, 3 ways: `stuck`, its stage sleeps for
// ever; `stopped`, it stops itself (SIGSTOP); `killed`, it kills itself (SIGKILL; run under
// mpirun --enable-recovery, mpi_test.sh). The trainer's lease of 2 s runs out, the others make
// its work, and every id of both epochs arrives once.
// `pad`: padding per batch (kPad), for batches MPI sends by rendezvous.
void remote_lost(Communicator& comm, const std::string& how, std::size_t pad = 0) {
  if (comm.size() < 3) throw Failed("modes remote_stuck, _stopped and _killed need at least 3 ranks");
  const int lost = comm.size() - 1;
  RemoteEdge<Ids> edge(comm, {.name = "batches",
                              .capacity = 2 * static_cast<std::size_t>(comm.size() - 1),
                              .shard = 16,
                              .lease = std::chrono::seconds(2)});
  if (edge.role() == RemoteRole::worker) {
    std::atomic<int> calls{0};
    edge.serve(remote_reader(), worker_pipeline(
                                    2, std::chrono::microseconds(200),
                                    [&, r = comm.rank()](std::uint64_t) {
                                      if (r != lost || ++calls != 100) return;
                                      if (how == "stopped") std::raise(SIGSTOP);
                                      if (how == "killed") std::raise(SIGKILL);
                                      std::this_thread::sleep_for(std::chrono::hours(1));
                                    },
                                    pad));
    return;
  }
  auto pipe = stoker::PipelineBuilder{}.epochs(2).source("batches", edge.receiver()).build();
  require(take_every_id(pipe) == 2, "two epochs");
  const auto stats = edge.stats();
  require(stats.lost == std::vector<int>{lost}, "the last worker was lost, and no other");
  require(stats.restarts >= 1, "a worker took its work over");
  std::printf(
      "remote_%s: worker rank %d lost, its work made by the others (%llu restarts): every id of both epochs "
      "once\n",
      how.c_str(), lost, static_cast<unsigned long long>(stats.restarts));
}

void remote_throw(Communicator& comm) {
  if (comm.size() < 3) throw Failed("mode remote_throw needs at least 3 ranks");
  const int failing = comm.size() - 1;
  RemoteEdge<Ids> edge(comm, {.name = "batches", .capacity = 4, .shard = 16});
  if (edge.role() == RemoteRole::worker) {
    std::atomic<std::size_t> calls{0};
    try {
      edge.serve(remote_reader(), worker_pipeline(0, std::chrono::microseconds(0), [&, r = comm.rank()](std::uint64_t) {
                   if (r == failing && ++calls == 40) throw std::runtime_error("a deliberate failure");
                 }));
      require(comm.rank() != failing, "the failing worker's serve() throws");
    } catch (const stoker::StageError& e) {
      require(comm.rank() == failing && e.stage() == "work", "the failing worker's serve() rethrows its error");
    }
    return;
  }
  auto pipe = stoker::PipelineBuilder{}.source("batches", edge.receiver()).build();
  try {
    // Epochs until the failure: the failing worker may get few shards of an epoch.
    for (auto epoch : pipe.epochs())
      for (auto& batch : epoch) (void)batch;
    throw Failed("the trainer's epochs ended though a worker failed");
  } catch (const stoker::StageError& e) {
    std::printf("remote_throw: the trainer got: %s\n", e.what());
    require(e.stage() == "batches", "the trainer's error names its receiving stage");
    const std::string what = e.what();
    require(what.find("worker rank " + std::to_string(failing)) != std::string::npos &&
                what.find("stage 'work' failed") != std::string::npos &&
                what.find("a deliberate failure") != std::string::npos,
            "the trainer's error names the worker's rank, its stage and its error");
    try {
      std::rethrow_exception(e.original());
    } catch (const stoker::cluster::RemoteError& remote) {
      require(remote.rank() == failing && remote.stage() == "work", "RemoteError: the worker's rank and stage");
    }
  }
}

void remote_stop(Communicator& comm) {
  if (comm.size() < 3) throw Failed("mode remote_stop needs at least 3 ranks");
  RemoteEdge<Ids> edge(comm, {.name = "batches", .capacity = 6, .shard = 16});
  if (edge.role() == RemoteRole::worker) {
    edge.serve(remote_reader(),
               worker_pipeline(0, std::chrono::microseconds(50), [](std::uint64_t) {}));  // until stopped
    return;
  }
  {
    auto pipe = stoker::PipelineBuilder{}.epochs(1).source("batches", edge.receiver()).build();
    for (int taken = 0; taken < 10; ++taken) require(pipe.next().has_value(), "batches before the stop");
  }  // the pipeline goes mid-epoch, its source maybe waiting for the workers; then the edge
  edge.close();
  std::printf("remote_stop: the trainer stopped after 10 batches, %llu received\n",
              static_cast<unsigned long long>(edge.stats().items));
}

// The trainer stops itself (SIGSTOP) after 10 batches, its workers running for ever: each
// worker's waits for it (a credit, then the stop after its failure, then the stop at its close)
// end at one deadline, twice the lease of 1 s after the trainer's last message, and the job
// ends (mpi_test.sh checks the message and the time).
void remote_trainer_stopped(Communicator& comm) {
  if (comm.size() < 3) throw Failed("mode remote_trainer_stopped needs at least 3 ranks");
  RemoteEdge<Ids> edge(comm, {.name = "batches", .capacity = 6, .shard = 16, .lease = std::chrono::seconds(1)});
  if (edge.role() == RemoteRole::worker) {
    edge.serve(remote_reader(), worker_pipeline(0, std::chrono::microseconds(50), [](std::uint64_t) {}));
    throw Failed("a worker's serve() returned though its trainer stopped");
  }
  auto pipe = stoker::PipelineBuilder{}.epochs(1).source("batches", edge.receiver()).build();
  for (int taken = 0; taken < 10; ++taken) require(pipe.next().has_value(), "batches before the stop");
  std::raise(SIGSTOP);
  throw Failed("the trainer went on");
}

void remote_epochs(Communicator& comm) {
  if (comm.size() < 3) throw Failed("mode remote_epochs needs at least 3 ranks");
  RemoteEdge<Ids> edge(comm, {.name = "batches", .capacity = 4, .shard = 64});
  if (edge.role() == RemoteRole::worker) {
    edge.serve(remote_reader(), worker_pipeline(1, std::chrono::microseconds(0), [](std::uint64_t) {}));
    return;  // the edge's destructor tells the trainer this worker is done
  }
  auto pipe = stoker::PipelineBuilder{}.epochs(2).source("batches", edge.receiver()).build();
  std::size_t epochs = 0;
  try {
    for (auto epoch : pipe.epochs()) {
      for (auto& batch : epoch) (void)batch;
      ++epochs;
    }
    throw Failed("the trainer's second epoch ended though the workers ran one");
  } catch (const stoker::StageError& e) {
    std::printf("remote_epochs: the trainer got: %s\n", e.what());
    const std::string what = e.what();
    require(epochs == 1 && what.find("closed its end after 1 epochs") != std::string::npos &&
                what.find("wants epoch 2") != std::string::npos,  // its second, counted from 1
            "the trainer's first epoch is whole, and its second fails naming a worker and the epochs");
  }
}

void remote_sizes(Communicator& comm) {
  if (comm.size() < 3) throw Failed("mode remote_sizes needs at least 3 ranks");
  RemoteEdge<Ids> edge(comm, {.name = "batches", .capacity = 4, .shard = 16});
  if (edge.role() == RemoteRole::worker) {
    const bool odd = comm.rank() == comm.size() - 1;
    edge.serve(remote_reader(odd ? kRemoteSamples + 1 : kRemoteSamples),
               worker_pipeline(0, std::chrono::microseconds(odd ? 0 : 200), [](std::uint64_t) {}));
    return;  // until the trainer, failed, stops the edge
  }
  auto pipe = stoker::PipelineBuilder{}.source("batches", edge.receiver()).build();
  try {
    for (auto epoch : pipe.epochs())
      for (auto& batch : epoch) (void)batch;
    throw Failed("the trainer's epochs ended though its workers read different data sets");
  } catch (const stoker::StageError& e) {
    std::printf("remote_sizes: the trainer got: %s\n", e.what());
    const std::string what = e.what(), odd = std::to_string(comm.size() - 1);
    require(
        what.find("reads 1004 samples") != std::string::npos || what.find(" 1004: every worker") != std::string::npos,
        "the error names the odd size");
    require(what.find("worker rank " + odd) != std::string::npos, "the error names the odd worker's rank");
    require(what.find("every worker must read the same data set") != std::string::npos, "the error says what to do");
  }
}

// Remote checkpoints: the trainer takes 30 batches of epoch 0 and writes where it stands (the
// edge's progress, its pipeline's state, the ids it took) to DIR; a job of any number of
// workers goes on from there: every id of epoch 0 once, before or after, then epoch 1 whole.
void remote_save(Communicator& comm, const std::string& dir) {
  RemoteEdge<Ids> edge(comm, {.name = "batches", .capacity = 4, .shard = 16});
  if (edge.role() == RemoteRole::worker) {
    edge.serve(remote_reader(), worker_pipeline(2, std::chrono::microseconds(100), [](std::uint64_t) {}));
    return;
  }
  auto pipe = stoker::PipelineBuilder{}.epochs(2).source("batches", edge.receiver()).build();
  std::vector<std::uint64_t> taken;
  for (int i = 0; i < 30; ++i) {
    auto batch = pipe.next();
    require(batch.has_value(), "30 batches of epoch 0");
    taken.insert(taken.end(), batch->begin(), batch->end());
  }
  // Meanwhile the pipeline's source receives more: what it holds was not trained.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto state = pipe.state();
  const auto progress = edge.progress(state);
  const auto plan =
      stoker::cluster::EpochPlan::of_rest(progress.epoch, progress.samples, progress.fanout, progress.left, 1, 1);
  std::ofstream out(dir + "/remote");
  out << plan.to_json() << '\n' << state.to_json() << '\n' << units_text(taken) << '\n';
  require(static_cast<bool>(out), "the checkpoint written");
  std::printf("remote_save: %zu workers; the trainer took 30 batches, %zu units, and %llu are left\n",
              edge.options().workers.size(), taken.size(),
              static_cast<unsigned long long>(stoker::cluster::unit_count(progress.left)));
}

void remote_resume(Communicator& comm, const std::string& dir) {
  std::ifstream in(dir + "/remote");
  std::string plan_text, state_text, taken_text;
  std::getline(in, plan_text);
  std::getline(in, state_text);
  std::getline(in, taken_text);
  const auto plan = stoker::cluster::EpochPlan::from_json(plan_text, "checkpoint");
  const stoker::cluster::RemoteProgress progress{plan.epoch(), plan.samples(), plan.fanout(), plan.units_of(0)};
  RemoteEdge<Ids> edge(comm, {.name = "batches", .capacity = 4, .shard = 16, .resume = progress});
  if (edge.role() == RemoteRole::worker) {
    edge.serve(remote_reader(), worker_pipeline(2, std::chrono::microseconds(100), [](std::uint64_t) {}));
    return;
  }
  // The trainer's pipeline goes on from the start of its epoch: the workers make what is left.
  auto state = stoker::PipelineState::from_json(state_text);
  state.consumed = 0;
  state.taken = stoker::PipelineState::Taken{state.taken->queue, 0, {}};
  auto pipe = stoker::PipelineBuilder{}.epochs(2).resume_from(state).source("batches", edge.receiver()).build();
  std::vector<int> seen(kRemoteSamples * kUnits, 0);
  for (const auto u : units_from(taken_text)) ++seen[u];
  std::size_t epochs = 0;
  for (auto epoch : pipe.epochs()) {
    if (epochs == 1) seen.assign(kRemoteSamples * kUnits, 0);
    for (const auto& batch : epoch)
      for (const auto u : batch) ++seen[u];
    for (std::uint64_t u = 0; u < seen.size(); ++u)
      require(seen[u] == 1, "unit " + std::to_string(u) + " exactly once in epoch " + std::to_string(epochs) +
                                " (before the checkpoint and after), not " + std::to_string(seen[u]) + " times");
    ++epochs;
  }
  require(epochs == 2, "the rest of epoch 0, and epoch 1");
  std::printf("remote_resume: %zu workers went on: every unit of epoch 0 once, before or after, and of epoch 1\n",
              edge.options().workers.size());
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
      mode == "setup_stopped" && rank && rank == std::string("1"))
    std::raise(SIGSTOP);
  return stoker::cluster::run_world(argc, argv, [&](Communicator& comm) {
    if (mode == "collectives" || mode == "setup_stopped") {
      collectives(comm);
    } else if (mode == "shards") {
      shards(comm);
    } else if (mode == "throw") {
      throws(comm);
    } else if (mode == "agree") {
      agreement(comm);
    } else if (mode == "idle_wait") {
      idle_wait(comm);
    } else if (mode == "stopped" || mode == "stuck" || mode == "stopped_first") {
      stopped_or_stuck(comm, mode != "stuck", mode == "stopped_first" ? 0 : 1);
    } else if (mode == "remote") {
      remote(comm);
    } else if (mode == "remote_throw") {
      remote_throw(comm);
    } else if (mode == "remote_stop") {
      remote_stop(comm);
    } else if (mode == "remote_trainer_stopped") {
      remote_trainer_stopped(comm);
    } else if (mode == "remote_epochs") {
      remote_epochs(comm);
    } else if (mode == "remote_sizes") {
      remote_sizes(comm);
    } else if (mode == "straggler" && argc > 3) {
      straggler(comm, argv[2], argv[3]);
    } else if (mode == "straggler_remote" && argc > 2) {
      straggler_remote(comm, argv[2]);
    } else if (mode == "remote_stuck" || mode == "remote_stopped" || mode == "remote_killed") {
      remote_lost(comm, mode.substr(7));
    } else if (mode == "remote_killed_large") {  // batches of 700 KB: MPI's rendezvous protocol
      remote_lost(comm, "killed", 90'000);
    } else if (mode == "remote_save" && argc > 2) {
      remote_save(comm, argv[2]);
    } else if (mode == "remote_resume" && argc > 2) {
      remote_resume(comm, argv[2]);
    } else if (mode == "elastic_save" && argc > 2) {
      elastic_save(comm, argv[2]);
    } else if (mode == "elastic_resume" && argc > 2) {
      elastic_resume(comm, argv[2]);
    } else {
      throw Failed("unknown mode '" + mode +
                   "' (collectives, setup_stopped, shards, throw, agree, idle_wait, stopped, stopped_first, stuck, "
                   "elastic_save DIR, elastic_resume DIR, straggler DIR, remote, "
                   "remote_throw, remote_stop, remote_trainer_stopped, remote_epochs, "
                   "remote_sizes, remote_stuck, remote_stopped, remote_killed, remote_save DIR, remote_resume DIR)");
    }
    if (comm.rank() == 0)
      std::printf("%s: passed on %d ranks (%s)\n", mode.c_str(), comm.size(), comm.engine().c_str());
    return 0;
  });
}
