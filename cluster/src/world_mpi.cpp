// The world over MPI. Every call's error comes back (MPI_ERRORS_RETURN) and is thrown as a
// ClusterError naming the rank and the call.
#include <mpi.h>

#include <cstdio>
#include <numeric>

#include "communicator_impl.h"

namespace stoker::cluster {

namespace {

class Mpi final : public Communicator {
 public:
  Mpi() {
    check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string engine() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(version, &length);
    std::string v(version, static_cast<std::size_t>(length));
    v = v.substr(0, v.find_first_of(",\n"));
    return "MPI (" + v + ")";
  }

  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }
  void broadcast(std::span<std::byte> data, int root) override {
    check_root(root, "MPI_Bcast");
    check(MPI_Bcast(data.data(), count(data.size(), "MPI_Bcast"), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
  }
  void allreduce_sum(std::span<float> data) override {
    check(MPI_Allreduce(MPI_IN_PLACE, data.data(), count(data.size(), "MPI_Allreduce"), MPI_FLOAT, MPI_SUM,
                        MPI_COMM_WORLD),
          "MPI_Allreduce");
  }
  std::vector<std::string> gather(std::string_view record, int root) override {
    check_root(root, "MPI_Gather");
    int length = count(record.size(), "MPI_Gather");
    std::vector<int> lengths(rank_ == root ? static_cast<std::size_t>(size_) : 0);
    check(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, root, MPI_COMM_WORLD), "MPI_Gather");
    std::vector<int> offsets(lengths.size());
    std::string all;
    if (rank_ == root) {
      std::exclusive_scan(lengths.begin(), lengths.end(), offsets.begin(), 0);
      all.resize(static_cast<std::size_t>(std::accumulate(lengths.begin(), lengths.end(), 0L)));
    }
    check(MPI_Gatherv(record.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, root,
                      MPI_COMM_WORLD),
          "MPI_Gatherv");
    std::vector<std::string> records;
    for (std::size_t r = 0; r < lengths.size(); ++r)
      records.push_back(all.substr(static_cast<std::size_t>(offsets[r]), static_cast<std::size_t>(lengths[r])));
    return records;
  }
  [[noreturn]] void abort(const std::string& why) noexcept override {
    std::fprintf(stderr, "rank %d of %d: %s\n", rank_, size_, why.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);  // MPI_Abort does not return; should it, this process still ends
  }

 private:
  void check(int code, const char* call) const {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    throw ClusterError("rank " + std::to_string(rank_) + ": " + call +
                    " failed: " + std::string(text, static_cast<std::size_t>(length)));
  }
  void check_root(int root, const char* call) const {
    if (root < 0 || root >= size_)
      throw ClusterError("rank " + std::to_string(rank_) + ": " + call + ": root " + std::to_string(root) +
                      " is not a rank of a world of " + std::to_string(size_));
  }
  // MPI counts are ints.
  int count(std::size_t n, const char* call) const {
    if (n > static_cast<std::size_t>(INT_MAX))
      throw ClusterError("rank " + std::to_string(rank_) + ": " + call + ": " + std::to_string(n) +
                      " elements, more than MPI's int count holds");
    return static_cast<int>(n);
  }

  int rank_ = 0, size_ = 1;
};

}  // namespace

bool built_with_mpi() noexcept { return true; }

int run_world(int argc, char** argv, const std::function<int(Communicator&)>& main) {
  int provided = 0;
  // Collectives come from the thread that runs `main`, and a remote edge's own thread calls MPI
  // at the same time (remote_mpi.cpp): that needs MPI_THREAD_MULTIPLE. A remote edge refuses to
  // open on an MPI that gives less; everything else works with what the MPI gives.
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
    throw ClusterError("MPI_Init_thread failed");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int status = 0;
  {
    Mpi comm;
    status = run_guarded(comm, main);
  }
  MPI_Finalize();
  return status;
}

}  // namespace stoker::cluster
