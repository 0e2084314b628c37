// SPDX-License-Identifier: Apache-2.0
// The CUDA launchers in a build without CUDA: unreachable, since only a CUDA stream has a
// native handle to launch on.
#include <stdexcept>

#include "augment_kernels.h"
#include "resize_kernels.h"

namespace stoker::gpu::detail {

void cuda_crop(void*, const CropArgs&) { throw std::logic_error("cuda_crop: this build of stoker has no CUDA"); }
void cuda_gather(void*, const GatherArgs&) { throw std::logic_error("cuda_gather: this build of stoker has no CUDA"); }
void cuda_resized_crop(void*, const ResizeArgs&) {
  throw std::logic_error("cuda_resized_crop: this build of stoker has no CUDA");
}

}  // namespace stoker::gpu::detail
