// SPDX-License-Identifier: Apache-2.0
// The world without MPI: one process.
#include "communicator_impl.h"

namespace stoker::cluster {

bool built_with_mpi() noexcept { return false; }

int run_world(int, char**, const std::function<int(Communicator&)>& main) {
  const auto comm = single_process();
  return run_guarded(*comm, main);
}

}  // namespace stoker::cluster
