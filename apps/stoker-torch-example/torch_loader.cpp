// SPDX-License-Identifier: Apache-2.0
// The libtorch side: the same job through libtorch's own C++ data API, the way its docs
// recommend: a Dataset whose get(index) makes one example, make_data_loader with a
// RandomSampler, worker threads, and the Stack collation.
#include <torch/data.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "loader.h"
#include "stoker/core/random.h"

namespace stoker::torch_example {
namespace {

// Every crop of the training set: index i is crop i % 5 of image i / 5. get() cuts it with a
// random window, mirrors it with probability 0.5 and normalizes it, in a plain loop, with the
// same arithmetic as stoker's crops: (x / 255 - mean) / std in float32. Its draws come from a
// generator seeded by (seed, epoch, index), so they differ from epoch to epoch but not with
// the worker that runs them. Thread-safe: get() only reads shared state.
class FashionCrops : public torch::data::datasets::Dataset<FashionCrops> {
 public:
  FashionCrops(std::shared_ptr<const IdxDataset> data, std::uint64_t seed,
               std::shared_ptr<const std::atomic<std::uint32_t>> epoch)
      : data_(std::move(data)), seed_(seed), epoch_(std::move(epoch)) {}

  torch::data::Example<> get(std::size_t index) override {
    const std::size_t image = index / kCropsPerImage;
    const std::uint32_t height = data_->images.height, width = data_->images.width;
    Rng rng(derive_seed(seed_, epoch_->load(std::memory_order_relaxed), index));
    const auto y0 = static_cast<std::uint32_t>(rng.below(height - kCropSide + 1));
    const auto x0 = static_cast<std::uint32_t>(rng.below(width - kCropSide + 1));
    const bool mirror = rng.bernoulli(kMirrorP);

    torch::Tensor crop = torch::empty({1, kCropSide, kCropSide}, torch::kFloat32);
    float* out = crop.data_ptr<float>();
    const std::uint8_t* in = data_->image(image).data();
    for (std::uint32_t y = 0; y < kCropSide; ++y) {
      const std::uint8_t* row = in + static_cast<std::size_t>(y0 + y) * width + x0;
      for (std::uint32_t x = 0; x < kCropSide; ++x) {
        const std::uint32_t from = mirror ? kCropSide - 1 - x : x;
        *out++ = (static_cast<float>(row[from]) / 255.0f - kMean) / kStd;
      }
    }
    return {std::move(crop), torch::tensor(static_cast<std::int64_t>(data_->labels[image]), torch::kInt64)};
  }

  torch::optional<std::size_t> size() const override { return data_->size() * kCropsPerImage; }

 private:
  std::shared_ptr<const IdxDataset> data_;
  std::uint64_t seed_;
  std::shared_ptr<const std::atomic<std::uint32_t>> epoch_;
};

class TorchLoader final : public Loader {
 public:
  TorchLoader(const ExampleOptions& o, std::shared_ptr<const IdxDataset> data)
      : workers_(o.workers),
        batch_size_(o.batch_size),
        epoch_(std::make_shared<std::atomic<std::uint32_t>>(0)),
        loader_(torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
            FashionCrops(std::move(data), o.seed, epoch_).map(torch::data::transforms::Stack<>()),
            torch::data::DataLoaderOptions().batch_size(o.batch_size).workers(static_cast<std::size_t>(o.workers)))) {}

  void run_epoch(std::uint32_t epoch, const UseBatch& use) override {
    // Before begin(): its workers start on the epoch's first batches at once.
    epoch_->store(epoch - 1, std::memory_order_relaxed);
    for (auto& batch : *loader_) use(batch.data, batch.target);
  }

  bool zero_copy() const override { return false; }
  std::string zero_copy_evidence() const override {
    return "none: the Stack collation copies every crop into a new batch tensor";
  }
  std::string describe() const override {
    return "libtorch DataLoader, " + std::to_string(workers_) +
           " workers: Dataset::get(i) cuts crop i % 5 of image i / 5 (random 24x24, mirror p 0.5, normalize) -> "
           "RandomSampler (a permutation of all crops) -> batch " +
           std::to_string(batch_size_) + " -> Stack";
  }

 private:
  using DataLoader = decltype(torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      std::declval<torch::data::datasets::MapDataset<FashionCrops, torch::data::transforms::Stack<>>>(),
      torch::data::DataLoaderOptions()));

  int workers_;
  std::size_t batch_size_;
  std::shared_ptr<std::atomic<std::uint32_t>> epoch_;
  DataLoader loader_;
};

}  // namespace

std::unique_ptr<Loader> make_torch_loader(const ExampleOptions& options, std::shared_ptr<const IdxDataset> data) {
  return std::make_unique<TorchLoader>(options, std::move(data));
}

}  // namespace stoker::torch_example
