// SPDX-License-Identifier: Apache-2.0
// A build without CUDA has no CUDA stream, so launch() never takes the CUDA branch; these
// only satisfy the linker.
#include <stdexcept>

#include "nn_cuda.h"

namespace stoker::gpu::detail::cuda_nn {

namespace {
[[noreturn]] void unavailable() { throw std::logic_error("nn: CUDA op called in a build without CUDA"); }
}  // namespace

void gemm(Stream&, void*, bool, bool, int, int, int, float, const float*, int, const float*, int, float, float*, int) {
  unavailable();
}
void bias_activation(void*, float*, const float*, int, int, bool) { unavailable(); }
void relu_backward(void*, float*, const float*, std::size_t) { unavailable(); }
void softmax_cross_entropy(void*, const float*, const std::int32_t*, int, int, float*, float, float*, std::int32_t*) {
  unavailable();
}
void column_sum(void*, const float*, int, int, float*) { unavailable(); }
void sgd_momentum(void*, float*, const float*, float*, std::size_t, const float*, float, float) { unavailable(); }
void fill(void*, float*, float) { unavailable(); }
void zero(void*, void*, std::size_t) { unavailable(); }

}  // namespace stoker::gpu::detail::cuda_nn
