// SPDX-License-Identifier: Apache-2.0
// Writing samples as JPEG and PNG files: for making data sets and test images.
#pragma once

#include <cstddef>
#include <vector>

#include "stoker/stages/sample.h"

namespace stoker {

enum class ChromaSubsampling : std::uint8_t { s444, s422, s420 };

struct JpegEncodeOptions {
  int quality = 90;  ///< 1 to 100
  ChromaSubsampling subsampling = ChromaSubsampling::s420;
  bool progressive = false;
};

/// A JPEG of `image`: interleaved uint8 (`channels_last`, or one channel) with 1 channel (a gray
/// JPEG), 3 (RGB, stored as YCbCr) or 4 (CMYK, stored as YCCK with an Adobe marker, the ink
/// amounts inverted as Photoshop writes them, so that decoders that follow Adobe's convention, as
/// PIL and stoker do, read back these values). Throws std::invalid_argument for anything else.
std::vector<std::byte> encode_jpeg(const Sample& image, const JpegEncodeOptions& options = {});

/// A lossless PNG of `image`: interleaved uint8 with 1 to 4 channels (gray, gray + alpha, RGB,
/// RGBA). Throws std::invalid_argument for anything else.
std::vector<std::byte> encode_png(const Sample& image);

}  // namespace stoker
