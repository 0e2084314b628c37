// SPDX-License-Identifier: Apache-2.0
// A profiler's ranges around every stage body.
#pragma once

namespace stoker {

/// Ranges a profiler draws around every stage body, named after the stage: stoker::gpu
/// installs NVTX ranges when it opens a CUDA device, so that Nsight Systems shows the stages
/// next to the copies and kernels. Process-wide; null functions turn it off.
struct BodyTracer {
  void (*begin)(const char* stage) = nullptr;
  void (*end)() = nullptr;
};

/// Installs `tracer` for the bodies that start from now on. Any thread.
void set_body_tracer(BodyTracer tracer) noexcept;

}  // namespace stoker
