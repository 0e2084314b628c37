// SPDX-License-Identifier: Apache-2.0
// Internal: what the world's communicators (MPI's, or none) share.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "stoker/cluster/communicator.h"
#include "stoker/cluster/remote.h"

namespace stoker::cluster {

/// Runs `main`; an exception out of it, with more than one rank, aborts them all, naming this one.
int run_guarded(Communicator& comm, const std::function<int(Communicator&)>& main);

/// A rank that did not say its last word on a remote edge: MPI_Finalize would wait for it, so
/// run_world ends the job instead (under Open MPI's --enable-recovery, where MPI_Abort does not end
/// it and a rank that died does not hold MPI_Finalize back, it finalizes). Thread-safe.
void note_unresponsive(int rank);
/// The ranks noted so far, ascending.
std::vector<int> unresponsive();

/// Bounds one of MPI's calls that block and cannot be given up (MPI_Init_thread, MPI_Comm_dup,
/// MPI_Finalize), where one rank that stopped, died or never started holds every other for ever:
/// unless the scope ends within the setup timeout (STOKER_SETUP_TIMEOUT, in seconds; 120 unless
/// set; 0: no limit), this process ends with exit status 1, saying which call of which rank
/// waited how long, and mpirun ends the others. Built with MPI only.
class SetupDeadline {
 public:
  explicit SetupDeadline(std::string call);
  ~SetupDeadline();
  SetupDeadline(const SetupDeadline&) = delete;
  SetupDeadline& operator=(const SetupDeadline&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  bool over_ = false;
  std::thread watcher_;
};

namespace detail {
/// The options of a remote edge checked against the world, with its workers filled in; throws
/// std::invalid_argument naming the edge and the option.
RemoteOptions checked(const Communicator& comm, RemoteOptions options);
}  // namespace detail

}  // namespace stoker::cluster
