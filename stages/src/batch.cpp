// SPDX-License-Identifier: Apache-2.0
#include "stoker/stages/batch.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <utility>

#include "stoker/stages/image_transforms.h"

namespace stoker {

namespace {

// Throws unless the samples can make one batch.
void check_batchable(const std::vector<Sample>& in) {
  if (in.empty()) throw std::invalid_argument("make_batch: no samples to batch");
  const Sample& first = in.front();
  for (std::size_t i = 0; i < in.size(); ++i) {
    const Sample& s = in[i];
    if (s.shape != first.shape || s.dtype != first.dtype)
      throw std::invalid_argument("make_batch: sample " + std::to_string(i) + " (id " + std::to_string(s.id) + ") is " +
                                  dtype_name(s.dtype) + " " + s.shape.str() + ", but sample 0 (id " +
                                  std::to_string(first.id) + ") is " + dtype_name(first.dtype) + " " +
                                  first.shape.str() + "; a batch needs one shape and dtype");
    if (s.data.size() != s.shape.elements() * dtype_size(s.dtype))
      throw std::invalid_argument("make_batch: sample " + std::to_string(i) + " (id " + std::to_string(s.id) +
                                  ") holds " + std::to_string(s.data.size()) + " bytes, but its shape " +
                                  s.shape.str() + " of " + dtype_name(s.dtype) + " needs " +
                                  std::to_string(s.shape.elements() * dtype_size(s.dtype)));
  }
}

// A batch's items: samples, or crops still to be cut from their sources.
const Sample& source_of(const Sample& s) noexcept { return s; }
const Sample& source_of(const DeferredCrop& c) noexcept { return *c.source; }
std::uint64_t id_of(const Sample& s) noexcept { return s.id; }
std::uint64_t id_of(const DeferredCrop& c) noexcept { return c.crop.id; }

// The bytes fill() reads of an item: all of a sample; of a crop's source, the span from the
// window's first element to its last in the first channel, at most a few pages.
std::span<const std::byte> read_span(const Sample& s) noexcept { return {s.data.data(), s.data.size()}; }
std::span<const std::byte> read_span(const DeferredCrop& c) noexcept {
  const Shape& s = c.source->shape;
  const Window& w = c.crop.window;
  const std::size_t e = dtype_size(c.source->dtype), row = std::size_t{s.width} * e, plane = s.height * row;
  const std::size_t first = w.z * plane + w.y * row + w.x * e;
  const std::size_t last = (w.z + w.depth - 1) * plane + (w.y + w.height - 1) * row + (w.x + w.width) * e;
  constexpr std::size_t kMost = 16 * 1024;
  const std::size_t size = c.source->data.size();  // a window that does not fit throws later
  if (first >= size || last <= first) return {};
  return {c.source->data.data() + first, std::min({last, size, first + kMost}) - first};
}

// Where a crop's source sample lies is known only once its own struct is read: ask for that a
// step earlier than for the elements.
void prefetch_source(const Sample&) noexcept {}
void prefetch_source(const DeferredCrop& c) noexcept {
  const auto* p = reinterpret_cast<const char*>(c.source.get());
  __builtin_prefetch(p, 0, 0);
  __builtin_prefetch(p + sizeof(Sample) - 1, 0, 0);
}

// Calls fill(i, destination) for every item i, in order, and sets labels and ids.
template <class Item, class Fill>
Batch collate(const std::vector<Item>& in, Shape shape, DType out_type, BufferPool& pool, const StageContext& ctx,
              Fill&& fill) {
  Batch b = Batch::allocate(pool, shape, out_type, in.size(), ctx);
  const std::size_t out_bytes = b.sample_bytes();
  auto labels = b.label_values();
  auto ids = b.id_values();
  // Items that come out of a shuffle buffer were written long ago, by another core, and
  // lie scattered over more memory than the caches hold: ask for the next one while
  // filling from this one, or every item starts with a wait for memory.
  constexpr std::size_t kLine = 64;
  auto prefetch = [&](std::size_t i) {
    if (i >= in.size()) return;
    const std::span<const std::byte> p = read_span(in[i]);
    for (std::size_t offset = 0; offset < p.size(); offset += kLine) __builtin_prefetch(p.data() + offset, 0, 0);
  };
  if (in.size() > 1) prefetch_source(in[1]);
  prefetch(0);
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (i + 2 < in.size()) prefetch_source(in[i + 2]);
    prefetch(i + 1);
    fill(i, b.data() + i * out_bytes);
    labels[i] = source_of(in[i]).label;
    ids[i] = id_of(in[i]);
  }
  return b;
}

Shape crop_shape(const DeferredCrop& c) {
  const Window& w = c.crop.window;
  const Shape& s = c.source->shape;
  return {s.channels, w.depth, w.height, w.width, s.volume, s.channels_last};
}

// Throws unless the crops have sources; returns the shape of the first. Each crop's shape is
// checked against it as the crop is cut (check_like_first), when its source is in cache.
Shape check_batchable(const std::vector<DeferredCrop>& in) {
  if (in.empty()) throw std::invalid_argument("make_batch: no crops to batch");
  for (std::size_t i = 0; i < in.size(); ++i)
    if (!in[i].source)
      throw std::invalid_argument("make_batch: crop " + std::to_string(i) + " (id " + std::to_string(in[i].crop.id) +
                                  ") has no source sample");
  return crop_shape(in.front());
}

void check_like_first(const std::vector<DeferredCrop>& in, std::size_t i) {
  const DeferredCrop &c = in[i], &first = in.front();
  if (crop_shape(c) != crop_shape(first) || c.source->dtype != first.source->dtype)
    throw std::invalid_argument("make_batch: crop " + std::to_string(i) + " (id " + std::to_string(c.crop.id) +
                                ") is " + dtype_name(c.source->dtype) + " " + crop_shape(c).str() +
                                ", but crop 0 (id " + std::to_string(first.crop.id) + ") is " +
                                dtype_name(first.source->dtype) + " " + crop_shape(first).str() +
                                "; a batch needs one shape and dtype");
}

bool channels_last(const std::vector<DeferredCrop>& in) noexcept {
  return !in.empty() && in.front().source && in.front().source->shape.channels_last;
}

// The shape of one sample of a batch of `layout` whose items have `shape`.
Shape batch_shape(const Shape& shape, Layout layout, const Normalizer* normalize) {
  if (normalize) normalize->check(shape, "make_batch");
  if (layout != layout_of(shape) && (shape.volume || shape.depth != 1))
    throw std::invalid_argument(std::string("make_batch: a ") + layout_name(layout) + " batch of " + shape.str() +
                                " volumes; only 2D images change layout");
  Shape out = shape;
  out.channels_last = layout == Layout::channels_last;
  return out;
}

}  // namespace

Batch Batch::allocate(BufferPool& pool, Shape shape, DType dtype, std::size_t count, const StageContext& ctx) {
  Batch b;
  b.shape = shape;
  b.dtype = dtype;
  b.count = count;
  b.storage = pool.acquire(storage_bytes(shape, dtype, count), ctx);
  return b;
}

std::vector<std::size_t> Batch::dims() const {
  std::vector<std::size_t> d{count};
  if (!shape.channels_last) d.push_back(shape.channels);
  if (shape.volume) d.push_back(shape.depth);
  d.push_back(shape.height);
  d.push_back(shape.width);
  if (shape.channels_last) d.push_back(shape.channels);
  return d;
}

Batch make_batch(std::vector<Sample>&& samples, BufferPool& pool, const StageContext& ctx) {
  if (!samples.empty() && samples.front().shape.channels_last)
    return make_batch(std::move(samples), Layout::planar, nullptr, pool, ctx);
  // Consumes the samples whatever happens, as the signature promises.
  const std::vector<Sample> in = std::move(samples);
  check_batchable(in);
  const std::size_t bytes = in.front().data.size();
  return collate(in, in.front().shape, in.front().dtype, pool, ctx, [&in, bytes](std::size_t i, std::byte* out) {
    if (bytes) std::memcpy(out, in[i].data.data(), bytes);
  });
}

Batch make_batch(std::vector<Sample>&& samples, const Normalizer& normalize, BufferPool& pool,
                 const StageContext& ctx) {
  if (!samples.empty() && samples.front().shape.channels_last)
    return make_batch(std::move(samples), Layout::planar, &normalize, pool, ctx);
  const std::vector<Sample> in = std::move(samples);
  check_batchable(in);
  const Shape& shape = in.front().shape;
  normalize.check(shape, "make_batch");
  const Window whole{0, 0, 0, shape.depth, shape.height, shape.width};
  return collate(in, shape, DType::f32, pool, ctx, [&](std::size_t i, std::byte* out) {
    crop_mirror_normalize_into(in[i], whole, {}, normalize, {reinterpret_cast<float*>(out), shape.elements()});
  });
}

Batch make_batch(std::vector<DeferredCrop>&& crops, BufferPool& pool, const StageContext& ctx) {
  if (channels_last(crops)) return make_batch(std::move(crops), Layout::planar, nullptr, pool, ctx);
  const std::vector<DeferredCrop> in = std::move(crops);
  const Shape shape = check_batchable(in);
  const DType dtype = in.front().source->dtype;
  const std::size_t bytes = shape.elements() * dtype_size(dtype);
  return collate(in, shape, dtype, pool, ctx, [&in, bytes](std::size_t i, std::byte* out) {
    check_like_first(in, i);
    crop_mirror_into(*in[i].source, in[i].crop.window, in[i].crop.flips, {out, bytes});
  });
}

Batch make_batch(std::vector<DeferredCrop>&& crops, const Normalizer& normalize, BufferPool& pool,
                 const StageContext& ctx) {
  if (channels_last(crops)) return make_batch(std::move(crops), Layout::planar, &normalize, pool, ctx);
  const std::vector<DeferredCrop> in = std::move(crops);
  const Shape shape = check_batchable(in);
  normalize.check(shape, "make_batch");
  return collate(in, shape, DType::f32, pool, ctx, [&](std::size_t i, std::byte* out) {
    check_like_first(in, i);
    const DeferredCrop& c = in[i];
    crop_mirror_normalize_into(*c.source, c.crop.window, c.crop.flips, normalize,
                               {reinterpret_cast<float*>(out), shape.elements()});
  });
}

Batch make_batch(std::vector<Sample>&& samples, Layout layout, const Normalizer* normalize, BufferPool& pool,
                 const StageContext& ctx) {
  if (!samples.empty() && layout == layout_of(samples.front().shape) && layout == Layout::planar)
    return normalize ? make_batch(std::move(samples), *normalize, pool, ctx)
                     : make_batch(std::move(samples), pool, ctx);
  const std::vector<Sample> in = std::move(samples);
  check_batchable(in);
  const Shape& first = in.front().shape;
  const Shape shape = batch_shape(first, layout, normalize);
  const Window whole{0, 0, 0, 1, first.height, first.width};
  const DType type = normalize ? DType::f32 : in.front().dtype;
  const std::size_t bytes = shape.elements() * dtype_size(type);
  return collate(in, shape, type, pool, ctx, [&](std::size_t i, std::byte* out) {
    crop_image_into(in[i], whole, {}, normalize, layout, {out, bytes});
  });
}

Batch make_batch(std::vector<DeferredCrop>&& crops, Layout layout, const Normalizer* normalize, BufferPool& pool,
                 const StageContext& ctx) {
  if (!channels_last(crops) && layout == Layout::planar)
    return normalize ? make_batch(std::move(crops), *normalize, pool, ctx) : make_batch(std::move(crops), pool, ctx);
  const std::vector<DeferredCrop> in = std::move(crops);
  const Shape shape = batch_shape(check_batchable(in), layout, normalize);
  const DType type = normalize ? DType::f32 : in.front().source->dtype;
  const std::size_t bytes = shape.elements() * dtype_size(type);
  return collate(in, shape, type, pool, ctx, [&](std::size_t i, std::byte* out) {
    check_like_first(in, i);
    const DeferredCrop& c = in[i];
    crop_image_into(*c.source, c.crop.window, c.crop.flips, normalize, layout, {out, bytes});
  });
}

}  // namespace stoker
