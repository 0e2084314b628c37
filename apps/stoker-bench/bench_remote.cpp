// SPDX-License-Identifier: Apache-2.0
// The `remote` suite, run under `mpirun -np N` (N >= 2): rank 0 is the trainer, the others its
// workers. For small (1 KiB) and batch-sized (600 KiB) items, in the same run:
//   - items/s through a remote edge: each worker's pipeline reads the shards it is handed (a
//     sample of a synthetic data set per item) and makes an item of each, the trainer's
//     pipeline receives them; against the same pipeline in one process (rank 0 reads every
//     sample and makes every item itself while the others wait);
//   - bytes/s through the edge against a plain MPI loop moving as many messages of the same size
//     from the same ranks (stoker::cluster::plain_send_recv) with the edge's memory pattern: each
//     message a Bytes of its own from the same cache of freed blocks, as many sends under way as
//     a worker may have items out (its credits), each received into a Bytes freed at once. On a
//     2-core VM the speed of a cross-process copy depends on where its buffers lie: a plain loop
//     that sent from and received into one buffer each, or went round 13 of its own, ran from a
//     twentieth to 25 times the edge's speed; with the same pattern the ratio means what it says.
// Items are made without being filled (only a counter is written), so that the figures are
// those of the transport, not of a memset.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_suite.h"
#include "stoker/cluster/communicator.h"
#include "stoker/cluster/plain_transfer.h"
#include "stoker/cluster/remote.h"
#include "stoker/core/pipeline.h"
#include "stoker/stages/shard.h"
#include "stoker/stages/synthetic.h"

namespace stoker::bench {
namespace {

using Clock = std::chrono::steady_clock;
using cluster::Bytes;

struct RemoteBenchOptions {
  std::size_t small_bytes = 1024, large_bytes = 600 * 1024;
  std::size_t small_items = 20'000, large_items = 500;  // per worker
  std::size_t capacity = 8;
  std::size_t queue = 4;  // the capacity of each pipeline's queue
  int threads = 1;        // each pipeline's
};

// A data set of `count` tiny samples: what the sources read, one per item.
std::shared_ptr<const Reader> samples(std::size_t count) {
  return std::make_shared<SyntheticSource>(SyntheticOptions{.shape = {1, 1, 1, 1, false}, .count = count});
}

// An item of `bytes` per sample, stamped with the sample's id.
auto make_item(std::size_t bytes) {
  return [bytes](Sample s) {
    Bytes b(bytes);
    std::memcpy(b.data(), &s.id, std::min(bytes, sizeof s.id));
    return b;
  };
}

// Takes an epoch of items and throws unless there are `expected`; returns the seconds since t0.
template <class Source>
double drain(Source& pipe, std::size_t expected, Clock::time_point t0) {
  std::size_t items = 0;
  for (auto& item : pipe.epoch()) items += item.size() > 0 ? 1 : 0;
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (items != expected)
    throw std::runtime_error("remote: " + std::to_string(items) + " items arrived of " + std::to_string(expected));
  return seconds;
}

// The items a worker may have out at once: its share of the edge's credits.
std::size_t sends_in_flight(const RemoteBenchOptions& o, const cluster::Communicator& comm) {
  return std::max<std::size_t>(1, o.capacity / static_cast<std::size_t>(comm.size() - 1));
}

struct Figures {
  std::vector<double> remote_s, in_process_s, plain_s;
  std::size_t peak_in_flight = 0;
};

// One repeat of one size; the figures land at rank 0.
void measure(cluster::Communicator& comm, const RemoteBenchOptions& o, std::size_t bytes, std::size_t per_worker,
             Figures& f) {
  const std::size_t workers = static_cast<std::size_t>(comm.size() - 1), total = workers * per_worker;

  const double plain = cluster::plain_send_recv(comm, 0, bytes, per_worker, sends_in_flight(o, comm));
  if (comm.rank() == 0) f.plain_s.push_back(plain);

  {
    cluster::RemoteEdge<Bytes> edge(
        comm,
        {.name = "bench", .trainer = 0, .capacity = o.capacity, .shard = std::max<std::uint64_t>(1, per_worker / 16)});
    comm.barrier();
    if (edge.role() == cluster::RemoteRole::worker) {
      edge.serve(samples(total), [&](cluster::RemoteShards shards, std::optional<PipelineState> resume) {
        PipelineBuilder b;
        b.threads(o.threads).epochs(1);
        if (resume) b.resume_from(std::move(*resume));
        return std::move(b)
            .source("read", std::move(shards), {.queue = o.queue})
            .map("make", make_item(bytes), {.queue = o.queue})
            .build();
      });
    } else {
      const auto t0 = Clock::now();
      auto pipe =
          PipelineBuilder{}.threads(o.threads).epochs(1).source("remote", edge.receiver(), {.queue = o.queue}).build();
      f.remote_s.push_back(drain(pipe, total, t0));
      f.peak_in_flight = std::max(f.peak_in_flight, edge.stats().peak_in_flight);
    }
  }

  comm.barrier();
  if (comm.rank() == 0) {
    const auto t0 = Clock::now();
    auto pipe = PipelineBuilder{}
                    .threads(o.threads)
                    .epochs(1)
                    .source("read", ShuffledShard(samples(total), {}), {.queue = o.queue})
                    .map("make", make_item(bytes), {.queue = o.queue})
                    .build();
    f.in_process_s.push_back(drain(pipe, total, t0));
  }
  comm.barrier();
}

Json run_remote(const CommonOptions& common, const RemoteBenchOptions& o) {
  Json out;
  int rank = 0;
  const int status = cluster::run_world(0, nullptr, [&](cluster::Communicator& comm) {
    rank = comm.rank();
    if (comm.size() < 2)
      throw std::invalid_argument(
          "remote: run it under mpirun with 2 or more ranks (mpirun -np 2 stoker-bench remote)");
    const std::size_t workers = static_cast<std::size_t>(comm.size() - 1);
    Json results = Json::array();
    for (const auto& [bytes, per_worker] : {std::pair{o.small_bytes, o.small_items}, {o.large_bytes, o.large_items}}) {
      Figures f;
      for (int r = 0; r < common.repeats; ++r) measure(comm, o, bytes, per_worker, f);
      if (rank != 0) continue;
      const std::size_t window = sends_in_flight(o, comm);
      const double items = static_cast<double>(workers * per_worker), moved = items * static_cast<double>(bytes);
      const Spread remote = spread(f.remote_s), local = spread(f.in_process_s), plain = spread(f.plain_s);
      Json row;
      row["item_bytes"] = bytes;
      row["items"] = workers * per_worker;
      row["remote_items_per_s"] = items / remote.median;
      row["in_process_items_per_s"] = items / local.median;
      row["remote_vs_in_process"] = local.median / remote.median;
      row["remote_bytes_per_s"] = moved / remote.median;
      row["plain_send_recv_bytes_per_s"] = moved / plain.median;
      row["plain_sends_in_flight"] = window;
      row["remote_vs_plain_send_recv"] = plain.median / remote.median;
      row["peak_in_flight"] = f.peak_in_flight;
      std::cout << bytes << "-byte items, " << workers << " worker(s) -> rank 0, median of " << common.repeats
                << ":\n  remote edge      " << items / remote.median << " items/s, " << moved / remote.median / 1e9
                << " GB/s\n  one process      " << items / local.median << " items/s  (remote/in-process "
                << local.median / remote.median << ")\n  MPI_Send/Recv    " << moved / plain.median / 1e9 << " GB/s, "
                << window << " sends in flight  (remote/plain " << plain.median / remote.median
                << ")\n  peak in flight   " << f.peak_in_flight << " of capacity " << o.capacity << "\n";
      results.push_back(row);
    }
    if (rank == 0) {
      out["config"] = {{"ranks", comm.size()},   {"workers", workers},   {"capacity", o.capacity},
                       {"queue", o.queue},       {"threads", o.threads}, {"repeats", common.repeats},
                       {"engine", comm.engine()}};
      out["results"] = results;
    }
    return 0;
  });
  if (status != 0) throw std::runtime_error("remote: a rank failed");
  if (rank != 0) std::exit(0);  // the figures are rank 0's to print
  return out;
}

}  // namespace

SuiteRun setup_remote(CLI::App& command) {
  auto o = std::make_shared<RemoteBenchOptions>();
  command.add_option("--capacity", o->capacity, "Items in flight through the edge, at most")
      ->check(apps::in_range<std::size_t>(1, 1 << 20))
      ->capture_default_str();
  command.add_option("--queue", o->queue, "Capacity of each pipeline's queue")
      ->check(apps::in_range<std::size_t>(1, 1 << 20))
      ->capture_default_str();
  command.add_option("--threads", o->threads, "Threads of each rank's pipeline (0: one per core)")
      ->check(apps::in_range(0, 256))
      ->capture_default_str();
  command.add_option("--small-items", o->small_items, "Small items per worker and repeat")
      ->check(apps::in_range<std::size_t>(1, 100'000'000))
      ->capture_default_str();
  command.add_option("--large-items", o->large_items, "Batch-sized items per worker and repeat")
      ->check(apps::in_range<std::size_t>(1, 1'000'000))
      ->capture_default_str();
  return [o](const CommonOptions& common) { return run_remote(common, *o); };
}

}  // namespace stoker::bench
