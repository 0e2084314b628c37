// The one checked path for CUDA runtime calls. Private to gpu/.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "stoker/gpu/device.h"

namespace stoker::gpu::detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line) {
  throw CudaError(static_cast<int>(code), std::string(file) + ":" + std::to_string(line) + ": " + call + " failed: " +
                                              cudaGetErrorName(code) + " (" + cudaGetErrorString(code) + ")");
}

}  // namespace stoker::gpu::detail

/// Evaluates a CUDA runtime call and throws stoker::gpu::CudaError, with file and line,
/// if it fails.
#define STOKER_CUDA_CHECK(call)                                                                \
  do {                                                                                         \
    const cudaError_t stoker_cuda_status_ = (call);                                            \
    if (stoker_cuda_status_ != cudaSuccess)                                                    \
      ::stoker::gpu::detail::throw_cuda_error(stoker_cuda_status_, #call, __FILE__, __LINE__); \
  } while (false)
