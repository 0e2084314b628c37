// SPDX-License-Identifier: Apache-2.0
#include "stoker/stages/transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "stoker/stages/image_transforms.h"
#include "transform_support.h"

namespace stoker {

namespace {

using detail::make_normalizer;
using detail::visit_dtype;

std::string sample_desc(const Shape& s, std::uint64_t id) {
  return "sample " + s.str() + " (id " + std::to_string(id) + ")";
}

// The extents of a crop of `size` in `s`, or a message naming `who`'s option and the sizes.
Window extents(const Shape& s, CropSize size, const char* who, std::uint64_t id) {
  if (size.height == 0 || size.width == 0)
    throw std::invalid_argument(std::string(who) + ": crop size " + size.str() + " is empty");
  if (!s.volume && size.depth > 1)
    throw std::invalid_argument(std::string(who) + ": crop size " + size.str() + " has a depth, but " +
                                sample_desc(s, id) + " is 2D");
  Window w;
  w.depth = size.depth == 0 || !s.volume ? s.depth : size.depth;
  w.height = size.height;
  w.width = size.width;
  if (w.depth > s.depth || w.height > s.height || w.width > s.width)
    throw std::invalid_argument(std::string(who) + ": crop size " + size.str() + " is larger than " +
                                sample_desc(s, id));
  return w;
}

void check_window(const Sample& in, const Window& w, const char* who) {
  const Shape& s = in.shape;
  const auto fits = [](std::uint32_t offset, std::uint32_t extent, std::uint32_t size) {
    return extent > 0 && extent <= size && offset <= size - extent;
  };
  if (!fits(w.z, w.depth, s.depth) || !fits(w.y, w.height, s.height) || !fits(w.x, w.width, s.width))
    throw std::invalid_argument(std::string(who) + ": window " + std::to_string(w.depth) + "x" +
                                std::to_string(w.height) + "x" + std::to_string(w.width) + " at (" +
                                std::to_string(w.z) + ", " + std::to_string(w.y) + ", " + std::to_string(w.x) +
                                ") does not fit in " + sample_desc(s, in.id));
  if (in.data.size() != s.elements() * dtype_size(in.dtype))
    throw std::invalid_argument(std::string(who) + ": " + sample_desc(s, in.id) + " of " + dtype_name(in.dtype) +
                                " holds " + std::to_string(in.data.size()) + " bytes, not " +
                                std::to_string(s.elements() * dtype_size(in.dtype)));
}

Shape window_shape(const Shape& s, const Window& w) {
  return {s.channels, w.depth, w.height, w.width, s.volume, s.channels_last};
}

// Calls row(channel, source row) for every row of the window, in the order the output is
// laid out, the source rows taken back to front along the flipped axes. Each row starts at
// the window's first column; reversing along width is the row kernel's business.
template <class T, class Row>
inline void for_each_row(const T* src, const Shape& s, const Window& w, Flips f, Row&& row) {
  const std::size_t W = s.width, plane = std::size_t{s.height} * W, volume = plane * s.depth;
  for (std::uint32_t c = 0; c < s.channels; ++c) {
    const T* channel = src + c * volume;
    for (std::uint32_t dz = 0; dz < w.depth; ++dz) {
      const std::size_t z = f.depth ? w.z + w.depth - 1 - dz : w.z + dz;
      const T* slab = channel + z * plane + w.x;
      for (std::uint32_t dy = 0; dy < w.height; ++dy) {
        const std::size_t y = f.height ? w.y + w.height - 1 - dy : w.y + dy;
        row(c, slab + y * W);
      }
    }
  }
}

template <class T>
void copy_window(const Sample& in, const Window& w, Flips f, T* out) {
  const std::size_t n = w.width;
  for_each_row(in.as<T>().data(), in.shape, w, f, [&](std::uint32_t, const T* row) {
    if (f.width)
      std::reverse_copy(row, row + n, out);
    else
      std::memcpy(out, row, n * sizeof(T));
    out += n;
  });
}

// Row kernels of the fused path. Plain loops over restrict pointers, so that the compiler
// keeps everything in registers and unrolls them.
inline void lut_row(const std::uint8_t* __restrict src, const float* __restrict lut, float* __restrict dst,
                    std::size_t n, bool reversed) noexcept {
  if (reversed) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = lut[src[n - 1 - i]];
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = lut[src[i]];
  }
}

template <class T>
inline void arithmetic_row(const T* __restrict src, const Normalizer& norm, std::uint32_t c, float* __restrict dst,
                           std::size_t n, bool reversed) noexcept {
  if (reversed) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = norm(static_cast<float>(src[n - 1 - i]), c);
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = norm(static_cast<float>(src[i]), c);
  }
}

// The fused kernel: one pass, each output element written once.
template <class T>
void normalize_window(const Sample& in, const Window& w, Flips f, const Normalizer& norm, float* out) {
  const std::size_t n = w.width;
  const T* src = in.as<T>().data();
  for_each_row(src, in.shape, w, f, [&norm, &out, n, reversed = f.width](std::uint32_t c, const T* row) {
    if constexpr (std::is_same_v<T, std::uint8_t>)
      lut_row(row, norm.table(c), out, n, reversed);
    else
      arithmetic_row(row, norm, c, out, n, reversed);
    out += n;
  });
}

// A crop of `in` with `flips` applied, same dtype, one pass.
Sample crop_flipped(const Sample& in, const Window& w, Flips f, BufferPool& pool, std::uint64_t id) {
  if (in.shape.channels_last) return crop_image(in, w, f, nullptr, Layout::channels_last, pool, id);
  Sample out(pool, window_shape(in.shape, w), in.dtype, in.label, id);
  visit_dtype(in.dtype, [&]<class T>(T) { copy_window<T>(in, w, f, out.as<T>().data()); });
  return out;
}

Sample fused(const Sample& in, const Window& w, Flips f, const Normalizer& n, BufferPool& pool, std::uint64_t id) {
  if (in.shape.channels_last) return crop_image(in, w, f, &n, Layout::channels_last, pool, id);
  Sample out(pool, window_shape(in.shape, w), DType::f32, in.label, id);
  visit_dtype(in.dtype, [&]<class T>(T) { normalize_window<T>(in, w, f, n, out.as<float>().data()); });
  return out;
}

template <class T>
void reverse_axis(Sample& s, Axis axis) {
  T* p = s.as<T>().data();
  const Shape& sh = s.shape;
  // Along any axis the array is (outer blocks) x (length of the axis) x (inner runs): reversing
  // the axis swaps whole inner runs within each block.
  std::size_t outer = 0, length = 0, inner = 0;
  switch (axis) {
    case Axis::depth:
      outer = sh.channels, length = sh.depth, inner = std::size_t{sh.height} * sh.width;
      break;
    case Axis::height:
      outer = std::size_t{sh.channels} * sh.depth, length = sh.height, inner = sh.width;
      break;
    case Axis::width:
      outer = std::size_t{sh.channels} * sh.depth * sh.height, length = sh.width, inner = 1;
      break;
  }
  // Channels last, a pixel's channels lie together: whole pixels are the runs that move.
  if (sh.channels_last) outer /= sh.channels, inner *= sh.channels;
  for (std::size_t o = 0; o < outer; ++o) {
    T* block = p + o * length * inner;
    if (inner == 1) {
      std::reverse(block, block + length);
      continue;
    }
    for (std::size_t a = 0, b = length - 1; a < b; ++a, --b)
      std::swap_ranges(block + a * inner, block + (a + 1) * inner, block + b * inner);
  }
}

MirrorOptions checked(MirrorOptions m, const char* who) {
  if (!(m.p >= 0.0 && m.p <= 1.0))
    throw std::invalid_argument(std::string(who) + ": mirror probability p = " + std::to_string(m.p) +
                                " is not in [0, 1]");
  if (m.axis != Axis::depth && m.axis != Axis::height && m.axis != Axis::width)
    throw std::invalid_argument(std::string(who) + ": mirror axis " + std::to_string(static_cast<int>(m.axis)) +
                                " is not depth, height or width");
  return m;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

std::string CropSize::str() const {
  std::string s;
  if (depth) s = std::to_string(depth) + "x";
  return s + std::to_string(height) + "x" + std::to_string(width);
}

const char* axis_name(Axis a) noexcept {
  switch (a) {
    case Axis::depth:
      return "depth";
    case Axis::height:
      return "height";
    case Axis::width:
      return "width";
  }
  return "?";
}

Window random_window(const Shape& s, CropSize size, Rng& rng) {
  Window w = extents(s, size, "random_window", 0);
  w.z = static_cast<std::uint32_t>(rng.below(s.depth - w.depth + 1ull));
  w.y = static_cast<std::uint32_t>(rng.below(s.height - w.height + 1ull));
  w.x = static_cast<std::uint32_t>(rng.below(s.width - w.width + 1ull));
  return w;
}

Window center_window(const Shape& s, CropSize size) {
  Window w = extents(s, size, "center_window", 0);
  w.z = (s.depth - w.depth) / 2;
  w.y = (s.height - w.height) / 2;
  w.x = (s.width - w.width) / 2;
  return w;
}

// ---------------------------------------------------------------------------------------------

Normalizer::Normalizer(Normalization n) : options_(std::move(n)) {
  const auto& o = options_;
  if (!std::isfinite(o.scale) || o.scale == 0.0f)
    throw std::invalid_argument("normalize: scale = " + std::to_string(o.scale) + " must be finite and non-zero");
  if (o.mean.empty() || o.std.empty())
    throw std::invalid_argument("normalize: mean and std need at least one value each");
  if (o.mean.size() != o.std.size() && o.mean.size() != 1 && o.std.size() != 1)
    throw std::invalid_argument("normalize: " + std::to_string(o.mean.size()) + " means but " +
                                std::to_string(o.std.size()) + " stds; give one value or one per channel");
  for (float s : o.std)
    if (!std::isfinite(s) || s == 0.0f)
      throw std::invalid_argument("normalize: std = " + std::to_string(s) + " must be finite and non-zero");
  for (float m : o.mean)
    if (!std::isfinite(m)) throw std::invalid_argument("normalize: mean = " + std::to_string(m) + " is not finite");
  const std::size_t channels = std::max(o.mean.size(), o.std.size());
  per_channel_ = channels > 1;
  scale_ = o.scale;
  for (std::size_t c = 0; c < channels; ++c) {
    mean_.push_back(o.mean[o.mean.size() == 1 ? 0 : c]);
    std_.push_back(o.std[o.std.size() == 1 ? 0 : c]);
  }
  lut_.resize(256 * channels);
  for (std::size_t c = 0; c < channels; ++c)
    for (int v = 0; v < 256; ++v) lut_[256 * c + static_cast<std::size_t>(v)] = (*this)(static_cast<float>(v), c);
}

void Normalizer::check(const Shape& s, const char* who) const {
  if (per_channel_ && mean_.size() != s.channels)
    throw std::invalid_argument(std::string(who) + ": normalize has values for " + std::to_string(mean_.size()) +
                                " channels, but the sample " + s.str() + " has " + std::to_string(s.channels));
}

// ---------------------------------------------------------------------------------------------

Sample crop(const Sample& in, const Window& window, BufferPool& pool) {
  check_window(in, window, "crop");
  return crop_flipped(in, window, {}, pool, in.id);
}

void mirror(Sample& s, Axis axis) {
  checked(MirrorOptions{.axis = axis, .p = 1.0}, "mirror");
  check_window(s, Window{0, 0, 0, s.shape.depth, s.shape.height, s.shape.width}, "mirror");
  visit_dtype(s.dtype, [&]<class T>(T) { reverse_axis<T>(s, axis); });
}

Sample normalize(Sample in, const Normalizer& n, BufferPool& pool) {
  const Shape& s = in.shape;
  n.check(s, "normalize");
  check_window(in, Window{0, 0, 0, s.depth, s.height, s.width}, "normalize");
  if (in.dtype == DType::f32 && s.channels_last) {
    float* p = in.as<float>().data();
    for (std::size_t i = 0, pixels = std::size_t{s.depth} * s.height * s.width; i < pixels; ++i)
      for (std::uint32_t c = 0; c < s.channels; ++c, ++p) *p = n(*p, c);
    return in;
  }
  if (in.dtype == DType::f32 && !in.data.is_view()) {  // a view is normalized into a copy, in one pass
    const std::size_t per_channel = std::size_t{s.depth} * s.height * s.width;
    float* p = in.as<float>().data();
    for (std::uint32_t c = 0; c < s.channels; ++c)
      for (std::size_t i = 0; i < per_channel; ++i, ++p) *p = n(*p, c);
    return in;
  }
  return fused(in, Window{0, 0, 0, s.depth, s.height, s.width}, {}, n, pool, in.id);
}

Sample crop_mirror_normalize(const Sample& in, const Window& window, Flips flips, const Normalizer& n,
                             BufferPool& pool) {
  n.check(in.shape, "crop_mirror_normalize");
  check_window(in, window, "crop_mirror_normalize");
  return fused(in, window, flips, n, pool, in.id);
}

void crop_mirror_normalize_into(const Sample& in, const Window& window, Flips flips, const Normalizer& n,
                                std::span<float> out) {
  if (in.shape.channels_last)
    return crop_image_into(in, window, flips, &n, Layout::channels_last, std::as_writable_bytes(out));
  n.check(in.shape, "crop_mirror_normalize_into");
  check_window(in, window, "crop_mirror_normalize_into");
  const std::size_t need = window_shape(in.shape, window).elements();
  if (out.size() != need)
    throw std::invalid_argument("crop_mirror_normalize_into: output holds " + std::to_string(out.size()) +
                                " floats, the crop needs " + std::to_string(need));
  visit_dtype(in.dtype, [&]<class T>(T) { normalize_window<T>(in, window, flips, n, out.data()); });
}

void crop_mirror_into(const Sample& in, const Window& window, Flips flips, std::span<std::byte> out) {
  if (in.shape.channels_last) return crop_image_into(in, window, flips, nullptr, Layout::channels_last, out);
  check_window(in, window, "crop_mirror_into");
  const std::size_t need = window_shape(in.shape, window).elements() * dtype_size(in.dtype);
  if (out.size() != need)
    throw std::invalid_argument("crop_mirror_into: output holds " + std::to_string(out.size()) +
                                " bytes, the crop needs " + std::to_string(need));
  visit_dtype(in.dtype, [&]<class T>(T) { copy_window<T>(in, window, flips, reinterpret_cast<T*>(out.data())); });
}

// ---------------------------------------------------------------------------------------------

RandomCrops::RandomCrops(RandomCropOptions options)
    : options_(std::move(options)), normalizer_(make_normalizer(options_.normalize, "RandomCrops")) {
  auto& o = options_;
  if (o.size.height == 0 || o.size.width == 0)
    throw std::invalid_argument("RandomCrops: option size " + o.size.str() + " is empty");
  if (o.count < 1)
    throw std::invalid_argument("RandomCrops: option count = " + std::to_string(o.count) +
                                " must be at least 1 (with count_of, it is the most count_of may return)");
  if (o.mirror) o.mirror = checked(*o.mirror, "RandomCrops");
  if (!o.pool) o.pool = BufferPool::create();
}

template <class F>
void RandomCrops::draw(const Sample& in, const StageContext& ctx, F&& f) const {
  const auto& o = options_;
  if (normalizer_) normalizer_->check(in.shape, "RandomCrops");
  Window w = extents(in.shape, o.size, "RandomCrops", in.id);
  Rng rng = sample_rng(ctx, in.id, o.salt);
  int n = o.count;
  if (o.count_of) {
    n = o.count_of(in, rng);
    if (n < 0 || n > o.count)
      throw std::invalid_argument("RandomCrops: count_of gave " + std::to_string(n) + " crops for " +
                                  sample_desc(in.shape, in.id) + ", outside [0, count = " + std::to_string(o.count) +
                                  "]");
  }
  // `f` may move `in` away: what the draws need is copied first.
  const Shape shape = in.shape;
  const std::uint64_t first_id = in.id * static_cast<std::uint64_t>(o.count);
  for (int k = 0; k < n; ++k) {
    w.z = static_cast<std::uint32_t>(rng.below(shape.depth - w.depth + 1ull));
    w.y = static_cast<std::uint32_t>(rng.below(shape.height - w.height + 1ull));
    w.x = static_cast<std::uint32_t>(rng.below(shape.width - w.width + 1ull));
    const std::uint64_t id = first_id + static_cast<std::uint64_t>(k);
    Flips flips;
    if (o.mirror) {
      Rng mirror_rng = sample_rng(ctx, id, o.mirror->salt);
      if (mirror_rng.bernoulli(o.mirror->p)) flips = Flips::along(o.mirror->axis);
    }
    f(PlannedCrop{w, flips, id});
  }
}

void RandomCrops::plan(const Sample& in, const StageContext& ctx, std::vector<PlannedCrop>& out) const {
  draw(in, ctx, [&](const PlannedCrop& c) { out.push_back(c); });
}

std::vector<PlannedCrop> RandomCrops::plan(const Sample& in, const StageContext& ctx) const {
  std::vector<PlannedCrop> out;
  plan(in, ctx, out);
  return out;
}

template <class Emit>
void RandomCrops::cut(const Sample& in, const StageContext& ctx, Emit&& emit) const {
  draw(in, ctx, [&](const PlannedCrop& c) {
    check_window(in, c.window, "RandomCrops");  // the planned crop fits; this checks the data
    if (normalizer_)
      emit(fused(in, c.window, c.flips, *normalizer_, *options_.pool, c.id));
    else
      emit(crop_flipped(in, c.window, c.flips, *options_.pool, c.id));
  });
}

void RandomCrops::operator()(Sample in, Emitter<Sample>& emit, const StageContext& ctx) const {
  cut(in, ctx, [&](Sample&& s) { emit(std::move(s)); });
}

void RandomCrops::operator()(Sample in, Emitter<DeferredCrop>& emit, const StageContext& ctx) const {
  if (normalizer_)
    throw std::invalid_argument(
        "RandomCrops: option normalize does not apply to deferred crops; give it to Collate (.normalize)");
  const Sample* entry = in.viewed();
  std::shared_ptr<const Sample> source;
  draw(in, ctx, [&](const PlannedCrop& c) {
    if (!source) {
      check_window(in, c.window, "RandomCrops");  // checks the data, which all crops share
      // An entry lives as long as its data set: its crops point at it and share nothing, so no
      // crop counts references on its way to Collate, and nothing is allocated. Any other
      // sample moves to the heap, shared by its crops.
      source = entry ? std::shared_ptr<const Sample>(std::shared_ptr<const Sample>{}, entry)
                     : std::make_shared<const Sample>(std::move(in));
    }
    emit(DeferredCrop{source, c});
  });
}

std::vector<Sample> RandomCrops::apply(const Sample& in, const StageContext& ctx) const {
  std::vector<Sample> out;
  cut(in, ctx, [&](Sample&& s) { out.push_back(std::move(s)); });
  return out;
}

CenterCrop::CenterCrop(CenterCropOptions options)
    : options_(std::move(options)), normalizer_(make_normalizer(options_.normalize, "CenterCrop")) {
  if (options_.size.height == 0 || options_.size.width == 0)
    throw std::invalid_argument("CenterCrop: option size " + options_.size.str() + " is empty");
  if (!options_.pool) options_.pool = BufferPool::create();
}

Sample CenterCrop::operator()(Sample in) const {
  if (normalizer_) normalizer_->check(in.shape, "CenterCrop");
  Window w = extents(in.shape, options_.size, "CenterCrop", in.id);
  w.z = (in.shape.depth - w.depth) / 2;
  w.y = (in.shape.height - w.height) / 2;
  w.x = (in.shape.width - w.width) / 2;
  check_window(in, w, "CenterCrop");
  if (normalizer_) return fused(in, w, {}, *normalizer_, *options_.pool, in.id);
  return crop_flipped(in, w, {}, *options_.pool, in.id);
}

RandomMirror::RandomMirror(MirrorOptions options) : options_(checked(options, "RandomMirror")) {}

Sample RandomMirror::operator()(Sample in, const StageContext& ctx) const {
  if (draw(ctx, in.id)) mirror(in, options_.axis);
  return in;
}

Normalize::Normalize(Normalization n, std::shared_ptr<BufferPool> pool)
    : normalizer_(*make_normalizer(std::move(n), "Normalize")), pool_(pool ? std::move(pool) : BufferPool::create()) {}

Sample Normalize::operator()(Sample in) const { return normalize(std::move(in), normalizer_, *pool_); }

}  // namespace stoker
