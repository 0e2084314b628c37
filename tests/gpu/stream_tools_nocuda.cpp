// SPDX-License-Identifier: Apache-2.0
// stream_tools.h in a build without CUDA: no stream has a native handle to launch on.
#include <stdexcept>

#include "stream_tools.h"

namespace stoker::test {

int current_cuda_device() { return -1; }
void set_current_cuda_device(int) { throw std::logic_error("set_current_cuda_device: this build has no CUDA"); }
bool thread_has_cuda_context() { return false; }

namespace detail {
void cuda_gate(void*, const volatile unsigned*) { throw std::logic_error("cuda_gate: this build has no CUDA"); }
void cuda_delay(void*, std::chrono::microseconds) { throw std::logic_error("cuda_delay: this build has no CUDA"); }
void cuda_fault(void*) { throw std::logic_error("cuda_fault: this build has no CUDA"); }
}  // namespace detail

}  // namespace stoker::test
