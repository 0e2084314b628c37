// Processes working together: the ranks of a data-parallel job. Over MPI when stoker is built
// with it (STOKER_MPI), as one process otherwise, behind one interface, so that code written
// against it runs everywhere. Nothing outside cluster/ includes mpi.h.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace stoker::cluster {

/// A collective that failed; the message names the rank and the operation.
class ClusterError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The ranks of a job. Collectives are called by every rank in the same order, from one thread
/// of each (the pipeline's threads never call them).
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  /// "MPI (Open MPI 4.1.4)" or "one process".
  virtual std::string engine() const = 0;

  /// Returns once every rank has called it.
  virtual void barrier() = 0;
  /// Copies `root`'s `data` into every rank's (the same size on every rank).
  virtual void broadcast(std::span<std::byte> data, int root = 0) = 0;
  /// Replaces `data`, on every rank, with its element-wise sum over the ranks.
  virtual void allreduce_sum(std::span<float> data) = 0;
  /// Replaces `data`, on every rank, with its element-wise mean over the ranks.
  void allreduce_mean(std::span<float> data);
  /// Every rank's `record`, in rank order, at `root`; empty at the other ranks. For small
  /// records (reports, counters), not for bulk data.
  virtual std::vector<std::string> gather(std::string_view record, int root = 0) = 0;
  /// Ends this process and every other rank's at once, printing `why` with this rank's number:
  /// for an error after which the others would wait for this rank forever.
  [[noreturn]] virtual void abort(const std::string& why) noexcept = 0;
};

/// A communicator of one rank: collectives return at once, leaving the data as it is.
std::unique_ptr<Communicator> single_process();

/// Whether this stoker was built with MPI.
bool built_with_mpi() noexcept;

/// Runs `main` with the job's communicator and returns its exit status: MPI's world when stoker
/// was built with MPI (initialized here, finalized after; a program started without mpirun is a
/// world of one), one process otherwise. An exception out of `main` on any rank is printed
/// naming the rank, and ends every rank (exit status 1): no rank is left waiting at a
/// collective for one that is gone.
int run_world(int argc, char** argv, const std::function<int(Communicator&)>& main);

}  // namespace stoker::cluster
