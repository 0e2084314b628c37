// SPDX-License-Identifier: Apache-2.0
// The resized-crop kernel and its launcher. The host logic is in image_augment.cpp.
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda_check.h"
#include "resize_kernels.h"

namespace stoker::gpu::detail {

namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kMaxGridY = 65535;

// resample_into's arithmetic with every rounding spelled out, so that no compiler flag
// contracts a multiply and an add into one rounding: the sums of the CPU's, taps in its order.
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }

// One axis's taps in TapsView's flat layout: first[size], count[size], weights[size][stride].
struct Taps {
  const std::int32_t* first;
  const std::int32_t* count;
  const float* weights;
  __device__ Taps(const std::byte* flat, unsigned size) {
    first = reinterpret_cast<const std::int32_t*>(flat);
    count = first + size;
    weights = reinterpret_cast<const float*>(count + size);
  }
};

// A thread per output pixel, all its channels; a block row per crop. Each output value is the
// CPU's: each source column's taps along the height summed, then those column sums weighted
// and summed along the width, every sum from its first product on, in order; then normalized.
template <unsigned C>
__global__ void __launch_bounds__(kThreads) resized_crop_kernel(ResizeArgs a, unsigned channels) {
  const ResizeJob job = a.jobs[blockIdx.y];
  const unsigned oh = a.out_height, ow = a.out_width;
  const unsigned p = blockIdx.x * kThreads + threadIdx.x;
  // A job that points outside the buffer fails the launch (a sticky error the host reports)
  // rather than read memory it does not own.
  const std::size_t image_bytes = std::size_t{job.height} * job.width * channels;
  const std::size_t row_taps = std::size_t{oh} * (8 + 4 * std::size_t{job.row_stride});
  const std::size_t col_taps = std::size_t{ow} * (8 + 4 * std::size_t{job.col_stride});
  if (job.pixels > a.bytes || image_bytes > a.bytes - job.pixels || job.rows > a.bytes ||
      row_taps > a.bytes - job.rows || job.cols > a.bytes || col_taps > a.bytes - job.cols || job.rows % 4 != 0 ||
      job.cols % 4 != 0)
    __trap();
  if (p == 0) a.labels[blockIdx.y] = job.label;
  if (p >= oh * ow) return;
  const unsigned r = p / ow, x = p - r * ow;
  const Taps rows(a.base + job.rows, oh), cols(a.base + job.cols, ow);
  const int fy = rows.first[r], ny = rows.count[r], fx = cols.first[x], nx = cols.count[x];
  if (fy < 0 || ny < 1 || ny > static_cast<int>(job.row_stride) || fy + ny > static_cast<int>(job.height) || fx < 0 ||
      nx < 1 || nx > static_cast<int>(job.col_stride) || fx + nx > static_cast<int>(job.width))
    __trap();
  const float* wy = rows.weights + std::size_t{r} * job.row_stride;
  const float* wx = cols.weights + std::size_t{x} * job.col_stride;
  const std::uint8_t* image = reinterpret_cast<const std::uint8_t*>(a.base + job.pixels);
  const std::size_t pixel = job.channels_last ? channels : 1;
  const std::size_t plane = job.channels_last ? 1 : std::size_t{job.height} * job.width;
  const std::size_t row = std::size_t{job.width} * pixel;

  // The channel count known when compiled for 1 and 3, so that the sums stay in registers.
  const unsigned n = C < kMaxResizeChannels ? C : channels;
  float acc[C];
  for (int kx = 0; kx < nx; ++kx) {
    // The column's taps along the height, then the column's weight: as resample_into sums.
    const std::uint8_t* src = image + std::size_t(fy) * row + std::size_t(fx + kx) * pixel;
    float h[C];
    const float w0 = __ldg(wy);
    for (unsigned c = 0; c < n; ++c) h[c] = mul(w0, static_cast<float>(__ldg(src + c * plane)));
    for (int ky = 1; ky < ny; ++ky) {
      src += row;
      const float w = __ldg(wy + ky);
      for (unsigned c = 0; c < n; ++c) h[c] = add(h[c], mul(w, static_cast<float>(__ldg(src + c * plane))));
    }
    const float w = __ldg(wx + kx);
    for (unsigned c = 0; c < n; ++c) acc[c] = kx == 0 ? mul(w, h[c]) : add(acc[c], mul(w, h[c]));
  }
  const std::size_t dy = (job.flips & kFlipHeight) ? oh - 1 - r : r;
  const std::size_t dx = (job.flips & kFlipWidth) ? ow - 1 - x : x;
  const std::size_t values = std::size_t{oh} * ow;
  float* out = a.out + std::size_t{blockIdx.y} * values * n;
  for (unsigned c = 0; c < n; ++c) {
    const float v = __fdiv_rn(__fsub_rn(__fdiv_rn(acc[c], a.scale), a.mean[c]), a.std[c]);
    if (a.channels_last)
      out[(dy * ow + dx) * n + c] = v;
    else
      out[c * values + dy * ow + dx] = v;
  }
}

}  // namespace

void cuda_resized_crop(void* stream, const ResizeArgs& a) {
  if (a.count == 0) return;
  if (a.count > kMaxGridY || a.channels == 0 || a.channels > kMaxResizeChannels)
    throw std::invalid_argument("resized crop kernel: " + std::to_string(a.count) + " crops of " +
                                std::to_string(a.channels) + " channels (at most 65535 of 1 to 4)");
  const std::size_t pixels = std::size_t{a.out_height} * a.out_width;
  if (pixels == 0 || pixels >= std::size_t{1} << 31)
    throw std::invalid_argument("resized crop kernel: outputs of " + std::to_string(pixels) + " pixels");
  const dim3 grid(static_cast<unsigned>((pixels + kThreads - 1) / kThreads), a.count);
  auto s = static_cast<cudaStream_t>(stream);
  if (a.channels == 1)
    resized_crop_kernel<1><<<grid, kThreads, 0, s>>>(a, 1);
  else if (a.channels == 3)
    resized_crop_kernel<3><<<grid, kThreads, 0, s>>>(a, 3);
  else
    resized_crop_kernel<kMaxResizeChannels><<<grid, kThreads, 0, s>>>(a, a.channels);
  STOKER_CUDA_CHECK(cudaGetLastError());
}

}  // namespace stoker::gpu::detail
