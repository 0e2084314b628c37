// SPDX-License-Identifier: Apache-2.0
// torchvision's RandomResizedCrop on the device: images decoded on the host, of any sizes, go
// to the device in one copy per batch, and the crops, their resize, mirror and normalization
// run there (what DALI calls a "mixed" decode).
//
//   auto device = stoker::gpu::Device::open("auto");
//   stoker::gpu::GpuResizedCrop crop(device, {
//       .crop = {.size = {224, 224}, .mirror = stoker::MirrorOptions{}, .normalize = imagenet},
//       .max_images = 256});
//   auto pipe = stoker::PipelineBuilder{}
//       .source("read", files)
//       .map("decode", decode, {.threads = 8})                           // uint8 H x W x 3 images
//       .batch("images", 256)
//       .map("pack", crop.packer(), {.threads = 2, .queue = 1})          // into pinned memory
//       .map("gpu_crop", crop, {.queue = 1})                             // one copy, one launch
//       .build();
//   for (auto& b : pipe.epoch()) {  // float32 [256, 3, 224, 224] and int32 labels, on the device
//     b.use_on(compute);
//     train_step(b, compute);
//     b.release_after(compute);
//   }
//
// The packer draws each image's window and mirror as stoker::RandomResizedCrop::plan does,
// from (seed, epoch, id), computes the resize's weights (ResampleTaps) and packs images and
// weights into one pinned staging buffer; the stage copies that buffer in one copy and cuts
// every crop of the batch in one launch, straight into the output batch. On the CPU backend the
// launch runs RandomResizedCrop's own resample (resample_into) over the copied images and
// weights: the same floats as the CPU transform. The CUDA kernel sums the same taps in the same
// order with round-to-nearest intrinsics; docs/device.md states the tolerance it is tested to.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "stoker/core/pipeline.h"
#include "stoker/gpu/device.h"
#include "stoker/gpu/staging.h"
#include "stoker/stages/image_transforms.h"
#include "stoker/stages/sample.h"

namespace stoker::gpu {

struct GpuResizedCropOptions {
  /// What to cut, drawn as RandomResizedCrop draws it: size, scale, ratio, attempts,
  /// antialias, mirror, normalize, salt. `layout` is the batch's: planar, [N, C, H, W], unless
  /// set. The output is float32 always: without `normalize`, the resized values.
  RandomResizedCropOptions crop{};
  std::uint32_t channels = 3;    ///< of every image: 3 (colour) or 1 (grayscale); at most 4
  std::size_t max_images = 256;  ///< most images per batch (at most 65535)
  /// Bytes of one pinned staging buffer (and of its device copy): a batch's images, each
  /// rounded up to 16 bytes, their crops' weights, and 48 bytes a crop. 0: enough for
  /// max_images colour images of 512 x 512 shrunk up to 8 times.
  std::size_t staging_bytes = 0;
  /// Pinned and device staging buffers: 1 being packed, the batches queued between the pack
  /// stage and this one, 1 being copied; with 2 or more, the copy of batch i+1 overlaps the
  /// crops of batch i.
  std::size_t staging_buffers = 3;
  /// Device buffers of output batches, by OutputSizing: 1 being cut, the batches queued after
  /// the stage, and those the consumer holds at once. 0 = 1 + 1 queued + 1 held.
  std::size_t output_buffers = 0;
  /// How long a call waits for a buffer that does not come back before it fails
  /// (SlotPoolOptions::wait_limit); 0 waits for ever.
  std::chrono::milliseconds wait_limit{60'000};
};

/// Images of one batch, of any sizes, packed into one pinned staging buffer with the crops to
/// cut of them: what GpuResizedCrop::pack gives and its operator() takes. Move-only.
struct PackedImages {
  Buffer storage;                    ///< from GpuResizedCrop::staging()
  std::size_t bytes = 0;             ///< the part of it that crosses to the device, in one copy
  std::size_t count = 0;             ///< images, and crops
  std::vector<std::int32_t> labels;  ///< the images' labels, kept on the host as well
  std::vector<std::uint64_t> ids;    ///< the images' ids (Sample::id), on the host: DeviceBatch::host_ids
};

/// The stage function that crops, resizes, mirrors and normalizes a batch of decoded images on
/// the device (a map function). Copies share their state, so that the pipeline and the caller
/// can both hold one; calls may come from several threads.
class GpuResizedCrop {
  struct State;

 public:
  /// Allocates every buffer now. Throws std::invalid_argument for a null device, channels
  /// outside [1, 4], a max_images of 0 or over 65535, no staging buffers, or bad crop options,
  /// naming the option.
  GpuResizedCrop(std::shared_ptr<Device> device, GpuResizedCropOptions options);

  /// Packs `images` (uint8 2D images of option channels, either layout; at most max_images) into a staging buffer, with
  /// the window and mirror of each drawn as RandomResizedCrop::plan draws them for its id in the call `ctx`, and the
  /// weights of its resize. Waits for a free staging buffer (backpressure). Thread-safe. Throws std::invalid_argument
  /// for no images or an image it cannot take, naming it, and for a batch larger than staging_bytes, saying by how
  /// much.
  PackedImages pack(std::vector<Sample> images, const StageContext& ctx = {}) const;

  /// Issues the copy of `images` to the device and the launch that cuts their crops into a
  /// new batch: float32 [count, C, size.height, size.width] (or [count, H, W, C]) with int32
  /// labels, ready() once the device has built it. The host never waits for the device but for
  /// buffers (backpressure).
  DeviceBatch operator()(PackedImages images, const StageContext& ctx = {});
  /// The same for images not yet packed: packs them first, on this thread.
  DeviceBatch operator()(std::vector<Sample> images, const StageContext& ctx = {});
  /// One batch at a time: a call waits for an output buffer.
  static constexpr std::size_t max_chunk() { return 1; }

  /// pack() as a map stage function, for threads of its own ahead of this stage.
  class Packer {
   public:
    PackedImages operator()(std::vector<Sample> images, const StageContext& ctx) const;
    static constexpr std::size_t max_chunk() { return 1; }  // it waits for staging buffers

   private:
    friend class GpuResizedCrop;
    explicit Packer(std::shared_ptr<const State> state) : state_(std::move(state)) {}
    std::shared_ptr<const State> state_;
  };
  Packer packer() const { return Packer(state_); }

  /// The pinned buffers images are packed into.
  std::shared_ptr<SlotPool> staging() const noexcept;
  /// One output crop.
  Shape output_shape() const noexcept;
  /// The CPU transform each crop equals: RandomResizedCrop with these options, float32 output.
  const RandomResizedCrop& transform() const noexcept;
  Device& device() const noexcept;
  const GpuResizedCropOptions& options() const noexcept;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace stoker::gpu
