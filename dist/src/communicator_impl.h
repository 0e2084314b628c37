// Internal: what the world's communicators (MPI's, or none) share.
#pragma once

#include <functional>

#include "stoker/dist/communicator.h"

namespace stoker::dist {

/// Runs `main`; an exception out of it, with more than one rank, aborts them all, naming this one.
int run_guarded(Communicator& comm, const std::function<int(Communicator&)>& main);

}  // namespace stoker::dist
