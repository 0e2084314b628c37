// SPDX-License-Identifier: Apache-2.0
// What the crop and gather kernels read, shared by their CUDA launchers (augment_kernels.cu)
// and the host code. Plain C++ that nvcc compiles too: no CUDA header, and no stoker header
// but core/random.h, whose integer-only counter-based generator nvcc compiles for the device
// (with --expt-relaxed-constexpr: its functions are constexpr). Private to gpu/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "stoker/core/random.h"

#if defined(__CUDACC__)
#define STOKER_HOST_DEVICE __host__ __device__
#else
#define STOKER_HOST_DEVICE
#endif

namespace stoker::gpu::detail {

/// One crop to cut. Plain data: it crosses PCIe inside staging buffers. No member
/// initializers, so that a kernel can hold one in shared memory.
///
/// Its window and flips are given (z, y, x, flips), or, with kDrawn in `flips`, drawn where
/// it is cut from the sample's id and the crop's number k, as RandomCrops::plan draws them
/// (draw_crop): z and y then hold the id's high and low 32 bits and x holds k.
struct CropJob {
  std::uint32_t image;    ///< which of the launch's images
  std::uint32_t dst;      ///< which crop (and label) slot of the output
  std::uint32_t z, y, x;  ///< the window's origin in the image (or the id and k, with kDrawn)
  std::uint32_t flips;    ///< kFlipDepth | kFlipHeight | kFlipWidth, or kDrawn
  std::int32_t label;     ///< written to the output's label slot `dst`
};
inline constexpr std::uint32_t kFlipDepth = 1, kFlipHeight = 2, kFlipWidth = 4, kDrawn = 8;

/// What RandomCrops::plan draws a sample's crops from, for one epoch: sample_rng(ctx, id, salt)
/// for the windows, in crop order, and sample_rng(ctx, id * count + k, mirror salt) for crop
/// k's mirror. Plain data for a kernel's parameters.
struct CropDraws {
  std::uint64_t window_seed = 0;  ///< ctx.seed ^ mix64(salt)
  std::uint64_t mirror_seed = 0;  ///< ctx.seed ^ mix64(mirror salt)
  std::uint32_t epoch = 0;
  std::uint32_t count = 1;                              ///< RandomCropOptions::count
  std::uint32_t spare_z = 1, spare_y = 1, spare_x = 1;  ///< image extent - crop extent + 1, per axis
  bool mirror = false;
  std::uint32_t mirror_flips = 0;  ///< the kFlip bits of the mirror's axis
  double mirror_p = 0;
};

/// Crop k of sample `id`, bit for bit as RandomCrops::plan draws it without a count_of: its
/// generator replays the windows of crops 0 to k - 1 first (a few dozen integer steps), so
/// that each crop is drawn on its own, on the host or the device, from (seed, epoch, id, k).
STOKER_HOST_DEVICE inline void draw_crop(const CropDraws& d, std::uint64_t id, std::uint32_t k, CropJob& job) {
  Rng windows(derive_seed(d.window_seed, d.epoch, id));
  for (std::uint32_t j = 0;; ++j) {
    job.z = static_cast<std::uint32_t>(windows.below(d.spare_z));
    job.y = static_cast<std::uint32_t>(windows.below(d.spare_y));
    job.x = static_cast<std::uint32_t>(windows.below(d.spare_x));
    if (j == k) break;
  }
  job.flips = 0;
  if (d.mirror) {
    Rng mirror(derive_seed(d.mirror_seed, d.epoch, id * d.count + k));
    if (mirror.bernoulli(d.mirror_p)) job.flips = d.mirror_flips;
  }
}

/// Whether a crop of `crop_*` extents at `job`'s origin lies inside an image of the given
/// extents: a job that fails this is corrupt, and is never cut (the CPU backend throws, the
/// kernel traps), whoever drew it.
STOKER_HOST_DEVICE inline bool window_inside(const CropJob& job, std::uint32_t crop_depth, std::uint32_t crop_height,
                                             std::uint32_t crop_width, std::uint32_t depth, std::uint32_t height,
                                             std::uint32_t width) {
  return std::uint64_t{job.z} + crop_depth <= depth && std::uint64_t{job.y} + crop_height <= height &&
         std::uint64_t{job.x} + crop_width <= width;
}

/// Draws `job`'s window and flips in place when they are to be drawn (kDrawn).
STOKER_HOST_DEVICE inline void draw_if_asked(const CropDraws& d, CropJob& job) {
  if (!(job.flips & kDrawn)) return;
  draw_crop(d, (std::uint64_t{job.z} << 32) | job.y, job.x, job);
}

enum class PixelType : std::uint8_t { u8, u16, f32 };

/// Where some of a launch's crops go: jobs [first, the next output's first) into
/// out + dst * crop elements and labels[dst], for dst < slots. One launch cuts the crops of
/// several minibatches, each in its own buffer.
struct CropOutput {
  float* out;
  std::int32_t* labels;
  std::uint32_t first;  ///< the index in the launch of the output's first job
  std::uint32_t slots;  ///< crops `out` holds: a job's dst outside them traps
};
/// The outputs one launch takes, in its parameters (which stay under CUDA's 4 KB).
inline constexpr std::uint32_t kMaxCropOutputs = 64;

/// The output of job i: the last of `outputs` (ascending firsts, the first 0) whose first is
/// at most i.
STOKER_HOST_DEVICE inline const CropOutput& output_of(const CropOutput* outputs, std::uint32_t count, std::uint32_t i) {
  std::uint32_t lo = 0, hi = count;
  while (hi - lo > 1) {
    const std::uint32_t mid = lo + (hi - lo) / 2;
    if (outputs[mid].first <= i)
      lo = mid;
    else
      hi = mid;
  }
  return outputs[lo];
}

/// A launch of the crop kernel: crop i is jobs[i] of images[jobs[i].image], mirrored and
/// normalized, written to its output's out[jobs[i].dst] (each crop channels x crop extents
/// floats), and its label to that output's labels[jobs[i].dst].
struct CropArgs {
  const void* images = nullptr;  // images of `pixel` elements, one after the other
  std::size_t image_count = 0;   // a job outside them traps
  PixelType pixel = PixelType::u8;
  std::uint32_t channels = 1, depth = 1, height = 1, width = 1;  // of one image
  std::uint32_t crop_depth = 1, crop_height = 1, crop_width = 1;
  const CropJob* jobs = nullptr;
  std::uint32_t count = 0;
  CropDraws draws;  // for the jobs marked kDrawn
  // The normalization: for uint8, lut[256 * t + value]; otherwise, in float32 exactly as the
  // CPU transform writes it, (x / scale - mean[t]) / std[t]; t is the channel, or 0 when the
  // normalization has one value for all channels (table_channels == 1).
  const float* lut = nullptr;
  const float* mean = nullptr;
  const float* std = nullptr;
  float scale = 1.0f;
  std::uint32_t table_channels = 1;
  std::uint32_t output_count = 0;
  CropOutput outputs[kMaxCropOutputs];
  std::uint32_t tile = 1;  // crops a block cuts: cuda_crop sets it from the crop's size
};

/// A launch of the gather kernel: out[i] = from[slots[i]], labels[i] = from_labels[slots[i]].
struct GatherArgs {
  const float* from = nullptr;
  const std::int32_t* from_labels = nullptr;
  std::size_t from_slots = 0;  // crops `from` holds: a slot outside them traps
  const std::uint32_t* slots = nullptr;
  std::uint32_t count = 0;
  std::size_t elements = 0;  // floats per crop
  float* out = nullptr;
  std::int32_t* labels = nullptr;
};

/// Launch on the cudaStream_t `stream`; a failed launch throws CudaError. In a build without
/// CUDA they throw std::logic_error: no stream has a native handle there to launch on.
void cuda_crop(void* stream, const CropArgs& args);
void cuda_gather(void* stream, const GatherArgs& args);

}  // namespace stoker::gpu::detail
