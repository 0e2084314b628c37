#include "stoker/gpu/device.h"

namespace stoker::gpu {

bool built_with_cuda() noexcept { return false; }
int cuda_device_count() noexcept { return 0; }

}  // namespace stoker::gpu
