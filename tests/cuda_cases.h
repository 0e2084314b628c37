// SPDX-License-Identifier: Apache-2.0
// Whether a test case's CUDA half runs here, decided and said the same way by every test.
#pragma once

#include <doctest/doctest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "stoker/gpu/device.h"

namespace stoker::test {

/// Counts the CUDA halves of a test process, and says at its exit how many ran and how many
/// were skipped: scripts/gpu-check.sh reports the count, so a GPU run shows that CUDA work ran.
struct CudaTally {
  std::atomic<int> ran{0}, skipped{0};
  ~CudaTally() { std::printf("CUDA halves: %d ran, %d skipped\n", ran.load(), skipped.load()); }
};
inline CudaTally& cuda_tally() {
  static CudaTally tally;
  return tally;
}

/// True when a CUDA device is visible: the case's CUDA half (`what`) runs. Otherwise it is
/// skipped, saying so, and why when CUDA cannot start. With STOKER_REQUIRE_CUDA set (as
/// scripts/gpu-check.sh sets it on a machine with a GPU) a skip fails the case instead: there,
/// CUDA that did not start must not pass for green.
inline bool cuda_half(const char* what) {
  if (gpu::cuda_device_count() > 0) {
    ++cuda_tally().ran;
    return true;
  }
  ++cuda_tally().skipped;
  const std::string problem = gpu::cuda_problem();
  const std::string why = problem.empty() ? "no CUDA device found" : "CUDA cannot start (" + problem + ")";
  if (std::getenv("STOKER_REQUIRE_CUDA") != nullptr)
    FAIL_CHECK("STOKER_REQUIRE_CUDA is set, but " << why << "; not run: " << std::string(what));
  else
    MESSAGE(why << "; skipped: " << std::string(what));
  return false;
}

}  // namespace stoker::test
