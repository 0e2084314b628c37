// The backends behind Device::open, and what gpu/'s kernels need to launch on either.
// Private to gpu/.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "stoker/gpu/device.h"

namespace stoker::gpu::detail {

std::shared_ptr<Device> open_cpu_device();
/// CUDA device `ordinal`, which must be visible. Throws std::runtime_error in a build without
/// CUDA.
std::shared_ptr<Device> open_cuda_device(int ordinal);
/// The calling thread's current CUDA device (0 when it has chosen none, or without CUDA).
int current_cuda_device();

/// Makes a CUDA device the calling thread's current one for as long as it lives, then puts
/// back the device that was current, so that stoker never moves its caller to another device.
/// A thread that has no CUDA context yet (it chose no device) is left on the device used:
/// putting back device 0 would create a context there. Costs a cudaGetDevice when the device
/// is already current (the common case). Does nothing for a CPU-backend stream, and in a build
/// without CUDA.
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal);
  /// The device `stream` belongs to.
  explicit DeviceGuard(Stream& stream);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  void enter(int ordinal);
  int previous_ = -1;  // the device to put back; -1 when there is nothing to put back
};

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

/// State a library keeps per CUDA stream (a cuBLAS handle, bound to the stream), made by
/// `make` with the stream's device current on first use, and destroyed with the stream after
/// its work. `key` (the address of a static) tells one library's from another's. Throws
/// std::logic_error for a stream that is not a CUDA one.
std::shared_ptr<void> stream_resource(Stream& stream, const void* key,
                                      const std::function<std::shared_ptr<void>()>& make);

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
/// The CUDA side runs with the stream's device current.
template <class Cpu, class Cuda>
void launch(Stream& stream, Cpu&& cpu, Cuda&& cuda) {
  if (void* native = stream.native_handle()) {
    const DeviceGuard guard(stream);
    cuda(native);
  } else {
    stream.host_task(std::forward<Cpu>(cpu));
  }
}

}  // namespace stoker::gpu::detail
