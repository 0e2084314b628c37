#include <stdexcept>

#include "backends.h"

namespace stoker::gpu {

bool built_with_cuda() noexcept { return false; }
int cuda_device_count() noexcept { return 0; }

namespace detail {
TraceRange::TraceRange(const char*) noexcept {}
TraceRange::~TraceRange() = default;

std::shared_ptr<Device> open_cuda_device() {
  throw std::runtime_error("device 'cuda': this build of stoker has no CUDA backend");
}
}  // namespace detail

}  // namespace stoker::gpu
