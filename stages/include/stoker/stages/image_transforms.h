// SPDX-License-Identifier: Apache-2.0
// Colour image transforms: torchvision's RandomResizedCrop for training, Resize and a centre
// crop for evaluation, and crops of images in either layout. Decoded images are channels-last
// uint8 samples (Shape{.channels = 3, .height, .width, .channels_last = true}); every transform
// here also takes planar 2D samples, and writes either layout.
//
//   const stoker::Normalization imagenet{.scale = 255, .mean = {0.485f, 0.456f, 0.406f},
//                                        .std = {0.229f, 0.224f, 0.225f}};
//   .map("crop", stoker::RandomResizedCrop({.size = {224, 224}, .mirror = stoker::MirrorOptions{},
//                                           .normalize = imagenet, .layout = stoker::Layout::planar}),
//        {.threads = 4})
//   .batch("batch", 256)
//   .map("collate", stoker::Collate{})  // float32 [256, 3, 224, 224]
//
// RandomResizedCrop draws its window from the image's height and width alone (plan()), and
// resizes from any decoded region that holds the window, at any DCT scale (apply_into()), so
// that a decoder can decode only what the crop needs; resize.h has the coordinate contract.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "stoker/core/pipeline.h"
#include "stoker/core/random.h"
#include "stoker/stages/buffer_pool.h"
#include "stoker/stages/resize.h"
#include "stoker/stages/sample.h"
#include "stoker/stages/transforms.h"

namespace stoker {

/// `window` of the 2D image `in` (planar or channels-last, any dtype), mirrored along the axes
/// set in `flips`, written to `out` laid out as `layout`: in its own dtype, or, with
/// `normalize`, in float32 and normalized. Each output element is written once. Throws
/// std::invalid_argument for a window that does not fit, a volume, or an `out` of another size.
void crop_image_into(const Sample& in, const Window& window, Flips flips, const Normalizer* normalize, Layout layout,
                     std::span<std::byte> out);

/// The same into a new sample from `pool`, with `in`'s label and the id `id`.
Sample crop_image(const Sample& in, const Window& window, Flips flips, const Normalizer* normalize, Layout layout,
                  BufferPool& pool, std::uint64_t id);

/// The window torchvision's RandomResizedCrop.get_params draws in an image of height x width:
/// up to `attempts` times, an area of uniform(scale[0], scale[1]) x height x width and an aspect
/// ratio (width / height) of exp(uniform(log ratio[0], log ratio[1])), the sides rounded to the
/// nearest integer (halves to even, as Python's round); the first that fits is placed uniformly.
/// If none fits, the centre crop of the whole image clamped to the ratio range. Draws, per
/// attempt, the area then the ratio, then the row and the column, from `rng`.
Window random_resized_window(std::uint32_t height, std::uint32_t width, std::array<double, 2> scale,
                             std::array<double, 2> ratio, int attempts, Rng& rng);

inline constexpr std::uint64_t kResizedCropSalt = 0x72726372;  // "rrcr"

struct RandomResizedCropOptions {
  CropSize size{};                                    ///< the output's height and width
  std::array<double, 2> scale{0.08, 1.0};             ///< of the image's area
  std::array<double, 2> ratio{3.0 / 4.0, 4.0 / 3.0};  ///< width / height
  int attempts = 10;                                  ///< before the centred fallback
  /// Widen the bilinear filter by the shrink factor (as PIL, and torch's antialias=True), so
  /// that shrinking averages rather than aliases; false is plain 2-tap bilinear.
  bool antialias = true;
  std::optional<MirrorOptions> mirror{};     ///< fused: mirror as RandomMirror would (height or width)
  std::optional<Normalization> normalize{};  ///< fused: output float32 as Normalize would
  std::optional<Layout> layout{};            ///< the output's; the input's unless set
  std::shared_ptr<BufferPool> pool{};        ///< null: a pool of its own
  std::uint64_t salt = kResizedCropSalt;
};

/// torchvision's RandomResizedCrop (a map function): a window drawn by random_resized_window
/// from sample_rng(ctx, id, salt), resized to `size` (bilinear, antialiased by default), then,
/// fused into the same write, mirrored and normalized. Without `normalize` the output keeps the
/// input's dtype (integers rounded). Keeps the label and id. Immutable: safe on many threads.
class RandomResizedCrop {
 public:
  /// Throws std::invalid_argument for an empty size, a size with a depth, scale or ratio out of
  /// order or not positive, negative attempts, a mirror along depth or p outside [0, 1], or a
  /// bad normalization, naming the option.
  explicit RandomResizedCrop(RandomResizedCropOptions options);

  /// Throws std::invalid_argument for a sample that is not a 2D image.
  Sample operator()(Sample in, const StageContext& ctx) const;

  /// The window (in full-resolution pixels) and flips for the sample `id` of an image of
  /// height x width, in the call `ctx`: every random draw, without the pixels.
  PlannedCrop plan(std::uint32_t height, std::uint32_t width, std::uint64_t id, const StageContext& ctx = {}) const;

  /// The rows and columns axes of resizing `crop` from `region` pixels of shape `shape` that lie
  /// at `where` in the image (resize.h).
  std::array<ResampleAxis, 2> axes(const PlannedCrop& crop, const Shape& shape, Region where = {}) const;

  /// Resizes `crop` (from plan()) out of `region`, decoded pixels of the image that lie at
  /// `where` and hold every pixel the window touches at their scale, into `out`
  /// (output_bytes() bytes). A whole image decoded at full resolution is `where = {}`. Throws
  /// std::invalid_argument for a region that does not hold the window.
  void apply_into(const Sample& region, Region where, const PlannedCrop& crop, std::span<std::byte> out) const;
  /// The same, normalized with `normalize` (none: the input's dtype) and laid out as `layout`
  /// rather than as the options say: for a batch that sets them (Collate).
  void apply_into(const Sample& region, Region where, const PlannedCrop& crop, const Normalizer* normalize,
                  Layout layout, std::span<std::byte> out) const;
  /// The same into a new sample with the region's label and the crop's id.
  Sample apply(const Sample& region, Region where, const PlannedCrop& crop) const;

  /// The output of an input of shape `in` and dtype `type`.
  Shape output_shape(const Shape& in) const noexcept;
  DType output_dtype(DType type) const noexcept { return normalizer_ ? DType::f32 : type; }
  std::size_t output_bytes(const Shape& in, DType type) const noexcept {
    return output_shape(in).elements() * dtype_size(output_dtype(type));
  }

  const RandomResizedCropOptions& options() const noexcept { return options_; }
  const Normalizer* normalizer() const noexcept { return normalizer_ ? &*normalizer_ : nullptr; }
  BufferPool& pool() const noexcept { return *options_.pool; }

 private:
  RandomResizedCropOptions options_;
  std::optional<Normalizer> normalizer_;
};

struct ResizeOptions {
  /// The shorter side's new length, the longer one's in proportion, rounded down (torchvision's
  /// Resize(n)); or 0 and `size`.
  std::uint32_t shorter = 0;
  CropSize size{};  ///< exactly this height and width (torchvision's Resize((h, w)))
  /// Then the centre crop of this size (rounded towards the origin, as CenterCrop's), cut in the
  /// same pass: the output of Resize then CenterCrop, without the resized image in between.
  CropSize crop{};
  bool antialias = true;                     ///< as RandomResizedCrop's
  std::optional<Normalization> normalize{};  ///< fused: output float32 as Normalize would
  std::optional<Layout> layout{};            ///< the output's; the input's unless set
  std::shared_ptr<BufferPool> pool{};        ///< null: a pool of its own
};

/// A resize of the whole image, and optionally its centre crop, for evaluation (a map
/// function): torchvision's Resize(256) and CenterCrop(224) are {.shorter = 256, .crop = {224,
/// 224}}. Bilinear as RandomResizedCrop's. Keeps the label and id.
class Resize {
 public:
  /// Throws std::invalid_argument for neither or both of shorter and size, a crop with a depth,
  /// or a bad normalization.
  explicit Resize(ResizeOptions options);
  /// Throws std::invalid_argument for a sample that is not a 2D image, or smaller after the
  /// resize than the crop.
  Sample operator()(Sample in) const;
  /// The image's height and width once resized (before the crop).
  CropSize resized(std::uint32_t height, std::uint32_t width) const;
  BufferPool& pool() const noexcept { return *options_.pool; }
  const ResizeOptions& options() const noexcept { return options_; }

 private:
  ResizeOptions options_;
  std::optional<Normalizer> normalizer_;
};

}  // namespace stoker
