// SPDX-License-Identifier: Apache-2.0
#include "stoker/stages/resize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "transform_support.h"

namespace stoker {

namespace {

std::string describe(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// The value written for resampled value v of channel c: normalized float32 (as Normalizer
// computes it), or the pixels' own type, rounded and clamped.
template <class Out>
inline Out convert(float v, std::uint32_t c, const Normalizer* n) {
  if constexpr (std::is_same_v<Out, float>) {
    return n ? (*n)(v, c) : v;
  } else {
    constexpr float top = static_cast<float>(std::numeric_limits<Out>::max());
    return static_cast<Out>(std::clamp(v, 0.0f, top) + 0.5f);
  }
}

// Four floats, for the three channels of an interleaved pixel (the fourth is ignored): one
// multiply and one add per tap for all three. Lane by lane the same IEEE operations as the
// scalar sums, so the same floats.
using Float4 = float __attribute__((vector_size(16)));
inline Float4 load4(const float* p) noexcept {
  Float4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// convert() of four values at once: clamped, rounded to nearest (halves up) and truncated.
using Int4 = std::int32_t __attribute__((vector_size(16)));
template <class Out>
inline Int4 round4(Float4 v) noexcept {
  constexpr float top = static_cast<float>(std::numeric_limits<Out>::max());
  const Float4 zero{}, most = zero + top;
  v = v < zero ? zero : v;
  v = v > most ? most : v;
  return __builtin_convertvector(v + 0.5f, Int4);
}

// A Normalizer's values for three channels, lane by lane: (x / scale - mean) / std.
struct Normalize3 {
  Float4 scale, mean, std;
  explicit Normalize3(const Normalizer& n) {
    const Normalization& o = n.options();
    for (int c = 0; c < 3; ++c) {
      scale[c] = o.scale;
      mean[c] = o.mean[o.mean.size() == 1 ? 0 : static_cast<std::size_t>(c)];
      std[c] = o.std[o.std.size() == 1 ? 0 : static_cast<std::size_t>(c)];
    }
    scale[3] = std[3] = 1.0f, mean[3] = 0.0f;
  }
  Float4 operator()(Float4 v) const noexcept { return (v / scale - mean) / std; }
};

// The vertical pass of one output row: the `count` source rows from row `first` weighted by
// `w` and summed, each of the row's first `n` elements from its first product on.
template <class T>
void sum_rows(const T* src, std::size_t row, std::int32_t first, std::int32_t count, const float* w, std::size_t n,
              float* __restrict line) {
  const T* __restrict r0 = src + static_cast<std::size_t>(first) * row;
  const float w0 = w[0];
  for (std::size_t e = 0; e < n; ++e) line[e] = w0 * static_cast<float>(r0[e]);
  for (std::int32_t k = 1; k < count; ++k) {
    const T* __restrict r = src + static_cast<std::size_t>(first + k) * row;
    const float wk = w[k];
    for (std::size_t e = 0; e < n; ++e) line[e] += wk * static_cast<float>(r[e]);
  }
}

// The horizontal pass of `Rows` output rows at once (their taps along the width are the same,
// so each is looked up once for all), written out: output pixel x of channel c is the column
// sums cols.first[x]... of its row's line (pixel and channel strides as given, the first
// column at index `lo`) weighted and summed from the first product on, converted, and stored
// mirrored and laid out as asked.
template <int Rows, class Out>
void sum_columns(const float* const* lines, std::size_t pixel, std::size_t channel, std::int32_t lo,
                 std::uint32_t channels, const TapsView& cols, const Normalizer* n,
                 const std::optional<Normalize3>& normalize3, bool reversed, Out* const* outs, std::size_t out_pixel,
                 std::size_t out_channel) {
  const std::uint32_t ow = cols.size;
  for (std::uint32_t x = 0; x < ow; ++x) {
    const float* w = cols.weights + std::size_t{x} * cols.stride;
    const std::int32_t count = cols.count[x];
    const std::size_t at = static_cast<std::size_t>(cols.first[x] - lo) * pixel;
    const std::size_t to = std::size_t{reversed ? ow - 1 - x : x} * out_pixel;
    if (channels == 3 && pixel == 3) {  // decoded colour images
      Float4 v[Rows];
      for (int j = 0; j < Rows; ++j) v[j] = w[0] * load4(lines[j] + at);
      for (std::int32_t k = 1; k < count; ++k) {
        const float wk = w[k];
        for (int j = 0; j < Rows; ++j) v[j] += wk * load4(lines[j] + at + 3 * static_cast<std::size_t>(k));
      }
      for (int j = 0; j < Rows; ++j) {
        Out* o = outs[j] + to;
        if constexpr (std::is_same_v<Out, float>) {
          if (normalize3) v[j] = (*normalize3)(v[j]);
          o[0] = v[j][0], o[out_channel] = v[j][1], o[2 * out_channel] = v[j][2];
        } else {
          const Int4 q = round4<Out>(v[j]);
          o[0] = static_cast<Out>(q[0]), o[out_channel] = static_cast<Out>(q[1]);
          o[2 * out_channel] = static_cast<Out>(q[2]);
        }
      }
      continue;
    }
    for (int j = 0; j < Rows; ++j)
      for (std::uint32_t c = 0; c < channels; ++c) {
        const float* q = lines[j] + at + c * channel;
        float v = w[0] * q[0];
        for (std::int32_t k = 1; k < count; ++k) v += w[k] * q[static_cast<std::size_t>(k) * pixel];
        outs[j][to + c * out_channel] = convert<Out>(v, c, n);
      }
  }
}

// The taps must stay inside the image, and their first and last pixels must ascend, as those
// of a resize do: the columns the first and last output pixels read bound all the others'.
void check_taps(const TapsView& t, std::uint32_t extent, const char* axis) {
  if (t.size == 0 || !t.first || !t.count || !t.weights)
    throw std::invalid_argument(std::string("resample_into: no ") + axis + " taps");
  std::int64_t last_first = 0, last_end = 0;
  for (std::uint32_t o = 0; o < t.size; ++o) {
    const std::int64_t first = t.first[o], count = t.count[o];
    if (count < 1 || count > t.stride || first < 0 || first + count > extent)
      throw std::invalid_argument(std::string("resample_into: output ") + axis + " " + std::to_string(o) + " reads " +
                                  std::to_string(count) + " pixels from " + std::to_string(first) + " (at most " +
                                  std::to_string(t.stride) + "), outside the image's " + std::to_string(extent));
    if (first < last_first || first + count < last_end)
      throw std::invalid_argument(std::string("resample_into: output ") + axis + " " + std::to_string(o) +
                                  " reads pixels before those of the one before it");
    last_first = first, last_end = first + count;
  }
}

template <class T, class Out>
void resample(const Sample& in, const TapsView& rows, const TapsView& cols, Flips flips, const Normalizer* n,
              Layout layout, Out* out) {
  const Shape& s = in.shape;
  const std::uint32_t C = s.channels, oh = rows.size, ow = cols.size;
  const bool interleaved = s.channels_last;
  // The columns any output pixel reads: the vertical pass sums those only.
  const std::int32_t lo = cols.first[0], hi = cols.first[ow - 1] + cols.count[ow - 1];
  const auto span = static_cast<std::size_t>(hi - lo);
  const std::size_t plane = std::size_t{s.height} * s.width;
  const std::size_t row = interleaved ? std::size_t{s.width} * C : s.width;
  // The column sums of a block of output rows, each in the source's layout and a float longer:
  // the last pixel's four-float load reads it.
  constexpr int kBlock = 4;
  const std::size_t line = span * C + 1;
  thread_local std::vector<float> sums;
  sums.assign(kBlock * line, 0.0f);
  const float* lines[kBlock];
  Out* outs[kBlock];
  const T* src = in.as<T>().data();
  const std::size_t out_pixel = layout == Layout::channels_last ? C : 1;
  const std::size_t out_channel = layout == Layout::channels_last ? 1 : std::size_t{oh} * ow;
  std::optional<Normalize3> normalize3;
  if (n && C == 3) normalize3.emplace(*n);
  for (std::uint32_t r0 = 0; r0 < oh; r0 += kBlock) {
    const std::uint32_t block = std::min<std::uint32_t>(kBlock, oh - r0);
    for (std::uint32_t j = 0; j < block; ++j) {
      const std::uint32_t r = r0 + j;
      const float* w = rows.weights + std::size_t{r} * rows.stride;
      float* sum = sums.data() + j * line;
      if (interleaved)
        sum_rows(src + static_cast<std::size_t>(lo) * C, row, rows.first[r], rows.count[r], w, span * C, sum);
      else
        for (std::uint32_t c = 0; c < C; ++c)
          sum_rows(src + c * plane + static_cast<std::size_t>(lo), row, rows.first[r], rows.count[r], w, span,
                   sum + c * span);
      lines[j] = sum;
      outs[j] = out + std::size_t{flips.height ? oh - 1 - r : r} * ow * out_pixel;
    }
    const std::size_t pixel = interleaved ? C : 1, channel = interleaved ? 1 : span;
    if (block == kBlock)
      sum_columns<kBlock>(lines, pixel, channel, lo, C, cols, n, normalize3, flips.width, outs, out_pixel, out_channel);
    else
      for (std::uint32_t j = 0; j < block; ++j)
        sum_columns<1>(lines + j, pixel, channel, lo, C, cols, n, normalize3, flips.width, outs + j, out_pixel,
                       out_channel);
  }
}

}  // namespace

const char* layout_name(Layout l) noexcept { return l == Layout::channels_last ? "channels_last" : "planar"; }

ResampleAxis resample_axis(std::uint32_t start, std::uint32_t extent, std::uint32_t size, bool antialias, double scale,
                           std::uint32_t region_start, std::uint32_t region_extent) {
  if (extent == 0 || size == 0)
    throw std::invalid_argument("resample_axis: resizing " + std::to_string(extent) + " pixels to " +
                                std::to_string(size) + ": both must be at least 1");
  if (!(scale > 0.0 && scale <= 1.0))
    throw std::invalid_argument("resample_axis: scale " + describe(scale) + " is not in (0, 1]");
  const double a = start * scale, b = (static_cast<double>(start) + extent) * scale;
  const double lo = std::floor(a), hi = std::ceil(b);
  if (lo < region_start || hi > static_cast<double>(region_start) + region_extent)
    throw std::invalid_argument("resample_axis: the window [" + std::to_string(start) + ", " +
                                std::to_string(start + extent) + ") at scale " + describe(scale) + " reads pixels [" +
                                describe(lo) + ", " + describe(hi) + ") of the scaled image, but the region holds [" +
                                std::to_string(region_start) + ", " + std::to_string(region_start + region_extent) +
                                ")");
  ResampleAxis axis;
  axis.size = size;
  axis.offset = static_cast<std::int32_t>(lo) - static_cast<std::int32_t>(region_start);
  axis.phase = a - lo;
  axis.step = extent * scale / size;
  axis.support = antialias ? std::max(1.0, axis.step) : 1.0;
  axis.lo = axis.offset;
  axis.hi = static_cast<std::int32_t>(hi) - static_cast<std::int32_t>(region_start);
  return axis;
}

TapsView TapsView::of(const std::byte* flat, std::uint32_t size, std::uint32_t stride) noexcept {
  const auto* first = reinterpret_cast<const std::int32_t*>(flat);
  return {first, first + size, reinterpret_cast<const float*>(first + 2 * std::size_t{size}), size, stride};
}

void ResampleTaps::reset(const ResampleAxis& a) {
  if (a.size == 0 || a.lo >= a.hi || !(a.step > 0.0) || !std::isfinite(a.step) || !(a.support >= 1.0) ||
      !std::isfinite(a.support))
    throw std::invalid_argument("ResampleTaps: an axis of size " + std::to_string(a.size) + " reading [" +
                                std::to_string(a.lo) + ", " + std::to_string(a.hi) + ") with step " + describe(a.step) +
                                " and support " + describe(a.support) + " resamples nothing");
  size_ = a.size;
  // floor(c + s + 0.5) - floor(c - s + 0.5) <= ceil(2 s): the most taps a pixel can take.
  stride_ = static_cast<std::uint32_t>(std::ceil(2.0 * a.support));
  first_.resize(size_);
  count_.resize(size_);
  weights_.assign(std::size_t{size_} * stride_, 0.0f);
  const double lo = a.lo - a.offset, hi = a.hi - a.offset;  // relative to the offset, as the centres are
  thread_local std::vector<double> unnormalized;
  unnormalized.resize(stride_);
  double* w = unnormalized.data();
  for (std::uint32_t o = 0; o < size_; ++o) {
    const double centre = a.phase + (static_cast<double>(a.skip) + o + 0.5) * a.step;
    double first = std::max(std::floor(centre - a.support + 0.5), lo);
    double end = std::min(std::floor(centre + a.support + 0.5), hi);
    double total = 0;
    const auto n = static_cast<std::int32_t>(std::max(0.0, end - first));
    for (std::int32_t k = 0; k < n; ++k) {
      w[k] = std::max(0.0, 1.0 - std::abs(first + k + 0.5 - centre) / a.support);
      total += w[k];
    }
    std::int32_t count = n;
    if (total <= 0.0) {  // a centre outside what it may read: the nearest pixel it may
      first = std::clamp(std::floor(centre), lo, hi - 1);
      end = first + 1;
      count = 1;
      w[0] = total = 1.0;
    }
    first_[o] = static_cast<std::int32_t>(first) + a.offset;
    count_[o] = count;
    float* out = weights_.data() + std::size_t{o} * stride_;
    for (std::int32_t k = 0; k < count; ++k) out[k] = static_cast<float>(w[k] / total);
  }
}

void ResampleTaps::write(std::byte* dst) const noexcept {
  std::memcpy(dst, first_.data(), size_ * sizeof(std::int32_t));
  std::memcpy(dst + size_ * sizeof(std::int32_t), count_.data(), size_ * sizeof(std::int32_t));
  std::memcpy(dst + 2 * size_ * sizeof(std::int32_t), weights_.data(), weights_.size() * sizeof(float));
}

void resample_into(const Sample& pixels, const TapsView& rows, const TapsView& cols, Flips flips,
                   const Normalizer* normalize, Layout layout, std::span<std::byte> out) {
  const Shape& s = pixels.shape;
  if (s.volume || s.depth != 1)
    throw std::invalid_argument("resample_into: the sample " + s.str() + " is not a 2D image");
  if (pixels.data.size() != s.elements() * dtype_size(pixels.dtype))
    throw std::invalid_argument("resample_into: the image " + s.str() + " holds " + std::to_string(pixels.data.size()) +
                                " bytes, not " + std::to_string(s.elements() * dtype_size(pixels.dtype)));
  if (normalize) normalize->check(s, "resample_into");
  check_taps(rows, s.height, "row");
  check_taps(cols, s.width, "column");
  const DType type = normalize ? DType::f32 : pixels.dtype;
  const std::size_t need = std::size_t{s.channels} * rows.size * cols.size * dtype_size(type);
  if (out.size() != need)
    throw std::invalid_argument("resample_into: the output holds " + std::to_string(out.size()) + " bytes, " +
                                std::to_string(rows.size) + "x" + std::to_string(cols.size) + "x" +
                                std::to_string(s.channels) + " of " + dtype_name(type) + " need " +
                                std::to_string(need));
  detail::visit_dtype(pixels.dtype, [&]<class T>(T) {
    if (normalize)
      resample<T>(pixels, rows, cols, flips, normalize, layout, reinterpret_cast<float*>(out.data()));
    else
      resample<T>(pixels, rows, cols, flips, nullptr, layout, reinterpret_cast<T*>(out.data()));
  });
}

}  // namespace stoker
