// SPDX-License-Identifier: Apache-2.0
// JPEG and PNG files decoded into samples: whole, or only the window a crop needs, at the
// smallest scale that still serves it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>

#include "stoker/core/stage.h"
#include "stoker/stages/buffer_pool.h"
#include "stoker/stages/reader.h"  // DataError
#include "stoker/stages/sample.h"

namespace stoker {

/// One image file's bytes, as an image source reads them: what flows from reading to decoding.
struct EncodedImage {
  Buffer data;  ///< the file's bytes, on a recycled buffer
  std::int32_t label = 0;
  std::uint64_t id = 0;  ///< stable across epochs, as Sample::id
  std::string name;      ///< what errors name: the file, or "shard.tar:key.jpg" for a tar member

  std::span<const std::byte> bytes() const noexcept { return {data.data(), data.size()}; }
};

enum class ImageFormat : std::uint8_t { jpeg, png };
const char* image_format_name(ImageFormat f) noexcept;  ///< "JPEG", "PNG"

/// What a file's header says, read without decoding it.
struct ImageInfo {
  ImageFormat format = ImageFormat::jpeg;
  std::uint32_t width = 0, height = 0;
  /// As stored: 1 gray, 2 gray + alpha, 3 color, 4 CMYK (JPEG) or color + alpha (PNG).
  std::uint32_t channels = 0;
  bool operator==(const ImageInfo&) const = default;
};

/// The format of an encoded image, told by its first bytes (never by a file name). Throws
/// DataError naming `name` when the bytes are empty or are no JPEG or PNG ("a GIF image: only
/// JPEG and PNG are decoded" when it is another format that can be recognised).
ImageFormat image_format(std::span<const std::byte> bytes, const std::string& name);

/// Reads the header only: no pixel is decoded and nothing is allocated for the image. Throws
/// DataError naming `name` for anything but a well-formed JPEG or PNG header.
ImageInfo read_image_info(std::span<const std::byte> bytes, const std::string& name);

enum class ImageColor : std::uint8_t {
  rgb,   ///< 3 channels, R G B; gray images are expanded, alpha is dropped, CMYK converted
  gray,  ///< 1 channel: a gray image's own; a color PNG's luma (ITU-R 601, as PIL); a JPEG's Y
};

/// PIL's `Image.MAX_IMAGE_PIXELS`: a header claiming more is taken for an attack or damage.
inline constexpr std::uint64_t kDefaultMaxPixels = 89'478'485;

struct DecodeOptions {
  ImageColor color = ImageColor::rgb;
  /// Images whose header claims more pixels (width x height, at full resolution) are refused
  /// with a DataError before anything is allocated for them.
  std::uint64_t max_pixels = kDefaultMaxPixels;
};

/// Decodes a whole image into interleaved uint8 pixels:
/// `Shape{.channels = 3 (1 for gray), .height = H, .width = W, .channels_last = true}`, on a
/// buffer of `pool` (acquired with `ctx`, so that a pool that waits can be stopped).
///
/// JPEG goes through TurboJPEG (baseline, progressive, gray, any chroma subsampling; CMYK and
/// YCCK through libjpeg, converted to RGB as PIL does); PNG through libspng (any color type and
/// bit depth; 16-bit samples keep their high byte, alpha is dropped, palettes expanded, no
/// gamma correction). Thread-safe.
///
/// Throws DataError naming `name` and the problem: empty, not an image, truncated or damaged
/// (a JPEG that libjpeg decodes only "with warnings" is refused, not returned half grey), a
/// bad PNG CRC, or a header over `options.max_pixels`.
Sample decode_image(std::span<const std::byte> bytes, const std::string& name, BufferPool& pool,
                    const DecodeOptions& options = {}, const StageContext& ctx = {});

/// A rectangle of pixels: columns x .. x + width - 1 and rows y .. y + height - 1.
struct PixelRect {
  std::uint32_t x = 0, y = 0, width = 0, height = 0;
  bool operator==(const PixelRect&) const = default;
};

/// What part of an image to decode, and how small it may come out.
struct WindowRequest {
  PixelRect window;  ///< in the full-resolution image; must lie inside it and not be empty
  /// The window may come out scaled down (JPEG: by n/8 in the DCT domain, jpeg_scale_eighths())
  /// as long as it stays at least this many pixels wide and high (0 x 0 lets it come out at 1/8;
  /// the window's own size keeps it at full resolution). Ask for the size a resize will make of
  /// it (224 x 224) to get the cheapest decode that resize can start from.
  std::uint32_t min_width = 0, min_height = 0;
};

/// A decoded window, and where it lies, so that a resize maps coordinates exactly.
///
/// `image` holds the pixels of the image scaled by s = scale_num / scale_denom (a
/// `scaled_width` x `scaled_height` image, ceil(W * s) x ceil(H * s)) in `window`, which is
/// given in those scaled pixels: pixel (i, j) of `image` is scaled pixel (window.y + i,
/// window.x + j), which covers full-resolution pixels [(window.x + j) / s, (window.x + j + 1) / s)
/// horizontally, and the same vertically. A region (x, y, w, h) of the full-resolution image is
/// (x * s - window.x, y * s - window.y, w * s, h * s) in `image`.
struct DecodedWindow {
  Sample image;  ///< interleaved uint8, as decode_image() makes
  PixelRect window;
  std::uint32_t scale_num = 1, scale_denom = 1;
  std::uint32_t scaled_width = 0, scaled_height = 0;
  ImageInfo info;  ///< the file's header, at full resolution
};

/// Decodes only `request.window`, at the smallest scale that keeps it at least
/// `request.min_width` x `request.min_height` (of those that are cheaper than full size). For a JPEG this decodes only
/// the rows from the window's top to its bottom (those above are skipped without the inverse DCT, those below are never
/// read) and only the iMCU columns the window touches, plus one pixel on each side so that the chroma upsampling at the
/// window's edges sees the same neighbours as in a full decode; DCT scaling then does in the decoder what a resize
/// would otherwise do after it. A PNG has no such shortcuts: it is decoded whole, then the window is cut out, at
/// scale 1.
///
/// Throws DataError as decode_image() does, and std::invalid_argument when the window is empty
/// or does not lie inside the image. Thread-safe.
DecodedWindow decode_window(std::span<const std::byte> bytes, const std::string& name, BufferPool& pool,
                            const WindowRequest& request, const DecodeOptions& options = {},
                            const StageContext& ctx = {});

/// Chooses the window to decode once the header is read: a reference to a callable taking the
/// file's `const ImageInfo&` (at full resolution) and returning the WindowRequest, called once,
/// on the calling thread, before anything is allocated for the pixels. Refers to the callable,
/// which must outlive the call it is passed to.
class WindowChooser {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::remove_cvref_t<F>, WindowChooser> &&
                                              std::is_invocable_r_v<WindowRequest, const F&, const ImageInfo&>>>
  WindowChooser(const F& choose) noexcept  // NOLINT(google-explicit-constructor): passed as a lambda
      : f_(&choose), call_(&call<F>) {}
  WindowRequest operator()(const ImageInfo& info) const { return call_(f_, info); }

 private:
  template <class F>
  static WindowRequest call(const void* f, const ImageInfo& info) {
    return (*static_cast<const F*>(f))(info);
  }
  const void* f_;
  WindowRequest (*call_)(const void*, const ImageInfo&);
};

/// decode_window() of a window that depends on the image's size (a random crop's): the header is
/// read once, `choose` picks the window from it, and only that window is decoded. This is how a
/// crop stage decodes no more than its crop needs without reading the header twice.
DecodedWindow decode_window(std::span<const std::byte> bytes, const std::string& name, BufferPool& pool,
                            WindowChooser choose, const DecodeOptions& options = {}, const StageContext& ctx = {});

/// The scale n/8 (returned as n: 1, 2, 3 or 8) that decode_window() picks for a JPEG: the smallest
/// that keeps a `width` x `height` window at least `min_width` x `min_height`, except that 4/8 to
/// 7/8 become 8/8: libjpeg-turbo decodes at those scales in more instructions than at full size.
std::uint32_t jpeg_scale_eighths(std::uint32_t width, std::uint32_t height, std::uint32_t min_width,
                                 std::uint32_t min_height) noexcept;

/// A map stage's function that decodes an EncodedImage into a Sample with its label and id:
///
///   .source("read", stoker::ImageSource(stoker::ImageDataset::open("train.txt")))
///   .map("decode", stoker::ImageDecoder(), {.threads = 4, .on_error = stoker::OnError::skip})
///
/// Safe to call from any number of threads at once: each thread keeps a TurboJPEG handle of its
/// own, and each PNG gets a fresh libspng context. Copies share the pool.
class ImageDecoder {
 public:
  /// `pool`: where decoded pixels go; null gives the decoder a pool of its own.
  explicit ImageDecoder(DecodeOptions options = {}, std::shared_ptr<BufferPool> pool = nullptr);

  Sample operator()(EncodedImage in, const StageContext& ctx = {}) const;

  const DecodeOptions& options() const noexcept { return options_; }
  const std::shared_ptr<BufferPool>& pool() const noexcept { return pool_; }

 private:
  DecodeOptions options_;
  std::shared_ptr<BufferPool> pool_;
};

}  // namespace stoker
