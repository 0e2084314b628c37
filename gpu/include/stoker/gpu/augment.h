// SPDX-License-Identifier: Apache-2.0
// Random crops on the device, shuffled on the device, batched on the device.
//
//   auto device = stoker::gpu::Device::open("auto");
//   stoker::gpu::GpuAugment augment(device, {
//       .crops = {.size = {24, 24}, .count = 5, .mirror = stoker::MirrorOptions{}, .normalize = fashion},
//       .batch_size = 255,
//       .shuffle = {.capacity = 10000, .min_after_dequeue = 2000, .seed = 7},
//       .image = stoker::Shape{1, 1, 28, 28},
//       .max_images = 256});
//   auto pipe = stoker::PipelineBuilder{}
//       .source("read", reader)                                         // whole uint8 images
//       .batch("images", 256)
//       .map("collate", stoker::Collate{.pool = augment.staging()}, {.queue = 1})  // into pinned memory
//       .flat_map<stoker::gpu::DeviceBatch>("gpu_augment", augment, {.queue = 1})  // queues as the pools are sized
//       .build();
//   for (auto& b : pipe.epoch()) {
//     b.use_on(compute);            // float32 [255, 1, 24, 24] and int32 labels, on the device
//     train_step(b, compute);
//     b.release_after(compute);
//   }
//
// Each input batch of images crosses PCIe in one copy, together with the crops to cut and the
// minibatches to gather, and nothing comes back. The images are collated into the pinned
// staging buffer that this copy leaves from by the stage before (on its own threads), so the
// copy needs no extra host copy. The crops and flips are drawn exactly as stoker::RandomCrops
// draws them (RandomCrops::plan): by the device itself, from (seed, epoch, id, k), where each
// crop is cut, or, with a count_of, on the host. Each crop equals, bit for bit, what
// RandomCrops' fused path gives on the CPU.
//
// Crops wait on the device in a shuffle window with the semantics of stoker::RandomShuffleQueue
// (the host keeps the books of which window slot holds which crop, with a RandomShuffleQueue of
// slot numbers); a minibatch is gathered out of the window by index as soon as the window holds
// min_after_dequeue + batch_size crops, and the rest drains in random order at the end of the
// epoch. So the crops of one image are spread over many minibatches, as with a host shuffle.
//
// GpuAugment::resident uploads a whole data set once; after that only the crops to cut cross
// PCIe, in one small copy per call (28 bytes a crop), and no image byte crosses again.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "stoker/core/pipeline.h"
#include "stoker/core/random_shuffle_queue.h"
#include "stoker/gpu/device.h"
#include "stoker/gpu/staging.h"
#include "stoker/stages/batch.h"
#include "stoker/stages/idx.h"
#include "stoker/stages/sample.h"
#include "stoker/stages/transforms.h"

namespace stoker::gpu {

struct GpuAugmentOptions {
  /// What to cut, drawn as RandomCrops draws it: size, count or count_of, mirror, normalize,
  /// salt (the pool is not used). Without `normalize`, crops are only cast to float32.
  RandomCropOptions crops{};
  std::size_t batch_size = 256;  ///< crops per minibatch
  bool drop_remainder = false;   ///< drop, rather than deliver, the short last minibatch of an epoch
  /// The window of crops on the device, counted in crops. A minibatch leaves as soon as it can,
  /// so the window never holds more than min_after_dequeue + batch_size, and capacity must be
  /// at least that. Reseeded every epoch with derive_seed(seed, epoch), as a pipeline's shuffle.
  ShuffleOptions shuffle{};
  /// Streaming: the shape and dtype of every image; required. Resident: the data set's.
  std::optional<Shape> image{};
  DType dtype = DType::u8;
  std::size_t max_images = 0;       ///< most images (or indices) per input batch; required
  std::size_t staging_buffers = 3;  ///< pinned and device staging buffers: with 2 or more, copy i+1 overlaps crop i
  /// Device buffers of minibatches, by OutputSizing: the minibatches of one call all need a
  /// buffer at once (buffers_per_call: enough for count * max_images crops, and for the drain
  /// at the end of an epoch), plus those queued after the stage and those the consumer holds
  /// at once. 0 = buffers_per_call + 1 queued + 1 held; a pipeline that holds more at a time
  /// needs more, or it waits for itself (and fails after wait_limit, saying so).
  std::size_t output_buffers = 0;
  /// How long a call waits for a buffer that does not come back before it fails
  /// (SlotPoolOptions::wait_limit); 0 waits for ever.
  std::chrono::milliseconds wait_limit{60'000};
};

/// The flat_map stage function that crops, shuffles and batches on the device. Serial: give
/// its stage one thread (the default). Copies share their state, so that the pipeline and the
/// caller can both hold one. Outputs DeviceBatches of float32 crops [batch_size, C, (D,) H, W]
/// with their labels, each ready() once the device has built it; the host never waits for the
/// device except through the pools (backpressure). End of epoch: the pipeline calls end_epoch.
class GpuAugment {
 public:
  /// Streaming: allocates every buffer now. Throws std::invalid_argument for a null device, a
  /// batch_size of 0, a window smaller than min_after_dequeue + batch_size, no image shape, a
  /// max_images of 0, no staging buffers, or bad crop options, naming the option.
  GpuAugment(std::shared_ptr<Device> device, GpuAugmentOptions options);

  /// A GpuAugment over `data` uploaded to the device now, in one copy (the host waits for that
  /// copy, once). Its input is batches of indices into `data`: std::vector<std::uint64_t>, each
  /// index the sample's id for the random draws, as IdxReader gives it. Throws
  /// std::invalid_argument for an empty data set.
  static GpuAugment resident(std::shared_ptr<Device> device, std::shared_ptr<const IdxDataset> data,
                             GpuAugmentOptions options);

  /// Streaming: crops a batch of at most max_images images of the shape and dtype of the
  /// options, collated into staging() (Collate{.pool = augment.staging()}). Emits the
  /// minibatches that became full.
  void operator()(Batch images, Emitter<DeviceBatch>& emit, const StageContext& ctx);
  /// The same for images not yet collated: collates them into staging() first, on this thread.
  void operator()(std::vector<Sample> images, Emitter<DeviceBatch>& emit, const StageContext& ctx);
  /// Resident: the same for a batch of indices into the data set.
  void operator()(std::vector<std::uint64_t> indices, Emitter<DeviceBatch>& emit, const StageContext& ctx);
  /// Drains the window in random order: the epoch's last minibatches. A pipeline calls it once
  /// its input has ended; without a pipeline, call it after the epoch's last batch. An epoch
  /// that was never ended (a stopped pipeline) is dropped when the next one starts.
  void end_epoch(Emitter<DeviceBatch>& emit, const StageContext& ctx);
  /// One input at a time: a call waits for output buffers that earlier outputs would hold.
  static constexpr std::size_t max_chunk() { return 1; }

  /// Pinned buffers to collate input batches into; null when resident.
  std::shared_ptr<SlotPool> staging() const noexcept;
  /// The output buffers that one call may need at once with these options: output_buffers
  /// must be at least this, plus the minibatches queued and held by the consumer.
  static std::size_t buffers_per_call(const GpuAugmentOptions& options);

  bool is_resident() const noexcept;
  std::size_t held() const;  ///< crops in the window now; not while a call runs
  Device& device() const noexcept;
  const GpuAugmentOptions& options() const noexcept;

 private:
  struct State;
  explicit GpuAugment(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace stoker::gpu
