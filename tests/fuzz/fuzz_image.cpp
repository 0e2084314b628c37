// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the image decoders (JPEG through TurboJPEG and libjpeg, PNG through libspng)
// on any bytes: read_image_info, decode_image in RGB and gray, and decode_window of the middle of
// the image at full size and DCT-scaled. Every input must decode or throw DataError; what decodes
// must have the shape its header says.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "stoker/stages/image.h"
#include "stoker/stages/reader.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace stoker;
  const auto bytes = std::as_bytes(std::span(data, size));
  auto pool = BufferPool::create();
  // A lower pixel limit than the default keeps each run fast; the limit is checked the same way.
  const DecodeOptions rgb{.max_pixels = 1 << 22}, gray{.color = ImageColor::gray, .max_pixels = 1 << 22};
  ImageInfo info;
  try {
    info = read_image_info(bytes, "fuzz");
  } catch (const DataError&) {
    return 0;
  }
  for (const auto& options : {rgb, gray}) {
    try {
      const Sample s = decode_image(bytes, "fuzz", *pool, options);
      const std::uint32_t channels = options.color == ImageColor::gray ? 1 : 3;
      if (s.shape.width != info.width || s.shape.height != info.height || s.shape.channels != channels ||
          s.data.size() != s.shape.elements())
        std::abort();
    } catch (const DataError&) {
    }
  }
  const PixelRect middle{info.width / 4, info.height / 4, info.width - info.width / 2, info.height - info.height / 2};
  if (middle.width == 0 || middle.height == 0) return 0;
  for (const std::uint32_t min_side : {0u, 1u << 20}) {
    try {
      const DecodedWindow w =
          decode_window(bytes, "fuzz", *pool, {.window = middle, .min_width = min_side, .min_height = min_side}, rgb);
      if (w.info != info || w.image.shape.width != w.window.width || w.image.shape.height != w.window.height ||
          w.image.data.size() != w.image.shape.elements() || w.window.x + w.window.width > w.scaled_width ||
          w.window.y + w.window.height > w.scaled_height)
        std::abort();
    } catch (const DataError&) {
    }
  }
  return 0;
}
