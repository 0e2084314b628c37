// SPDX-License-Identifier: Apache-2.0
// The CUDA side of nn.h: each launches on the cudaStream_t it is given (as void*, so that
// this header stays plain C++). Defined in nn_cuda.cu, or in nn_nocuda.cpp for a build
// without CUDA, where no CUDA stream can exist to call them with. Private to gpu/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "stoker/gpu/device.h"

namespace stoker::gpu::detail::cuda_nn {

/// `owner` is the Stream whose cudaStream_t `stream` is: it owns the cuBLAS handle bound to it.
void gemm(Stream& owner, void* stream, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
          int lda, const float* b, int ldb, float beta, float* c, int ldc);
void bias_activation(void* stream, float* y, const float* bias, int rows, int cols, bool relu);
void relu_backward(void* stream, float* grad, const float* activation, std::size_t n);
void softmax_cross_entropy(void* stream, const float* logits, const std::int32_t* labels, int rows, int classes,
                           float* grad, float grad_scale, float* loss_sum, std::int32_t* correct);
void column_sum(void* stream, const float* a, int rows, int cols, float* out);
void sgd_momentum(void* stream, float* param, const float* grad, float* velocity, std::size_t n, const float* lr,
                  float momentum, float weight_decay);
void fill(void* stream, float* dst, float value);
void zero(void* stream, void* dst, std::size_t bytes);

}  // namespace stoker::gpu::detail::cuda_nn
