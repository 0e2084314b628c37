// A remote edge without MPI: there is no other rank to reach.
#include "communicator_impl.h"
#include "stoker/dist/plain_transfer.h"

namespace stoker::dist::detail {

std::shared_ptr<Link> open_link(Communicator& comm, RemoteOptions options) {
  options = checked(comm, std::move(options));  // a world of one: says it needs two ranks
  throw DistError("remote edge '" + options.name + "' needs MPI, and this stoker was built without it (STOKER_MPI)");
}

}  // namespace stoker::dist::detail

namespace stoker::dist {

double plain_send_recv(Communicator&, int, std::size_t, std::size_t, std::size_t) {
  throw DistError("plain_send_recv needs MPI, and this stoker was built without it (STOKER_MPI)");
}

}  // namespace stoker::dist
