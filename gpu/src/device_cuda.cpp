#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "stoker/gpu/device.h"

namespace stoker::gpu {

bool built_with_cuda() noexcept { return true; }

int cuda_device_count() noexcept {
  int count = 0;
  // No driver or no device is an answer here, not an error.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

}  // namespace stoker::gpu
