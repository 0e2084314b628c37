// SPDX-License-Identifier: Apache-2.0
// Decoding JPEG and PNG: every kind against a known pattern or a reference decode, bad files,
// windows and DCT scaling.
#include <doctest/doctest.h>
#include <spng.h>
#include <turbojpeg.h>
#include <zlib.h>

#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "stages/image_support.h"
#include "stoker/stages/image.h"
#include "stoker/stages/image_encode.h"
#include "stoker/stages/reader.h"
#include "support.h"

using namespace stoker;
using namespace stoker::test;

namespace {

struct JpegKind {
  const char* name;
  std::uint32_t channels;  // of the pattern encoded: 1 gray, 3 RGB, 4 CMYK
  JpegEncodeOptions options;
};

const JpegKind kJpegKinds[] = {
    {"baseline 4:4:4", 3, {.quality = 100, .subsampling = ChromaSubsampling::s444}},
    {"baseline 4:2:2", 3, {.quality = 100, .subsampling = ChromaSubsampling::s422}},
    {"baseline 4:2:0", 3, {.quality = 100, .subsampling = ChromaSubsampling::s420}},
    {"progressive 4:2:0", 3, {.quality = 100, .subsampling = ChromaSubsampling::s420, .progressive = true}},
    {"progressive 4:4:4", 3, {.quality = 100, .subsampling = ChromaSubsampling::s444, .progressive = true}},
    {"grayscale", 1, {.quality = 100}},
    {"CMYK (Adobe, YCCK)", 4, {.quality = 100, .subsampling = ChromaSubsampling::s444}},
};

// PIL's CMYK -> RGB of ink amounts (Convert.c cmyk2rgb): what a CMYK JPEG decodes to.
std::vector<std::uint8_t> cmyk_to_rgb(std::span<const std::uint8_t> cmyk) {
  std::vector<std::uint8_t> rgb;
  for (std::size_t i = 0; i < cmyk.size(); i += 4) {
    const unsigned not_k = 255u - cmyk[i + 3];
    for (int c = 0; c < 3; ++c) {
      const unsigned t = cmyk[i + c] * not_k + 128;
      rgb.push_back(static_cast<std::uint8_t>(not_k - (((t >> 8) + t) >> 8)));
    }
  }
  return rgb;
}

// PIL's luma (Image.convert("L")) of interleaved RGB.
std::vector<std::uint8_t> luma_of(const std::vector<std::uint8_t>& rgb) {
  std::vector<std::uint8_t> gray;
  for (std::size_t i = 0; i < rgb.size(); i += 3)
    gray.push_back(static_cast<std::uint8_t>((rgb[i] * 19595 + rgb[i + 1] * 38470 + rgb[i + 2] * 7471 + 0x8000) >> 16));
  return gray;
}

// What decoding `pattern` with `color` should give, before the codec's own error.
std::vector<std::uint8_t> expected_pixels(const Sample& pattern, ImageColor color) {
  const auto p = pixels(pattern);
  std::vector<std::uint8_t> rgb;
  if (pattern.shape.channels == 4)
    rgb = cmyk_to_rgb(p);
  else if (pattern.shape.channels == 1)
    for (const auto v : p) rgb.insert(rgb.end(), {v, v, v});
  else
    rgb.assign(p.begin(), p.end());
  return color == ImageColor::rgb ? rgb : luma_of(rgb);
}

// A PNG of raw PNG-format rows (packed for bit depths under 8, host-endian for 16), written by
// libspng itself: the kinds encode_png() does not make.
std::vector<std::byte> raw_png(std::uint32_t width, std::uint32_t height, std::uint8_t color_type, std::uint8_t depth,
                               std::span<const std::byte> rows, const spng_plte* plte = nullptr,
                               bool interlace = false) {
  const std::unique_ptr<spng_ctx, void (*)(spng_ctx*)> ctx(spng_ctx_new(SPNG_CTX_ENCODER), spng_ctx_free);
  spng_ihdr ihdr{};
  ihdr.width = width;
  ihdr.height = height;
  ihdr.bit_depth = depth;
  ihdr.color_type = color_type;
  ihdr.interlace_method = interlace ? 1 : 0;
  REQUIRE(spng_set_option(ctx.get(), SPNG_ENCODE_TO_BUFFER, 1) == 0);
  REQUIRE(spng_set_ihdr(ctx.get(), &ihdr) == 0);
  if (plte) REQUIRE(spng_set_plte(ctx.get(), const_cast<spng_plte*>(plte)) == 0);
  REQUIRE(spng_encode_image(ctx.get(), rows.data(), rows.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE) == 0);
  std::size_t size = 0;
  int error = 0;
  void* png = spng_get_png_buffer(ctx.get(), &size, &error);
  REQUIRE(error == 0);
  std::vector<std::byte> out(size);
  std::memcpy(out.data(), png, size);
  std::free(png);
  return out;
}

void store_be32(std::byte* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (24 - 8 * i));
}
void store_be16(std::byte* p, std::uint32_t v) {
  p[0] = static_cast<std::byte>(v >> 8);
  p[1] = static_cast<std::byte>(v);
}

// A PNG whose IHDR claims `width` x `height`, with a valid CRC, so that only the size is wrong.
std::vector<std::byte> png_claiming(std::vector<std::byte> png, std::uint32_t width, std::uint32_t height) {
  REQUIRE(std::memcmp(png.data() + 12, "IHDR", 4) == 0);
  store_be32(png.data() + 16, width);
  store_be32(png.data() + 20, height);
  store_be32(png.data() + 29,
             static_cast<std::uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(png.data() + 12), 17)));
  return png;
}

// A JPEG whose frame header (SOF0 or SOF2) claims `width` x `height`.
std::vector<std::byte> jpeg_claiming(std::vector<std::byte> jpeg, std::uint32_t width, std::uint32_t height) {
  for (std::size_t i = 2; i + 9 < jpeg.size(); ++i)
    if (jpeg[i] == std::byte{0xFF} && (jpeg[i + 1] == std::byte{0xC0} || jpeg[i + 1] == std::byte{0xC2})) {
      store_be16(jpeg.data() + i + 5, height);
      store_be16(jpeg.data() + i + 7, width);
      return jpeg;
    }
  FAIL("no frame header in the JPEG");
  return jpeg;
}

// Counts what is acquired from it: a decoder that refuses a file must not have allocated for it.
class CountingPool final : public BufferPool {
 public:
  static std::shared_ptr<CountingPool> create() { return std::shared_ptr<CountingPool>(new CountingPool()); }
  Buffer acquire(std::size_t bytes, const StageContext& ctx) override {
    ++acquired;
    return BufferPool::acquire(bytes, ctx);
  }
  using BufferPool::acquire;
  std::atomic<int> acquired{0};

 private:
  CountingPool() : BufferPool(std::size_t{1} << 24) {}
};

// A pool that counts the bytes it has handed out and not had back, and the most at once (one
// thread at a time).
class PeakPool final : public BufferPool {
 public:
  static std::shared_ptr<PeakPool> create() { return std::shared_ptr<PeakPool>(new PeakPool()); }
  Buffer acquire(std::size_t bytes, const StageContext& ctx) override {
    Buffer b = BufferPool::acquire(bytes, ctx);
    held += b.size();
    peak = std::max(peak, held);
    return b;
  }
  using BufferPool::acquire;
  std::size_t held = 0, peak = 0;

 protected:
  void release(std::byte* data, std::size_t size) noexcept override {
    held -= size;
    BufferPool::release(data, size);
  }

 private:
  PeakPool() : BufferPool(std::size_t{1} << 24) {}
};

// TurboJPEG's own decode of a whole JPEG at scale n/8: the reference a DCT-scaled window is cut from.
std::vector<std::uint8_t> turbojpeg_scaled(std::span<const std::byte> jpeg, int eighths, int channels,
                                           std::uint32_t& width, std::uint32_t& height) {
  const std::unique_ptr<void, int (*)(tjhandle)> tj(tjInitDecompress(), tjDestroy);
  int w = 0, h = 0, subsampling = 0, colorspace = 0;
  const auto* data = reinterpret_cast<const unsigned char*>(jpeg.data());
  REQUIRE(tjDecompressHeader3(tj.get(), data, jpeg.size(), &w, &h, &subsampling, &colorspace) == 0);
  const tjscalingfactor factor{eighths, 8};
  width = static_cast<std::uint32_t>(TJSCALED(w, factor));
  height = static_cast<std::uint32_t>(TJSCALED(h, factor));
  std::vector<std::uint8_t> out(std::size_t{width} * height * channels);
  REQUIRE(tjDecompress2(tj.get(), data, jpeg.size(), out.data(), static_cast<int>(width), 0, static_cast<int>(height),
                        channels == 1 ? TJPF_GRAY : TJPF_RGB, 0) == 0);
  return out;
}

// A box filter of `image` (interleaved, `channels`) to scale n/8: scaled pixel j is the mean of
// full-resolution pixels [j * 8 / n, (j + 1) * 8 / n), partly covered ones weighted by their cover.
std::vector<double> area_scaled(std::span<const std::uint8_t> image, std::uint32_t width, std::uint32_t height,
                                std::uint32_t channels, int eighths, std::uint32_t& out_w, std::uint32_t& out_h) {
  const double step = 8.0 / eighths;
  out_w = static_cast<std::uint32_t>((width * eighths + 7) / 8);
  out_h = static_cast<std::uint32_t>((height * eighths + 7) / 8);
  const auto weights = [&](std::uint32_t j, std::uint32_t n) {
    std::vector<std::pair<std::uint32_t, double>> w;
    const double lo = j * step, hi = std::min<double>((j + 1) * step, n);
    for (auto i = static_cast<std::uint32_t>(lo); i < n && i < hi; ++i)
      w.emplace_back(i, std::min<double>(i + 1, hi) - std::max<double>(i, lo));
    return w;
  };
  std::vector<double> out(std::size_t{out_w} * out_h * channels);
  for (std::uint32_t y = 0; y < out_h; ++y)
    for (std::uint32_t x = 0; x < out_w; ++x)
      for (std::uint32_t c = 0; c < channels; ++c) {
        double sum = 0, total = 0;
        for (const auto& [yy, wy] : weights(y, height))
          for (const auto& [xx, wx] : weights(x, width)) {
            sum += wy * wx * image[(std::size_t{yy} * width + xx) * channels + c];
            total += wy * wx;
          }
        out[(std::size_t{y} * out_w + x) * channels + c] = sum / total;
      }
  return out;
}

}  // namespace

TEST_CASE("image_format tells JPEG from PNG by their bytes, and names what else a file is") {
  auto pool = BufferPool::create();
  const auto jpeg = encode_jpeg(smooth_image(*pool, 8, 8, 3));
  const auto png = encode_png(smooth_image(*pool, 8, 8, 3));
  CHECK(image_format(jpeg, "a.png") == ImageFormat::jpeg);  // the name says nothing
  CHECK(image_format(png, "a.jpg") == ImageFormat::png);
  const auto bytes = [](const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); };
  CHECK_THROWS_WITH_AS(image_format({}, "d/empty.jpg"), "d/empty.jpg: empty file: no image in it", DataError);
  CHECK_THROWS_WITH_AS(image_format(bytes("GIF89a......"), "x.jpg"),
                       "x.jpg: not a JPEG or PNG image but a GIF image: only JPEG and PNG are decoded", DataError);
  CHECK_THROWS_WITH_AS(image_format(bytes(std::string("RIFF\x10\0\0\0WEBPVP8 ", 16)), "x.jpg"),
                       doctest::Contains("a WebP image"), DataError);
  CHECK_THROWS_WITH_AS(image_format(bytes("hello, world"), "notes.jpg"),
                       "notes.jpg: not a JPEG or PNG image (it starts with 68 65 6c 6c 6f 2c 20 77)", DataError);
}

TEST_CASE("every kind of JPEG decodes to its pattern, in RGB and in gray") {
  auto pool = BufferPool::create();
  for (const auto& kind : kJpegKinds) {
    const std::string kind_name = kind.name;
    CAPTURE(kind_name);
    const Sample pattern = smooth_image(*pool, 45, 67, kind.channels);  // neither side a multiple of 16
    const auto jpeg = encode_jpeg(pattern, kind.options);
    const ImageInfo info = read_image_info(jpeg, "p.jpg");
    CHECK(info == ImageInfo{ImageFormat::jpeg, 67, 45, kind.channels});
    for (const auto color : {ImageColor::rgb, ImageColor::gray}) {
      CAPTURE(color == ImageColor::rgb);
      const Sample out = decode_image(jpeg, "p.jpg", *pool, {.color = color});
      const std::uint32_t channels = color == ImageColor::rgb ? 3 : 1;
      CHECK(out.shape == Shape{.channels = channels, .height = 45, .width = 67, .channels_last = true});
      CHECK(out.dtype == DType::u8);
      REQUIRE(out.data.size() == out.shape.elements());
      // Quality 100 keeps a smooth pattern within a few levels; chroma subsampling and the
      // JPEG's own luma (gray from a color JPEG is its Y, not PIL's luma of the RGB) add a little.
      const auto expected = expected_pixels(pattern, color);
      CHECK(mean_abs_diff(pixels(out), expected) < 1.0);
      CHECK(max_abs_diff(pixels(out), expected) <= 6);
    }
  }
}

TEST_CASE("TurboJPEG's whole decode and libjpeg's whole-image window decode agree exactly") {
  auto pool = BufferPool::create();
  for (const auto& kind : kJpegKinds) {
    const std::string kind_name = kind.name;
    CAPTURE(kind_name);
    auto options = kind.options;
    options.quality = 85;
    const auto jpeg = encode_jpeg(noise_image(*pool, 61, 93, kind.channels), options);
    for (const auto color : {ImageColor::rgb, ImageColor::gray}) {
      const Sample whole = decode_image(jpeg, "n.jpg", *pool, {.color = color});
      const DecodedWindow window = decode_window(
          jpeg, "n.jpg", *pool, {.window = {0, 0, 93, 61}, .min_width = 93, .min_height = 61}, {.color = color});
      CHECK(window.scale_num == 8);
      CHECK(window.window == PixelRect{0, 0, 93, 61});
      CHECK(window.image.shape == whole.shape);
      CHECK(max_abs_diff(pixels(window.image), pixels(whole)) == 0);
    }
  }
}

TEST_CASE("every kind of PNG decodes exactly: RGB, RGBA, gray, gray + alpha, palette, 1-16 bits, interlaced") {
  auto pool = BufferPool::create();
  const std::uint32_t w = 13, h = 7;
  // 8-bit kinds through encode_png: alpha dropped, gray expanded.
  for (std::uint32_t channels = 1; channels <= 4; ++channels) {
    CAPTURE(channels);
    const Sample pattern = noise_image(*pool, h, w, channels);
    const auto png = encode_png(pattern);
    CHECK(read_image_info(png, "p.png") == ImageInfo{ImageFormat::png, w, h, channels});
    const Sample rgb = decode_image(png, "p.png", *pool);
    const Sample gray = decode_image(png, "p.png", *pool, {.color = ImageColor::gray});
    std::vector<std::uint8_t> want_rgb;
    const auto p = pixels(pattern);
    for (std::size_t i = 0; i < p.size(); i += channels) {
      if (channels <= 2)
        want_rgb.insert(want_rgb.end(), {p[i], p[i], p[i]});
      else
        want_rgb.insert(want_rgb.end(), {p[i], p[i + 1], p[i + 2]});
    }
    CHECK(rgb.shape == Shape{.channels = 3, .height = h, .width = w, .channels_last = true});
    CHECK(std::vector<std::uint8_t>(pixels(rgb).begin(), pixels(rgb).end()) == want_rgb);
    std::vector<std::uint8_t> want_gray;
    for (std::size_t i = 0; i < want_rgb.size(); i += 3)
      want_gray.push_back(static_cast<std::uint8_t>(
          (want_rgb[i] * 19595 + want_rgb[i + 1] * 38470 + want_rgb[i + 2] * 7471 + 0x8000) >> 16));
    CHECK(std::vector<std::uint8_t>(pixels(gray).begin(), pixels(gray).end()) == want_gray);
  }

  SUBCASE("palette") {
    spng_plte plte{};
    plte.n_entries = 5;
    for (std::uint32_t i = 0; i < 5; ++i)
      plte.entries[i] = {std::uint8_t(i * 50), std::uint8_t(255 - i * 40), std::uint8_t(i * i * 9), 255};
    std::vector<std::byte> indices(std::size_t{w} * h);
    for (std::size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<std::byte>(i * 7 % 5);
    const auto png = raw_png(w, h, SPNG_COLOR_TYPE_INDEXED, 8, indices, &plte);
    const Sample out = decode_image(png, "pal.png", *pool);
    std::vector<std::uint8_t> want;
    for (const auto i : indices) {
      const auto& e = plte.entries[static_cast<int>(i)];
      want.insert(want.end(), {e.red, e.green, e.blue});
    }
    CHECK(std::vector<std::uint8_t>(pixels(out).begin(), pixels(out).end()) == want);
    // As gray: PIL's luma of each entry.
    const Sample gray = decode_image(png, "pal.png", *pool, {.color = ImageColor::gray});
    CHECK(std::vector<std::uint8_t>(pixels(gray).begin(), pixels(gray).end()) == luma_of(want));
    // 2 bits a pixel, packed, with 3 of the 4 entries a palette of 2 bits can have.
    plte.n_entries = 3;
    const std::size_t row_bytes = (w + 3) / 4;
    std::vector<std::byte> packed(row_bytes * h, std::byte{0});
    want.clear();
    for (std::uint32_t y = 0; y < h; ++y)
      for (std::uint32_t x = 0; x < w; ++x) {
        const unsigned i = (x + 2 * y) % 3;
        packed[y * row_bytes + x / 4] |= static_cast<std::byte>(i << (6 - 2 * (x % 4)));
        const auto& e = plte.entries[i];
        want.insert(want.end(), {e.red, e.green, e.blue});
      }
    const Sample two = decode_image(raw_png(w, h, SPNG_COLOR_TYPE_INDEXED, 2, packed, &plte), "pal2.png", *pool);
    CHECK(std::vector<std::uint8_t>(pixels(two).begin(), pixels(two).end()) == want);
  }
  SUBCASE("gray of 1, 2 and 4 bits, scaled to 0..255") {
    for (const std::uint8_t depth : {1, 2, 4}) {
      CAPTURE(int(depth));
      const std::uint32_t levels = (1u << depth) - 1, per_byte = 8 / depth, row_bytes = (w + per_byte - 1) / per_byte;
      std::vector<std::byte> rows(std::size_t{row_bytes} * h);
      std::vector<std::uint8_t> want;
      for (std::uint32_t y = 0; y < h; ++y)
        for (std::uint32_t x = 0; x < w; ++x) {
          const std::uint32_t v = (x + 3 * y) % (levels + 1);
          auto& b = rows[std::size_t{y} * row_bytes + x / per_byte];
          b |= static_cast<std::byte>(v << (8 - depth * (x % per_byte + 1)));
          want.push_back(static_cast<std::uint8_t>(v * 255 / levels));
        }
      const auto png = raw_png(w, h, SPNG_COLOR_TYPE_GRAYSCALE, depth, rows);
      const Sample out = decode_image(png, "g.png", *pool, {.color = ImageColor::gray});
      CHECK(std::vector<std::uint8_t>(pixels(out).begin(), pixels(out).end()) == want);
    }
  }
  SUBCASE("16 bits keep the high byte, in gray and in RGB") {
    for (const std::uint8_t type :
         {SPNG_COLOR_TYPE_GRAYSCALE, SPNG_COLOR_TYPE_TRUECOLOR, SPNG_COLOR_TYPE_TRUECOLOR_ALPHA}) {
      CAPTURE(int(type));
      const std::uint32_t channels = type == SPNG_COLOR_TYPE_GRAYSCALE ? 1 : type == SPNG_COLOR_TYPE_TRUECOLOR ? 3 : 4;
      std::vector<std::uint16_t> samples(std::size_t{w} * h * channels);
      for (std::size_t i = 0; i < samples.size(); ++i) samples[i] = static_cast<std::uint16_t>(i * 40503u);
      const auto png = raw_png(w, h, type, 16, std::as_bytes(std::span(samples)));
      const Sample out =
          decode_image(png, "16.png", *pool, {.color = channels == 1 ? ImageColor::gray : ImageColor::rgb});
      std::vector<std::uint8_t> want;
      for (std::size_t i = 0; i < samples.size(); ++i)
        if (channels != 4 || i % 4 != 3) want.push_back(static_cast<std::uint8_t>(samples[i] >> 8));
      CHECK(std::vector<std::uint8_t>(pixels(out).begin(), pixels(out).end()) == want);
    }
  }
  SUBCASE("interlaced (Adam7)") {
    const Sample pattern = noise_image(*pool, h, w, 3);
    const auto png =
        raw_png(w, h, SPNG_COLOR_TYPE_TRUECOLOR, 8, std::span(pattern.data.data(), pattern.data.size()), nullptr, true);
    const Sample out = decode_image(png, "i.png", *pool);
    CHECK(max_abs_diff(pixels(out), pixels(pattern)) == 0);
  }
}

TEST_CASE("a PNG window holds the window and a row of the image (a row per window line if interlaced), not the image") {
  // A 1024x768 image is 2.25 MiB decoded; the window is 12 KiB.
  const std::uint32_t W = 1024, H = 768;
  auto pool = PeakPool::create();
  const Sample pattern = noise_image(*pool, H, W, 3);
  const auto plain = encode_png(pattern);
  const auto interlaced =
      raw_png(W, H, SPNG_COLOR_TYPE_TRUECOLOR, 8, std::span(pattern.data.data(), pattern.data.size()), nullptr, true);
  const PixelRect w{300, 200, 64, 64};
  const std::size_t window = std::size_t{w.width} * w.height * 3, row = std::size_t{W} * 3;
  for (const bool adam7 : {false, true}) {
    CAPTURE(adam7);
    const std::size_t before = pool->held;
    pool->peak = before;
    const auto out = decode_window(adam7 ? interlaced : plain, "big.png", *pool, {.window = w});
    CHECK(max_abs_diff(pixels(out.image), cut(pattern, w)) == 0);
    // Each buffer at most 1/8 over what was asked (the pool's size classes).
    const std::size_t most = (window + row * (adam7 ? w.height + 1 : 1)) * 9 / 8;
    CHECK(pool->peak - before <= most);
  }
}

TEST_CASE("bad files are a DataError naming the file and what is wrong, and nothing is allocated for them") {
  auto pool = CountingPool::create();
  const Sample pattern = noise_image(*pool, 64, 80, 3);
  const auto jpeg = encode_jpeg(pattern, {.quality = 90});
  const auto progressive = encode_jpeg(pattern, {.quality = 90, .progressive = true});
  const auto png = encode_png(pattern);
  const auto half = [](const std::vector<std::byte>& b) {
    return std::vector<std::byte>(b.begin(), b.begin() + b.size() / 2);
  };
  std::vector<std::byte> bad_crc = png;
  bad_crc[bad_crc.size() - 13] ^= std::byte{0x5A};  // IDAT's CRC (IEND's 12 bytes follow it)
  std::vector<std::byte> bad_iend_crc = png;
  bad_iend_crc.back() ^= std::byte{0x5A};
  const std::vector<std::byte> cut_in_iend_crc(png.begin(), png.end() - 2);
  // A palette of 3 entries, and one index (7) past it.
  spng_plte three{};
  three.n_entries = 3;
  std::vector<std::byte> indices(80 * 64, std::byte{1});
  indices[80 * 10 + 5] = std::byte{7};
  const auto past_palette = raw_png(80, 64, SPNG_COLOR_TYPE_INDEXED, 8, indices, &three);
  // A JPEG whose frame header says 12 bits per sample (SOF1, extended sequential).
  std::vector<std::byte> twelve_bit = jpeg;
  for (std::size_t i = 2; i + 4 < twelve_bit.size(); ++i)
    if (twelve_bit[i] == std::byte{0xFF} && twelve_bit[i + 1] == std::byte{0xC0}) {
      twelve_bit[i + 1] = std::byte{0xC1};
      twelve_bit[i + 4] = std::byte{12};
      break;
    }
  struct Case {
    const char* what;
    std::vector<std::byte> bytes;
    const char* message;
    bool allocates = false;  // the damage shows only once decoding has started
  };
  const std::string nonsense = "nothing to see here";
  const Case cases[] = {
      {"empty", {}, "empty file"},
      {"not an image",
       {reinterpret_cast<const std::byte*>(nonsense.data()),
        reinterpret_cast<const std::byte*>(nonsense.data()) + nonsense.size()},
       "not a JPEG or PNG image"},
      {"JPEG truncated", half(jpeg), "Premature end of JPEG file", true},
      {"progressive JPEG truncated", half(progressive), "Premature end of JPEG file", true},
      {"JPEG header only", std::vector<std::byte>(jpeg.begin(), jpeg.begin() + 40), "damaged or truncated JPEG"},
      {"PNG truncated", half(png), "truncated", true},
      {"PNG with a bad CRC", bad_crc, "bad CRC", true},
      {"PNG with a bad CRC in IEND", bad_iend_crc, "bad CRC", true},
      {"PNG cut inside IEND's CRC", cut_in_iend_crc, "truncated", true},
      {"PNG with a palette index past its PLTE", past_palette,
       "damaged PNG: palette index 7 at (5, 10) past the 3 entries of its palette (PLTE)", true},
      {"12-bit JPEG", twelve_bit,
       "unsupported JPEG: 12 bits per sample (stoker decodes 8-bit JPEG only; convert the file to 8 bits)"},
      {"PNG header only", std::vector<std::byte>(png.begin(), png.begin() + 20), "damaged PNG"},
      {"JPEG claiming 60000 x 60000", jpeg_claiming(jpeg, 60000, 60000),
       "JPEG header claims 60000x60000 = 3600000000 pixels, over the limit of 89478485"},
      {"JPEG just over PIL's limit", jpeg_claiming(jpeg, 10000, 8948), "over the limit of 89478485"},
      {"progressive JPEG claiming 60000 x 60000", jpeg_claiming(progressive, 60000, 60000), "over the limit"},
      {"PNG claiming 60000 x 60000", png_claiming(png, 60000, 60000),
       "PNG header claims 60000x60000 = 3600000000 pixels, over the limit of 89478485"},
      {"PNG claiming a side over the limit", png_claiming(png, 100000000, 1), "over the limit of 89478485"},
  };
  for (const auto& c : cases) {
    const std::string what = c.what;
    CAPTURE(what);
    for (const bool window : {false, true}) {
      CAPTURE(window);
      pool->acquired = 0;
      try {
        if (window)  // the whole image: a window decode reads no further than its last row
          decode_window(c.bytes, "data/bad.img", *pool, {.window = {0, 0, 80, 64}});
        else
          decode_image(c.bytes, "data/bad.img", *pool);
        FAIL("decoded");
      } catch (const DataError& e) {
        CHECK(e.file() == "data/bad.img");
        CHECK(std::string(e.what()).rfind("data/bad.img: ", 0) == 0);
        CHECK_MESSAGE(std::string(e.what()).find(c.message) != std::string::npos, std::string(e.what()));
      }
      if (!c.allocates) CHECK(pool->acquired == 0);
    }
  }
  CHECK_THROWS_WITH_AS(ImageDecoder({}, pool)(EncodedImage{.data = {}, .name = "x"}), "x: empty file: no image in it",
                       DataError);
  // A window above the damage of a baseline JPEG decodes: nothing below its last row is read.
  const auto top =
      decode_window(half(jpeg), "a.jpg", *pool, {.window = {0, 0, 80, 8}, .min_width = 80, .min_height = 8});
  CHECK(max_abs_diff(pixels(top.image), cut(decode_image(jpeg, "a.jpg", *pool), {0, 0, 80, 8})) == 0);
  // The limit is the caller's to set.
  CHECK_THROWS_WITH_AS(decode_image(jpeg, "a.jpg", *pool, {.max_pixels = 64 * 80 - 1}),
                       doctest::Contains("64 = 5120 pixels, over the limit of 5119"), DataError);
  CHECK_THROWS_WITH_AS(decode_image(png, "a.png", *pool, {.max_pixels = 64 * 80 - 1}),
                       doctest::Contains("over the limit of 5119"), DataError);
  CHECK(decode_image(jpeg, "a.jpg", *pool, {.max_pixels = 64 * 80}).shape.elements() == 64 * 80 * 3);
}

TEST_CASE("a JPEG that fails to decode leaves the thread's decoder fit for the next one") {
  // TurboJPEG 2.1 read the header of the next, good file as 0 x 0 after some failures.
  auto pool = BufferPool::create();
  const auto good = encode_jpeg(noise_image(*pool, 8, 7, 3), {.quality = 80});
  for (const std::size_t cut : {good.size() / 2, std::size_t{40}, good.size() - 3}) {
    CAPTURE(cut);
    CHECK_THROWS_AS(decode_image(std::span(good).first(cut), "cut.jpg", *pool), DataError);
    const Sample out = decode_image(good, "good.jpg", *pool);
    CHECK(out.shape == Shape{.channels = 3, .height = 8, .width = 7, .channels_last = true});
  }
}

TEST_CASE("a window decodes exactly as the same window of the whole image, at any position") {
  auto pool = BufferPool::create();
  const std::uint32_t W = 203, H = 157;
  const PixelRect windows[] = {{0, 0, W, H},     {1, 1, W - 2, H - 2}, {17, 9, 50, 40},   {W - 13, H - 7, 13, 7},
                               {5, 0, 1, 1},     {0, 33, W, 20},       {40, 0, 30, H},    {15, 15, 2, 2},
                               {16, 16, 16, 16}, {W - 1, 0, 1, H},     {100, H - 1, 3, 1}};
  for (const auto& kind : kJpegKinds) {
    const std::string kind_name = kind.name;
    CAPTURE(kind_name);
    auto options = kind.options;
    options.quality = 90;
    const auto jpeg = encode_jpeg(noise_image(*pool, H, W, kind.channels), options);
    for (const auto color : {ImageColor::rgb, ImageColor::gray}) {
      const Sample whole = decode_image(jpeg, "n.jpg", *pool, {.color = color});
      for (const auto& w : windows) {
        CAPTURE(w.x);
        CAPTURE(w.y);
        CAPTURE(w.width);
        CAPTURE(w.height);
        const auto out = decode_window(jpeg, "n.jpg", *pool,
                                       {.window = w, .min_width = w.width, .min_height = w.height}, {.color = color});
        CHECK(out.scale_num == 8);
        CHECK(out.scale_denom == 8);
        CHECK(out.window == w);
        CHECK(out.scaled_width == W);
        CHECK(out.info == ImageInfo{ImageFormat::jpeg, W, H, kind.channels});
        REQUIRE(out.image.shape ==
                Shape{.channels = whole.shape.channels, .height = w.height, .width = w.width, .channels_last = true});
        CHECK(max_abs_diff(pixels(out.image), cut(whole, w)) == 0);
      }
    }
  }
  // PNG, decoded row by row: exactly the whole decode's pixels, cut; interlaced too, and gray
  // of 8-bit gray, of RGB and of 16-bit gray (the last two through RGB and luma).
  const Sample colour = noise_image(*pool, H, W, 3), gray8 = noise_image(*pool, H, W, 1);
  std::vector<std::byte> gray16(std::size_t{W} * H * 2);
  for (std::size_t i = 0; i < gray16.size(); ++i) gray16[i] = static_cast<std::byte>(i * 131 % 251);
  const struct {
    const char* name;
    std::vector<std::byte> png;
  } pngs[] = {{"RGB", encode_png(colour)},
              {"gray", encode_png(gray8)},
              {"RGB interlaced", raw_png(W, H, SPNG_COLOR_TYPE_TRUECOLOR, 8,
                                         std::span(colour.data.data(), colour.data.size()), nullptr, true)},
              {"16-bit gray interlaced", raw_png(W, H, SPNG_COLOR_TYPE_GRAYSCALE, 16, gray16, nullptr, true)}};
  for (const auto& kind : pngs) {
    const std::string kind_name = kind.name;
    for (const auto color : {ImageColor::rgb, ImageColor::gray}) {
      CAPTURE(kind_name);
      CAPTURE(color == ImageColor::rgb);
      const Sample whole = decode_image(kind.png, "n.png", *pool, {.color = color});
      for (const auto& w : windows) {
        const auto out =
            decode_window(kind.png, "n.png", *pool, {.window = w, .min_width = 1, .min_height = 1}, {.color = color});
        CHECK(out.scale_num == out.scale_denom);
        CHECK(out.window == w);
        CHECK(max_abs_diff(pixels(out.image), cut(whole, w)) == 0);
      }
    }
  }
  const auto png = pngs[0].png;
  CHECK_THROWS_WITH_AS(decode_window(png, "n.png", *pool, {.window = {200, 0, 4, 1}}),
                       "n.png: window 4x1 at (200, 0) does not lie inside the 203x157 image", std::invalid_argument);
  CHECK_THROWS_AS(decode_window(encode_jpeg(noise_image(*pool, 8, 8, 3)), "n.jpg", *pool, {.window = {0, 0, 0, 1}}),
                  std::invalid_argument);
}

TEST_CASE(
    "jpeg_scale_eighths picks the smallest n/8 that keeps the window at least the size asked, of 1/8 to 3/8 and 8/8") {
  CHECK(jpeg_scale_eighths(224, 224, 224, 224) == 8);
  CHECK(jpeg_scale_eighths(1000, 2000, 224, 224) == 2);
  CHECK(jpeg_scale_eighths(3000, 3000, 224, 224) == 1);
  CHECK(jpeg_scale_eighths(1792, 1792, 224, 224) == 1);
  CHECK(jpeg_scale_eighths(1791, 1792, 224, 224) == 2);  // 1791 / 8 < 224
  CHECK(jpeg_scale_eighths(600, 598, 224, 224) == 3);
  CHECK(jpeg_scale_eighths(597, 598, 224, 224) == 8);  // 4/8 would do, but costs more than 8/8
  CHECK(jpeg_scale_eighths(448, 448, 224, 224) == 8);
  CHECK(jpeg_scale_eighths(100, 100, 224, 224) == 8);  // no upscaling in the decoder
  CHECK(jpeg_scale_eighths(500, 400, 0, 0) == 1);
  CHECK(jpeg_scale_eighths(800, 100, 200, 25) == 2);  // the tighter side decides
  CHECK(jpeg_scale_eighths(800, 100, 200, 26) == 3);
}

TEST_CASE("a DCT-scaled window equals TurboJPEG's scaled decode cut there, and is close to an area resize") {
  auto pool = BufferPool::create();
  const std::uint32_t W = 203, H = 157;
  for (const auto& kind : kJpegKinds) {
    if (kind.channels == 4) continue;  // TurboJPEG 2.1 does not make RGB of CMYK
    const std::string kind_name = kind.name;
    CAPTURE(kind_name);
    const Sample pattern = smooth_image(*pool, H, W, kind.channels, 5);
    const auto jpeg = encode_jpeg(pattern, kind.options);
    const auto color = kind.channels == 1 ? ImageColor::gray : ImageColor::rgb;
    const std::uint32_t channels = kind.channels == 1 ? 1 : 3;
    const Sample full = decode_image(jpeg, "s.jpg", *pool, {.color = color});
    for (int n = 1; n <= 7; ++n) {  // 1/8 to 7/8 asked for
      CAPTURE(n);
      for (const PixelRect w :
           {PixelRect{0, 0, W, H}, PixelRect{37, 21, 120, 101}, PixelRect{W - 64, H - 48, 64, 48}}) {
        CAPTURE(w.x);
        // Ask for what n/8 of the window gives: the decoder picks n, or 8 for n of 4 to 7.
        const std::uint32_t min_w = (w.width * n) / 8, min_h = (w.height * n) / 8;
        const std::uint32_t picked = jpeg_scale_eighths(w.width, w.height, min_w, min_h);
        REQUIRE(picked == std::uint32_t(n <= 3 ? n : 8));
        if (picked == 8) continue;  // full resolution: the test above
        const auto out = decode_window(jpeg, "s.jpg", *pool, {.window = w, .min_width = min_w, .min_height = min_h},
                                       {.color = color});
        REQUIRE(out.scale_num == std::uint32_t(n));
        REQUIRE(out.scale_denom == 8);
        const PixelRect scaled{w.x * n / 8, w.y * n / 8,
                               (w.x + w.width) * n / 8 + ((w.x + w.width) * n % 8 != 0) - w.x * n / 8,
                               (w.y + w.height) * n / 8 + ((w.y + w.height) * n % 8 != 0) - w.y * n / 8};
        CHECK(out.window == scaled);
        CHECK(out.image.shape.width >= min_w);
        CHECK(out.image.shape.height >= min_h);
        std::uint32_t tw = 0, th = 0;
        const auto reference = turbojpeg_scaled(jpeg, n, static_cast<int>(channels), tw, th);
        CHECK(out.scaled_width == tw);
        CHECK(out.scaled_height == th);
        Sample ref_sample(*pool, {.channels = channels, .height = th, .width = tw, .channels_last = true}, DType::u8);
        std::memcpy(ref_sample.data.data(), reference.data(), reference.size());
        CHECK(max_abs_diff(pixels(out.image), cut(ref_sample, scaled)) == 0);
        // Against a box filter of the full-resolution decode: DCT scaling is close to an area
        // resize on smooth content, within 1.5 levels on average; at 1/8 each pixel is its 8x8
        // block's DC, and subsampled chroma is upsampled from blocks of two, within 3.5.
        std::uint32_t aw = 0, ah = 0;
        const auto area = area_scaled(pixels(full), W, H, channels, n, aw, ah);
        REQUIRE(aw == tw);
        double sum = 0;
        const auto got = pixels(out.image);
        for (std::uint32_t y = 0; y < scaled.height; ++y)
          for (std::uint32_t x = 0; x < scaled.width * channels; ++x)
            sum += std::abs(got[std::size_t{y} * scaled.width * channels + x] -
                            area[(std::size_t{y + scaled.y} * aw + scaled.x) * channels + x]);
        CHECK(sum / double(got.size()) < (n == 1 ? 3.5 : 1.5));
      }
    }
  }
}

TEST_CASE("ImageDecoder decodes from many threads at once, each image as a lone decode does" * doctest::timeout(60)) {
  auto pool = BufferPool::create();
  std::vector<EncodedImage> inputs;
  std::vector<Sample> expected;
  for (int i = 0; i < 24; ++i) {
    const auto& kind = kJpegKinds[i % std::size(kJpegKinds)];
    const Sample pattern = noise_image(*pool, 30 + i, 40 + 2 * i, kind.channels, i);
    auto bytes =
        i % 4 == 3 ? encode_png(noise_image(*pool, 30 + i, 40 + 2 * i, 3, i)) : encode_jpeg(pattern, kind.options);
    EncodedImage in{.data = pool->acquire(bytes.size()),
                    .label = i,
                    .id = std::uint64_t(100 + i),
                    .name = "img" + std::to_string(i)};
    std::memcpy(in.data.data(), bytes.data(), bytes.size());
    expected.push_back(decode_image(in.bytes(), in.name, *pool));
    inputs.push_back(std::move(in));
  }
  const ImageDecoder decode({}, pool);
  std::atomic<int> mismatches{0};
  run_threads(4, [&](int t) {
    for (int round = 0; round < 5; ++round)
      for (std::size_t i = static_cast<std::size_t>(t); i < inputs.size(); i += 2) {
        const EncodedImage& src = inputs[i];
        EncodedImage copy{.data = pool->acquire(src.data.size()), .label = src.label, .id = src.id, .name = src.name};
        std::memcpy(copy.data.data(), src.data.data(), src.data.size());
        const Sample out = decode(std::move(copy));
        if (out.label != src.label || out.id != src.id || out.shape != expected[i].shape ||
            std::memcmp(out.data.data(), expected[i].data.data(), out.data.size()) != 0)
          ++mismatches;
      }
  });
  CHECK(mismatches == 0);
}
