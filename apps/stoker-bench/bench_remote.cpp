// The `remote` suite, run under `mpirun -np N` (N >= 2): rank 0 is the trainer, the others its
// workers. For small (1 KiB) and batch-sized (600 KiB) items, in the same run:
//   - items/s through a remote edge: each worker's pipeline makes its items and serves them,
//     the trainer's pipeline receives them; against the same pipeline in one process (rank 0
//     makes every item itself while the others wait);
//   - bytes/s through the edge against a plain MPI_Send/MPI_Recv loop moving as many messages of
//     the same size from the same ranks (stoker::cluster::plain_send_recv).
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
#include "stoker/core/pipeline.h"
#include "stoker/cluster/communicator.h"
#include "stoker/cluster/plain_transfer.h"
#include "stoker/cluster/remote.h"

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

// A source of `count` items of `bytes` per epoch, each stamped with its number.
auto maker(std::size_t bytes, std::size_t count) {
  return [bytes, count, made = std::size_t{0}]() mutable -> std::optional<Bytes> {
    if (made == count) {
      made = 0;
      return std::nullopt;
    }
    Bytes b(bytes);
    std::memcpy(b.data(), &made, std::min(bytes, sizeof made));
    ++made;
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

struct Figures {
  std::vector<double> remote_s, in_process_s, plain_s, plain_ring_s;
  std::size_t peak_in_flight = 0;
};

// One repeat of one size; the figures land at rank 0.
void measure(cluster::Communicator& comm, const RemoteBenchOptions& o, std::size_t bytes, std::size_t per_worker,
             Figures& f) {
  const std::size_t workers = static_cast<std::size_t>(comm.size() - 1), total = workers * per_worker;

  // The buffers a pipeline holds: its queue's, the edge's credits, one being made.
  const std::size_t held = o.queue + o.capacity + 1;  // (as in run_remote)
  const double plain = cluster::plain_send_recv(comm, 0, bytes, per_worker);
  const double plain_ring = cluster::plain_send_recv(comm, 0, bytes, per_worker, held);
  if (comm.rank() == 0) {
    f.plain_s.push_back(plain);
    f.plain_ring_s.push_back(plain_ring);
  }

  {
    cluster::RemoteEdge<Bytes> edge(comm, {.name = "bench", .trainer = 0, .capacity = o.capacity});
    comm.barrier();
    if (edge.role() == cluster::RemoteRole::worker) {
      auto pipe = PipelineBuilder{}
                      .threads(o.threads)
                      .epochs(1)
                      .source("make", maker(bytes, per_worker), {.queue = o.queue})
                      .build();
      edge.serve(pipe);
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
    auto pipe =
        PipelineBuilder{}.threads(o.threads).epochs(1).source("make", maker(bytes, total), {.queue = o.queue}).build();
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
      const std::size_t held = o.queue + o.capacity + 1;
      const double items = static_cast<double>(workers * per_worker), moved = items * static_cast<double>(bytes);
      const Spread remote = spread(f.remote_s), local = spread(f.in_process_s), plain = spread(f.plain_s),
                   ring = spread(f.plain_ring_s);
      Json row;
      row["item_bytes"] = bytes;
      row["items"] = workers * per_worker;
      row["remote_items_per_s"] = items / remote.median;
      row["in_process_items_per_s"] = items / local.median;
      row["remote_vs_in_process"] = local.median / remote.median;
      row["remote_bytes_per_s"] = moved / remote.median;
      row["plain_send_recv_bytes_per_s"] = moved / plain.median;
      row["remote_vs_plain_send_recv"] = plain.median / remote.median;
      row["plain_send_recv_new_memory_bytes_per_s"] = moved / ring.median;
      row["remote_vs_plain_send_recv_new_memory"] = ring.median / remote.median;
      row["peak_in_flight"] = f.peak_in_flight;
      std::cout << bytes << "-byte items, " << workers << " worker(s) -> rank 0, median of " << common.repeats
                << ":\n  remote edge      " << items / remote.median << " items/s, " << moved / remote.median / 1e9
                << " GB/s\n  one process      " << items / local.median << " items/s  (remote/in-process "
                << local.median / remote.median << ")\n  MPI_Send/Recv    " << moved / plain.median / 1e9
                << " GB/s  (remote/plain " << plain.median / remote.median << ")\n  MPI_Send/Recv, " << held
                << " buffers " << moved / ring.median / 1e9 << " GB/s  (remote/plain " << ring.median / remote.median
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
