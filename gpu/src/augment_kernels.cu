// The crop and gather kernels and their launchers. The host logic is in augment*.cpp.
#include <cuda_runtime.h>

#include <algorithm>

#include "augment_kernels.h"
#include "cuda_check.h"

namespace stoker::gpu::detail {

namespace {

constexpr unsigned kThreads = 128;
constexpr unsigned kMaxGridY = 65535;

// The CPU transform's arithmetic with every rounding spelled out: __fdiv_rn and __fsub_rn
// are IEEE round-to-nearest and can never be contracted or approximated, whatever the
// compiler flags, so the result is the CPU's to the bit.
__device__ __forceinline__ float normalized(float x, const CropArgs& a, unsigned t) {
  return __fdiv_rn(__fsub_rn(__fdiv_rn(x, a.scale), a.mean[t]), a.std[t]);
}
__device__ __forceinline__ float normalized(std::uint8_t v, const CropArgs& a, unsigned t) {
  return a.lut[256u * t + v];
}
__device__ __forceinline__ float normalized(std::uint16_t v, const CropArgs& a, unsigned t) {
  return normalized(static_cast<float>(v), a, t);
}

// One block row (blockIdx.x) per crop; blockIdx.y and the threads stride over its elements,
// consecutive threads on consecutive output elements so that the writes coalesce.
template <class T>
__global__ void crop_kernel(CropArgs a) {
  // Read once per block: the jobs may be in pinned host memory, read across PCIe.
  __shared__ CropJob job;
  if (threadIdx.x == 0) job = a.jobs[blockIdx.x];
  __syncthreads();

  const std::size_t width = a.width, plane = width * a.height, volume = plane * a.depth;
  const T* image = static_cast<const T*>(a.images) + job.image * volume * a.channels;
  const unsigned cw = a.crop_width, ch = a.crop_height, cd = a.crop_depth;
  const std::size_t elements = std::size_t{a.channels} * cd * ch * cw;
  float* out = a.out + job.dst * elements;
  const bool flip_z = job.flips & kFlipDepth, flip_y = job.flips & kFlipHeight, flip_x = job.flips & kFlipWidth;

  for (std::size_t e = std::size_t{blockIdx.y} * blockDim.x + threadIdx.x; e < elements;
       e += std::size_t{gridDim.y} * blockDim.x) {
    std::size_t rest = e;
    const unsigned dx = rest % cw;
    rest /= cw;
    const unsigned dy = rest % ch;
    rest /= ch;
    const unsigned dz = rest % cd;
    const unsigned c = static_cast<unsigned>(rest / cd);
    const std::size_t x = job.x + (flip_x ? cw - 1 - dx : dx);
    const std::size_t y = job.y + (flip_y ? ch - 1 - dy : dy);
    const std::size_t z = job.z + (flip_z ? cd - 1 - dz : dz);
    out[e] = normalized(image[c * volume + z * plane + y * width + x], a, a.table_channels == 1 ? 0 : c);
  }
  if (blockIdx.y == 0 && threadIdx.x == 0) a.labels[job.dst] = job.label;
}

__global__ void gather_kernel(GatherArgs a) {
  __shared__ std::uint32_t slot;
  if (threadIdx.x == 0) slot = a.slots[blockIdx.x];
  __syncthreads();
  const float* from = a.from + slot * a.elements;
  float* out = a.out + blockIdx.x * a.elements;
  for (std::size_t e = std::size_t{blockIdx.y} * blockDim.x + threadIdx.x; e < a.elements;
       e += std::size_t{gridDim.y} * blockDim.x)
    out[e] = from[e];
  if (blockIdx.y == 0 && threadIdx.x == 0) a.labels[blockIdx.x] = a.from_labels[slot];
}

dim3 grid_for(std::uint32_t crops, std::size_t elements) {
  const std::size_t rows = (elements + kThreads - 1) / kThreads;
  return dim3(crops, static_cast<unsigned>(std::min<std::size_t>(std::max<std::size_t>(rows, 1), kMaxGridY)));
}

}  // namespace

void cuda_crop(void* stream, const CropArgs& a) {
  if (a.count == 0) return;
  const std::size_t elements = std::size_t{a.channels} * a.crop_depth * a.crop_height * a.crop_width;
  const dim3 grid = grid_for(a.count, elements);
  auto s = static_cast<cudaStream_t>(stream);
  switch (a.pixel) {
    case PixelType::u8: crop_kernel<std::uint8_t><<<grid, kThreads, 0, s>>>(a); break;
    case PixelType::u16: crop_kernel<std::uint16_t><<<grid, kThreads, 0, s>>>(a); break;
    case PixelType::f32: crop_kernel<float><<<grid, kThreads, 0, s>>>(a); break;
  }
  STOKER_CUDA_CHECK(cudaGetLastError());
}

void cuda_gather(void* stream, const GatherArgs& a) {
  if (a.count == 0) return;
  gather_kernel<<<grid_for(a.count, a.elements), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  STOKER_CUDA_CHECK(cudaGetLastError());
}

}  // namespace stoker::gpu::detail
