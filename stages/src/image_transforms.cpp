// SPDX-License-Identifier: Apache-2.0
#include "stoker/stages/image_transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "transform_support.h"

namespace stoker {

namespace {

using detail::make_normalizer;
using detail::visit_dtype;

std::string image_desc(const Sample& s) { return "sample " + s.shape.str() + " (id " + std::to_string(s.id) + ")"; }

void check_image(const Sample& in, const char* who) {
  const Shape& s = in.shape;
  if (s.volume || s.depth != 1)
    throw std::invalid_argument(std::string(who) + ": " + image_desc(in) + " is not a 2D image");
  if (in.data.size() != s.elements() * dtype_size(in.dtype))
    throw std::invalid_argument(std::string(who) + ": " + image_desc(in) + " of " + dtype_name(in.dtype) + " holds " +
                                std::to_string(in.data.size()) + " bytes, not " +
                                std::to_string(s.elements() * dtype_size(in.dtype)));
}

std::span<std::byte> bytes_of(Sample& s) noexcept { return {s.data.data(), s.data.size()}; }

Shape image_shape(std::uint32_t channels, std::uint32_t height, std::uint32_t width, Layout layout) {
  return Shape{.channels = channels,
               .depth = 1,
               .height = height,
               .width = width,
               .volume = false,
               .channels_last = layout == Layout::channels_last};
}

// Element strides of a 2D image of `s`'s geometry laid out as `layout`.
struct Strides {
  std::size_t pixel, channel, row;
};
Strides strides_of(std::uint32_t channels, std::uint32_t height, std::uint32_t width, Layout layout) {
  if (layout == Layout::channels_last) return {channels, 1, std::size_t{width} * channels};
  return {1, std::size_t{height} * width, width};
}

// The window's rows, channel by channel: dst[x * out.pixel] = convert(src[x' * in.pixel], c),
// x' running backwards when mirrored along the width.
template <class T, class Out, class Convert>
void copy_window(const T* src, Strides in, Out* dst, Strides out, const Window& w, Flips f, std::uint32_t channels,
                 Convert&& convert) {
  const std::size_t n = w.width;
  for (std::uint32_t r = 0; r < w.height; ++r) {
    const std::size_t y = w.y + (f.height ? w.height - 1 - r : r);
    const T* row = src + y * in.row + w.x * in.pixel;
    Out* out_row = dst + r * out.row;
    for (std::uint32_t c = 0; c < channels; ++c) {
      const T* __restrict s = row + c * in.channel;
      Out* __restrict d = out_row + c * out.channel;
      if (f.width) {
        for (std::size_t x = 0; x < n; ++x) d[x * out.pixel] = convert(s[(n - 1 - x) * in.pixel], c);
      } else {
        for (std::size_t x = 0; x < n; ++x) d[x * out.pixel] = convert(s[x * in.pixel], c);
      }
    }
  }
}

// Python's round(): to the nearest integer, halves to even (the default rounding mode).
std::int64_t round_even(double v) { return static_cast<std::int64_t>(std::nearbyint(v)); }

double uniform(Rng& rng, double lo, double hi) {
  return lo + (hi - lo) * (static_cast<double>(rng() >> 11) * 0x1.0p-53);
}

}  // namespace

// ---------------------------------------------------------------------------------------------

void crop_image_into(const Sample& in, const Window& w, Flips f, const Normalizer* normalize, Layout layout,
                     std::span<std::byte> out) {
  check_image(in, "crop_image_into");
  const Shape& s = in.shape;
  if (w.z != 0 || w.depth != 1 || w.width == 0 || w.height == 0 || w.width > s.width || w.height > s.height ||
      w.x > s.width - w.width || w.y > s.height - w.height)
    throw std::invalid_argument("crop_image_into: window " + std::to_string(w.height) + "x" + std::to_string(w.width) +
                                " at (" + std::to_string(w.y) + ", " + std::to_string(w.x) + ") does not fit in " +
                                image_desc(in));
  if (normalize) normalize->check(s, "crop_image_into");
  const DType type = normalize ? DType::f32 : in.dtype;
  const std::size_t need = std::size_t{s.channels} * w.height * w.width * dtype_size(type);
  if (out.size() != need)
    throw std::invalid_argument("crop_image_into: the output holds " + std::to_string(out.size()) +
                                " bytes, the crop needs " + std::to_string(need));
  const Strides from = strides_of(s.channels, s.height, s.width, layout_of(s));
  const Strides to = strides_of(s.channels, w.height, w.width, layout);
  visit_dtype(in.dtype, [&]<class T>(T) {
    const T* src = in.as<T>().data();
    if (!normalize) {
      T* dst = reinterpret_cast<T*>(out.data());
      if (layout == layout_of(s) && layout == Layout::channels_last && !f.width) {
        // Rows are runs of whole pixels: one copy each.
        const std::size_t row = std::size_t{w.width} * s.channels;
        for (std::uint32_t r = 0; r < w.height; ++r) {
          const std::size_t y = w.y + (f.height ? w.height - 1 - r : r);
          std::memcpy(dst + r * row, src + y * from.row + w.x * from.pixel, row * sizeof(T));
        }
        return;
      }
      copy_window(src, from, dst, to, w, f, s.channels, [](T v, std::uint32_t) { return v; });
      return;
    }
    float* dst = reinterpret_cast<float*>(out.data());
    if constexpr (std::is_same_v<T, std::uint8_t>)
      copy_window(src, from, dst, to, w, f, s.channels,
                  [normalize](std::uint8_t v, std::uint32_t c) { return normalize->table(c)[v]; });
    else
      copy_window(src, from, dst, to, w, f, s.channels,
                  [normalize](T v, std::uint32_t c) { return (*normalize)(static_cast<float>(v), c); });
  });
}

Sample crop_image(const Sample& in, const Window& window, Flips flips, const Normalizer* normalize, Layout layout,
                  BufferPool& pool, std::uint64_t id) {
  check_image(in, "crop_image");
  Sample out(pool, image_shape(in.shape.channels, window.height, window.width, layout),
             normalize ? DType::f32 : in.dtype, in.label, id);
  crop_image_into(in, window, flips, normalize, layout, bytes_of(out));
  return out;
}

Window random_resized_window(std::uint32_t height, std::uint32_t width, std::array<double, 2> scale,
                             std::array<double, 2> ratio, int attempts, Rng& rng) {
  if (height == 0 || width == 0)
    throw std::invalid_argument("random_resized_window: an image of " + std::to_string(height) + "x" +
                                std::to_string(width) + " has no pixels");
  const double area = static_cast<double>(height) * width;
  const double log_lo = std::log(ratio[0]), log_hi = std::log(ratio[1]);
  for (int attempt = 0; attempt < attempts; ++attempt) {
    const double target = area * uniform(rng, scale[0], scale[1]);
    const double aspect = std::exp(uniform(rng, log_lo, log_hi));
    const std::int64_t w = round_even(std::sqrt(target * aspect));
    const std::int64_t h = round_even(std::sqrt(target / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      Window out{.z = 0,
                 .y = 0,
                 .x = 0,
                 .depth = 1,
                 .height = static_cast<std::uint32_t>(h),
                 .width = static_cast<std::uint32_t>(w)};
      out.y = static_cast<std::uint32_t>(rng.below(height - out.height + 1ull));
      out.x = static_cast<std::uint32_t>(rng.below(width - out.width + 1ull));
      return out;
    }
  }
  // The whole image, clamped to the ratio range, in the middle.
  const double in_ratio = static_cast<double>(width) / height;
  std::int64_t w = width, h = height;
  if (in_ratio < std::min(ratio[0], ratio[1]))
    h = round_even(w / std::min(ratio[0], ratio[1]));
  else if (in_ratio > std::max(ratio[0], ratio[1]))
    w = round_even(h * std::max(ratio[0], ratio[1]));
  h = std::clamp<std::int64_t>(h, 1, height);
  w = std::clamp<std::int64_t>(w, 1, width);
  return Window{.z = 0,
                .y = static_cast<std::uint32_t>((height - h) / 2),
                .x = static_cast<std::uint32_t>((width - w) / 2),
                .depth = 1,
                .height = static_cast<std::uint32_t>(h),
                .width = static_cast<std::uint32_t>(w)};
}

// ---------------------------------------------------------------------------------------------

RandomResizedCrop::RandomResizedCrop(RandomResizedCropOptions options)
    : options_(std::move(options)), normalizer_(make_normalizer(options_.normalize, "RandomResizedCrop")) {
  auto& o = options_;
  const auto fail = [](const std::string& what) { throw std::invalid_argument("RandomResizedCrop: " + what); };
  if (o.size.height == 0 || o.size.width == 0) fail("option size " + o.size.str() + " is empty");
  if (o.size.depth > 1) fail("option size " + o.size.str() + " has a depth; images are 2D");
  if (!(o.scale[0] >= 0.0 && o.scale[0] <= o.scale[1] && o.scale[1] > 0.0 && std::isfinite(o.scale[1])))
    fail("option scale = {" + std::to_string(o.scale[0]) + ", " + std::to_string(o.scale[1]) +
         "} must be finite, ordered, not negative, and not both 0");
  if (!(o.ratio[0] > 0.0 && o.ratio[0] <= o.ratio[1] && std::isfinite(o.ratio[1])))
    fail("option ratio = {" + std::to_string(o.ratio[0]) + ", " + std::to_string(o.ratio[1]) +
         "} must be finite, ordered and positive");
  if (o.attempts < 0) fail("option attempts = " + std::to_string(o.attempts) + " must not be negative");
  if (o.mirror) {
    if (o.mirror->axis == Axis::depth) fail("option mirror.axis is depth; an image mirrors along height or width");
    if (!(o.mirror->p >= 0.0 && o.mirror->p <= 1.0))
      fail("option mirror.p = " + std::to_string(o.mirror->p) + " is not in [0, 1]");
  }
  if (!o.pool) o.pool = BufferPool::create();
}

Shape RandomResizedCrop::output_shape(const Shape& in) const noexcept {
  return image_shape(in.channels, options_.size.height, options_.size.width, options_.layout.value_or(layout_of(in)));
}

PlannedCrop RandomResizedCrop::plan(std::uint32_t height, std::uint32_t width, std::uint64_t id,
                                    const StageContext& ctx) const {
  const auto& o = options_;
  Rng rng = sample_rng(ctx, id, o.salt);
  PlannedCrop p{random_resized_window(height, width, o.scale, o.ratio, o.attempts, rng), {}, id};
  if (o.mirror) {
    Rng mirror_rng = sample_rng(ctx, id, o.mirror->salt);
    if (mirror_rng.bernoulli(o.mirror->p)) p.flips = Flips::along(o.mirror->axis);
  }
  return p;
}

std::array<ResampleAxis, 2> RandomResizedCrop::axes(const PlannedCrop& crop, const Shape& shape, Region where) const {
  const Window& w = crop.window;
  const bool aa = options_.antialias;
  return {resample_axis(w.y, w.height, options_.size.height, aa, where.scale, where.y, shape.height),
          resample_axis(w.x, w.width, options_.size.width, aa, where.scale, where.x, shape.width)};
}

void RandomResizedCrop::apply_into(const Sample& region, Region where, const PlannedCrop& crop,
                                   std::span<std::byte> out) const {
  apply_into(region, where, crop, normalizer(), options_.layout.value_or(layout_of(region.shape)), out);
}

void RandomResizedCrop::apply_into(const Sample& region, Region where, const PlannedCrop& crop,
                                   const Normalizer* normalize, Layout layout, std::span<std::byte> out) const {
  check_image(region, "RandomResizedCrop");
  if (normalize) normalize->check(region.shape, "RandomResizedCrop");
  std::array<ResampleAxis, 2> a;
  try {
    a = axes(crop, region.shape, where);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("RandomResizedCrop: " + image_desc(region) + ": " + e.what());
  }
  // Reused, so that the steady state does not allocate per image.
  thread_local ResampleTaps rows, cols;
  rows.reset(a[0]);
  cols.reset(a[1]);
  resample_into(region, rows.view(), cols.view(), crop.flips, normalize, layout, out);
}

Sample RandomResizedCrop::apply(const Sample& region, Region where, const PlannedCrop& crop) const {
  check_image(region, "RandomResizedCrop");
  Sample out(*options_.pool, output_shape(region.shape), output_dtype(region.dtype), region.label, crop.id);
  apply_into(region, where, crop, bytes_of(out));
  return out;
}

Sample RandomResizedCrop::operator()(Sample in, const StageContext& ctx) const {
  check_image(in, "RandomResizedCrop");
  return apply(in, {}, plan(in.shape.height, in.shape.width, in.id, ctx));
}

// ---------------------------------------------------------------------------------------------

Resize::Resize(ResizeOptions options)
    : options_(std::move(options)), normalizer_(make_normalizer(options_.normalize, "Resize")) {
  auto& o = options_;
  const bool sized = o.size.height != 0 || o.size.width != 0;
  if ((o.shorter != 0) == sized)
    throw std::invalid_argument("Resize: give one of the options shorter (the shorter side's length) and size");
  if (sized && (o.size.height == 0 || o.size.width == 0 || o.size.depth > 1))
    throw std::invalid_argument("Resize: option size " + o.size.str() + " must be a height and a width");
  if ((o.crop.height == 0) != (o.crop.width == 0) || o.crop.depth > 1)
    throw std::invalid_argument("Resize: option crop " + o.crop.str() + " must be a height and a width, or none");
  if (!o.pool) o.pool = BufferPool::create();
}

CropSize Resize::resized(std::uint32_t height, std::uint32_t width) const {
  const auto& o = options_;
  if (o.shorter == 0) return o.size;
  // torchvision: the longer side int(shorter * long / short), in double, truncated.
  const auto longer = [&](std::uint32_t l, std::uint32_t s) {
    return static_cast<std::uint32_t>(std::max(1.0, std::floor(static_cast<double>(o.shorter) * l / s)));
  };
  return width <= height ? CropSize{longer(height, width), o.shorter} : CropSize{o.shorter, longer(width, height)};
}

Sample Resize::operator()(Sample in) const {
  check_image(in, "Resize");
  if (normalizer_) normalizer_->check(in.shape, "Resize");
  const Shape& s = in.shape;
  const CropSize to = resized(s.height, s.width);
  CropSize out = options_.crop.height ? options_.crop : to;
  if (out.height > to.height || out.width > to.width)
    throw std::invalid_argument("Resize: " + image_desc(in) + " resized to " + to.str() + " is smaller than the crop " +
                                out.str());
  ResampleAxis rows = resample_axis(0, s.height, to.height, options_.antialias, 1.0, 0, s.height);
  ResampleAxis cols = resample_axis(0, s.width, to.width, options_.antialias, 1.0, 0, s.width);
  rows.skip = (to.height - out.height) / 2, rows.size = out.height;
  cols.skip = (to.width - out.width) / 2, cols.size = out.width;
  thread_local ResampleTaps row_taps, col_taps;
  row_taps.reset(rows);
  col_taps.reset(cols);
  const Layout layout = options_.layout.value_or(layout_of(s));
  Sample result(*options_.pool, image_shape(s.channels, out.height, out.width, layout),
                normalizer_ ? DType::f32 : in.dtype, in.label, in.id);
  resample_into(in, row_taps.view(), col_taps.view(), {}, normalizer_ ? &*normalizer_ : nullptr, layout,
                bytes_of(result));
  return result;
}

}  // namespace stoker
