// SPDX-License-Identifier: Apache-2.0
#include "stoker/stages/image_encode.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

#include <spng.h>
#include <turbojpeg.h>

namespace stoker {

namespace {

// Interleaved uint8 of 1 to 4 channels; `what` names the caller in the message.
void check_image(const Sample& image, const char* what) {
  const Shape& s = image.shape;
  if (image.dtype != DType::u8 || s.volume || s.depth != 1 || s.channels < 1 || s.channels > 4 ||
      (s.channels > 1 && !s.channels_last) || s.width == 0 || s.height == 0)
    throw std::invalid_argument(std::string(what) + ": needs a 2D uint8 image of 1 to 4 interleaved channels, got " +
                                dtype_name(image.dtype) + " " + s.str());
  if (image.data.size() != s.elements())
    throw std::invalid_argument(std::string(what) + ": the sample holds " + std::to_string(image.data.size()) +
                                " bytes, its shape " + s.str() + " needs " + std::to_string(s.elements()));
}

}  // namespace

std::vector<std::byte> encode_jpeg(const Sample& image, const JpegEncodeOptions& options) {
  check_image(image, "encode_jpeg");
  const Shape& s = image.shape;
  if (s.channels == 2) throw std::invalid_argument("encode_jpeg: a JPEG has 1, 3 or 4 channels, not 2");
  if (options.quality < 1 || options.quality > 100)
    throw std::invalid_argument("encode_jpeg: quality must be 1 to 100, got " + std::to_string(options.quality));
  const auto* pixels = reinterpret_cast<const unsigned char*>(image.data.data());
  std::vector<unsigned char> inverted;
  if (s.channels == 4) {  // Adobe's convention: ink amounts are stored inverted
    inverted.assign(pixels, pixels + image.data.size());
    for (auto& v : inverted) v = static_cast<unsigned char>(255 - v);
    pixels = inverted.data();
  }
  const int format = s.channels == 1 ? TJPF_GRAY : s.channels == 3 ? TJPF_RGB : TJPF_CMYK;
  const int subsampling = s.channels == 1                                  ? TJSAMP_GRAY
                          : options.subsampling == ChromaSubsampling::s444 ? TJSAMP_444
                          : options.subsampling == ChromaSubsampling::s422 ? TJSAMP_422
                                                                           : TJSAMP_420;
  const std::unique_ptr<void, int (*)(tjhandle)> tj(tjInitCompress(), tjDestroy);
  if (!tj) throw std::runtime_error(std::string("TurboJPEG cannot make a compressor: ") + tjGetErrorStr2(nullptr));
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  const int flags = TJFLAG_ACCURATEDCT | (options.progressive ? TJFLAG_PROGRESSIVE : 0);
  if (tjCompress2(tj.get(), pixels, static_cast<int>(s.width), 0, static_cast<int>(s.height), format, &jpeg, &size,
                  subsampling, options.quality, flags) != 0) {
    tjFree(jpeg);
    throw std::runtime_error(std::string("TurboJPEG cannot encode: ") + tjGetErrorStr2(tj.get()));
  }
  std::vector<std::byte> out(size);
  std::memcpy(out.data(), jpeg, size);
  tjFree(jpeg);
  return out;
}

std::vector<std::byte> encode_png(const Sample& image) {
  check_image(image, "encode_png");
  const Shape& s = image.shape;
  const std::unique_ptr<spng_ctx, void (*)(spng_ctx*)> ctx(spng_ctx_new(SPNG_CTX_ENCODER), spng_ctx_free);
  if (!ctx) throw std::bad_alloc();
  static constexpr std::uint8_t kColorType[] = {SPNG_COLOR_TYPE_GRAYSCALE, SPNG_COLOR_TYPE_GRAYSCALE_ALPHA,
                                                SPNG_COLOR_TYPE_TRUECOLOR, SPNG_COLOR_TYPE_TRUECOLOR_ALPHA};
  spng_ihdr ihdr{};
  ihdr.width = s.width;
  ihdr.height = s.height;
  ihdr.bit_depth = 8;
  ihdr.color_type = kColorType[s.channels - 1];
  const auto check = [](int r) {
    if (r != 0) throw std::runtime_error(std::string("libspng cannot encode: ") + spng_strerror(r));
  };
  check(spng_set_option(ctx.get(), SPNG_ENCODE_TO_BUFFER, 1));
  check(spng_set_ihdr(ctx.get(), &ihdr));
  check(spng_encode_image(ctx.get(), image.data.data(), image.data.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE));
  std::size_t size = 0;
  int error = 0;
  const std::unique_ptr<void, void (*)(void*)> png(spng_get_png_buffer(ctx.get(), &size, &error), std::free);
  check(error);
  std::vector<std::byte> out(size);
  std::memcpy(out.data(), png.get(), size);
  return out;
}

}  // namespace stoker
