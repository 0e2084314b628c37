// What every communicator shares, and the one of a single process.
#include <cstdio>
#include <cstdlib>

#include "communicator_impl.h"

namespace stoker::cluster {

void Communicator::allreduce_mean(std::span<float> data) {
  allreduce_sum(data);
  const float scale = 1.0f / static_cast<float>(size());
  for (float& v : data) v *= scale;
}

namespace {

class SingleProcess final : public Communicator {
 public:
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  std::string engine() const override { return "one process"; }
  void barrier() override {}
  void broadcast(std::span<std::byte>, int root) override { check_root(root); }
  void allreduce_sum(std::span<float>) override {}
  std::vector<std::string> gather(std::string_view record, int root) override {
    check_root(root);
    return {std::string(record)};
  }
  [[noreturn]] void abort(const std::string& why) noexcept override {
    std::fprintf(stderr, "rank 0: %s\n", why.c_str());
    std::_Exit(1);
  }

 private:
  static void check_root(int root) {
    if (root != 0) throw ClusterError("rank 0: root " + std::to_string(root) + " is not a rank of a world of 1");
  }
};

}  // namespace

std::unique_ptr<Communicator> single_process() { return std::make_unique<SingleProcess>(); }

int run_guarded(Communicator& comm, const std::function<int(Communicator&)>& main) {
  try {
    return main(comm);
  } catch (const std::exception& e) {
    if (comm.size() == 1) throw;  // one process: the caller reports it as it would any other
    comm.abort(std::string("error: ") + e.what());
  } catch (...) {
    if (comm.size() == 1) throw;
    comm.abort("error: an unknown exception");
  }
  return 1;  // not reached: abort() ends the process (GCC does not see that through a virtual call)
}

}  // namespace stoker::cluster
