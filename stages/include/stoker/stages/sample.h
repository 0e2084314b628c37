// SPDX-License-Identifier: Apache-2.0
// The unit of data that flows through a training pipeline.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "stoker/stages/buffer_pool.h"

namespace stoker {

enum class DType : std::uint8_t { u8, u16, f32 };

constexpr std::size_t dtype_size(DType t) noexcept { return t == DType::u8 ? 1 : t == DType::u16 ? 2 : 4; }
const char* dtype_name(DType t) noexcept;

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<std::uint8_t>() {
  return DType::u8;
}
template <>
constexpr DType dtype_of<std::uint16_t>() {
  return DType::u16;
}
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}

/// Throws std::invalid_argument unless T is `held`, the element type of a `holder`.
template <class T>
void check_dtype(DType held, const char* holder) {
  using U = std::remove_const_t<T>;
  if (dtype_of<U>() != held)
    throw std::invalid_argument(std::string(holder) + " holds " + dtype_name(held) + ", not " +
                                dtype_name(dtype_of<U>()));
}

/// Channels, depth, height, width. A 2D image has depth 1 and `volume == false`.
/// The elements lie channel by channel ((C, D, H, W), planar) unless `channels_last`, when each
/// pixel's channels lie together ((D, H, W, C), interleaved, as image decoders write them).
struct Shape {
  std::uint32_t channels = 1, depth = 1, height = 1, width = 1;
  bool volume = false;         ///< 3D: depth is a spatial axis
  bool channels_last = false;  ///< interleaved (D, H, W, C) rather than planar (C, D, H, W)

  std::size_t elements() const noexcept { return std::size_t{channels} * depth * height * width; }
  bool operator==(const Shape&) const = default;
  std::string str() const;  ///< "1x28x28", "1x16x64x64", or "224x224x3" when channels_last
};

/// An array of up to four dimensions with a label and an id. Its storage comes from a
/// BufferPool and goes back there when the sample is destroyed; or, for a sample of a data set
/// held in memory (an IdxReader's), it is a read-only view of the data set (Sample::view).
struct Sample {
  Buffer data;
  Shape shape;
  DType dtype = DType::u8;
  std::int32_t label = 0;
  std::uint64_t id = 0;  ///< stable across epochs; seeds the sample's random draws

  Sample() = default;
  Sample(BufferPool& pool, Shape s, DType t, std::int32_t label_ = 0, std::uint64_t id_ = 0)
      : data(pool.acquire(s.elements() * dtype_size(t))), shape(s), dtype(t), label(label_), id(id_) {}

  /// A sample equal to `entry` whose elements are a read-only view of entry's (Buffer::view):
  /// nothing is copied. `owner` keeps the entry alive as long as the view lives: a data set
  /// held in memory and its samples, for one. Writing to the view's elements (the non-const
  /// as()) first gives it a copy of its own, so the entry never changes through it.
  static Sample view(const Sample& entry, std::shared_ptr<const void> owner) noexcept;

  /// The entry this sample is a view of (view()), while the sample still equals it: the same
  /// elements in place, shape, dtype, label and id. Null for any other sample. It lives as long
  /// as the data set it belongs to, which the sample's `owner` keeps alive. Whatever needs the
  /// elements for longer than the sample itself lives (a DeferredCrop) can point there rather
  /// than share the sample.
  const Sample* viewed() const noexcept;

  /// The elements as T; throws std::invalid_argument if T is not the sample's type. Writable:
  /// a view first becomes a copy of its own (Buffer::data).
  template <class T>
  std::span<T> as() {
    check_dtype<T>(dtype, "sample");
    return {reinterpret_cast<T*>(data.data()), shape.elements()};
  }
  template <class T>
  std::span<const T> as() const {
    check_dtype<T>(dtype, "sample");
    return {reinterpret_cast<const T*>(data.data()), shape.elements()};
  }

 private:
  const Sample* entry_ = nullptr;  // what view() made this a view of
};

}  // namespace stoker
