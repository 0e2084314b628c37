// Collation: n samples of one shape into one contiguous batch, the layout a training step
// (and a single host-to-device copy) wants.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "stoker/stages/buffer_pool.h"
#include "stoker/stages/sample.h"
#include "stoker/stages/transforms.h"

namespace stoker {

/// `count` samples of one `shape` and `dtype`, one after the other in `data`:
/// (N, C, [D,] H, W). Labels and ids in sample order. All three buffers come from a
/// BufferPool and go back to it when the batch is destroyed.
struct Batch {
  Buffer data;
  Shape shape;  ///< of one sample
  DType dtype = DType::f32;
  std::size_t count = 0;
  Buffer labels;  ///< `count` int32
  Buffer ids;     ///< `count` uint64

  /// An uninitialised batch of `count` samples, for code that fills it in place.
  static Batch allocate(BufferPool& pool, Shape shape, DType dtype, std::size_t count);

  /// N, C, [D,] H, W: D only for volumes.
  std::vector<std::size_t> dims() const;
  std::size_t sample_bytes() const noexcept { return shape.elements() * dtype_size(dtype); }

  /// All the elements as T; throws std::invalid_argument if T is not the batch's type.
  template <class T>
  std::span<T> as() {
    check_dtype<T>(dtype, "batch");
    return {reinterpret_cast<T*>(data.data()), count * shape.elements()};
  }
  template <class T>
  std::span<const T> as() const {
    check_dtype<T>(dtype, "batch");
    return {reinterpret_cast<const T*>(data.data()), count * shape.elements()};
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

  std::span<std::int32_t> label_values() noexcept { return {reinterpret_cast<std::int32_t*>(labels.data()), count}; }
  std::span<const std::int32_t> label_values() const noexcept {
    return {reinterpret_cast<const std::int32_t*>(labels.data()), count};
  }
  std::span<std::uint64_t> id_values() noexcept { return {reinterpret_cast<std::uint64_t*>(ids.data()), count}; }
  std::span<const std::uint64_t> id_values() const noexcept {
    return {reinterpret_cast<const std::uint64_t*>(ids.data()), count};
  }
};

/// Copies `samples` into one batch from `pool` and releases them. Throws std::invalid_argument
/// for no samples, or a sample whose shape or dtype differs from the first one's.
Batch make_batch(std::vector<Sample>&& samples, BufferPool& pool);

/// The same, cast to float32 and normalized on the way: each element of the batch is written
/// once, and equals, bit for bit, what normalize() gives. Normalizing here rather than per
/// crop keeps uint8 crops uint8 while they wait in a shuffle buffer: a quarter of the memory
/// and of the memory traffic of float32 crops.
Batch make_batch(std::vector<Sample>&& samples, const Normalizer& normalize, BufferPool& pool);

/// make_batch as a pipeline stage function, following `.batch(name, n)`:
///   .batch("batch", 255).map("collate", stoker::Collate{})
/// Thread-safe; copies share the pool.
struct Collate {
  std::shared_ptr<BufferPool> pool = BufferPool::create();
  std::optional<Normalizer> normalize{};  ///< cast to float32 and normalize while collating

  Batch operator()(std::vector<Sample> samples) const {
    return normalize ? make_batch(std::move(samples), *normalize, *pool) : make_batch(std::move(samples), *pool);
  }
};

}  // namespace stoker
