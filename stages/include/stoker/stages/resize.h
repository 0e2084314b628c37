// SPDX-License-Identifier: Apache-2.0
// Resampling images: where a resize reads, its weights, and the kernel that applies them. The
// layer under RandomResizedCrop and Resize (image_transforms.h), public so that a decoder that
// decodes part of an image, or decodes it at a reduced scale, and a device, resize exactly as
// they do.
//
// Coordinates. Pixel k of an axis spans [k, k + 1), its centre at k + 0.5. Resizing the window
// [start, start + extent) of an axis to `size` pixels centres output pixel o at
// start + (o + 0.5) * extent / size and reads the window's pixels only: a crop, then a resize,
// as torchvision's RandomResizedCrop does it. An output pixel is the mean of the pixels whose
// centres lie within `support` of its centre, weighted by the triangle max(0, 1 - |d| / support)
// and normalized to sum 1. support = 1 is bilinear interpolation (torch's
// interpolate(mode="bilinear", align_corners=False)); with antialiasing, support =
// max(1, extent / size), the triangle widened by the shrink factor, as PIL and torch's
// antialias=True do it, so that a shrink averages every pixel rather than sampling a few. At
// the window's edges the triangle is cut and the rest renormalized: the edge pixel repeats.
//
// Decoded regions. A decoder may give a region of the image only, and at a reduced scale s
// (libjpeg-turbo's DCT scaling, s = n/8): pixel (i, j) of the image scaled by s covers the
// full-resolution pixels [i / s, (i + 1) / s) x [j / s, (j + 1) / s), and a region holds the
// scaled image's pixels from row `y`, column `x` on (Region). Windows stay in full-resolution
// pixels at any scale: the window [start, start + extent) is [start * s, (start + extent) * s)
// of the scaled image, and the resize reads the region's pixels that this span touches, which
// the region must hold. Output pixel o samples the same point of the picture at every scale;
// at s = 1 with the region the whole image, this is the plain resize above.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "stoker/stages/sample.h"
#include "stoker/stages/transforms.h"

namespace stoker {

/// How an image's elements lie: channel by channel (C, H, W), or each pixel's channels together
/// (H, W, C), as Shape::channels_last says of a sample.
enum class Layout : std::uint8_t { planar, channels_last };
const char* layout_name(Layout l) noexcept;  ///< "planar" or "channels_last"
inline Layout layout_of(const Shape& s) noexcept { return s.channels_last ? Layout::channels_last : Layout::planar; }

/// Where decoded pixels lie in their image: the scale they were decoded at (1, or n/8 with
/// libjpeg-turbo's DCT scaling) and the first row and column they hold, counted in pixels of
/// the image at that scale.
struct Region {
  double scale = 1.0;
  std::uint32_t y = 0, x = 0;
};

/// One axis of a resize: output pixel o (of `size`) is centred at offset + phase +
/// (skip + o + 0.5) * step pixels of the source, and reads the source pixels [lo, hi) within
/// `support` of that point. `skip` drops the first output pixels of the resize: a centre crop
/// after it, cut in the same pass. Split into an integer offset and a phase so that where a
/// region starts changes no weight.
struct ResampleAxis {
  std::uint32_t size = 1;
  std::uint32_t skip = 0;
  std::int32_t offset = 0;
  double phase = 0.0;  ///< in [0, 1)
  double step = 1.0;   ///< source pixels per output pixel
  double support = 1;  ///< the triangle's half-width, in source pixels
  std::int32_t lo = 0, hi = 1;
};

/// The axis that resizes the full-resolution span [start, start + extent) to `size` pixels,
/// from a region that holds `region_extent` pixels of the image scaled by `scale`, starting at
/// its pixel `region_start` (the whole image at full resolution: scale 1, region_start 0,
/// region_extent the image's). Throws std::invalid_argument for an empty span or size, a scale
/// outside (0, 1], or a region that does not hold every pixel the scaled span touches.
ResampleAxis resample_axis(std::uint32_t start, std::uint32_t extent, std::uint32_t size, bool antialias, double scale,
                           std::uint32_t region_start, std::uint32_t region_extent);

/// The weights of one axis read in place from ResampleTaps' flat layout: `size` first source
/// pixels (int32), `size` tap counts (int32), then `size` x `stride` weights (float32), the
/// taps of output pixel o at weights[o * stride], count[o] of them used.
struct TapsView {
  const std::int32_t* first = nullptr;
  const std::int32_t* count = nullptr;
  const float* weights = nullptr;
  std::uint32_t size = 0, stride = 0;

  static std::size_t bytes(std::uint32_t size, std::uint32_t stride) noexcept {
    return std::size_t{size} * (2 * sizeof(std::int32_t) + std::size_t{stride} * sizeof(float));
  }
  /// The view of bytes(size, stride) bytes at `flat`, 4-byte aligned.
  static TapsView of(const std::byte* flat, std::uint32_t size, std::uint32_t stride) noexcept;
};

/// The weights of one axis: output pixel o reads count(o) source pixels from first(o) on,
/// weighted by weights(o), which sum to 1 (each rounded to float32). Reusable: reset() keeps
/// the memory. Flat (write()) so that the weights cross to a device as they are.
class ResampleTaps {
 public:
  ResampleTaps() = default;
  /// Throws std::invalid_argument for an axis that reads nothing or has no size.
  explicit ResampleTaps(const ResampleAxis& axis) { reset(axis); }
  void reset(const ResampleAxis& axis);

  std::uint32_t size() const noexcept { return size_; }
  std::uint32_t stride() const noexcept { return stride_; }  ///< the most taps an output pixel may take
  TapsView view() const noexcept { return {first_.data(), count_.data(), weights_.data(), size_, stride_}; }
  std::size_t bytes() const noexcept { return TapsView::bytes(size_, stride_); }
  /// The flat layout of TapsView at `dst` (bytes() bytes, 4-byte aligned).
  void write(std::byte* dst) const noexcept;

 private:
  std::vector<std::int32_t> first_, count_;
  std::vector<float> weights_;
  std::uint32_t size_ = 0, stride_ = 0;
};

/// Resamples the 2D image (or region) `pixels`, planar or channels-last, of any dtype, through
/// `rows` and `cols` into `out`: rows.size x cols.size pixels of its channels, mirrored along
/// the axes set in `flips` (height, width), laid out as `layout`; with `normalize`, float32
/// normalized as Normalizer computes it; without, in the pixels' dtype (integers rounded to
/// nearest, halves up, and clamped). In float32, along the height first: for each output row,
/// each source column's taps weighted and summed, then those column sums weighted and summed
/// along the width; every sum starts from its first product and adds the others in order, so
/// that any implementation that sums in the same order gives the same floats.
/// Throws std::invalid_argument when `out` does not hold exactly the output's bytes, or a tap
/// lies outside `pixels` (weights read from memory someone else wrote are checked, not trusted).
void resample_into(const Sample& pixels, const TapsView& rows, const TapsView& cols, Flips flips,
                   const Normalizer* normalize, Layout layout, std::span<std::byte> out);

}  // namespace stoker
