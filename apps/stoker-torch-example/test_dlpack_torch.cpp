// SPDX-License-Identifier: Apache-2.0
// libtorch's own DLPack import (at::fromDLPack, 1.13) takes stoker's batches as they are exported:
// from host memory and from pinned memory (the usual pipeline collates into pinned staging, then
// copies to the device non-blocking), with int32 or int64 labels, without a copy.
#include <ATen/DLConvertor.h>
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "stages/counting_pool.h"
#include "stoker/stages/batch.h"
#include "stoker/stages/dlpack.h"

using namespace stoker;
using stoker::test::CountingPool;

namespace {

constexpr std::size_t kCount = 5;

Batch batch_from(BufferPool& pool) {
  Batch b = Batch::allocate(pool, Shape{.channels = 1, .height = 2, .width = 3}, DType::f32, kCount);
  for (std::size_t i = 0; i < b.as<float>().size(); ++i) b.as<float>()[i] = static_cast<float>(i);
  for (std::size_t i = 0; i < kCount; ++i) b.label_values()[i] = static_cast<std::int32_t>(9 - i);
  return b;
}

}  // namespace

TEST_CASE("at::fromDLPack takes batches from host and pinned memory, labels int32 or int64, without a copy") {
  for (const MemoryKind kind : {MemoryKind::host, MemoryKind::pinned}) {
    for (const LabelType labels : {LabelType::i32, LabelType::i64}) {
      CAPTURE(static_cast<int>(kind));
      CAPTURE(static_cast<int>(labels));
      const auto released = std::make_shared<std::atomic<int>>(0);
      const auto pool = CountingPool::create(released, kind);  // says it is `kind`
      Batch batch = batch_from(*pool);
      const void* storage = batch.data();
      DLPackBatch t = to_dlpack(std::move(batch), {.labels = labels});
      // Before pinned batches were exported as kDLCPU, this threw "Unsupported device_type".
      const at::Tensor x = at::fromDLPack(t.samples);
      const at::Tensor y = at::fromDLPack(t.labels);
      CHECK(x.device().is_cpu());
      CHECK(x.data_ptr() == storage);
      CHECK((x.sizes() == at::IntArrayRef{kCount, 1, 2, 3}));
      CHECK(x.flatten()[7].item<float>() == 7.0f);
      CHECK((y.scalar_type() == (labels == LabelType::i64 ? at::kLong : at::kInt)));
      CHECK(y[4].item<std::int64_t>() == 5);
      if (labels == LabelType::i64)  // cross_entropy takes them as they are
        CHECK(torch::nn::functional::cross_entropy(torch::zeros({kCount, 10}), y).item<float>() > 0);
      CHECK(released->load() == 0);
    }
  }
}

TEST_CASE("the batch's buffer goes back to its pool when libtorch frees the last of its two tensors") {
  const auto released = std::make_shared<std::atomic<int>>(0);
  const auto pool = CountingPool::create(released, MemoryKind::pinned);
  DLPackBatch t = to_dlpack(batch_from(*pool));
  {
    const at::Tensor y = at::fromDLPack(t.labels);
    { const at::Tensor x = at::fromDLPack(t.samples); }
    CHECK(released->load() == 0);
  }
  CHECK(released->load() == 1);
}
