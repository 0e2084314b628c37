// SPDX-License-Identifier: Apache-2.0
// Telling JPEG from PNG by their bytes, and decoding them: JPEG through TurboJPEG (one handle per
// thread), PNG through libspng (a fresh context per image, with limits, as its documentation
// asks for untrusted files).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>

#include <spng.h>
#include <turbojpeg.h>

#include "image_codec.h"
#include "stoker/stages/reader.h"

namespace stoker {

namespace {

template <std::size_t N>  // N counts the literal's terminating zero
bool starts_with(std::span<const std::byte> bytes, const char (&magic)[N]) noexcept {
  return bytes.size() >= N - 1 && std::memcmp(bytes.data(), magic, N - 1) == 0;
}

// Formats a data set may hold by mistake, named so that the error says what the file is.
const char* other_format(std::span<const std::byte> b) noexcept {
  if (starts_with(b, "GIF87a") || starts_with(b, "GIF89a")) return "a GIF image";
  if (starts_with(b, "BM")) return "a BMP image";
  if (starts_with(b, "II*") || starts_with(b, "MM\0*")) return "a TIFF image";
  if (b.size() >= 12 && starts_with(b, "RIFF") && std::memcmp(b.data() + 8, "WEBP", 4) == 0) return "a WebP image";
  if (b.size() >= 12 && std::memcmp(b.data() + 4, "ftyp", 4) == 0) return "an ISO media file (AVIF, HEIC or video)";
  return nullptr;
}

std::string first_bytes(std::span<const std::byte> b) {
  std::string text;
  for (std::size_t i = 0; i < std::min<std::size_t>(b.size(), 8); ++i) {
    char hex[4];
    std::snprintf(hex, sizeof hex, "%s%02x", i ? " " : "", static_cast<unsigned>(b[i]));
    text += hex;
  }
  return text;
}

// ---- JPEG through TurboJPEG ----------------------------------------------------------------

// The calling thread's decompressor: a TurboJPEG handle keeps its error text and scratch state,
// so one per thread makes decoding safe from any number of threads without a lock. TurboJPEG 2.1
// leaves a handle in a bad state after some failures (the next header read returns 0 x 0), so a
// handle that failed is replaced by a fresh one.
class ThreadDecompressor {
 public:
  static ThreadDecompressor& get() {
    thread_local ThreadDecompressor d;
    if (!d.handle_)
      throw std::runtime_error(std::string("TurboJPEG cannot make a decompressor: ") + tjGetErrorStr2(nullptr));
    return d;
  }
  tjhandle handle() const noexcept { return handle_; }
  /// The handle's error message; the handle is replaced.
  std::string failed() {
    std::string message = tjGetErrorStr2(handle_);
    tjDestroy(handle_);
    handle_ = tjInitDecompress();
    return message;
  }
  ~ThreadDecompressor() {
    if (handle_) tjDestroy(handle_);
  }

 private:
  ThreadDecompressor() = default;
  tjhandle handle_ = tjInitDecompress();
};

// A whole JPEG. TurboJPEG 2.1 converts neither CMYK nor YCCK to RGB, names only the common
// chroma subsamplings, and reads a header cut short as 0 x 0: those go through libjpeg, as a
// window that is the whole image.
Sample decode_jpeg(std::span<const std::byte> bytes, const std::string& name, BufferPool& pool,
                   const DecodeOptions& options, const StageContext& ctx) {
  ThreadDecompressor& tj = ThreadDecompressor::get();
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const auto size = static_cast<unsigned long>(bytes.size());
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  const bool read = tjDecompressHeader3(tj.handle(), data, size, &width, &height, &subsampling, &colorspace) == 0;
  if (!read) tj.failed();
  if (!read || width <= 0 || height <= 0 || colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
    const auto whole = [](const ImageInfo& info) {
      return WindowRequest{
          .window = {0, 0, info.width, info.height}, .min_width = info.width, .min_height = info.height};
    };
    return detail::jpeg_window(bytes, name, pool, whole, options, ctx).image;
  }
  detail::check_pixels(static_cast<std::uint64_t>(width), static_cast<std::uint64_t>(height), options, name, "JPEG");
  const std::uint32_t channels = detail::channels_of(options.color);
  Sample out = detail::make_image(
      pool, detail::image_shape(static_cast<std::uint32_t>(height), static_cast<std::uint32_t>(width), channels), ctx);
  // STOPONWARNING: a warning (data missing or corrupt) is damage; without it TurboJPEG would
  // return -1 only after filling the rest of the image with grey. LIMITSCANS: at most 500
  // progressive scans.
  if (tjDecompress2(tj.handle(), data, size, reinterpret_cast<unsigned char*>(out.data.data()), width,
                    width * static_cast<int>(channels), height,
                    options.color == ImageColor::gray ? TJPF_GRAY : TJPF_RGB,
                    TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS) != 0)
    throw DataError(name, "damaged or truncated JPEG: " + tj.failed());
  return out;
}

// ---- PNG through libspng --------------------------------------------------------------------

// Ancillary chunks (text, ICC profiles) are kept in memory by libspng; none of a training image's
// needs megabytes, and a file that claims them is refused rather than trusted.
constexpr std::size_t kPngChunkLimit = std::size_t{64} << 20;
constexpr std::size_t kPngChunkCache = std::size_t{64} << 20;

class PngDecoder {
 public:
  PngDecoder(std::span<const std::byte> bytes, const std::string& name, const DecodeOptions& options)
      : name_(name), bytes_(bytes), owner_(spng_ctx_new(0), spng_ctx_free), ctx_(owner_.get()) {
    if (!ctx_) throw std::bad_alloc();
    // Per side: no side can be longer than the pixel limit allows when the other is 1.
    const auto side = static_cast<std::uint32_t>(std::min<std::uint64_t>(options.max_pixels, 0x7fffffff));
    spng_set_image_limits(ctx_, std::max(side, 1u), std::max(side, 1u));
    spng_set_chunk_limits(ctx_, kPngChunkLimit, kPngChunkCache);
    spng_set_crc_action(ctx_, SPNG_CRC_ERROR, SPNG_CRC_ERROR);
    check(spng_set_png_buffer(ctx_, bytes.data(), bytes.size()));
    const int r = spng_get_ihdr(ctx_, &ihdr_);
    if (r == SPNG_EUSER_WIDTH || r == SPNG_EUSER_HEIGHT)
      throw DataError(name, "PNG header claims a side over the limit of " + std::to_string(options.max_pixels) +
                                " pixels (DecodeOptions::max_pixels)");
    check(r);
    detail::check_pixels(ihdr_.width, ihdr_.height, options, name, "PNG");
  }

  const spng_ihdr& ihdr() const noexcept { return ihdr_; }
  const std::string& name() const noexcept { return name_; }
  spng_plte palette() const {
    spng_plte plte{};
    check(spng_get_plte(ctx_, &plte));
    return plte;
  }
  ImageInfo info() const noexcept {
    static constexpr std::uint32_t kChannels[] = {1, 0, 3, 3, 2, 0, 4};  // by color type; palette: 3
    return {ImageFormat::png, ihdr_.width, ihdr_.height, ihdr_.color_type < 7 ? kChannels[ihdr_.color_type] : 0};
  }

  // Decodes into `out`, which must hold exactly the image in `format`: checked before anything
  // is written, as libspng computes the size from the header.
  void decode(std::byte* out, std::size_t bytes, int format) {
    std::size_t expected = 0;
    check(spng_decoded_image_size(ctx_, format, &expected));
    if (expected != bytes)
      throw DataError(name_, "PNG decodes to " + std::to_string(expected) + " bytes, " + std::to_string(bytes) +
                                 " expected for its " + std::to_string(ihdr_.width) + "x" +
                                 std::to_string(ihdr_.height) + " header");
    check(spng_decode_image(ctx_, out, bytes, format, 0));
    // The image ends with the deflate stream, before the last IDAT's CRC: read on to IEND, so that
    // a damaged CRC or a file cut after its pixels is found, as libpng finds them.
    check(spng_decode_chunks(ctx_));
    check_last_chunk();
  }

  // Decodes row by row in `format`, the rows of all passes of an interlaced image in the order
  // the file holds them: `row(y, pass)` gives where row y goes, at least `row_bytes` long (the
  // same place for every pass of a row, which each pass fills in part). Checked as decode() is.
  template <class RowOf>
  void decode_rows(int format, std::size_t row_bytes, RowOf row) {
    std::size_t expected = 0;
    check(spng_decoded_image_size(ctx_, format, &expected));
    if (expected != row_bytes * ihdr_.height)
      throw DataError(name_, "PNG decodes to " + std::to_string(expected) + " bytes, " +
                                 std::to_string(row_bytes * ihdr_.height) + " expected for its " +
                                 std::to_string(ihdr_.width) + "x" + std::to_string(ihdr_.height) + " header");
    check(spng_decode_image(ctx_, nullptr, 0, format, SPNG_DECODE_PROGRESSIVE));
    for (;;) {
      spng_row_info info{};
      int r = spng_get_row_info(ctx_, &info);
      if (r == 0) r = spng_decode_row(ctx_, row(info.row_num), row_bytes);
      if (r == SPNG_EOI) break;
      check(r);
    }
    check(spng_decode_chunks(ctx_));
    check_last_chunk();
  }

 private:
  void check(int r) const {
    if (r == 0) return;
    std::string problem = spng_strerror(r);
    if (r == SPNG_EOF || r == SPNG_IO_EOF || r == SPNG_EIDAT_TOO_SHORT)
      problem = "truncated (" + problem + ")";
    else if (r == SPNG_ECHUNK_CRC)
      problem = "bad CRC (" + problem + "): the file is damaged";
    else if (r == SPNG_ECHUNK_LIMITS || r == SPNG_EMEM)  // libspng reports some limits as out of memory
      problem = "chunks over the limit of 64 MiB (" + problem + ")";
    throw DataError(name_, "damaged PNG: " + problem);
  }

  // libspng 0.7.3 takes a file cut inside IEND's CRC for a whole one: the chunks are walked to
  // their IEND (headers only), whose CRC must be there; what follows IEND is not looked at.
  void check_last_chunk() const {
    const auto* b = reinterpret_cast<const unsigned char*>(bytes_.data());
    const std::size_t size = bytes_.size();
    for (std::size_t at = 8;;) {  // after the signature: length, type, data, CRC
      if (size - at < 12) throw DataError(name_, "damaged PNG: truncated (it ends inside a chunk before IEND's end)");
      const std::uint64_t length =
          std::uint64_t{b[at]} << 24 | std::uint64_t{b[at + 1]} << 16 | std::uint64_t{b[at + 2]} << 8 | b[at + 3];
      if (length > size - at - 12) throw DataError(name_, "damaged PNG: truncated (its chunks end before IEND's end)");
      if (std::memcmp(b + at + 4, "IEND", 4) == 0) return;
      at += 12 + length;
    }
  }

  std::string name_;
  std::span<const std::byte> bytes_;
  std::unique_ptr<spng_ctx, void (*)(spng_ctx*)> owner_;  // freed however the constructor leaves
  spng_ctx* ctx_;
  spng_ihdr ihdr_{};
};

// A palette image whose PLTE has fewer than 2^depth entries, through its indices: libspng 0.7
// expands an index past the palette to black without a word, and that is a damaged file.
void decode_indexed(PngDecoder& png, Sample& out, BufferPool& pool, const StageContext& ctx) {
  const auto& h = png.ihdr();
  const spng_plte plte = png.palette();
  const std::size_t depth = h.bit_depth, row_bytes = (std::size_t{h.width} * depth + 7) / 8;
  Buffer indices = pool.acquire(row_bytes * h.height, ctx);
  png.decode(indices.data(), indices.size(), SPNG_FMT_PNG);  // rows of packed indices, as stored
  const auto* in = reinterpret_cast<const std::uint8_t*>(indices.data());
  auto* px = reinterpret_cast<std::uint8_t*>(out.data.data());
  const bool rgb = out.shape.channels == 3;
  const unsigned per_byte = 8 / static_cast<unsigned>(depth), mask = (1u << depth) - 1;
  for (std::uint32_t y = 0; y < h.height; ++y, in += row_bytes)
    for (std::uint32_t x = 0; x < h.width; ++x) {
      const unsigned shift = static_cast<unsigned>(depth) * (per_byte - 1 - x % per_byte);
      const unsigned i = (in[x / per_byte] >> shift) & mask;
      if (i >= plte.n_entries)
        throw DataError(png.name(), "damaged PNG: palette index " + std::to_string(i) + " at (" + std::to_string(x) +
                                        ", " + std::to_string(y) + ") past the " + std::to_string(plte.n_entries) +
                                        " entries of its palette (PLTE)");
      const spng_plte_entry& e = plte.entries[i];
      if (rgb) {
        *px++ = e.red, *px++ = e.green, *px++ = e.blue;
      } else {
        *px++ = detail::luma(e.red, e.green, e.blue);
      }
    }
}

Sample decode_png(PngDecoder& png, BufferPool& pool, const DecodeOptions& options, const StageContext& ctx) {
  const auto& h = png.ihdr();
  const std::uint32_t channels = detail::channels_of(options.color);
  Sample out = detail::make_image(pool, detail::image_shape(h.height, h.width, channels), ctx);
  if (h.color_type == SPNG_COLOR_TYPE_INDEXED && png.palette().n_entries < (1u << h.bit_depth)) {
    decode_indexed(png, out, pool, ctx);
    return out;
  }
  // libspng makes gray only of gray files of up to 8 bits; of anything else, RGB and then luma.
  if (options.color == ImageColor::rgb || (h.color_type == SPNG_COLOR_TYPE_GRAYSCALE && h.bit_depth <= 8)) {
    png.decode(out.data.data(), out.data.size(), options.color == ImageColor::rgb ? SPNG_FMT_RGB8 : SPNG_FMT_G8);
    return out;
  }
  Buffer rgb = pool.acquire(out.data.size() * 3, ctx);
  png.decode(rgb.data(), rgb.size(), SPNG_FMT_RGB8);
  const auto* in = reinterpret_cast<const std::uint8_t*>(rgb.data());
  auto* gray = reinterpret_cast<std::uint8_t*>(out.data.data());
  for (std::size_t i = 0, n = out.data.size(); i < n; ++i, in += 3) gray[i] = detail::luma(in[0], in[1], in[2]);
  return out;
}

}  // namespace

namespace detail {

void check_pixels(std::uint64_t width, std::uint64_t height, const DecodeOptions& options, const std::string& name,
                  const char* format) {
  if (width == 0 || height == 0)
    throw DataError(name, std::string(format) + " header gives an empty image (" + std::to_string(width) + "x" +
                              std::to_string(height) + ")");
  if (width * height > options.max_pixels)  // both are below 2^32: no overflow
    throw DataError(name, std::string(format) + " header claims " + std::to_string(width) + "x" +
                              std::to_string(height) + " = " + std::to_string(width * height) +
                              " pixels, over the limit of " + std::to_string(options.max_pixels) +
                              " (DecodeOptions::max_pixels); refused before decoding");
}

void check_window(const PixelRect& w, const ImageInfo& info, const std::string& name) {
  if (w.width == 0 || w.height == 0 || w.x >= info.width || w.y >= info.height || w.width > info.width - w.x ||
      w.height > info.height - w.y)
    throw std::invalid_argument(name + ": window " + std::to_string(w.width) + "x" + std::to_string(w.height) +
                                " at (" + std::to_string(w.x) + ", " + std::to_string(w.y) +
                                ") does not lie inside the " + std::to_string(info.width) + "x" +
                                std::to_string(info.height) + " image");
}

}  // namespace detail

const char* image_format_name(ImageFormat f) noexcept { return f == ImageFormat::png ? "PNG" : "JPEG"; }

ImageFormat image_format(std::span<const std::byte> bytes, const std::string& name) {
  if (bytes.empty()) throw DataError(name, "empty file: no image in it");
  if (starts_with(bytes, "\xFF\xD8\xFF")) return ImageFormat::jpeg;
  if (starts_with(bytes, "\x89PNG\r\n\x1A\n")) return ImageFormat::png;
  if (const char* other = other_format(bytes))
    throw DataError(name, std::string("not a JPEG or PNG image but ") + other + ": only JPEG and PNG are decoded");
  throw DataError(name, "not a JPEG or PNG image (it starts with " + first_bytes(bytes) + ")");
}

ImageInfo read_image_info(std::span<const std::byte> bytes, const std::string& name) {
  if (image_format(bytes, name) == ImageFormat::jpeg) return detail::jpeg_header(bytes, name);
  // No pixel limit: reading a header allocates nothing for the image.
  return PngDecoder(bytes, name, {.max_pixels = ~std::uint64_t{0}}).info();
}

Sample decode_image(std::span<const std::byte> bytes, const std::string& name, BufferPool& pool,
                    const DecodeOptions& options, const StageContext& ctx) {
  if (image_format(bytes, name) == ImageFormat::jpeg) return decode_jpeg(bytes, name, pool, options, ctx);
  PngDecoder png(bytes, name, options);
  return decode_png(png, pool, options, ctx);
}

std::uint32_t jpeg_scale_eighths(std::uint32_t width, std::uint32_t height, std::uint32_t min_width,
                                 std::uint32_t min_height) noexcept {
  // The scaled window is side * n / 8 long: the smallest n with side * n >= 8 * min_side.
  const auto need = [](std::uint32_t side, std::uint32_t min_side) -> std::uint64_t {
    return side == 0 ? 8 : (std::uint64_t{min_side} * 8 + side - 1) / side;
  };
  const std::uint64_t n = std::clamp<std::uint64_t>(std::max(need(width, min_width), need(height, min_height)), 1, 8);
  // libjpeg-turbo 2.1 decodes a whole image in fewer instructions than at 8/8 only at 1/8 to 3/8;
  // 4/8 to 7/8 cost up to 1.8 times as much (docs/images.md), so they are not used.
  return static_cast<std::uint32_t>(n <= 3 ? n : 8);
}

DecodedWindow decode_window(std::span<const std::byte> bytes, const std::string& name, BufferPool& pool,
                            const WindowRequest& request, const DecodeOptions& options, const StageContext& ctx) {
  const auto same = [&request](const ImageInfo&) { return request; };
  return decode_window(bytes, name, pool, same, options, ctx);
}

DecodedWindow decode_window(std::span<const std::byte> bytes, const std::string& name, BufferPool& pool,
                            WindowChooser choose, const DecodeOptions& options, const StageContext& ctx) {
  if (image_format(bytes, name) == ImageFormat::jpeg)
    return detail::jpeg_window(bytes, name, pool, choose, options, ctx);
  DecodedWindow result;
  PngDecoder png(bytes, name, options);
  result.info = png.info();
  const WindowRequest request = choose(result.info);
  const PixelRect& w = request.window;
  detail::check_window(w, result.info, name);
  result.window = w;
  result.scaled_width = result.info.width;
  result.scaled_height = result.info.height;
  const auto& h = png.ihdr();
  if ((w.width == h.width && w.height == h.height) ||
      (h.color_type == SPNG_COLOR_TYPE_INDEXED && png.palette().n_entries < (1u << h.bit_depth))) {
    Sample whole = decode_png(png, pool, options, ctx);  // the window is the image, or indices are checked whole
    if (w.width == h.width && w.height == h.height) {
      result.image = std::move(whole);
      return result;
    }
    result.image = detail::make_image(pool, detail::image_shape(w.height, w.width, whole.shape.channels), ctx);
    const std::size_t row = std::size_t{w.width} * whole.shape.channels,
                      stride = std::size_t{whole.shape.width} * whole.shape.channels;
    const std::byte* in = whole.data.data() + std::size_t{w.y} * stride + std::size_t{w.x} * whole.shape.channels;
    std::byte* out = result.image.data.data();
    for (std::uint32_t r = 0; r < w.height; ++r, in += stride, out += row) std::memcpy(out, in, row);
    return result;
  }
  // Row by row: what is held is the window and one row (a row of each of the window's lines for
  // an interlaced image, whose passes come back to each line), never the whole image.
  const std::uint32_t channels = detail::channels_of(options.color);
  // libspng makes gray only of gray files of up to 8 bits; of anything else, RGB and then luma.
  const bool luma =
      options.color == ImageColor::gray && !(h.color_type == SPNG_COLOR_TYPE_GRAYSCALE && h.bit_depth <= 8);
  const int format = options.color == ImageColor::rgb || luma ? SPNG_FMT_RGB8 : SPNG_FMT_G8;
  const std::size_t decoded = luma ? 3 : channels;  // bytes per pixel as libspng writes them
  const std::size_t row_bytes = std::size_t{h.width} * decoded;
  const bool interlaced = h.interlace_method != 0;
  Buffer lines = pool.acquire(row_bytes * (interlaced ? w.height : 1), ctx);
  result.image = detail::make_image(pool, detail::image_shape(w.height, w.width, channels), ctx);
  std::byte* out = result.image.data.data();
  const std::size_t out_row = std::size_t{w.width} * channels;
  // A line of the window, as decoded, into its row of the result.
  const auto cut = [&](const std::byte* line, std::uint32_t y) {
    const std::byte* in = line + std::size_t{w.x} * decoded;
    std::byte* to = out + std::size_t{y - w.y} * out_row;
    if (!luma) {
      std::memcpy(to, in, out_row);
      return;
    }
    const auto* rgb = reinterpret_cast<const std::uint8_t*>(in);
    auto* gray = reinterpret_cast<std::uint8_t*>(to);
    for (std::uint32_t x = 0; x < w.width; ++x, rgb += 3) gray[x] = detail::luma(rgb[0], rgb[1], rgb[2]);
  };
  const auto inside = [&](std::uint32_t y) { return y >= w.y && y - w.y < w.height; };
  if (interlaced) {
    Buffer scratch = pool.acquire(row_bytes, ctx);  // the lines outside the window
    png.decode_rows(format, row_bytes, [&](std::uint32_t y) {
      return inside(y) ? lines.data() + std::size_t{y - w.y} * row_bytes : scratch.data();
    });
    for (std::uint32_t y = w.y; y < w.y + w.height; ++y) cut(lines.data() + std::size_t{y - w.y} * row_bytes, y);
    return result;
  }
  // Each line is whole when decode_row returns: the one before is cut once the next is asked for.
  std::optional<std::uint32_t> last;
  png.decode_rows(format, row_bytes, [&](std::uint32_t y) {
    if (last && inside(*last)) cut(lines.data(), *last);
    last = y;
    return lines.data();
  });
  if (last && inside(*last)) cut(lines.data(), *last);
  return result;
}

ImageDecoder::ImageDecoder(DecodeOptions options, std::shared_ptr<BufferPool> pool)
    : options_(options), pool_(pool ? std::move(pool) : BufferPool::create()) {}

Sample ImageDecoder::operator()(EncodedImage in, const StageContext& ctx) const {
  Sample out = decode_image(in.bytes(), in.name, *pool_, options_, ctx);
  out.label = in.label;
  out.id = in.id;
  return out;
}

}  // namespace stoker
