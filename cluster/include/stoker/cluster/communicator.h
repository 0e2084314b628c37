// SPDX-License-Identifier: Apache-2.0
// Processes working together: the ranks of a data-parallel job. Over MPI when stoker is built
// with it (STOKER_MPI), as one process otherwise, behind one interface, so that code written
// against it runs everywhere. Nothing outside cluster/ includes mpi.h.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace stoker::cluster {

/// A collective that failed; the message names the rank and the operation.
class ClusterError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The ranks of a job differ in something that must be the same on all of them (agree()).
class RankMismatch : public ClusterError {
 public:
  using ClusterError::ClusterError;
};

/// The ranks of a job. Collectives are called by every rank in the same order, from one thread
/// of each (the pipeline's threads never call them).
///
/// A collective waits for the other ranks asleep, not spinning: it polls its request, at first
/// continuously, then at intervals of a sixteenth of the time it has waited, 1 ms at most. So a
/// rank that waits long for a slow one costs a thousand wake-ups a second rather than a core
/// (Open MPI's blocking collectives spin), and once the slow one comes, each message hop of the
/// collective may take up to a sixteenth of the wait (1 ms at most) longer.
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
  /// records (reports, counters), not for bulk data: records of more than 2 GiB - 1 bytes in
  /// all (MPI's displacements are ints) throw ClusterError on every rank, and nothing is sent.
  virtual std::vector<std::string> gather(std::string_view record, int root = 0) = 0;

  /// How long a collective waits for the slowest rank; zero (the default) is as long as it takes.
  /// A collective that has waited this long asks every other rank what it is doing and ends
  /// the job (abort()) with a message naming the ranks that have not come, what each was doing
  /// (set_status()) and which collective it had reached; a rank that does not answer within
  /// 2 s is named as not answering (stopped, or stuck where nothing of it runs). MPI has no way
  /// to leave a collective half done, so the job cannot go on. Call it from the thread that
  /// calls the collectives.
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;
  /// What this rank is doing, in a few words ("epoch 2, step 340: waiting for its next batch"),
  /// which another rank's timeout reports. Thread-safe, and cheap enough to call every step.
  virtual void set_status(std::string_view status) = 0;
  /// Ends this process and every other rank's at once, printing `why` with this rank's number:
  /// for an error after which the others would wait for this rank forever.
  [[noreturn]] virtual void abort(const std::string& why) noexcept = 0;
};

/// A communicator of one rank: collectives return at once, leaving the data as it is.
std::unique_ptr<Communicator> single_process();

/// "rank 3", "ranks 0, 2", "ranks 0-3, 5": ascending ranks, for a person.
std::string rank_list(const std::vector<int>& ranks);

/// Named facts that must be the same on every rank, e.g. {"training data", fingerprint}.
using Facts = std::vector<std::pair<std::string, std::string>>;

/// Compares every rank's `facts` (a collective): returns when they are the same on every rank,
/// and otherwise throws RankMismatch on every rank, naming each fact that differs and which
/// ranks have which value, e.g. "the ranks differ: training data: ranks 0, 2 have 'idx, 2000
/// samples...', rank 1 has 'idx, 1000 samples...'". A fact that a rank lacks counts as a value
/// of its own ("nothing"). Made for a job's start: what a rank could not read or open belongs
/// in its facts too, so that every rank stops at once, rather than one rank leaving the others
/// waiting at a collective.
void agree(Communicator& comm, const Facts& facts);

/// Whether this stoker was built with MPI.
bool built_with_mpi() noexcept;

/// Runs `main` with the job's communicator and returns its exit status: MPI's world when stoker
/// was built with MPI (initialized here, finalized after; a program started without mpirun is a
/// world of one), one process otherwise. An exception out of `main` on any rank is printed
/// naming the rank, and ends every rank (exit status 1): no rank is left waiting at a
/// collective for one that is gone.
int run_world(int argc, char** argv, const std::function<int(Communicator&)>& main);

}  // namespace stoker::cluster
