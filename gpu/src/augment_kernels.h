// What the crop and gather kernels read, shared by their CUDA launchers (augment_kernels.cu)
// and the host code. Plain C++ that nvcc compiles too: no stoker header beyond this one, no
// CUDA header. Private to gpu/.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stoker::gpu::detail {

/// One crop to cut. Plain data: it crosses PCIe inside staging buffers. No member
/// initializers, so that a kernel can hold one in shared memory.
struct CropJob {
  std::uint32_t image;    ///< which of the launch's images
  std::uint32_t dst;      ///< which crop (and label) slot of the output
  std::uint32_t z, y, x;  ///< the window's origin in the image
  std::uint32_t flips;    ///< kFlipDepth | kFlipHeight | kFlipWidth
  std::int32_t label;     ///< written to the output's label slot `dst`
};
inline constexpr std::uint32_t kFlipDepth = 1, kFlipHeight = 2, kFlipWidth = 4;

enum class PixelType : std::uint8_t { u8, u16, f32 };

/// A launch of the crop kernel: crop i is jobs[i] of images[jobs[i].image], mirrored and
/// normalized, written to out[jobs[i].dst] (each crop channels x crop extents floats), and
/// its label to labels[jobs[i].dst].
struct CropArgs {
  const void* images = nullptr;  // images of `pixel` elements, one after the other
  std::size_t image_count = 0;   // a job outside them traps
  std::size_t out_slots = 0;     // crops `out` holds: a job's dst outside them traps
  PixelType pixel = PixelType::u8;
  std::uint32_t channels = 1, depth = 1, height = 1, width = 1;  // of one image
  std::uint32_t crop_depth = 1, crop_height = 1, crop_width = 1;
  const CropJob* jobs = nullptr;
  std::uint32_t count = 0;
  // The normalization: for uint8, lut[256 * t + value]; otherwise, in float32 exactly as the
  // CPU transform writes it, (x / scale - mean[t]) / std[t]; t is the channel, or 0 when the
  // normalization has one value for all channels (table_channels == 1).
  const float* lut = nullptr;
  const float* mean = nullptr;
  const float* std = nullptr;
  float scale = 1.0f;
  std::uint32_t table_channels = 1;
  float* out = nullptr;
  std::int32_t* labels = nullptr;
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
