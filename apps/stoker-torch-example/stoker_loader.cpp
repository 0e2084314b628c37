// SPDX-License-Identifier: Apache-2.0
// The stoker side: the reference job as a pipeline, its batches handed to libtorch through
// DLPack without a copy.
#include <ATen/DLConvertor.h>

#include <cstdio>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "loader.h"
#include "stoker/core/pipeline.h"
#include "stoker/stages/batch.h"
#include "stoker/stages/dlpack.h"
#include "stoker/stages/transforms.h"

namespace stoker::torch_example {
namespace {

// Owns what to_dlpack handed out until libtorch has taken it: if the second fromDLPack
// threw, the labels' deleter would otherwise never run (and the batch's buffer never return).
struct DLPackGuard {
  DLPackBatch b;
  ~DLPackGuard() {
    for (DLManagedTensor* t : {b.samples, b.labels})
      if (t != nullptr && t->deleter != nullptr) t->deleter(t);
  }
};

// at::fromDLPack takes ownership: the tensor calls the DLPack deleter when its storage goes.
torch::Tensor adopt(DLManagedTensor*& t) {
  torch::Tensor out = at::fromDLPack(t);
  t = nullptr;
  return out;
}

std::string address(const void* p) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", p);
  return text;
}

class StokerLoader final : public Loader {
 public:
  StokerLoader(const ExampleOptions& o, std::shared_ptr<const IdxDataset> data)
      : workers_(o.workers),
        batch_size_(o.batch_size),
        pipe_(PipelineBuilder{}
                  .threads(o.workers)
                  .seed(o.seed)
                  .epochs(o.epochs)
                  .source("read", IdxReader(std::move(data), {.pool = BufferPool::create()}))
                  .flat_map<DeferredCrop>("crops",
                                          RandomCrops({.size = {kCropSide, kCropSide},
                                                       .count = kCropsPerImage,
                                                       .mirror = MirrorOptions{.axis = Axis::width, .p = kMirrorP}}),
                                          {.threads = o.workers})
                  .shuffle("shuffle", {.capacity = kShuffleCapacity, .min_after_dequeue = kMinAfterDequeue})
                  .batch("batch", o.batch_size, {.queue = 8})
                  .map("collate", Collate{.normalize = Normalizer({.scale = 255.0f, .mean = {kMean}, .std = {kStd}})},
                       {.threads = o.workers, .queue = 16})
                  .build()) {}

  void run_epoch(std::uint32_t /*epoch*/, const UseBatch& use) override {
    for (Batch& batch : pipe_.epoch()) {
      if (checked_) {
        const BatchTensors t = to_tensors(std::move(batch));
        use(t.samples, t.labels);
        continue;
      }
      // Once: the tensors must point into the batch's own storage, and hold what it held.
      const void* storage = batch.data();
      const void* labels_at = batch.id_values().data();  // int64 labels go where the ids were
      const std::int32_t first_label = batch.label_values()[0];
      const float first_value = batch.as<float>()[0];
      const std::size_t count = batch.count;
      const BatchTensors t = to_tensors(std::move(batch));
      const bool same_memory = t.samples.data_ptr() == storage && t.labels.data_ptr() == labels_at;
      const bool same_values = t.samples.size(0) == static_cast<std::int64_t>(count) &&
                               t.labels.size(0) == static_cast<std::int64_t>(count) &&
                               t.samples.data_ptr<float>()[0] == first_value &&
                               t.labels.data_ptr<std::int64_t>()[0] == first_label;
      zero_copy_ = same_memory && same_values;
      std::ostringstream e;
      e << "batch storage " << address(storage) << ", samples tensor data_ptr " << address(t.samples.data_ptr())
        << (t.samples.data_ptr() == storage ? " (the same)" : " (DIFFERENT)") << "; labels at " << address(labels_at)
        << ", labels tensor data_ptr " << address(t.labels.data_ptr())
        << (t.labels.data_ptr() == labels_at ? " (the same)" : " (DIFFERENT)") << "; samples " << t.samples.sizes()
        << " " << t.samples.dtype() << ", labels " << t.labels.sizes() << " " << t.labels.dtype() << ", "
        << t.samples.device() << (same_values ? "" : "; values DIFFER");
      evidence_ = e.str();
      checked_ = true;
      use(t.samples, t.labels);
    }
  }

  bool zero_copy() const override { return zero_copy_; }
  std::string zero_copy_evidence() const override { return evidence_; }
  std::string describe() const override {
    return "stoker pipeline on " + std::to_string(workers_) + " threads: IdxReader -> RandomCrops " +
           std::to_string(kCropSide) + "x" + std::to_string(kCropSide) + " x" + std::to_string(kCropsPerImage) +
           ", mirror p 0.5 (flat_map<DeferredCrop>, " + std::to_string(workers_) + " bodies) -> shuffle " +
           std::to_string(kShuffleCapacity) + "/" + std::to_string(kMinAfterDequeue) + " -> batch " +
           std::to_string(batch_size_) + " -> Collate, normalizing (" + std::to_string(workers_) +
           " bodies) -> to_dlpack -> at::fromDLPack";
  }

 private:
  int workers_;
  std::size_t batch_size_;
  Pipeline<Batch> pipe_;
  bool checked_ = false, zero_copy_ = false;
  std::string evidence_;
};

}  // namespace

BatchTensors to_tensors(Batch&& batch) {
  DLPackGuard g{to_dlpack(std::move(batch), {.labels = LabelType::i64})};
  if (g.b.samples == nullptr || g.b.labels == nullptr) throw std::logic_error("to_dlpack gave no tensor");
  BatchTensors t;
  t.samples = adopt(g.b.samples);
  t.labels = adopt(g.b.labels);
  return t;
}

std::unique_ptr<Loader> make_stoker_loader(const ExampleOptions& options, std::shared_ptr<const IdxDataset> data) {
  return std::make_unique<StokerLoader>(options, std::move(data));
}

}  // namespace stoker::torch_example
