// SPDX-License-Identifier: Apache-2.0
// The few neural-network operations a multilayer perceptron needs, on either backend.
//
// Every op is issued asynchronously to a Stream and runs in that stream's order; the host
// never waits. Pointers are device memory from Device::allocate (host memory on the CPU
// backend) and must stay valid until the work is done. On a CUDA stream the op is a kernel
// or a cuBLAS call; on a CPU-backend stream it runs on the stream's worker thread, its matrix
// products through OpenBLAS. Every op may be issued from any thread. Plain C++: no CUDA
// header here.
//
// Matrices are row-major: element (i, j) of a matrix with leading dimension ld is at
// [i * ld + j].
#pragma once

#include <cstddef>
#include <cstdint>

#include "stoker/gpu/device.h"

namespace stoker::gpu::nn {

/// C = alpha * op(A) * op(B) + beta * C, where op(X) is X or its transpose, op(A) is m x k,
/// op(B) is k x n and C is m x n, all row-major. `lda` is A's leading dimension as stored
/// (k when A is m x k untransposed, m when trans_a and A is stored k x m); likewise ldb and
/// ldc >= n. With beta = 0, C may hold anything beforehand, NaN included.
/// Throws std::invalid_argument for negative sizes or leading dimensions too small.
void gemm(Stream& stream, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc);

/// y[i][j] += bias[j] for a rows x cols matrix y, then, with `relu`, y = max(y, 0).
void bias_activation(Stream& stream, float* y, const float* bias, int rows, int cols, bool relu);

/// grad[i] = 0 wherever activation[i] <= 0: the gradient through a ReLU whose output was
/// `activation` (a ReLU's output is positive exactly where its input was).
void relu_backward(Stream& stream, float* grad, const float* activation, std::size_t n);

/// Softmax cross-entropy of `logits` (rows x classes) against int32 `labels` in [0, classes).
/// Each output is optional (null: not computed):
///   grad[i][j] = (softmax(logits[i])[j] - (j == labels[i])) * grad_scale
///               (grad_scale = 1 / rows gives the gradient of the mean loss);
///   *loss_sum  += sum over rows of -log softmax(logits[i])[labels[i]], in a fixed order on either
///               backend, so that a run repeats to the bit (the sum is part of a checkpoint);
///   *correct   += rows whose largest logit (the first of equals) is at labels[i].
/// `grad` may be `logits` itself. A label outside [0, classes) marks a row to ignore: no
/// loss, a zero gradient, never counted correct.
void softmax_cross_entropy(Stream& stream, const float* logits, const std::int32_t* labels, int rows, int classes,
                           float* grad, float grad_scale, float* loss_sum, std::int32_t* correct);

/// out[j] = sum over i of a[i][j], for a rows x cols matrix: the gradient of a bias.
void column_sum(Stream& stream, const float* a, int rows, int cols, float* out);

/// One step of SGD with momentum and L2 weight decay over n parameters:
///   velocity = momentum * velocity + grad + weight_decay * param;  param -= *lr * velocity.
/// The learning rate is read from device memory as the step runs, so that a captured step
/// (Replay) takes the rate set before each replay (fill()).
void sgd_momentum(Stream& stream, float* param, const float* grad, float* velocity, std::size_t n, const float* lr,
                  float momentum, float weight_decay);

/// *dst = value, in stream order: a scalar in device memory that later work reads.
void fill(Stream& stream, float* dst, float value);

/// Sets `bytes` bytes at `dst` to zero (zero bits: 0.0f and int 0 alike).
void zero(Stream& stream, void* dst, std::size_t bytes);

}  // namespace stoker::gpu::nn
