// The backends behind Device::open, and what gpu/'s kernels need to launch on either.
// Private to gpu/.
#pragma once

#include <functional>
#include <memory>
#include <string>

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

/// What a failure of device work says once it surfaces: `what`, and why it may surface far from
/// the work that failed.
std::string async_failure(const std::string& what);

/// For a destructor that caught a failure while it waited for device work (a sticky CUDA error,
/// the CUDA runtime unloading at exit): logs the first such failure of the process through
/// spdlog, counts the later ones at debug level, and returns. Call it from a catch block.
void log_teardown_failure(const char* where) noexcept;

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
