// SPDX-License-Identifier: Apache-2.0
// The one checked path for CUDA runtime calls. Private to gpu/.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "backends.h"
#include "stoker/gpu/device.h"

namespace stoker::gpu::detail {

/// True for the errors of device work that failed after its launch (a kernel's fault), which
/// CUDA reports at a later call, whatever that call is, and for good: the context is lost.
inline bool is_async_fault(cudaError_t code) noexcept {
  switch (code) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

[[noreturn]] inline void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line) {
  // The failed call also set the thread's last error, which the next launch's check reads: a
  // failure its caller catches and goes on from (a best-effort timing mark) would fail that
  // launch too. A sticky fault is not cleared by this: every later call still reports it.
  (void)cudaGetLastError();
  std::string what = std::string(file) + ":" + std::to_string(line) + ": " + call +
                     " failed: " + cudaGetErrorName(code) + " (" + cudaGetErrorString(code) + ")";
  throw CudaError(static_cast<int>(code), is_async_fault(code) ? async_failure(what) : what);
}

}  // namespace stoker::gpu::detail

/// Evaluates a CUDA runtime call and throws stoker::gpu::CudaError, with file and line (the
/// thread's last error cleared), if it fails.
#define STOKER_CUDA_CHECK(call)                                                                \
  do {                                                                                         \
    const cudaError_t stoker_cuda_status_ = (call);                                            \
    if (stoker_cuda_status_ != cudaSuccess)                                                    \
      ::stoker::gpu::detail::throw_cuda_error(stoker_cuda_status_, #call, __FILE__, __LINE__); \
  } while (false)
