// What the process can see of CUDA devices. Plain C++: no CUDA header here.
#pragma once

#include <stdexcept>
#include <string>

namespace stoker::gpu {

/// True when this build of stoker contains the CUDA backend.
bool built_with_cuda() noexcept;

/// Number of CUDA devices visible to the process; 0 in a build without CUDA, on a
/// machine without a GPU or driver, or when CUDA_VISIBLE_DEVICES hides them all.
int cuda_device_count() noexcept;

/// A failed CUDA call: the call, its error string, and where it was made.
class CudaError : public std::runtime_error {
 public:
  CudaError(int code, const std::string& what) : std::runtime_error(what), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

}  // namespace stoker::gpu
