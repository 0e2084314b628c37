// The backends behind Device::open, and what gpu/'s kernels need to launch on either.
// Private to gpu/.
#pragma once

#include <functional>
#include <memory>

#include "stoker/gpu/device.h"

namespace stoker::gpu::detail {

std::shared_ptr<Device> open_cpu_device();
/// Throws std::runtime_error in a build without CUDA.
std::shared_ptr<Device> open_cuda_device();

/// Base of both backends' devices: gives their streams access to the copy counters.
class DeviceBase : public Device {
 public:
  void counted_h2d(std::size_t bytes) noexcept { count_h2d(bytes); }
  void counted_d2h(std::size_t bytes) noexcept { count_d2h(bytes); }
};

/// A named NVTX range for as long as it lives, in a build with CUDA; nothing otherwise.
class TraceRange {
 public:
  explicit TraceRange(const char* name) noexcept;
  ~TraceRange();
  TraceRange(const TraceRange&) = delete;
  TraceRange& operator=(const TraceRange&) = delete;
};

/// Runs `cpu` in stream order on a CPU-backend stream, or `cuda(cudaStream_t)` on a CUDA one.
/// The one place where a kernel's two implementations meet.
template <class Cpu, class Cuda>
void launch(Stream& stream, Cpu&& cpu, Cuda&& cuda) {
  if (void* native = stream.native_handle())
    cuda(native);
  else
    stream.host_task(std::forward<Cpu>(cpu));
}

}  // namespace stoker::gpu::detail
