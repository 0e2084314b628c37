// SPDX-License-Identifier: Apache-2.0
// The two loaders of the same job, behind one interface for the training loop. Private to
// stoker-torch-example.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "example.h"
#include "stoker/stages/batch.h"
#include "stoker/stages/idx.h"

namespace stoker::torch_example {

/// What the loop is handed for each batch: samples float32 [n, 1, 24, 24], normalized, and
/// labels int64 [n], what cross_entropy takes.
using UseBatch = std::function<void(const torch::Tensor& samples, const torch::Tensor& labels)>;

class Loader {
 public:
  virtual ~Loader() = default;
  /// Hands every batch of the next epoch (epochs from 1, in turn) to `use`.
  virtual void run_epoch(std::uint32_t epoch, const UseBatch& use) = 0;
  /// Whether the tensors of the first batch alias the loader's own memory, and the evidence.
  /// Meaningful once a batch has been handed out.
  virtual bool zero_copy() const = 0;
  virtual std::string zero_copy_evidence() const = 0;
  /// One line naming what the loader does.
  virtual std::string describe() const = 0;
};

/// A stoker::Batch as two libtorch tensors over its own storage, through to_dlpack and
/// at::fromDLPack: samples [count, C, H, W] of the batch's dtype and labels int64 [count]
/// (written over the batch's ids: DLPackOptions).
/// No copy: the tensors own the batch's buffer now, and the last of them to go returns it to
/// its pool (through the DLPack deleters).
struct BatchTensors {
  torch::Tensor samples, labels;
};
BatchTensors to_tensors(Batch&& batch);

/// IdxReader -> RandomCrops as flat_map<DeferredCrop> -> shuffle -> batch -> Collate
/// (normalizing), each stoker::Batch handed to libtorch by to_dlpack + at::fromDLPack.
/// The pipeline starts at once.
std::unique_ptr<Loader> make_stoker_loader(const ExampleOptions& options, std::shared_ptr<const IdxDataset> data);

/// A torch::data::Dataset of crops (index -> image index / 5, crop index % 5) mapped by
/// Stack<>, through make_data_loader with a RandomSampler and options.workers workers.
std::unique_ptr<Loader> make_torch_loader(const ExampleOptions& options, std::shared_ptr<const IdxDataset> data);

}  // namespace stoker::torch_example
