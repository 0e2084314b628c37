// SPDX-License-Identifier: Apache-2.0
// Collation: n samples of one shape into one contiguous batch, the layout a training step
// (and a single host-to-device copy) wants.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "stoker/core/stage.h"
#include "stoker/stages/buffer_pool.h"
#include "stoker/stages/resize.h"
#include "stoker/stages/sample.h"
#include "stoker/stages/transforms.h"

namespace stoker {

/// `count` samples of one `shape` and `dtype` in one buffer from a BufferPool: the samples
/// one after the other, (N, C, [D,] H, W), or (N, [D,] H, W, C) when shape.channels_last,
/// then `count` int32 labels, then `count` uint64 ids,
/// in sample order. One buffer, so that one copy moves a batch to a device: samples and
/// labels are its first payload_bytes(). The buffer goes back to its pool with the batch.
struct Batch {
  Buffer storage;
  Shape shape;  ///< of one sample
  DType dtype = DType::f32;
  std::size_t count = 0;

  /// An uninitialised batch of `count` samples, for code that fills it in place.
  static Batch allocate(BufferPool& pool, Shape shape, DType dtype, std::size_t count, const StageContext& ctx = {});
  /// Bytes a batch of this geometry takes in its pool.
  static std::size_t storage_bytes(Shape shape, DType dtype, std::size_t count) noexcept {
    return ids_offset(shape, dtype, count) + count * sizeof(std::uint64_t);
  }

  /// N, C, [D,] H, W, or N, [D,] H, W, C when shape.channels_last: D only for volumes.
  std::vector<std::size_t> dims() const;
  std::size_t sample_bytes() const noexcept { return shape.elements() * dtype_size(dtype); }
  std::size_t data_bytes() const noexcept { return count * sample_bytes(); }
  /// Where the labels start in `storage`: after the samples, 64-byte aligned.
  std::size_t labels_offset() const noexcept { return labels_offset(shape, dtype, count); }
  /// Samples and labels: what a device needs.
  std::size_t payload_bytes() const noexcept { return labels_offset() + count * sizeof(std::int32_t); }

  std::byte* data() noexcept { return storage.data(); }
  const std::byte* data() const noexcept { return storage.data(); }

  /// All the elements as T; throws std::invalid_argument if T is not the batch's type.
  template <class T>
  std::span<T> as() {
    check_dtype<T>(dtype, "batch");
    return {reinterpret_cast<T*>(data()), count * shape.elements()};
  }
  template <class T>
  std::span<const T> as() const {
    check_dtype<T>(dtype, "batch");
    return {reinterpret_cast<const T*>(data()), count * shape.elements()};
  }
  /// Sample i's elements as T.
  template <class T>
  std::span<T> sample(std::size_t i) {
    return as<T>().subspan(i * shape.elements(), shape.elements());
  }
  template <class T>
  std::span<const T> sample(std::size_t i) const {
    return as<T>().subspan(i * shape.elements(), shape.elements());
  }

  std::span<std::int32_t> label_values() noexcept {
    return {reinterpret_cast<std::int32_t*>(data() + labels_offset()), count};
  }
  std::span<const std::int32_t> label_values() const noexcept {
    return {reinterpret_cast<const std::int32_t*>(data() + labels_offset()), count};
  }
  std::span<std::uint64_t> id_values() noexcept {
    return {reinterpret_cast<std::uint64_t*>(data() + ids_offset(shape, dtype, count)), count};
  }
  std::span<const std::uint64_t> id_values() const noexcept {
    return {reinterpret_cast<const std::uint64_t*>(data() + ids_offset(shape, dtype, count)), count};
  }

 private:
  static constexpr std::size_t round_up(std::size_t n) noexcept { return (n + 63) / 64 * 64; }
  static std::size_t labels_offset(Shape shape, DType dtype, std::size_t count) noexcept {
    return round_up(count * shape.elements() * dtype_size(dtype));
  }
  static std::size_t ids_offset(Shape shape, DType dtype, std::size_t count) noexcept {
    return round_up(labels_offset(shape, dtype, count) + count * sizeof(std::int32_t));
  }
};

/// Copies `samples` into one batch from `pool` and releases them. Throws std::invalid_argument
/// for no samples, or a sample whose shape or dtype differs from the first one's.
Batch make_batch(std::vector<Sample>&& samples, BufferPool& pool, const StageContext& ctx = {});

/// The same, cast to float32 and normalized on the way: each element of the batch is written
/// once, and equals, bit for bit, what normalize() gives. Normalizing here rather than per
/// crop keeps uint8 crops uint8 while they wait in a shuffle buffer: a quarter of the memory
/// and of the memory traffic of float32 crops.
Batch make_batch(std::vector<Sample>&& samples, const Normalizer& normalize, BufferPool& pool,
                 const StageContext& ctx = {});

/// Cuts `crops` straight into one batch from `pool`, each crop mirrored as planned, in the
/// dtype of its source or, with `normalize`, in float32 and normalized: every element of the
/// batch is written once. Equals, bit for bit, make_batch of the same crops cut by RandomCrops.
/// Releases the crops. Throws std::invalid_argument for no crops, a crop without a source, or
/// crops of different shapes or dtypes.
Batch make_batch(std::vector<DeferredCrop>&& crops, BufferPool& pool, const StageContext& ctx = {});
Batch make_batch(std::vector<DeferredCrop>&& crops, const Normalizer& normalize, BufferPool& pool,
                 const StageContext& ctx = {});

/// make_batch into a batch laid out as `layout`, from samples (or crops of samples) of either
/// layout, converted on the way, and with `normalize` (when not null) cast to float32 and
/// normalized; each element of the batch is written once. The overloads above give planar
/// batches, converting channels-last samples. A layout other than the samples' takes 2D images;
/// planar samples into a planar batch take any shape. Equals, bit for bit, converting each
/// sample (crop_image_into) then batching.
Batch make_batch(std::vector<Sample>&& samples, Layout layout, const Normalizer* normalize, BufferPool& pool,
                 const StageContext& ctx = {});
Batch make_batch(std::vector<DeferredCrop>&& crops, Layout layout, const Normalizer* normalize, BufferPool& pool,
                 const StageContext& ctx = {});

struct DeferredResize;  // decode_crop.h

/// Resizes `crops` (DecodeCropWindow's) straight into one batch from `pool`, laid out as `layout`,
/// normalized by their own normalization or by `normalize` (throws std::invalid_argument for
/// both), mirrored as drawn: every element of the batch is written once. Equals, bit for bit,
/// make_batch of the same crops made by DecodeResizedCrop. Releases the crops.
Batch make_batch(std::vector<DeferredResize>&& crops, Layout layout, const Normalizer* normalize, BufferPool& pool,
                 const StageContext& ctx = {});

/// make_batch as a pipeline stage function, following `.batch(name, n)`:
///   .batch("batch", 255).map("collate", stoker::Collate{})
/// of Samples, DeferredCrops or DeferredResizes. Batches are planar, (N, C, H, W), unless `layout` says
/// channels_last, (N, H, W, C); decoded (channels-last) images are converted on the way.
/// Thread-safe; copies share the pool.
struct Collate {
  std::shared_ptr<BufferPool> pool = BufferPool::create();
  std::optional<Normalizer> normalize{};  ///< cast to float32 and normalize while collating
  Layout layout = Layout::planar;         ///< the batch's

  Batch operator()(std::vector<Sample> samples, const StageContext& ctx = {}) const {
    return make_batch(std::move(samples), layout, normalize ? &*normalize : nullptr, *pool, ctx);
  }
  Batch operator()(std::vector<DeferredCrop> crops, const StageContext& ctx = {}) const {
    return make_batch(std::move(crops), layout, normalize ? &*normalize : nullptr, *pool, ctx);
  }
  /// Resizes crops whose windows DecodeCropWindow decoded (decode_crop.h).
  Batch operator()(std::vector<DeferredResize> crops, const StageContext& ctx = {}) const;
  /// One batch at a time from a pool that waits for free buffers (a pinned staging pool): a
  /// body then holds none of its own batches while it waits (StageOptions::max_chunk).
  std::size_t max_chunk() const { return pool->waits() ? 1 : std::numeric_limits<std::size_t>::max(); }
};

}  // namespace stoker
