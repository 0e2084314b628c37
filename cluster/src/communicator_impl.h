// Internal: what the world's communicators (MPI's, or none) share.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "stoker/cluster/communicator.h"
#include "stoker/cluster/remote.h"

namespace stoker::cluster {

/// Runs `main`; an exception out of it, with more than one rank, aborts them all, naming this one.
int run_guarded(Communicator& comm, const std::function<int(Communicator&)>& main);

namespace detail {
/// The options of a remote edge checked against the world, with its workers filled in; throws
/// std::invalid_argument naming the edge and the option.
RemoteOptions checked(const Communicator& comm, RemoteOptions options);
}  // namespace detail

}  // namespace stoker::cluster
