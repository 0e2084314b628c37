// The baseline a remote edge's bandwidth is measured against (stoker-bench remote).
#pragma once

#include <cstddef>

#include "stoker/cluster/communicator.h"

namespace stoker::cluster {

/// A plain MPI_Send/MPI_Recv loop: every rank but `receiver` sends `count` messages of `bytes`
/// to it with MPI_Send; the receiver takes them all with MPI_Recv, from any rank. Each side
/// goes round `buffers` buffers of its own: with one, every message is sent from and received
/// into memory that is in the CPU's caches; with as many as a pipeline holds, each message is
/// new memory, as each batch of a pipeline is. Collective. Returns, at the receiver, the
/// seconds from a barrier to its last MPI_Recv; 0 at the other ranks. Throws ClusterError without
/// MPI.
double plain_send_recv(Communicator& comm, int receiver, std::size_t bytes, std::size_t count, std::size_t buffers = 1);

}  // namespace stoker::cluster
