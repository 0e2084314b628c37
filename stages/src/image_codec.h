// SPDX-License-Identifier: Apache-2.0
// What the JPEG and PNG code shares. Private to stoker_stages.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "stoker/stages/image.h"

namespace stoker::detail {

/// Interleaved H x W x C uint8.
inline Shape image_shape(std::uint32_t height, std::uint32_t width, std::uint32_t channels) noexcept {
  return Shape{.channels = channels, .height = height, .width = width, .channels_last = true};
}

inline std::uint32_t channels_of(ImageColor c) noexcept { return c == ImageColor::gray ? 1 : 3; }

/// An image sample of `shape` on a buffer of `pool`, acquired with `ctx` (a pool that waits can be stopped).
inline Sample make_image(BufferPool& pool, Shape shape, const StageContext& ctx) {
  Sample s;
  s.data = pool.acquire(shape.elements(), ctx);
  s.shape = shape;
  return s;
}

/// Throws DataError naming `name` when a `width` x `height` image is over the pixel limit.
void check_pixels(std::uint64_t width, std::uint64_t height, const DecodeOptions& options, const std::string& name,
                  const char* format);

/// Throws std::invalid_argument naming `name` unless `window` is non-empty and inside the image.
void check_window(const PixelRect& window, const ImageInfo& info, const std::string& name);

/// ITU-R 601 luma in PIL's fixed point (Image.convert("L")), so that gray matches PIL.
constexpr std::uint8_t luma(std::uint32_t r, std::uint32_t g, std::uint32_t b) noexcept {
  return static_cast<std::uint8_t>((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
}

/// The header of a JPEG as libjpeg reads it (every subsampling, CMYK and YCCK included).
ImageInfo jpeg_header(std::span<const std::byte> bytes, const std::string& name);

/// decode_window() of a JPEG, through libjpeg. Also the full decode of what TurboJPEG 2.1 does
/// not convert itself (CMYK, YCCK, subsamplings it cannot name).
DecodedWindow jpeg_window(std::span<const std::byte> bytes, const std::string& name, BufferPool& pool,
                          WindowChooser choose, const DecodeOptions& options, const StageContext& ctx);

}  // namespace stoker::detail
