#include <doctest/doctest.h>

#include "stoker/gpu/device.h"

TEST_CASE("cuda_device_count answers without throwing, with or without a GPU") {
  const int n = stoker::gpu::cuda_device_count();
  CHECK(n >= 0);
  if (!stoker::gpu::built_with_cuda()) CHECK(n == 0);
  if (n == 0) MESSAGE("no CUDA device found: GPU tests are skipped on this machine");
}
