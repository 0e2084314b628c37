// SPDX-License-Identifier: Apache-2.0
// The crop and gather kernels behind one entry point for both backends: the CUDA kernels, or
// on the CPU backend the CPU transform itself (crop_mirror_normalize_into), so that the two
// agree bit for bit by construction on the CPU side and by test on the CUDA side.
// Private to gpu/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "augment_kernels.h"
#include "stoker/gpu/device.h"
#include "stoker/stages/transforms.h"

namespace stoker::gpu::detail {

/// The job that cuts `crop` out of image `image` of a launch, with `label`, into slot `dst`.
CropJob make_job(std::uint32_t image, const PlannedCrop& crop, std::int32_t label, std::uint32_t dst = 0) noexcept;

/// A Sample over memory it does not own (the memory must outlive it): what lets the CPU
/// transforms read images that sit in staging or (emulated) device memory.
Sample borrowed_sample(const std::byte* data, Shape shape, DType dtype, std::int32_t label = 0, std::uint64_t id = 0);

/// The kernels for one geometry: images of one shape and dtype, crops of one size, one
/// normalization. Immutable: safe to share between threads.
class CropKernels {
 public:
  /// Throws std::invalid_argument when crops of `size` do not fit `image`, or `normalizer`
  /// does not apply to it.
  CropKernels(Shape image, DType dtype, CropSize size, Normalizer normalizer);

  const Shape& image() const noexcept { return image_; }
  DType dtype() const noexcept { return dtype_; }
  std::size_t image_bytes() const noexcept { return image_.elements() * dtype_size(dtype_); }
  /// The shape of one crop: the image's channels, the crop's extents.
  const Shape& crop() const noexcept { return crop_; }
  std::size_t crop_elements() const noexcept { return crop_.elements(); }
  const Normalizer& normalizer() const noexcept { return *normalizer_; }

  /// The normalization as the CUDA kernel reads it (lookup tables, means, stds): write it
  /// into table_bytes() of host memory and move it to the device along with other data.
  std::size_t table_bytes() const noexcept;
  void write_table(std::byte* dst) const noexcept;

  /// Issues to `stream`, for each of `count` jobs, the crop of image `job.image` of `images`
  /// (image_count images of image_bytes() each), mirrored and normalized, into
  /// out + job.dst * crop_elements(), and its label into labels[job.dst], for out_slots slots.
  /// `images`, `out` and `labels` are device memory; `jobs` is device or pinned memory;
  /// `table` is a device copy of write_table's bytes. All must stay valid until the stream
  /// has passed this work. Equal, bit for bit, to crop_mirror_normalize_into, which is what
  /// the CPU backend runs. A job outside the images or the slots fails the stream's work (a
  /// trap on CUDA, a host task that throws on the CPU backend) rather than touch memory it
  /// must not.
  /// Jobs marked kDrawn get their window and flips from `draws` (draws_for()), where they are
  /// cut.
  void crop(Stream& stream, const std::byte* images, std::size_t image_count, const CropJob* jobs, std::size_t count,
            const std::byte* table, float* out, std::int32_t* labels, std::size_t out_slots,
            const CropDraws& draws = {}) const;
  /// The same into several outputs (the minibatches of a call, each in its own buffer): job i
  /// goes to output_of(outputs, i), whose slots its dst must be under. One launch per
  /// kMaxCropOutputs outputs.
  void crop(Stream& stream, const std::byte* images, std::size_t image_count, const CropJob* jobs, std::size_t count,
            const std::byte* table, std::span<const CropOutput> outputs, const CropDraws& draws = {}) const;

  /// What the crops of `options` (which has no count_of) draw from in epoch `epoch` of a
  /// pipeline seeded `seed`, for images of this geometry.
  CropDraws draws_for(const RandomCropOptions& options, std::uint64_t seed, std::uint32_t epoch) const;
  /// A job whose window and flips are drawn where it is cut: crop k of sample `id`.
  static CropJob drawn_job(std::uint32_t image, std::uint64_t id, std::uint32_t k, std::int32_t label) noexcept;

  /// Issues to `stream`: crop i of `out` and labels[i] become crop slots[i] of `from` and
  /// from_labels[slots[i]], for i < count; `from` holds from_slots crops. `slots` is device or
  /// pinned memory. A slot outside `from` fails the stream's work, as crop() does.
  void gather(Stream& stream, const float* from, const std::int32_t* from_labels, std::size_t from_slots,
              const std::uint32_t* slots, std::size_t count, float* out, std::int32_t* labels) const;

 private:
  // One launch: at most kMaxCropOutputs outputs, firsts counted from `jobs`.
  void launch_crop(Stream& stream, const std::byte* images, std::size_t image_count, const CropJob* jobs,
                   std::uint32_t count, const std::byte* table, std::vector<CropOutput> outputs,
                   const CropDraws& draws) const;

  Shape image_;
  DType dtype_;
  Window extent_;  // the crop's extents; the origin comes with each job
  Shape crop_;
  std::uint32_t table_channels_;
  std::shared_ptr<const Normalizer> normalizer_;  // shared with CPU-backend work still queued
};

}  // namespace stoker::gpu::detail
