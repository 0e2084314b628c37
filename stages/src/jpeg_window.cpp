// SPDX-License-Identifier: Apache-2.0
// JPEG through the libjpeg API: headers, and windows decoded at a DCT scale.
//
// libjpeg reports errors by calling error_exit, which must not return: here it longjmps back to
// the setjmp of the function that called into libjpeg. Every such function (the three `step_*`
// below) holds no object with a destructor and reads no local after the jump, so the jump skips
// nothing that C++ would have to undo; the objects that own memory (the decompressor, the sample,
// the row buffer) live in jpeg_window(), which calls the steps and throws when one fails.
#include <algorithm>
#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE and size_t first
#include <cstring>
#include <vector>

#include <jerror.h>
#include <jpeglib.h>

#include "image_codec.h"
#include "stoker/stages/reader.h"

namespace stoker::detail {

namespace {

// Progressive JPEGs may hold any number of scans, each a pass over the whole coefficient buffer;
// a few hundred bytes can ask for millions. TurboJPEG's TJFLAG_LIMITSCANS stops at 500 too.
constexpr int kMaxScans = 500;

struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  int code;       // libjpeg's message code of the error (J_MESSAGE_CODE), or 0
  int precision;  // for JERR_BAD_PRECISION: the file's bits per sample
};

// A decompressor and everything its callbacks need, in one C-style block.
struct Decompressor {
  jpeg_decompress_struct cinfo;
  ErrorManager error;
  jpeg_progress_mgr progress;
};

[[noreturn]] void jump_with(j_common_ptr cinfo, const char* message) {
  auto* error = reinterpret_cast<ErrorManager*>(cinfo->err);
  std::snprintf(error->message, sizeof error->message, "%s", message);
  std::longjmp(error->jump, 1);
}

[[noreturn]] void on_error(j_common_ptr cinfo) {
  auto* error = reinterpret_cast<ErrorManager*>(cinfo->err);
  error->code = cinfo->err->msg_code;
  error->precision = cinfo->err->msg_parm.i[0];
  char message[JMSG_LENGTH_MAX];
  (*cinfo->err->format_message)(cinfo, message);
  jump_with(cinfo, message);
}

// libjpeg goes on after a warning (data missing or corrupt) and fills what it could not decode
// with grey: that is a damaged image, and an error here, as in TurboJPEG with
// TJFLAG_STOPONWARNING. Levels 0 and up are trace messages.
void on_message(j_common_ptr cinfo, int level) {
  if (level < 0) on_error(cinfo);
}

void on_progress(j_common_ptr cinfo) {
  const auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (d->progressive_mode && d->input_scan_number > kMaxScans)
    jump_with(cinfo, "more than 500 progressive scans (refused as a denial of service)");
}

// Where the decoded window goes, and how its rows are converted on the way.
enum class Convert : std::uint8_t { copy, cmyk_to_rgb, cmyk_to_gray };

struct RowPlan {
  JDIMENSION crop_x = 0, crop_width = 0;  // asked of jpeg_crop_scanline; crop_width 0: no crop
  JDIMENSION first_row = 0, rows = 0;     // scaled rows to decode
  JDIMENSION window_x = 0, window_width = 0;
  unsigned char* row = nullptr;  // one decoded row, output_width * output_components
  unsigned char* out = nullptr;  // window_width * out_channels per row
  Convert convert = Convert::copy;
  int out_channels = 3;
  bool finish = false;  // read to the end of the data once the last row is decoded
};

// PIL's CMYK -> RGB (Convert.c cmyk2rgb), on the ink amounts: an Adobe file stores them
// inverted, as Photoshop writes them and as libjpeg hands them back.
inline std::uint8_t mul_div_255(unsigned a, unsigned b) noexcept {
  const unsigned t = a * b + 128;
  return static_cast<std::uint8_t>(((t >> 8) + t) >> 8);
}
void cmyk_row(const unsigned char* in, unsigned char* out, JDIMENSION width, bool adobe, bool gray) {
  for (JDIMENSION i = 0; i < width; ++i, in += 4) {
    unsigned rgb[3];
    const unsigned not_k = adobe ? in[3] : 255u - in[3];
    for (int c = 0; c < 3; ++c) {
      const unsigned ink = adobe ? 255u - in[c] : in[c];
      rgb[c] = not_k - mul_div_255(ink, not_k);
    }
    if (gray) {
      *out++ = luma(rgb[0], rgb[1], rgb[2]);
    } else {
      *out++ = static_cast<unsigned char>(rgb[0]);
      *out++ = static_cast<unsigned char>(rgb[1]);
      *out++ = static_cast<unsigned char>(rgb[2]);
    }
  }
}

// Each step returns false, with libjpeg's message in d->error.message, when libjpeg fails.

bool step_read_header(Decompressor* d, const unsigned char* data, unsigned long size) {
  d->cinfo.err = jpeg_std_error(&d->error.pub);
  d->error.pub.error_exit = on_error;
  d->error.pub.emit_message = on_message;
  if (setjmp(d->error.jump)) return false;
  jpeg_create_decompress(&d->cinfo);
  d->progress.progress_monitor = on_progress;
  d->cinfo.progress = &d->progress;
  jpeg_mem_src(&d->cinfo, data, size);
  jpeg_read_header(&d->cinfo, TRUE);  // TRUE: a file of tables and no image is an error
  return true;
}

bool step_output_size(Decompressor* d) {
  if (setjmp(d->error.jump)) return false;
  jpeg_calc_output_dimensions(&d->cinfo);
  return true;
}

bool step_decode(Decompressor* d, const RowPlan* plan) {
  if (setjmp(d->error.jump)) return false;
  j_decompress_ptr cinfo = &d->cinfo;
  jpeg_start_decompress(cinfo);
  JDIMENSION crop_x = plan->crop_x, crop_width = plan->crop_width;
  if (crop_width != 0) jpeg_crop_scanline(cinfo, &crop_x, &crop_width);  // moves crop_x to an iMCU edge
  if (plan->first_row != 0 && jpeg_skip_scanlines(cinfo, plan->first_row) != plan->first_row)
    jump_with(reinterpret_cast<j_common_ptr>(cinfo), "the image ended before the window's first row");
  const std::size_t in_offset =
      std::size_t{plan->window_x - crop_x} * static_cast<std::size_t>(cinfo->output_components);
  const std::size_t out_stride = std::size_t{plan->window_width} * static_cast<std::size_t>(plan->out_channels);
  unsigned char* out = plan->out;
  JSAMPROW rows[1] = {plan->row};
  for (JDIMENSION r = 0; r < plan->rows; ++r, out += out_stride) {
    if (jpeg_read_scanlines(cinfo, rows, 1) != 1)
      jump_with(reinterpret_cast<j_common_ptr>(cinfo), "the image ended inside the window");
    if (plan->convert == Convert::copy)
      std::memcpy(out, plan->row + in_offset, out_stride);
    else
      cmyk_row(plan->row + in_offset, out, plan->window_width, cinfo->saw_Adobe_marker,
               plan->convert == Convert::cmyk_to_gray);
  }
  // Below the window nothing is decoded, unless the window reaches the bottom: then the rest of
  // the data is read too, so that a whole image decoded here is checked to its end, as TurboJPEG's is.
  if (plan->finish) jpeg_finish_decompress(cinfo);
  return true;
}

// Owns a Decompressor; jpeg_destroy_decompress is safe at any stage, even on one whose creation
// failed half-way (it does nothing while the memory manager is null).
class JpegDecoder {
 public:
  JpegDecoder() { std::memset(&d_, 0, sizeof d_); }
  ~JpegDecoder() { jpeg_destroy_decompress(&d_.cinfo); }
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  void read_header(std::span<const std::byte> bytes, const std::string& name) {
    check(step_read_header(&d_, reinterpret_cast<const unsigned char*>(bytes.data()),
                           static_cast<unsigned long>(bytes.size())),
          name);
  }
  Decompressor& get() noexcept { return d_; }
  void check(bool ok, const std::string& name) const {
    if (ok) return;
    // A JPEG of 12 or 16 bits per sample is well formed; libjpeg-turbo 2.1's API decodes 8 only.
    if (d_.error.code == JERR_BAD_PRECISION)
      throw DataError(name, "unsupported JPEG: " + std::to_string(d_.error.precision) +
                                " bits per sample (stoker decodes 8-bit JPEG only; convert the file to 8 bits)");
    throw DataError(name, std::string("damaged or truncated JPEG: ") + d_.error.message);
  }
  ImageInfo info() const noexcept {
    const auto& c = d_.cinfo;
    return {ImageFormat::jpeg, c.image_width, c.image_height, static_cast<std::uint32_t>(c.num_components)};
  }

 private:
  Decompressor d_;
};

bool is_cmyk(const jpeg_decompress_struct& c) noexcept {
  return c.jpeg_color_space == JCS_CMYK || c.jpeg_color_space == JCS_YCCK;
}

}  // namespace

ImageInfo jpeg_header(std::span<const std::byte> bytes, const std::string& name) {
  JpegDecoder decoder;
  decoder.read_header(bytes, name);
  return decoder.info();
}

DecodedWindow jpeg_window(std::span<const std::byte> bytes, const std::string& name, BufferPool& pool,
                          WindowChooser choose, const DecodeOptions& options, const StageContext& ctx) {
  JpegDecoder decoder;
  decoder.read_header(bytes, name);
  auto& cinfo = decoder.get().cinfo;
  DecodedWindow result;
  result.info = decoder.info();
  check_pixels(cinfo.image_width, cinfo.image_height, options, name, "JPEG");
  const WindowRequest request = choose(result.info);
  const PixelRect& w = request.window;
  check_window(w, result.info, name);

  const bool gray = options.color == ImageColor::gray;
  const bool cmyk = is_cmyk(cinfo);
  cinfo.out_color_space = cmyk ? JCS_CMYK : gray ? JCS_GRAYSCALE : JCS_RGB;
  const std::uint32_t eighths = jpeg_scale_eighths(w.width, w.height, request.min_width, request.min_height);
  cinfo.scale_num = eighths;
  cinfo.scale_denom = 8;
  decoder.check(step_output_size(&decoder.get()), name);

  // The window in scaled pixels: every scaled pixel that overlaps it.
  const auto lo = [&](std::uint32_t v) { return static_cast<std::uint32_t>(std::uint64_t{v} * eighths / 8); };
  const auto hi = [&](std::uint32_t v) { return static_cast<std::uint32_t>((std::uint64_t{v} * eighths + 7) / 8); };
  result.scale_num = eighths;
  result.scale_denom = 8;
  result.scaled_width = cinfo.output_width;
  result.scaled_height = cinfo.output_height;
  const std::uint32_t x0 = lo(w.x), y0 = lo(w.y);
  const std::uint32_t x1 = std::min(hi(w.x + w.width), result.scaled_width);
  const std::uint32_t y1 = std::min(hi(w.y + w.height), result.scaled_height);
  result.window = {x0, y0, x1 - x0, y1 - y0};

  RowPlan plan;
  plan.window_x = x0;
  plan.window_width = x1 - x0;
  plan.first_row = y0;
  plan.rows = y1 - y0;
  plan.finish = y1 == result.scaled_height;
  // One pixel more on each side, cut off again: the fancy upsampling of chroma at the edge of a
  // cropped row treats it as the image's edge, and only that extra pixel sees the difference.
  if (x0 != 0 || x1 != result.scaled_width) {
    plan.crop_x = x0 == 0 ? 0 : x0 - 1;
    plan.crop_width = std::min(x1 + 1, result.scaled_width) - plan.crop_x;
  }
  plan.out_channels = static_cast<int>(channels_of(options.color));
  plan.convert = !cmyk ? Convert::copy : gray ? Convert::cmyk_to_gray : Convert::cmyk_to_rgb;

  // Sizes are known and bounded by the pixel limit: only now is anything allocated.
  result.image = make_image(pool, image_shape(plan.rows, plan.window_width, channels_of(options.color)), ctx);
  // One decoded row, kept by the thread: a crop stage decodes many windows one after another.
  thread_local std::vector<unsigned char> row;
  row.resize(std::size_t{result.scaled_width} * static_cast<std::size_t>(cinfo.out_color_components));
  plan.row = row.data();
  plan.out = reinterpret_cast<unsigned char*>(result.image.data.data());
  decoder.check(step_decode(&decoder.get(), &plan), name);
  return result;
}

}  // namespace stoker::detail
