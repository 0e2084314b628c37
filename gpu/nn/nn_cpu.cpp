// SPDX-License-Identifier: Apache-2.0
// nn.h's entry points, each with its CPU implementation next to it; the CUDA ones are in
// nn_cuda.cu. On the CPU backend an op runs on the stream's worker thread, in stream order.
#include "stoker/gpu/nn.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "backends.h"
#include "nn_cuda.h"

// Declared here as well because Debian's <cblas.h> is an alternative that may point at the
// reference CBLAS header, which lacks it; the library linked is OpenBLAS in any case.
extern "C" void openblas_set_num_threads(int num_threads);

namespace stoker::gpu::nn {

namespace {

using detail::launch;
namespace cuda = detail::cuda_nn;

// One thread for OpenBLAS: a CPU stream is already one worker among the pipeline's threads,
// which own the cores. OpenBLAS's own thread pool would oversubscribe them, and its threads
// spin while they wait for work, taking cycles from the stages that feed the trainer.
void use_one_blas_thread() {
  static const bool once = (openblas_set_num_threads(1), true);
  (void)once;
}

void check_gemm(bool trans_a, bool trans_b, int m, int n, int k, int lda, int ldb, int ldc) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("nn::gemm: " + what); };
  if (m < 0 || n < 0 || k < 0)
    fail("negative size (m " + std::to_string(m) + ", n " + std::to_string(n) + ", k " + std::to_string(k) + ")");
  // Row-major: a stored matrix's leading dimension is at least its number of columns.
  auto check_ld = [&](const char* name, int ld, int cols) {
    if (ld < std::max(1, cols))
      fail(std::string(name) + " is " + std::to_string(ld) + ", below the " + std::to_string(cols) +
           " columns of the matrix as stored");
  };
  check_ld("lda", lda, trans_a ? m : k);
  check_ld("ldb", ldb, trans_b ? k : n);
  check_ld("ldc", ldc, n);
}

void check_size(const char* op, int rows, int cols) {
  if (rows < 0 || cols < 0)
    throw std::invalid_argument(std::string("nn::") + op + ": negative size (" + std::to_string(rows) + " x " +
                                std::to_string(cols) + ")");
}

// -------------------------------------------------------------------------------------------
// CPU implementations

void cpu_bias_activation(float* y, const float* bias, int rows, int cols, bool relu) {
  for (int i = 0; i < rows; ++i) {
    float* row = y + static_cast<std::size_t>(i) * static_cast<std::size_t>(cols);
    for (int j = 0; j < cols; ++j) {
      const float v = row[j] + bias[j];
      row[j] = relu ? std::max(v, 0.0f) : v;  // NaN stays NaN (v < 0 is false), as on CUDA
    }
  }
}

void cpu_softmax_cross_entropy(const float* logits, const std::int32_t* labels, int rows, int classes, float* grad,
                               float grad_scale, float* loss_sum, std::int32_t* correct) {
  double loss = 0;  // summed in double: a batch's losses can differ by orders of magnitude
  std::int32_t right = 0;
  for (int i = 0; i < rows; ++i) {
    const std::size_t offset = static_cast<std::size_t>(i) * static_cast<std::size_t>(classes);
    const float* z = logits + offset;
    const std::int32_t label = labels[i];
    const bool valid = label >= 0 && label < classes;
    int best = 0;
    for (int j = 1; j < classes; ++j)
      if (z[j] > z[best]) best = j;
    // Shifted by the largest logit so that exp() cannot overflow.
    const float top = z[best];
    float sum = 0;
    for (int j = 0; j < classes; ++j) sum += std::exp(z[j] - top);
    if (valid) {
      loss += std::log(sum) - (z[label] - top);
      right += best == label;
    }
    if (grad) {
      float* g = grad + offset;
      if (!valid) {
        std::fill(g, g + classes, 0.0f);
        continue;
      }
      for (int j = 0; j < classes; ++j) {
        const float p = std::exp(z[j] - top) / sum;
        g[j] = (p - (j == label ? 1.0f : 0.0f)) * grad_scale;
      }
    }
  }
  if (loss_sum) *loss_sum += static_cast<float>(loss);
  if (correct) *correct += right;
}

void cpu_column_sum(const float* a, int rows, int cols, float* out) {
  std::fill(out, out + cols, 0.0f);
  for (int i = 0; i < rows; ++i) {
    const float* row = a + static_cast<std::size_t>(i) * static_cast<std::size_t>(cols);
    for (int j = 0; j < cols; ++j) out[j] += row[j];
  }
}

void cpu_sgd_momentum(float* param, const float* grad, float* velocity, std::size_t n, float lr, float momentum,
                      float weight_decay) {
  for (std::size_t i = 0; i < n; ++i) {
    velocity[i] = momentum * velocity[i] + grad[i] + weight_decay * param[i];
    param[i] -= lr * velocity[i];
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Entry points: one per op, whatever the backend.

void gemm(Stream& stream, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc) {
  check_gemm(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  launch(
      stream, "gemm",
      [=] {
        use_one_blas_thread();
        cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k,
                    alpha, a, lda, b, ldb, beta, c, ldc);
      },
      [&](void* native) {
        cuda::gemm(stream, native, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      });
}

void bias_activation(Stream& stream, float* y, const float* bias, int rows, int cols, bool relu) {
  check_size("bias_activation", rows, cols);
  if (rows == 0 || cols == 0) return;
  launch(
      stream, "bias_activation", [=] { cpu_bias_activation(y, bias, rows, cols, relu); },
      [=](void* native) { cuda::bias_activation(native, y, bias, rows, cols, relu); });
}

void relu_backward(Stream& stream, float* grad, const float* activation, std::size_t n) {
  if (n == 0) return;
  launch(
      stream, "relu_backward",
      [=] {
        for (std::size_t i = 0; i < n; ++i)
          if (!(activation[i] > 0)) grad[i] = 0;
      },
      [=](void* native) { cuda::relu_backward(native, grad, activation, n); });
}

void softmax_cross_entropy(Stream& stream, const float* logits, const std::int32_t* labels, int rows, int classes,
                           float* grad, float grad_scale, float* loss_sum, std::int32_t* correct) {
  check_size("softmax_cross_entropy", rows, classes);
  if (rows == 0) return;
  if (classes == 0) throw std::invalid_argument("nn::softmax_cross_entropy: no classes");
  launch(
      stream, "softmax_cross_entropy",
      [=] { cpu_softmax_cross_entropy(logits, labels, rows, classes, grad, grad_scale, loss_sum, correct); },
      [=](void* native) {
        cuda::softmax_cross_entropy(native, logits, labels, rows, classes, grad, grad_scale, loss_sum, correct);
      });
}

void column_sum(Stream& stream, const float* a, int rows, int cols, float* out) {
  check_size("column_sum", rows, cols);
  if (cols == 0) return;
  launch(
      stream, "column_sum", [=] { cpu_column_sum(a, rows, cols, out); },
      [=](void* native) { cuda::column_sum(native, a, rows, cols, out); });
}

void sgd_momentum(Stream& stream, float* param, const float* grad, float* velocity, std::size_t n, const float* lr,
                  float momentum, float weight_decay) {
  if (n == 0) return;
  launch(
      stream, "sgd_momentum", [=] { cpu_sgd_momentum(param, grad, velocity, n, *lr, momentum, weight_decay); },
      [=](void* native) { cuda::sgd_momentum(native, param, grad, velocity, n, lr, momentum, weight_decay); });
}

void fill(Stream& stream, float* dst, float value) {
  launch(
      stream, "fill", [=] { *dst = value; }, [=](void* native) { cuda::fill(native, dst, value); });
}

void zero(Stream& stream, void* dst, std::size_t bytes) {
  if (bytes == 0) return;
  launch(
      stream, "zero", [=] { std::memset(dst, 0, bytes); }, [=](void* native) { cuda::zero(native, dst, bytes); });
}

}  // namespace stoker::gpu::nn
