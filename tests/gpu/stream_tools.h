// SPDX-License-Identifier: Apache-2.0
// What the device-layer tests need to hold streams back and to see CUDA's per-thread state, on
// either backend, without CUDA headers: the CUDA halves are kernels in stream_tools_cuda.cu.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <vector>

#include "cuda_cases.h"
#include "stoker/gpu/device.h"

namespace stoker::test {

/// Every backend of this machine, for a case to run on each: the CPU backend, and CUDA when a
/// GPU is visible (otherwise the case says that its CUDA half is skipped).
inline std::vector<std::shared_ptr<gpu::Device>> devices() {
  std::vector<std::shared_ptr<gpu::Device>> out{gpu::Device::open("cpu")};
  if (cuda_half("the CUDA half of this case")) out.push_back(gpu::Device::open("cuda"));
  return out;
}

/// Holds streams at a point until opened. On the CPU backend the stream's worker waits; on
/// CUDA a one-thread kernel spins on a flag in pinned memory that open() writes (a host task
/// would block CUDA's callback thread, which the host tasks of every stream share). Opens
/// itself when destroyed, so that no stream stays held.
class StreamGate {
 public:
  explicit StreamGate(gpu::Device& device);
  ~StreamGate();
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  /// Work issued to `stream` after this starts once the gate is open.
  void hold(gpu::Stream& stream);
  void open();

 private:
  struct State;
  std::shared_ptr<State> state_;
};

/// Work that takes about `duration` on `stream`: a host task that sleeps on the CPU backend, a
/// kernel that spins on CUDA.
void delay(gpu::Stream& stream, std::chrono::microseconds duration);

/// A kernel that traps, on a CUDA stream: a real fault, sticky for the whole process. Throws
/// std::logic_error on a stream without a native handle (the CPU backend).
void fault(gpu::Stream& stream);

/// The calling thread's current CUDA device, -1 without CUDA or without a device.
int current_cuda_device();
/// Makes `ordinal` the calling thread's current CUDA device; throws without CUDA.
void set_current_cuda_device(int ordinal);
/// Whether the calling thread has a CUDA context current (cuCtxGetCurrent); false without CUDA.
bool thread_has_cuda_context();

namespace detail {
// The CUDA halves, on a cudaStream_t (stream_tools_cuda.cu; a build without CUDA has stubs).
void cuda_gate(void* stream, const volatile unsigned* flag);
void cuda_delay(void* stream, std::chrono::microseconds duration);
void cuda_fault(void* stream);
}  // namespace detail

}  // namespace stoker::test
