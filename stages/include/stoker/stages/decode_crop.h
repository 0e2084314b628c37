// SPDX-License-Identifier: Apache-2.0
// Decoding and RandomResizedCrop in one stage: each image's crop is drawn from its header, and
// only the pixels the crop needs are decoded, at the smallest DCT scale that still serves it.
//
//   const stoker::Normalization imagenet{.scale = 255, .mean = {0.485f, 0.456f, 0.406f},
//                                        .std = {0.229f, 0.224f, 0.225f}};
//   auto pipe = stoker::PipelineBuilder{}
//                   .source("read", stoker::ImageSource(stoker::ImageDataset::open("train.txt")))
//                   .map("decode_crop",
//                        stoker::DecodeCropWindow({.crop = {.size = {224, 224},
//                                                           .mirror = stoker::MirrorOptions{},
//                                                           .normalize = imagenet}}),
//                        {.threads = 8})
//                   .batch("batch", 256)
//                   .map("collate", stoker::Collate{})  // resized into float32 [256, 3, 224, 224]
//                   .build();
//
// DecodeCropWindow decodes and leaves the resize to Collate, which writes it straight into the
// batch; DecodeResizedCrop resizes in the map stage and outputs the crop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "stoker/core/stage.h"
#include "stoker/stages/batch.h"  // Collate, which resizes DecodeCropWindow's crops
#include "stoker/stages/buffer_pool.h"
#include "stoker/stages/image.h"
#include "stoker/stages/image_transforms.h"
#include "stoker/stages/sample.h"

namespace stoker {

/// A crop drawn and its window decoded, not yet resized: the first half of DecodeResizedCrop,
/// for a stage that resizes later (straight into a batch).
struct DecodedCrop {
  DecodedWindow decoded;  ///< the window's pixels and where they lie
  Region where;           ///< the same, as RandomResizedCrop::apply_into() takes it
  PlannedCrop crop;       ///< the window (full-resolution pixels), the flips, the id
  std::int32_t label = 0;
};

struct DecodeResizedCropOptions {
  /// The crop: its size, torchvision's scale and ratio, antialiasing, the fused mirror and
  /// normalization, the output's layout (channels-last, as decoded, unless set) and the pool the
  /// outputs come from.
  RandomResizedCropOptions crop{};
  /// RGB (3 channels) or gray (1), and the pixel limit.
  DecodeOptions decode{};
  /// Decode a JPEG's window at the smallest scale n/8 that keeps it at least crop.size
  /// (jpeg_scale_eighths()); false decodes it at full resolution, which makes the output equal,
  /// bit for bit, to decode_image() followed by RandomResizedCrop.
  bool dct_scaling = true;
  /// Where the decoded windows go for the time of one call; null gives the stage a pool of its own.
  std::shared_ptr<BufferPool> scratch = nullptr;
};

/// A map stage's function that turns an EncodedImage into its RandomResizedCrop, in one pass:
/// it reads the header, draws the crop from the image's size alone (RandomResizedCrop::plan(),
/// the same draw as RandomResizedCrop's for the same seed, epoch and id), decodes only that window
/// (decode_window(): for a JPEG the rows from the window's top to its bottom and the iMCU columns
/// it touches, at the smallest DCT scale that keeps it at least the output's size), and resizes,
/// mirrors and normalizes it into the output (RandomResizedCrop::apply_into()). A PNG is decoded
/// whole, then cut. The decoded window lives on a recycled buffer for the call only; the output
/// is a recycled buffer of `crop.pool`.
///
/// The output equals decode_image() followed by RandomResizedCrop: bit for bit when the window is
/// decoded at full resolution (always for a PNG, and for a JPEG window less than 8/3 times the
/// output's size on either side, or with dct_scaling off); at a scale n/8 the decoder's DCT-domain
/// downscale replaces part of the resize's, within 2 grey levels on the mean and 6 on the 99th
/// percentile of pixels (docs/images.md states how it was measured).
///
/// Immutable: safe to call from any number of threads at once. Throws DataError naming the file
/// for a bad image (the stage's on_error decides), std::invalid_argument for bad options.
class DecodeResizedCrop {
 public:
  /// Throws std::invalid_argument as RandomResizedCrop does for bad crop options, and for a
  /// normalization whose channels are not the decoded images' (3 for rgb, 1 for gray).
  explicit DecodeResizedCrop(DecodeResizedCropOptions options);

  Sample operator()(EncodedImage in, const StageContext& ctx = {}) const;

  /// The crop of image `id`, encoded as `bytes`, written straight into `out` (output_bytes()
  /// bytes): for a loop that fills its batch in place. `name` is what errors name.
  void decode_into(std::span<const std::byte> bytes, const std::string& name, std::uint64_t id, const StageContext& ctx,
                   std::span<std::byte> out) const;

  /// The two halves of decode_into(): the crop drawn and its window decoded (on a buffer of
  /// `scratch`), then resized, mirrored and normalized into `out` (output_bytes() bytes).
  DecodedCrop decode(std::span<const std::byte> bytes, const std::string& name, std::uint64_t id,
                     const StageContext& ctx) const;
  void resize_into(const DecodedCrop& c, std::span<std::byte> out) const {
    crop_.apply_into(c.decoded.image, c.where, c.crop, out);
  }

  /// Every output's: channels (3, or 1 for gray), the crop's size, the layout asked for.
  Shape output_shape() const noexcept { return shape_; }
  /// float32 with a normalization, uint8 without.
  DType output_dtype() const noexcept { return crop_.output_dtype(DType::u8); }
  std::size_t output_bytes() const noexcept { return shape_.elements() * dtype_size(output_dtype()); }

  const RandomResizedCrop& crop() const noexcept { return crop_; }
  const DecodeResizedCropOptions& options() const noexcept { return options_; }

 private:
  DecodeResizedCropOptions options_;
  RandomResizedCrop crop_;
  Shape shape_;
};

/// A crop whose window is decoded and whose resize is left to Collate, which resizes, mirrors and
/// normalizes it straight into the batch: each element of the batch written once, and the queues
/// after decoding hold decoded windows (uint8, mostly smaller than a float32 crop) rather than
/// crops. What DecodeCropWindow makes.
struct DeferredResize {
  DecodedCrop decoded;
  std::shared_ptr<const DecodeResizedCrop> resize;  ///< how: size, antialiasing, mirror, normalization, layout
};

/// DecodeResizedCrop with the resize moved into the batch (a map stage's function):
///
///   .map("decode_crop", stoker::DecodeCropWindow({.crop = {.size = {224, 224},
///                                                          .mirror = stoker::MirrorOptions{},
///                                                          .normalize = imagenet}}),
///        {.threads = 8})
///   .batch("batch", 256)
///   .map("collate", stoker::Collate{})  // float32 [256, 3, 224, 224]: the crops resized into it
///
/// The same crops, bit for bit, as DecodeResizedCrop followed by Collate, without the copy of
/// every crop into its batch. The batch is laid out as Collate's `layout` says (the crop's
/// `layout` option must then be unset or the same), and normalized by the crop's `normalize` or
/// by Collate's (not both). Immutable: safe on any number of threads.
class DecodeCropWindow {
 public:
  explicit DecodeCropWindow(DecodeResizedCropOptions options)
      : resize_(std::make_shared<const DecodeResizedCrop>(std::move(options))) {}
  DeferredResize operator()(EncodedImage in, const StageContext& ctx = {}) const;
  const DecodeResizedCrop& resize() const noexcept { return *resize_; }

 private:
  std::shared_ptr<const DecodeResizedCrop> resize_;
};

}  // namespace stoker
