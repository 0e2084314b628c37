// SPDX-License-Identifier: Apache-2.0
// What the resized-crop kernel reads, shared by its CUDA launcher (resize_kernels.cu) and the
// host code (image_augment.cpp). Plain C++ that nvcc compiles too. Private to gpu/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "augment_kernels.h"

namespace stoker::gpu::detail {

/// One image of a launch and the crop to cut of it, in the launch's staging buffer. Plain
/// data: it crosses PCIe inside that buffer. Offsets are bytes from the buffer's start.
struct ResizeJob {
  std::uint64_t pixels;                  ///< the image: uint8, height x width x channels
  std::uint64_t rows, cols;              ///< its taps, in TapsView's flat layout (resize.h)
  std::uint32_t height, width;           ///< of the image
  std::uint32_t row_stride, col_stride;  ///< of the taps
  std::uint32_t channels_last;           ///< the image's layout: 1 (H, W, C), 0 (C, H, W)
  std::uint32_t flips;                   ///< kFlipHeight | kFlipWidth
  std::int32_t label;                    ///< written to the output's label slot
  std::uint32_t unused;
};

/// A launch: crop i of jobs[i] resized into out + i * channels x out_height x out_width floats,
/// laid out planar or channels-last, normalized as (x / scale - mean[c]) / std[c]; its label
/// into labels[i]. A job or a tap outside the buffer's `bytes` or its image traps.
struct ResizeArgs {
  const std::byte* base = nullptr;  // the staging buffer, on the device
  std::size_t bytes = 0;
  const ResizeJob* jobs = nullptr;
  std::uint32_t count = 0;
  std::uint32_t channels = 3, out_height = 1, out_width = 1;
  bool channels_last = false;  // of the output
  float* out = nullptr;
  std::int32_t* labels = nullptr;
  float scale = 1.0f;
  float mean[4] = {0, 0, 0, 0}, std[4] = {1, 1, 1, 1};
};
inline constexpr std::uint32_t kMaxResizeChannels = 4;

/// Launch on the cudaStream_t `stream`; a failed launch throws CudaError. In a build without
/// CUDA it throws std::logic_error: no stream has a native handle there to launch on.
void cuda_resized_crop(void* stream, const ResizeArgs& args);

}  // namespace stoker::gpu::detail
