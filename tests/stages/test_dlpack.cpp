// SPDX-License-Identifier: Apache-2.0
// Batches exported as DLPack tensors: layout, zero copy, and the buffer's single return to its
// pool whichever tensor goes last, and however long after the pipeline.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "stages/counting_pool.h"
#include "stoker/core/pipeline.h"
#include "stoker/stages/batch.h"
#include "stoker/stages/dlpack.h"

using namespace stoker;
using stoker::test::CountingPool;

namespace {

constexpr std::size_t kCount = 7;

// Element i of the batch holds i (mod the type's range), label of sample n is 3n - 5.
Batch filled_batch(BufferPool& pool, Shape shape, DType dtype) {
  Batch b = Batch::allocate(pool, shape, dtype, kCount);
  const std::size_t n = kCount * shape.elements();
  for (std::size_t i = 0; i < n; ++i) switch (dtype) {
      case DType::u8:
        b.as<std::uint8_t>()[i] = static_cast<std::uint8_t>(i);
        break;
      case DType::u16:
        b.as<std::uint16_t>()[i] = static_cast<std::uint16_t>(i);
        break;
      case DType::f32:
        b.as<float>()[i] = static_cast<float>(i);
        break;
    }
  for (std::size_t i = 0; i < kCount; ++i) b.label_values()[i] = 3 * static_cast<std::int32_t>(i) - 5;
  return b;
}

std::vector<std::int64_t> shape_of(const DLTensor& t) { return {t.shape, t.shape + t.ndim}; }
std::vector<std::int64_t> strides_of(const DLTensor& t) { return {t.strides, t.strides + t.ndim}; }

void release(DLManagedTensor*& t) {
  t->deleter(t);
  t = nullptr;
}

}  // namespace

TEST_CASE("DLPack: a batch's samples and labels are exported in place, with shape, strides and dtype") {
  struct Case {
    Shape shape;
    DType dtype;
    std::vector<std::int64_t> dims, strides;
    std::uint8_t code, bits;
  };
  const std::vector<Case> cases{
      {{.channels = 2, .height = 3, .width = 5}, DType::u8, {7, 2, 3, 5}, {30, 15, 5, 1}, kDLUInt, 8},
      {{.channels = 2, .height = 3, .width = 5}, DType::u16, {7, 2, 3, 5}, {30, 15, 5, 1}, kDLUInt, 16},
      {{.channels = 1, .height = 4, .width = 4}, DType::f32, {7, 1, 4, 4}, {16, 16, 4, 1}, kDLFloat, 32},
      {{.channels = 2, .depth = 4, .height = 3, .width = 2, .volume = true},
       DType::f32,
       {7, 2, 4, 3, 2},
       {48, 24, 6, 2, 1},
       kDLFloat,
       32},
  };
  for (const auto& c : cases) {
    CAPTURE(c.shape.str());
    CAPTURE(static_cast<int>(c.dtype));
    const auto released = std::make_shared<std::atomic<int>>(0);
    const auto pool = CountingPool::create(released);
    Batch batch = filled_batch(*pool, c.shape, c.dtype);
    const std::byte* storage = batch.data();
    const std::size_t labels_offset = batch.labels_offset();

    DLPackBatch t = to_dlpack(std::move(batch));
    CHECK(batch.storage.empty());
    REQUIRE(t.samples != nullptr);
    REQUIRE(t.labels != nullptr);

    const DLTensor& s = t.samples->dl_tensor;
    CHECK(s.ndim == static_cast<int>(c.dims.size()));
    CHECK(shape_of(s) == c.dims);
    REQUIRE(s.strides != nullptr);
    CHECK(strides_of(s) == c.strides);
    CHECK(s.dtype.code == c.code);
    CHECK(s.dtype.bits == c.bits);
    CHECK(s.dtype.lanes == 1);
    CHECK(s.device.device_type == kDLCPU);
    CHECK(s.device.device_id == 0);
    CHECK(s.byte_offset == 0);
    CHECK(s.data == storage);  // the batch's own memory: nothing was copied
    const std::size_t last = kCount * c.shape.elements() - 1;
    switch (c.dtype) {
      case DType::u8:
        CHECK(static_cast<const std::uint8_t*>(s.data)[last] == static_cast<std::uint8_t>(last));
        break;
      case DType::u16:
        CHECK(static_cast<const std::uint16_t*>(s.data)[last] == last);
        break;
      case DType::f32:
        CHECK(static_cast<const float*>(s.data)[last] == static_cast<float>(last));
        break;
    }

    const DLTensor& l = t.labels->dl_tensor;
    CHECK(l.ndim == 1);
    CHECK(shape_of(l) == std::vector<std::int64_t>{kCount});
    REQUIRE(l.strides != nullptr);
    CHECK(strides_of(l) == std::vector<std::int64_t>{1});
    CHECK(l.dtype.code == kDLInt);
    CHECK(l.dtype.bits == 32);
    CHECK(l.dtype.lanes == 1);
    CHECK(l.device.device_type == kDLCPU);
    CHECK(l.byte_offset == 0);
    CHECK(l.data == storage + labels_offset);
    const auto* labels = static_cast<const std::int32_t*>(l.data);
    for (std::size_t i = 0; i < kCount; ++i) CHECK(labels[i] == 3 * static_cast<std::int32_t>(i) - 5);

    release(t.samples);
    release(t.labels);
    CHECK(released->load() == 1);
  }
}

TEST_CASE("DLPack: an exported buffer returns to its pool once, when the last of its two tensors is deleted") {
  const Shape shape{.channels = 1, .height = 4, .width = 4};
  for (const bool samples_first : {true, false}) {
    CAPTURE(samples_first);
    const auto released = std::make_shared<std::atomic<int>>(0);
    const auto pool = CountingPool::create(released);
    DLPackBatch t = to_dlpack(filled_batch(*pool, shape, DType::f32));
    release(samples_first ? t.samples : t.labels);
    CHECK(released->load() == 0);
    release(samples_first ? t.labels : t.samples);
    CHECK(released->load() == 1);
    // Back in the pool's cache, not freed behind its back: the next batch reuses it.
    const auto reuses = pool->reuses();
    const Batch next = Batch::allocate(*pool, shape, DType::f32, kCount);
    CHECK(pool->reuses() == reuses + 1);
  }
}

TEST_CASE("DLPack: the two tensors of a batch may be deleted on different threads at once" * doctest::timeout(30)) {
  const Shape shape{.channels = 1, .height = 8, .width = 8};
  const auto released = std::make_shared<std::atomic<int>>(0);
  const auto pool = CountingPool::create(released);
  constexpr int kBatches = 200;
  for (int i = 0; i < kBatches; ++i) {
    DLPackBatch t = to_dlpack(filled_batch(*pool, shape, DType::u8));
    std::thread other([&] { t.labels->deleter(t.labels); });
    t.samples->deleter(t.samples);
    other.join();
  }
  CHECK(released->load() == kBatches);
}

TEST_CASE("DLPack: exported tensors outlive the pipeline that made the batch and the pool's owner" *
          doctest::timeout(60)) {
  const Shape shape{.channels = 1, .height = 4, .width = 4};
  const auto released = std::make_shared<std::atomic<int>>(0);
  auto pool = CountingPool::create(released);
  const std::weak_ptr<CountingPool> watch = pool;
  DLPackBatch t;
  {
    auto samples = BufferPool::create();
    auto pipe = PipelineBuilder{}
                    .threads(2)
                    .epochs(1)
                    .source("read",
                            [samples, shape, i = 0]() mutable -> std::optional<Sample> {
                              if (i == 64) return std::nullopt;
                              Sample s(*samples, shape, DType::f32, i, static_cast<std::uint64_t>(i));
                              for (float& x : s.as<float>()) x = static_cast<float>(i);
                              ++i;
                              return s;
                            })
                    .batch("batch", 4)
                    .map("collate", Collate{.pool = pool})
                    .build();
    pool.reset();  // the pipeline's Collate now owns the pool
    std::optional<Batch> batch = pipe.next();
    REQUIRE(batch.has_value());
    REQUIRE(batch->count == 4);
    t = to_dlpack(std::move(*batch));
  }  // the pipeline, its Collate and every other batch are gone
  REQUIRE(t.samples != nullptr);
  const int before = released->load();
  CHECK_FALSE(watch.expired());  // the exported buffer holds its pool

  const auto* x = static_cast<const float*>(t.samples->dl_tensor.data);
  const auto* labels = static_cast<const std::int32_t*>(t.labels->dl_tensor.data);
  for (std::size_t i = 0; i < 4; ++i) CHECK(x[i * shape.elements()] == static_cast<float>(labels[i]));

  release(t.labels);
  CHECK(released->load() == before);
  CHECK_FALSE(watch.expired());
  release(t.samples);
  CHECK(released->load() == before + 1);
  CHECK(watch.expired());  // the last buffer out took the pool with it
}

TEST_CASE("DLPack: an exported batch names the memory of its pool: host (pinned or not) or a device's") {
  const Shape shape{.channels = 1, .height = 2, .width = 2};
  struct Case {
    MemoryKind kind;
    int device;
    DLDeviceType type;
    int id;
  };
  // Pinned memory goes out as kDLCPU: libtorch's fromDLPack refuses kDLCUDAHost.
  for (const auto& c : {Case{MemoryKind::pinned, 0, kDLCPU, 0}, Case{MemoryKind::device, 3, kDLCUDA, 3},
                        Case{MemoryKind::host, 0, kDLCPU, 0}}) {
    CAPTURE(static_cast<int>(c.kind));
    const auto released = std::make_shared<std::atomic<int>>(0);
    const auto pool = CountingPool::create(released, c.kind, c.device);
    DLPackBatch t = to_dlpack(filled_batch(*pool, shape, DType::f32));
    CHECK(t.samples->dl_tensor.device.device_type == c.type);
    CHECK(t.samples->dl_tensor.device.device_id == c.id);
    CHECK(t.labels->dl_tensor.device.device_type == c.type);
    CHECK(t.labels->dl_tensor.device.device_id == c.id);
    release(t.samples);
    release(t.labels);
    CHECK(released->load() == 1);
  }
}

TEST_CASE("DLPack: to_dlpack rejects a batch without enough storage, and leaves it as it was") {
  CHECK_THROWS_WITH_AS(to_dlpack(Batch{}), doctest::Contains("no storage"), std::invalid_argument);
  // A batch that claims more samples than its buffer holds would export memory it does not own.
  const auto pool = BufferPool::create();
  Batch short_batch = Batch::allocate(*pool, Shape{.channels = 1, .height = 2, .width = 2}, DType::f32, 2);
  short_batch.count = 10;
  CHECK_THROWS_WITH_AS(to_dlpack(std::move(short_batch)), doctest::Contains("smaller"), std::invalid_argument);
  CHECK_FALSE(short_batch.storage.empty());  // a failed export leaves the batch as it was
}

TEST_CASE("DLPack: int64 labels, on request, lie over the batch's ids in its own buffer, for host and pinned memory") {
  const Shape shape{.channels = 1, .height = 3, .width = 3};
  for (const MemoryKind kind : {MemoryKind::host, MemoryKind::pinned}) {
    CAPTURE(static_cast<int>(kind));
    const auto released = std::make_shared<std::atomic<int>>(0);
    const auto pool = CountingPool::create(released, kind);
    Batch batch = filled_batch(*pool, shape, DType::f32);
    const std::byte* storage = batch.data();
    const auto* ids = reinterpret_cast<const std::byte*>(batch.id_values().data());
    const auto allocations = pool->allocations();

    DLPackBatch t = to_dlpack(std::move(batch), {.labels = LabelType::i64});
    const DLTensor& l = t.labels->dl_tensor;
    CHECK(l.dtype.code == kDLInt);
    CHECK(l.dtype.bits == 64);
    CHECK(l.dtype.lanes == 1);
    CHECK(shape_of(l) == std::vector<std::int64_t>{kCount});
    CHECK(strides_of(l) == std::vector<std::int64_t>{1});
    CHECK(l.device.device_type == kDLCPU);
    CHECK(l.data == ids);  // in the batch's buffer: nothing allocated
    CHECK(pool->allocations() == allocations);
    const auto* labels = static_cast<const std::int64_t*>(l.data);
    for (std::size_t i = 0; i < kCount; ++i) CHECK(labels[i] == 3 * static_cast<std::int64_t>(i) - 5);
    CHECK(t.samples->dl_tensor.data == storage);  // the samples as before
    CHECK(static_cast<const float*>(t.samples->dl_tensor.data)[1] == 1.0f);

    release(t.labels);
    release(t.samples);
    CHECK(released->load() == 1);
  }
}

TEST_CASE("DLPack: int64 labels are refused for a batch in device memory, or without room for its ids") {
  const Shape shape{.channels = 1, .height = 2, .width = 2};
  const auto released = std::make_shared<std::atomic<int>>(0);
  const auto device = CountingPool::create(released, MemoryKind::device, 1);
  Batch on_device = filled_batch(*device, shape, DType::f32);
  CHECK_THROWS_WITH_AS(to_dlpack(std::move(on_device), {.labels = LabelType::i64}), doctest::Contains("device memory"),
                       std::invalid_argument);
  CHECK_FALSE(on_device.storage.empty());

  // Samples and int32 labels fit, the ids do not: int32 goes, int64 is refused.
  const auto pool = BufferPool::create();
  Batch full = filled_batch(*pool, shape, DType::f32);
  Batch cut{.storage = pool->acquire(full.payload_bytes()), .shape = shape, .dtype = DType::f32, .count = kCount};
  CHECK_THROWS_WITH_AS(to_dlpack(std::move(cut), {.labels = LabelType::i64}), doctest::Contains("and ids"),
                       std::invalid_argument);
  CHECK_FALSE(cut.storage.empty());
  DLPackBatch t = to_dlpack(std::move(cut));
  release(t.samples);
  release(t.labels);
}

TEST_CASE("DLPack: a shared sample is exported in place, channels first or last, and held until released") {
  const auto released = std::make_shared<std::atomic<int>>(0);
  const auto pool = CountingPool::create(released);
  struct Case {
    Shape shape;
    std::vector<std::int64_t> dims, strides;
  };
  for (const auto& c :
       {Case{{.channels = 2, .height = 3, .width = 4}, {2, 3, 4}, {12, 4, 1}},
        Case{{.channels = 3, .height = 2, .width = 4, .channels_last = true}, {2, 4, 3}, {12, 3, 1}},
        Case{{.channels = 1, .depth = 2, .height = 3, .width = 2, .volume = true}, {1, 2, 3, 2}, {12, 6, 2, 1}}}) {
    CAPTURE(c.shape.str());
    auto sample = std::make_shared<Sample>(*pool, c.shape, DType::u16, 4, 9);
    for (std::size_t i = 0; i < c.shape.elements(); ++i) sample->as<std::uint16_t>()[i] = static_cast<std::uint16_t>(i);
    const std::byte* data = sample->data.data();
    const int before = released->load();
    DLManagedTensor* t = to_dlpack(std::shared_ptr<const Sample>(std::move(sample)));
    CHECK(t->dl_tensor.data == data);
    CHECK(shape_of(t->dl_tensor) == c.dims);
    CHECK(strides_of(t->dl_tensor) == c.strides);
    CHECK(t->dl_tensor.dtype.code == kDLUInt);
    CHECK(t->dl_tensor.dtype.bits == 16);
    CHECK(t->dl_tensor.device.device_type == kDLCPU);
    CHECK(static_cast<const std::uint16_t*>(t->dl_tensor.data)[5] == 5);
    CHECK(released->load() == before);  // the tensor holds the sample
    t->deleter(t);
    CHECK(released->load() == before + 1);
  }
  CHECK_THROWS_AS(to_dlpack(std::shared_ptr<const Sample>()), std::invalid_argument);
}
