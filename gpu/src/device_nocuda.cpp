// SPDX-License-Identifier: Apache-2.0
#include <stdexcept>

#include "backends.h"

namespace stoker::gpu {

bool built_with_cuda() noexcept { return false; }
int cuda_device_count() noexcept { return 0; }
std::string cuda_problem() { return {}; }

namespace detail {
TraceRange::TraceRange(const char*) noexcept {}
TraceRange::~TraceRange() = default;

std::shared_ptr<Device> open_cuda_device(int) {
  throw std::runtime_error("device 'cuda': this build of stoker has no CUDA backend");
}
int current_cuda_device() { return 0; }

// Without CUDA there is no device to make current: only CPU-backend streams exist.
DeviceGuard::DeviceGuard(int) {}
DeviceGuard::DeviceGuard(Stream&) {}
DeviceGuard::~DeviceGuard() = default;

std::shared_ptr<void> stream_resource(Stream&, const void*, const std::function<std::shared_ptr<void>()>&) {
  throw std::logic_error("stream_resource: this build of stoker has no CUDA");
}
std::shared_ptr<void> capture_graph(Stream&, const std::function<void()>&) {
  throw std::logic_error("capture_graph: this build of stoker has no CUDA");
}
void launch_graph(Stream&, void*) { throw std::logic_error("launch_graph: this build of stoker has no CUDA"); }
}  // namespace detail

}  // namespace stoker::gpu
