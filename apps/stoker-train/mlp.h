// SPDX-License-Identifier: Apache-2.0
// A multilayer perceptron classifier built only on stoker::gpu::nn ops, so that the same code
// trains on a CUDA device or on the CPU backend. All its state lives in device memory; the
// host issues work and reads the running counters back once per epoch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "stoker/gpu/device.h"

namespace stoker::train {

struct MlpOptions {
  std::vector<int> layers{676, 256, 128, 10};  ///< input size, hidden widths (ReLU), classes
  int max_rows = 255;                          ///< largest batch given to train_step or evaluate
  float momentum = 0.9f;                       ///< of SGD
  float weight_decay = 5e-4f;                  ///< L2, on weights and biases alike
  std::uint64_t seed = 0;                      ///< of the He initialisation
};

/// Sums since the last reset_counters(), as read back from the device.
struct MlpCounters {
  double train_loss_sum = 0;       ///< cross-entropy summed over the training samples
  std::int64_t train_correct = 0;  ///< training samples predicted right (before their step)
  std::int64_t test_correct = 0;   ///< evaluated samples predicted right
};

/// Not thread-safe: one thread issues its work, to one stream at a time (or to several that
/// are ordered by events). Must not outlive the device.
class Mlp {
 public:
  /// Allocates everything, draws the weights (He: normal with variance 2 / inputs, biases 0)
  /// and uploads them in one copy on `stream`, waiting for it. Throws std::invalid_argument
  /// for fewer than two layers, a width below 1 or max_rows below 1.
  Mlp(gpu::Device& device, gpu::Stream& stream, MlpOptions options);

  /// What a data-parallel step does to the gradients (`n` floats on the device) between
  /// computing and applying them: average them over the ranks.
  using Reduce = std::function<void(gpu::Stream& stream, float* gradients, std::size_t n)>;

  /// One SGD step on `rows` samples (x: rows x inputs, float32; labels: int32), issued to
  /// `stream`; adds the batch's loss and correct predictions to the counters.
  void train_step(gpu::Stream& stream, const float* x, const std::int32_t* labels, int rows, float learning_rate,
                  const Reduce& reduce = {});
  /// The same step without a reduce, for inputs at `x` and `labels` (`rows` of them), captured
  /// once on `stream` to be run again and again (a CUDA graph on CUDA), each run with the rate
  /// of the last set_learning_rate() before it.
  std::unique_ptr<gpu::Replay> capture_step(gpu::Stream& stream, const float* x, const std::int32_t* labels, int rows);
  /// The learning rate of the steps issued after it, set in stream order.
  void set_learning_rate(gpu::Stream& stream, float learning_rate);

  /// Adds to test_correct the samples among `rows` (any number) that the model predicts right.
  void evaluate(gpu::Stream& stream, const float* x, const std::int32_t* labels, std::size_t rows);

  void reset_counters(gpu::Stream& stream);
  /// The counters, through one device-to-host copy; waits for the work issued to `stream`.
  MlpCounters read_counters(gpu::Stream& stream);

  /// Everything training changes: the parameters, the optimizer's momenta and the counters, as
  /// bytes (read back through `stream`, after the work issued to it).
  std::vector<std::byte> save(gpu::Stream& stream);
  /// Puts back what save() returned; throws std::invalid_argument when its size is not this
  /// model's.
  void restore(gpu::Stream& stream, std::span<const std::byte> state);

  std::size_t parameter_count() const noexcept { return parameter_count_; }
  const MlpOptions& options() const noexcept { return options_; }

 private:
  struct Layer {
    int inputs, outputs;
    std::size_t weights, bias;  // offsets into the parameter vector: W (inputs x outputs), b
  };
  struct DeviceCounters {
    float train_loss_sum;
    std::int32_t train_correct, test_correct;
  };

  // A step that reads its learning rate from learning_rate_.
  void issue_step(gpu::Stream& stream, const float* x, const std::int32_t* labels, int rows, const Reduce& reduce);
  // Returns the logits of the last layer.
  float* forward(gpu::Stream& stream, const float* x, int rows);
  float* at(gpu::Memory& m, std::size_t offset = 0) const noexcept {
    return reinterpret_cast<float*>(m.data()) + offset;
  }
  // A field of the device's counters, by offset: the host never touches that memory.
  template <class T>
  T* counter(std::size_t offset) const noexcept {
    return reinterpret_cast<T*>(counters_.data() + offset);
  }

  MlpOptions options_;
  std::vector<Layer> layers_;
  std::size_t parameter_count_ = 0;
  // Parameters, their gradients and momenta are each one vector in one layout, so that the
  // optimizer is one op over all of them.
  gpu::Memory params_, grads_, velocity_;
  std::vector<gpu::Memory> activations_;  // each layer's output, max_rows x outputs
  gpu::Memory grad_a_, grad_b_;           // gradients w.r.t. a layer's output, ping-pong
  gpu::Memory counters_;
  gpu::Memory learning_rate_;       // one float, read by the optimizer's kernel as it runs
  DeviceCounters host_counters_{};  // where read_counters() copies to
};

}  // namespace stoker::train
