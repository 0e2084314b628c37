// The crop and gather kernels and their launchers. The host logic is in augment*.cpp.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "augment_kernels.h"
#include "cuda_check.h"

namespace stoker::gpu::detail {

namespace {

constexpr unsigned kWarps = 8, kThreads = 32 * kWarps;
constexpr unsigned kMaxGridY = 65535;
// A crop block cuts about kTileValues values (several small crops, at most kMaxTile), kUnits
// units a thread when one crop spans several blocks.
constexpr unsigned kTileValues = 2048, kMaxTile = 32, kUnits = 4;

// The CPU transform's arithmetic with every rounding spelled out: __fdiv_rn and __fsub_rn
// are IEEE round-to-nearest and can never be contracted or approximated, whatever the
// compiler flags, so the result is the CPU's to the bit.
__device__ __forceinline__ float normalized(float x, const CropArgs& a, unsigned t) {
  return __fdiv_rn(__fsub_rn(__fdiv_rn(x, a.scale), __ldg(a.mean + t)), __ldg(a.std + t));
}
__device__ __forceinline__ float normalized(std::uint8_t v, const CropArgs& a, unsigned t) {
  return __ldg(a.lut + 256u * t + v);
}
__device__ __forceinline__ float normalized(std::uint16_t v, const CropArgs& a, unsigned t) {
  return normalized(static_cast<float>(v), a, t);
}

// Each block cuts `a.tile` consecutive crops of the launch (several small ones, so that no lane
// idles on a 24-wide row; one large one, split over gridDim.y blocks): its first threads read
// and draw the jobs once, then every thread takes units of the block's crops in turn, a unit
// being 4 consecutive values of a row (one 16-byte store, with `Quads`: crop width a multiple of
// 4 and every output on 16 bytes) or one value. Consecutive threads take consecutive units, and
// a crop's values are consecutive in its output, so stores coalesce whatever the width.
template <bool Quads, class T>
__global__ void __launch_bounds__(kThreads) crop_kernel(CropArgs a) {
  __shared__ CropJob jobs[kMaxTile];
  __shared__ float* outs[kMaxTile];
  const unsigned first = blockIdx.x * a.tile;
  const unsigned tile = min(a.tile, a.count - first);
  const unsigned cw = a.crop_width, ch = a.crop_height, cd = a.crop_depth;
  const unsigned rows = a.channels * cd * ch;
  if (threadIdx.x < tile) {
    // The jobs may be in pinned host memory, read across PCIe: read once, by one thread each.
    CropJob job = a.jobs[first + threadIdx.x];
    draw_if_asked(a.draws, job);  // a few dozen integer steps, once per crop
    const CropOutput& o = output_of(a.outputs, a.output_count, first + threadIdx.x);
    // A corrupt job fails the launch (a sticky error the host reports) rather than read or
    // write memory it does not own.
    if (job.image >= a.image_count || job.dst >= o.slots) __trap();
    jobs[threadIdx.x] = job;
    outs[threadIdx.x] = o.out + std::size_t{job.dst} * rows * cw;
    if (blockIdx.y == 0) o.labels[job.dst] = job.label;
  }
  __syncthreads();

  const unsigned per_row = Quads ? cw / 4 : cw, per_crop = rows * per_row;
  const std::size_t plane = std::size_t{a.width} * a.height, volume = plane * a.depth;
  for (unsigned u = blockIdx.y * kThreads + threadIdx.x; u < tile * per_crop; u += gridDim.y * kThreads) {
    const unsigned j = u / per_crop, in_crop = u - j * per_crop;
    const unsigned r = in_crop / per_row, at_row = in_crop - r * per_row;
    const unsigned dy = r % ch, dz = r / ch % cd, c = r / ch / cd;
    const CropJob& job = jobs[j];
    const unsigned t = a.table_channels == 1 ? 0 : c;
    const std::size_t y = job.y + ((job.flips & kFlipHeight) ? ch - 1 - dy : dy);
    const std::size_t z = job.z + ((job.flips & kFlipDepth) ? cd - 1 - dz : dz);
    const T* src = static_cast<const T*>(a.images) + job.image * volume * a.channels + c * volume + z * plane +
                   y * a.width + job.x;
    float* dst = outs[j] + std::size_t{r} * cw;
    const bool flip = job.flips & kFlipWidth;
    const auto at = [&](unsigned dx) { return normalized(src[flip ? cw - 1 - dx : dx], a, t); };
    if constexpr (Quads) {
      const unsigned dx = 4 * at_row;
      reinterpret_cast<float4*>(dst)[at_row] = make_float4(at(dx), at(dx + 1), at(dx + 2), at(dx + 3));
    } else {
      dst[at_row] = at(at_row);
    }
  }
}

// One block row per crop, copied 16 bytes at a time when every crop starts on 16 bytes.
template <class V>
__global__ void __launch_bounds__(kThreads) gather_kernel(GatherArgs a) {
  __shared__ std::uint32_t slot;
  if (threadIdx.x == 0) slot = a.slots[blockIdx.x];
  __syncthreads();
  if (slot >= a.from_slots) __trap();
  const std::size_t n = a.elements * sizeof(float) / sizeof(V);
  const V* from = reinterpret_cast<const V*>(a.from + slot * a.elements);
  V* out = reinterpret_cast<V*>(a.out + blockIdx.x * a.elements);
  for (std::size_t e = std::size_t{blockIdx.y} * blockDim.x + threadIdx.x; e < n;
       e += std::size_t{gridDim.y} * blockDim.x)
    out[e] = from[e];
  if (blockIdx.y == 0 && threadIdx.x == 0) a.labels[blockIdx.x] = a.from_labels[slot];
}

dim3 grid_for(std::uint32_t crops, std::size_t rows_of_work, std::size_t per_block) {
  const std::size_t blocks = (rows_of_work + per_block - 1) / per_block;
  return dim3(crops, static_cast<unsigned>(std::min<std::size_t>(std::max<std::size_t>(blocks, 1), kMaxGridY)));
}

}  // namespace

void cuda_crop(void* stream, const CropArgs& args) {
  if (args.count == 0) return;
  CropArgs a = args;
  const std::size_t values = std::size_t{a.channels} * a.crop_depth * a.crop_height * a.crop_width;
  if (values > std::size_t{1} << 31)
    throw std::invalid_argument("crop kernel: crops of more than 2^31 values (" + std::to_string(values) + ")");
  a.tile = static_cast<std::uint32_t>(std::clamp<std::size_t>(kTileValues / values, 1, kMaxTile));
  bool aligned = true;
  for (std::uint32_t o = 0; o < a.output_count; ++o)
    aligned = aligned && reinterpret_cast<std::uintptr_t>(a.outputs[o].out) % 16 == 0;
  const bool quads = a.crop_width % 4 == 0 && aligned;
  const std::size_t units = a.tile * values / (quads ? 4 : 1);
  const dim3 grid((a.count + a.tile - 1) / a.tile,
                  static_cast<unsigned>(std::clamp<std::size_t>((units + kThreads * kUnits - 1) / (kThreads * kUnits),
                                                                1, kMaxGridY)));
  auto s = static_cast<cudaStream_t>(stream);
  const auto launch = [&](auto pixel) {
    using T = decltype(pixel);
    if (quads)
      crop_kernel<true, T><<<grid, kThreads, 0, s>>>(a);
    else
      crop_kernel<false, T><<<grid, kThreads, 0, s>>>(a);
  };
  switch (a.pixel) {
    case PixelType::u8:
      launch(std::uint8_t{});
      break;
    case PixelType::u16:
      launch(std::uint16_t{});
      break;
    case PixelType::f32:
      launch(float{});
      break;
  }
  STOKER_CUDA_CHECK(cudaGetLastError());
}

void cuda_gather(void* stream, const GatherArgs& a) {
  if (a.count == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const bool aligned = a.elements % 4 == 0 && reinterpret_cast<std::uintptr_t>(a.from) % 16 == 0 &&
                       reinterpret_cast<std::uintptr_t>(a.out) % 16 == 0;
  if (aligned)
    gather_kernel<float4><<<grid_for(a.count, a.elements / 4, kThreads), kThreads, 0, s>>>(a);
  else
    gather_kernel<float><<<grid_for(a.count, a.elements, kThreads), kThreads, 0, s>>>(a);
  STOKER_CUDA_CHECK(cudaGetLastError());
}

}  // namespace stoker::gpu::detail
