// SPDX-License-Identifier: Apache-2.0
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
constexpr unsigned kTileValues = 8192, kMaxTile = 32, kUnits = 4;

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

// n / d for any n < 2^31 as a multiply and a shift (d fixed for a launch): with L = ceil(log2 d)
// and p = 31 + L, m = ceil(2^p / d) fits 32 bits, and floor(n m / 2^p) = floor(n / d) because
// n (m d - 2^p) < 2^31 d <= 2^p. A crop's units are counted in 32 bits, under 2^31.
struct Divisor {
  std::uint32_t d = 1, m = 1u << 31, p = 31;
  Divisor() = default;
  explicit Divisor(std::uint32_t divisor) : d(divisor) {
    unsigned log = 0;
    while ((std::uint64_t{1} << log) < divisor) ++log;
    p = 31 + log;
    m = static_cast<std::uint32_t>(((std::uint64_t{1} << p) + divisor - 1) / divisor);
  }
  __device__ __forceinline__ std::uint32_t div(std::uint32_t n) const {
    return static_cast<std::uint32_t>((static_cast<std::uint64_t>(n) * m) >> p);
  }
};

// The divisors of a launch's unit index: units in a crop, in a row, rows in a plane and planes
// in a channel.
struct Divisors {
  Divisor per_crop, per_row, height, depth;
};

// Each block cuts `a.tile` consecutive crops of the launch (several small ones, so that no lane
// idles on a 24-wide row; one large one, split over gridDim.y blocks): its first threads read
// and draw the jobs once, then every thread takes units of the block's crops in turn, a unit
// being V consecutive values of a row stored at once (V = 4 or 2 when the crop's width is a
// multiple of it and every output is aligned to a V-float vector, else 1). Consecutive threads
// take consecutive units, and a crop's values are consecutive in its output, so stores
// coalesce whatever the width.
template <unsigned V, class T>
__global__ void __launch_bounds__(kThreads) crop_kernel(CropArgs a, Divisors dv) {
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
    if (job.image >= a.image_count || job.dst >= o.slots ||
        !window_inside(job, cd, ch, cw, a.depth, a.height, a.width))
      __trap();
    jobs[threadIdx.x] = job;
    outs[threadIdx.x] = o.out + std::size_t{job.dst} * rows * cw;
    if (blockIdx.y == 0) o.labels[job.dst] = job.label;
  }
  __syncthreads();

  const unsigned per_crop = dv.per_crop.d;
  const std::size_t plane = std::size_t{a.width} * a.height, volume = plane * a.depth;
  for (unsigned u = blockIdx.y * kThreads + threadIdx.x; u < tile * per_crop; u += gridDim.y * kThreads) {
    const unsigned j = dv.per_crop.div(u), in_crop = u - j * per_crop;
    const unsigned r = dv.per_row.div(in_crop), dx = (in_crop - r * dv.per_row.d) * V;
    const unsigned plane_row = dv.height.div(r), dy = r - plane_row * ch;
    const unsigned c = dv.depth.div(plane_row), dz = plane_row - c * cd;
    const CropJob& job = jobs[j];
    const unsigned t = a.table_channels == 1 ? 0 : c;
    const std::size_t y = job.y + ((job.flips & kFlipHeight) ? ch - 1 - dy : dy);
    const std::size_t z = job.z + ((job.flips & kFlipDepth) ? cd - 1 - dz : dz);
    const T* src = static_cast<const T*>(a.images) + job.image * volume * a.channels + c * volume + z * plane +
                   y * a.width + job.x;
    float* dst = outs[j] + std::size_t{r} * cw + dx;
    const bool flip = job.flips & kFlipWidth;
    const auto at = [&](unsigned x) { return normalized(src[flip ? cw - 1 - x : x], a, t); };
    if constexpr (V == 4)
      *reinterpret_cast<float4*>(dst) = make_float4(at(dx), at(dx + 1), at(dx + 2), at(dx + 3));
    else if constexpr (V == 2)
      *reinterpret_cast<float2*>(dst) = make_float2(at(dx), at(dx + 1));
    else
      *dst = at(dx);
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
  if (values >= std::size_t{1} << 31)
    throw std::invalid_argument("crop kernel: crops of 2^31 values or more (" + std::to_string(values) + ")");
  a.tile = static_cast<std::uint32_t>(std::clamp<std::size_t>(kTileValues / values, 1, kMaxTile));
  // The widest store every crop's rows allow.
  unsigned vector = a.crop_width % 4 == 0 ? 4 : a.crop_width % 2 == 0 ? 2 : 1;
  for (std::uint32_t o = 0; o < a.output_count; ++o)
    while (reinterpret_cast<std::uintptr_t>(a.outputs[o].out) % (vector * sizeof(float)) != 0) vector /= 2;
  const std::size_t per_crop = values / vector;
  const Divisors dv{Divisor(static_cast<std::uint32_t>(per_crop)), Divisor(a.crop_width / vector),
                    Divisor(a.crop_height), Divisor(a.crop_depth)};
  const dim3 grid((a.count + a.tile - 1) / a.tile,
                  static_cast<unsigned>(std::clamp<std::size_t>(
                      (a.tile * per_crop + kThreads * kUnits - 1) / (kThreads * kUnits), 1, kMaxGridY)));
  auto s = static_cast<cudaStream_t>(stream);
  const auto launch = [&](auto pixel) {
    using T = decltype(pixel);
    if (vector == 4)
      crop_kernel<4, T><<<grid, kThreads, 0, s>>>(a, dv);
    else if (vector == 2)
      crop_kernel<2, T><<<grid, kThreads, 0, s>>>(a, dv);
    else
      crop_kernel<1, T><<<grid, kThreads, 0, s>>>(a, dv);
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
