// The crop and gather kernels and their launchers. The host logic is in augment*.cpp.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "augment_kernels.h"
#include "cuda_check.h"

namespace stoker::gpu::detail {

namespace {

constexpr unsigned kWarps = 8, kThreads = 32 * kWarps;
constexpr unsigned kMaxGridY = 65535;

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

// One row of a crop: dst[dx] = the normalized src[dx], or src[cw - 1 - dx] mirrored, by the
// lanes of a warp. With `Quads`, each lane writes four consecutive values as one 16-byte store
// (dst on 16 bytes, cw a multiple of 4) after loading all four: a warp moves 512 bytes a store
// and keeps four loads in flight per lane.
template <bool Quads, class T>
__device__ __forceinline__ void crop_row(const T* src, float* dst, unsigned cw, bool flip, const CropArgs& a,
                                         unsigned t, unsigned lane) {
  const auto at = [&](unsigned dx) { return normalized(src[flip ? cw - 1 - dx : dx], a, t); };
  if constexpr (Quads) {
#pragma unroll 2
    for (unsigned q = lane; q < cw / 4; q += 32) {
      const unsigned dx = 4 * q;
      reinterpret_cast<float4*>(dst)[q] = make_float4(at(dx), at(dx + 1), at(dx + 2), at(dx + 3));
    }
  } else {
#pragma unroll 4
    for (unsigned dx = lane; dx < cw; dx += 32) dst[dx] = at(dx);
  }
}

// One block row (blockIdx.x) per crop; each warp copies one row of the crop at a time, its
// lanes on consecutive elements so that reads and writes coalesce, and the row's place in the
// image is worked out once per row rather than once per element.
template <bool Quads, class T>
__global__ void __launch_bounds__(kThreads) crop_kernel(CropArgs a) {
  // Read once per block: the jobs may be in pinned host memory, read across PCIe.
  __shared__ CropJob job;
  if (threadIdx.x == 0) {
    job = a.jobs[blockIdx.x];
    draw_if_asked(a.draws, job);  // a few dozen integer steps, once per block
  }
  __syncthreads();
  // A corrupt job fails the launch (a sticky error the host reports) rather than read or
  // write memory it does not own.
  if (job.image >= a.image_count || job.dst >= a.out_slots) __trap();

  const unsigned cw = a.crop_width, ch = a.crop_height, cd = a.crop_depth;
  const unsigned rows = a.channels * cd * ch;
  const std::size_t plane = std::size_t{a.width} * a.height, volume = plane * a.depth;
  const T* image = static_cast<const T*>(a.images) + job.image * volume * a.channels;
  float* out = a.out + std::size_t{job.dst} * rows * cw;
  const bool flip_z = job.flips & kFlipDepth, flip_y = job.flips & kFlipHeight, flip_x = job.flips & kFlipWidth;

  for (unsigned r = blockIdx.y * kWarps + threadIdx.x / 32; r < rows; r += gridDim.y * kWarps) {
    const unsigned dy = r % ch, dz = r / ch % cd, c = r / ch / cd;
    const std::size_t y = job.y + (flip_y ? ch - 1 - dy : dy);
    const std::size_t z = job.z + (flip_z ? cd - 1 - dz : dz);
    crop_row<Quads>(image + c * volume + z * plane + y * a.width + job.x, out + std::size_t{r} * cw, cw, flip_x, a,
                    a.table_channels == 1 ? 0 : c, threadIdx.x % 32);
  }
  if (blockIdx.y == 0 && threadIdx.x == 0) a.labels[job.dst] = job.label;
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

void cuda_crop(void* stream, const CropArgs& a) {
  if (a.count == 0) return;
  const dim3 grid = grid_for(a.count, std::size_t{a.channels} * a.crop_depth * a.crop_height, kWarps);
  auto s = static_cast<cudaStream_t>(stream);
  const bool quads = a.crop_width % 4 == 0 && reinterpret_cast<std::uintptr_t>(a.out) % 16 == 0;
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
