// SPDX-License-Identifier: Apache-2.0
#include "mlp.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numbers>
#include <stdexcept>
#include <string>

#include "stoker/core/random.h"
#include "stoker/gpu/nn.h"

namespace stoker::train {

namespace nn = gpu::nn;

namespace {

// Box-Muller on stoker's generator rather than std::normal_distribution, whose output
// differs between standard libraries: a seed gives the same network everywhere.
double standard_normal(Rng& rng) {
  const double u1 = (static_cast<double>(rng() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]: log() finite
  const double u2 = static_cast<double>(rng() >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace

Mlp::Mlp(gpu::Device& device, gpu::Stream& stream, MlpOptions options) : options_(std::move(options)) {
  const auto& widths = options_.layers;
  if (widths.size() < 2) throw std::invalid_argument("mlp: needs at least an input size and a number of classes");
  if (std::any_of(widths.begin(), widths.end(), [](int w) { return w < 1; }))
    throw std::invalid_argument("mlp: every layer width must be at least 1");
  if (options_.max_rows < 1) throw std::invalid_argument("mlp: max_rows must be at least 1");

  for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
    Layer layer{widths[l], widths[l + 1], parameter_count_, 0};
    layer.bias = layer.weights + static_cast<std::size_t>(layer.inputs) * static_cast<std::size_t>(layer.outputs);
    parameter_count_ = layer.bias + static_cast<std::size_t>(layer.outputs);
    layers_.push_back(layer);
  }

  const std::size_t bytes = parameter_count_ * sizeof(float);
  params_ = device.allocate(bytes);
  grads_ = device.allocate(bytes);
  velocity_ = device.allocate(bytes);
  const auto rows = static_cast<std::size_t>(options_.max_rows);
  int widest = 0;
  for (const Layer& layer : layers_) {
    activations_.push_back(device.allocate(rows * static_cast<std::size_t>(layer.outputs) * sizeof(float)));
    widest = std::max(widest, layer.outputs);
  }
  grad_a_ = device.allocate(rows * static_cast<std::size_t>(widest) * sizeof(float));
  grad_b_ = device.allocate(rows * static_cast<std::size_t>(widest) * sizeof(float));
  counters_ = device.allocate(sizeof(DeviceCounters));
  learning_rate_ = device.allocate(sizeof(float));

  std::vector<float> initial(parameter_count_, 0.0f);  // biases stay 0
  Rng rng(derive_seed(options_.seed, 0x6d6c70));
  for (const Layer& layer : layers_) {
    const double scale = std::sqrt(2.0 / layer.inputs);
    for (std::size_t i = layer.weights; i < layer.bias; ++i)
      initial[i] = static_cast<float>(scale * standard_normal(rng));
  }
  stream.copy_to_device(params_.data(), initial.data(), bytes);
  nn::zero(stream, velocity_.data(), bytes);
  nn::zero(stream, counters_.data(), sizeof(DeviceCounters));
  stream.synchronize();  // `initial` goes out of scope
}

float* Mlp::forward(gpu::Stream& stream, const float* x, int rows) {
  const float* input = x;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    float* out = at(activations_[l]);
    nn::gemm(stream, false, false, rows, layer.outputs, layer.inputs, 1.0f, input, layer.inputs,
             at(params_, layer.weights), layer.outputs, 0.0f, out, layer.outputs);
    nn::bias_activation(stream, out, at(params_, layer.bias), rows, layer.outputs, l + 1 < layers_.size());
    input = out;
  }
  return at(activations_.back());
}

void Mlp::train_step(gpu::Stream& stream, const float* x, const std::int32_t* labels, int rows, float learning_rate,
                     const Reduce& reduce) {
  set_learning_rate(stream, learning_rate);
  issue_step(stream, x, labels, rows, reduce);
}

void Mlp::set_learning_rate(gpu::Stream& stream, float learning_rate) {
  nn::fill(stream, at(learning_rate_), learning_rate);
}

std::unique_ptr<gpu::Replay> Mlp::capture_step(gpu::Stream& stream, const float* x, const std::int32_t* labels,
                                               int rows) {
  return std::make_unique<gpu::Replay>(stream, [=, this, &stream] { issue_step(stream, x, labels, rows, {}); });
}

void Mlp::issue_step(gpu::Stream& stream, const float* x, const std::int32_t* labels, int rows, const Reduce& reduce) {
  if (rows < 1 || rows > options_.max_rows)
    throw std::invalid_argument("mlp: a training batch of " + std::to_string(rows) + " rows (1 to " +
                                std::to_string(options_.max_rows) + " allowed)");
  const float* logits = forward(stream, x, rows);
  float* grad_out = at(grad_a_);  // gradient of the loss w.r.t. the current layer's output
  float* grad_in = at(grad_b_);
  nn::softmax_cross_entropy(stream, logits, labels, rows, layers_.back().outputs, grad_out, 1.0f / rows,
                            counter<float>(offsetof(DeviceCounters, train_loss_sum)),
                            counter<std::int32_t>(offsetof(DeviceCounters, train_correct)));
  for (std::size_t l = layers_.size(); l-- > 0;) {
    const Layer& layer = layers_[l];
    const float* input = l == 0 ? x : at(activations_[l - 1]);
    // dW = input^T grad_out, db = column sums of grad_out.
    nn::gemm(stream, true, false, layer.inputs, layer.outputs, rows, 1.0f, input, layer.inputs, grad_out, layer.outputs,
             0.0f, at(grads_, layer.weights), layer.outputs);
    nn::column_sum(stream, grad_out, rows, layer.outputs, at(grads_, layer.bias));
    if (l == 0) break;  // no gradient w.r.t. the data
    // Through the weights, then through the previous layer's ReLU.
    nn::gemm(stream, false, true, rows, layer.inputs, layer.outputs, 1.0f, grad_out, layer.outputs,
             at(params_, layer.weights), layer.outputs, 0.0f, grad_in, layer.inputs);
    nn::relu_backward(stream, grad_in, input, static_cast<std::size_t>(rows) * static_cast<std::size_t>(layer.inputs));
    std::swap(grad_out, grad_in);
  }
  if (reduce) reduce(stream, at(grads_), parameter_count_);
  nn::sgd_momentum(stream, at(params_), at(grads_), at(velocity_), parameter_count_, at(learning_rate_),
                   options_.momentum, options_.weight_decay);
}

void Mlp::evaluate(gpu::Stream& stream, const float* x, const std::int32_t* labels, std::size_t rows) {
  const auto inputs = static_cast<std::size_t>(layers_.front().inputs);
  const auto chunk = static_cast<std::size_t>(options_.max_rows);
  for (std::size_t first = 0; first < rows; first += chunk) {
    const int n = static_cast<int>(std::min(chunk, rows - first));
    const float* logits = forward(stream, x + first * inputs, n);
    nn::softmax_cross_entropy(stream, logits, labels + first, n, layers_.back().outputs, nullptr, 0.0f, nullptr,

                              counter<std::int32_t>(offsetof(DeviceCounters, test_correct)));
  }
}

void Mlp::reset_counters(gpu::Stream& stream) { nn::zero(stream, counters_.data(), sizeof(DeviceCounters)); }

MlpCounters Mlp::read_counters(gpu::Stream& stream) {
  stream.copy_to_host(&host_counters_, counters_.data(), sizeof(DeviceCounters));
  stream.synchronize();
  return {host_counters_.train_loss_sum, host_counters_.train_correct, host_counters_.test_correct};
}

std::vector<std::byte> Mlp::save(gpu::Stream& stream) {
  const std::size_t bytes = parameter_count_ * sizeof(float);
  std::vector<std::byte> state(2 * bytes + sizeof(DeviceCounters));
  stream.copy_to_host(state.data(), params_.data(), bytes);
  stream.copy_to_host(state.data() + bytes, velocity_.data(), bytes);
  stream.copy_to_host(state.data() + 2 * bytes, counters_.data(), sizeof(DeviceCounters));
  stream.synchronize();
  return state;
}

void Mlp::restore(gpu::Stream& stream, std::span<const std::byte> state) {
  const std::size_t bytes = parameter_count_ * sizeof(float);
  if (state.size() != 2 * bytes + sizeof(DeviceCounters))
    throw std::invalid_argument("mlp: a saved state of " + std::to_string(state.size()) +
                                " bytes, but this model's is " + std::to_string(2 * bytes + sizeof(DeviceCounters)));
  stream.copy_to_device(params_.data(), state.data(), bytes);
  stream.copy_to_device(velocity_.data(), state.data() + bytes, bytes);
  stream.copy_to_device(counters_.data(), state.data() + 2 * bytes, sizeof(DeviceCounters));
  stream.synchronize();  // `state` may go on return
}

}  // namespace stoker::train
