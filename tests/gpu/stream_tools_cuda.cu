// SPDX-License-Identifier: Apache-2.0
// The CUDA halves of stream_tools.h: test kernels and the current device.
#include <cuda.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "stream_tools.h"

namespace stoker::test {

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

__global__ void gate_kernel(const volatile unsigned* flag) {
  while (*flag == 0) __nanosleep(1000);
}

__device__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void fault_kernel() { __trap(); }

__global__ void delay_kernel(unsigned long long ns) {
  const unsigned long long start = now_ns();
  while (now_ns() - start < ns) __nanosleep(1000);
}

}  // namespace

int current_cuda_device() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return device;
}

void set_current_cuda_device(int ordinal) { check(cudaSetDevice(ordinal), "cudaSetDevice"); }

// Asked of the driver through the runtime, as stoker does: the tests need no libcuda to link.
bool thread_has_cuda_context() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  check(cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &found),
        "cudaGetDriverEntryPointByVersion");
  if (found != cudaDriverEntryPointSuccess) throw std::runtime_error("cuCtxGetCurrent: not found in the driver");
  CUcontext context = nullptr;
  if (reinterpret_cast<CUresult (*)(CUcontext*)>(fn)(&context) != CUDA_SUCCESS)
    throw std::runtime_error("cuCtxGetCurrent failed");
  return context != nullptr;
}

namespace detail {

void cuda_gate(void* stream, const volatile unsigned* flag) {
  gate_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(flag);
  check(cudaGetLastError(), "gate kernel");
}

void cuda_delay(void* stream, std::chrono::microseconds duration) {
  delay_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<unsigned long long>(duration.count()) *
                                                               1000ull);
  check(cudaGetLastError(), "delay kernel");
}

void cuda_fault(void* stream) {
  fault_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>();
  check(cudaGetLastError(), "fault kernel");
}

}  // namespace detail

}  // namespace stoker::test
