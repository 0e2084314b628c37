// SPDX-License-Identifier: Apache-2.0
// A remote edge without MPI: there is no other rank to reach.
#include "communicator_impl.h"
#include "stoker/cluster/plain_transfer.h"

namespace stoker::cluster::detail {

std::shared_ptr<Link> open_link(Communicator& comm, RemoteOptions options) {
  options = checked(comm, std::move(options));  // a world of one: says it needs two ranks
  throw ClusterError("remote edge '" + options.name + "' needs MPI, and this stoker was built without it (STOKER_MPI)");
}

}  // namespace stoker::cluster::detail

namespace stoker::cluster {

double plain_send_recv(Communicator&, int, std::size_t, std::size_t, std::size_t) {
  throw ClusterError("plain_send_recv needs MPI, and this stoker was built without it (STOKER_MPI)");
}

}  // namespace stoker::cluster
