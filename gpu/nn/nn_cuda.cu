// SPDX-License-Identifier: Apache-2.0
// nn.h on CUDA: small elementwise kernels and their launchers, and matrix products through
// cuBLAS.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>

#include "backends.h"
#include "cuda_check.h"
#include "nn_cuda.h"

namespace stoker::gpu::detail::cuda_nn {

namespace {

// A DeviceError, not a CudaError: a cuBLAS status is not a CUDA error code (CudaError::code()).
#define STOKER_CUBLAS_CHECK(call)                                                               \
  do {                                                                                          \
    const cublasStatus_t stoker_cublas_status_ = (call);                                        \
    if (stoker_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                         \
      throw DeviceError(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " + #call + \
                        " failed: " + cublasGetStatusName(stoker_cublas_status_));              \
  } while (false)

// One cuBLAS handle per stream, bound to it when made (a handle carries its stream, and
// rebinding one shared handle from several threads would race), owned by the stream and
// destroyed with it, with its device current: a handle belongs to the device it was made on.
cublasHandle_t handle_for(Stream& owner, cudaStream_t stream) {
  static const char key = 0;
  const auto handle = stream_resource(owner, &key, [&] {
    cublasHandle_t h = nullptr;
    STOKER_CUBLAS_CHECK(cublasCreate(&h));
    std::shared_ptr<void> owned(h, [](void* p) { (void)cublasDestroy(static_cast<cublasHandle_t>(p)); });
    STOKER_CUBLAS_CHECK(cublasSetStream(h, stream));
    return owned;
  });
  return static_cast<cublasHandle_t>(handle.get());
}

constexpr int kThreads = 256;

// Grid-stride kernels need no more blocks than keep every SM busy.
unsigned blocks_for(std::size_t n) {
  return static_cast<unsigned>(std::min<std::size_t>((n + kThreads - 1) / kThreads, 4096));
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

__global__ void bias_activation_kernel(float* y, const float* bias, int rows, int cols, bool relu) {
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float v = y[i] + bias[i % cols];
    // Not fmaxf, which turns NaN into 0 and would hide a diverged step: v < 0 is false for NaN,
    // so NaN stays NaN, as with std::max(v, 0.0f) on the CPU backend.
    y[i] = relu && v < 0.0f ? 0.0f : v;
  }
}

__global__ void relu_backward_kernel(float* grad, const float* activation, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    if (!(activation[i] > 0.0f)) grad[i] = 0.0f;
}

// Row i's gradient, and its loss and whether it is right, for the caller to add up.
__device__ void softmax_cross_entropy_row(const float* logits, const std::int32_t* labels, std::size_t i, int classes,
                                          float* grad, float grad_scale, float& loss, std::int32_t& correct) {
  const std::size_t offset = i * static_cast<std::size_t>(classes);
  const float* z = logits + offset;
  const std::int32_t label = labels[i];
  const bool valid = label >= 0 && label < classes;
  int best = 0;
  for (int j = 1; j < classes; ++j)
    if (z[j] > z[best]) best = j;
  const float top = z[best];
  float sum = 0.0f;
  for (int j = 0; j < classes; ++j) sum += expf(z[j] - top);
  if (valid) {
    loss += logf(sum) - (z[label] - top);
    if (best == label) ++correct;
  }
  if (grad) {
    float* g = grad + offset;
    for (int j = 0; j < classes; ++j)
      g[j] = valid ? (expf(z[j] - top) / sum - (j == label ? 1.0f : 0.0f)) * grad_scale : 0.0f;
  }
}

// One thread per row, striding over the rows: a classifier's rows are short (10 classes
// here), and the grid is capped (blocks_for), so past 4096 blocks' worth a thread takes more.
// The loss and the count are summed in a fixed order, so that a run repeats to the bit (they
// are part of a checkpoint): each thread over its rows in turn, then the block's threads by a
// fixed tree. The launcher makes it one block when they are asked for.
__global__ void softmax_cross_entropy_kernel(const float* logits, const std::int32_t* labels, int rows, int classes,
                                             float* grad, float grad_scale, float* loss_sum, std::int32_t* correct) {
  float loss = 0.0f;
  std::int32_t right = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < static_cast<std::size_t>(rows);
       i += std::size_t{gridDim.x} * blockDim.x)
    softmax_cross_entropy_row(logits, labels, i, classes, grad, grad_scale, loss, right);
  if (!loss_sum && !correct) return;
  __shared__ float losses[kThreads];
  __shared__ std::int32_t rights[kThreads];
  losses[threadIdx.x] = loss;
  rights[threadIdx.x] = right;
  __syncthreads();
  for (unsigned half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      losses[threadIdx.x] += losses[threadIdx.x + half];
      rights[threadIdx.x] += rights[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (loss_sum) *loss_sum += losses[0];
    if (correct) *correct += rights[0];
  }
}

// One thread per column, striding over the columns past what the capped grid covers;
// neighbouring threads read neighbouring elements of each row.
__global__ void column_sum_kernel(const float* a, int rows, int cols, float* out) {
  for (std::size_t j = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; j < static_cast<std::size_t>(cols);
       j += std::size_t{gridDim.x} * blockDim.x) {
    float sum = 0.0f;
    for (std::size_t i = 0; i < static_cast<std::size_t>(rows); ++i) sum += a[i * cols + j];
    out[j] = sum;
  }
}

__global__ void sgd_momentum_kernel(float* param, const float* grad, float* velocity, std::size_t n,
                                    const float* learning_rate, float momentum, float weight_decay) {
  const float lr = *learning_rate;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float v = momentum * velocity[i] + grad[i] + weight_decay * param[i];
    velocity[i] = v;
    param[i] -= lr * v;
  }
}

__global__ void fill_kernel(float* dst, float value) { *dst = value; }

}  // namespace

// cuBLAS is column-major. A row-major m x n matrix is, read column-major, its n x m
// transpose, so C = op(A) op(B) row-major is C^T = op(B)^T op(A)^T column-major: the same
// call with the operands swapped and m and n swapped, leading dimensions unchanged.
void gemm(Stream& owner, void* stream, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
          int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  STOKER_CUBLAS_CHECK(cublasSgemm(handle_for(owner, as_stream(stream)), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc));
}

void bias_activation(void* stream, float* y, const float* bias, int rows, int cols, bool relu) {
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  bias_activation_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(y, bias, rows, cols, relu);
  STOKER_CUDA_CHECK(cudaGetLastError());
}

void relu_backward(void* stream, float* grad, const float* activation, std::size_t n) {
  relu_backward_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(grad, activation, n);
  STOKER_CUDA_CHECK(cudaGetLastError());
}

void softmax_cross_entropy(void* stream, const float* logits, const std::int32_t* labels, int rows, int classes,
                           float* grad, float grad_scale, float* loss_sum, std::int32_t* correct) {
  // One block adds up the loss, in its fixed order: a step's rows are a batch, a few hundred.
  const unsigned blocks = loss_sum || correct ? 1 : blocks_for(static_cast<std::size_t>(rows));
  softmax_cross_entropy_kernel<<<blocks, kThreads, 0, as_stream(stream)>>>(logits, labels, rows, classes, grad,
                                                                           grad_scale, loss_sum, correct);
  STOKER_CUDA_CHECK(cudaGetLastError());
}

void column_sum(void* stream, const float* a, int rows, int cols, float* out) {
  column_sum_kernel<<<blocks_for(static_cast<std::size_t>(cols)), kThreads, 0, as_stream(stream)>>>(a, rows, cols, out);
  STOKER_CUDA_CHECK(cudaGetLastError());
}

void sgd_momentum(void* stream, float* param, const float* grad, float* velocity, std::size_t n, const float* lr,
                  float momentum, float weight_decay) {
  sgd_momentum_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(param, grad, velocity, n, lr, momentum,
                                                                         weight_decay);
  STOKER_CUDA_CHECK(cudaGetLastError());
}

void zero(void* stream, void* dst, std::size_t bytes) {
  STOKER_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, as_stream(stream)));
}

void fill(void* stream, float* dst, float value) {
  fill_kernel<<<1, 1, 0, as_stream(stream)>>>(dst, value);
  STOKER_CUDA_CHECK(cudaGetLastError());
}

}  // namespace stoker::gpu::detail::cuda_nn
