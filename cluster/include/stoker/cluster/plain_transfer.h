// SPDX-License-Identifier: Apache-2.0
// The baseline a remote edge's bandwidth is measured against (stoker-bench remote).
#pragma once

#include <cstddef>

#include "stoker/cluster/communicator.h"
#include "stoker/cluster/remote.h"

namespace stoker::cluster {

/// A plain MPI loop with the memory pattern of a remote edge and none of its machinery: every
/// rank but `receiver` sends `count` messages of `bytes` to it, each from a Bytes of its own (as
/// an edge's items are: from the same cache of freed blocks), with up to `window` sends under
/// way (MPI_Isend; a Bytes goes back to the cache once its send completes); the receiver takes
/// them all, from any rank, each into a Bytes of its own that goes back at once. Each side
/// waits as an edge's pump does, testing its request and yielding the core in between (Open
/// MPI's blocking calls spin, which on a loaded machine makes the loop's speed a matter of
/// scheduling). Collective. Returns, at the receiver, the seconds from a barrier to its last MPI_Recv; 0 at
/// the other ranks. Throws ClusterError without MPI.
double plain_send_recv(Communicator& comm, int receiver, std::size_t bytes, std::size_t count, std::size_t window = 1);

}  // namespace stoker::cluster
