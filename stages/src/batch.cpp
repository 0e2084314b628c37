#include "stoker/stages/batch.h"

#include <cstring>
#include <utility>

namespace stoker {

namespace {

// Throws unless the samples can make one batch.
void check_batchable(const std::vector<Sample>& in) {
  if (in.empty()) throw std::invalid_argument("make_batch: no samples to batch");
  const Sample& first = in.front();
  for (std::size_t i = 0; i < in.size(); ++i) {
    const Sample& s = in[i];
    if (s.shape != first.shape || s.dtype != first.dtype)
      throw std::invalid_argument("make_batch: sample " + std::to_string(i) + " (id " + std::to_string(s.id) +
                                  ") is " + dtype_name(s.dtype) + " " + s.shape.str() + ", but sample 0 (id " +
                                  std::to_string(first.id) + ") is " + dtype_name(first.dtype) + " " +
                                  first.shape.str() + "; a batch needs one shape and dtype");
    if (s.data.size() != s.shape.elements() * dtype_size(s.dtype))
      throw std::invalid_argument("make_batch: sample " + std::to_string(i) + " (id " + std::to_string(s.id) +
                                  ") holds " + std::to_string(s.data.size()) + " bytes, but its shape " +
                                  s.shape.str() + " of " + dtype_name(s.dtype) + " needs " +
                                  std::to_string(s.shape.elements() * dtype_size(s.dtype)));
  }
}

// Calls fill(i, sample, destination) for every sample and sets labels and ids.
template <class Fill>
Batch collate(const std::vector<Sample>& in, DType out_type, BufferPool& pool, Fill&& fill) {
  Batch b = Batch::allocate(pool, in.front().shape, out_type, in.size());
  const std::size_t in_bytes = in.front().data.size(), out_bytes = b.sample_bytes();
  auto labels = b.label_values();
  auto ids = b.id_values();
  // Samples that come out of a shuffle buffer were written long ago, by another core, and
  // lie scattered over more memory than the caches hold: ask for the next one while
  // filling from this one, or every sample starts with a wait for memory.
  constexpr std::size_t kLine = 64;
  auto prefetch = [&](std::size_t i) {
    if (i >= in.size()) return;
    const std::byte* p = in[i].data.data();
    for (std::size_t offset = 0; offset < in_bytes; offset += kLine) __builtin_prefetch(p + offset, 0, 0);
  };
  prefetch(0);
  for (std::size_t i = 0; i < in.size(); ++i) {
    prefetch(i + 1);
    fill(in[i], b.data() + i * out_bytes);
    labels[i] = in[i].label;
    ids[i] = in[i].id;
  }
  return b;
}

}  // namespace

Batch Batch::allocate(BufferPool& pool, Shape shape, DType dtype, std::size_t count) {
  Batch b;
  b.shape = shape;
  b.dtype = dtype;
  b.count = count;
  b.storage = pool.acquire(storage_bytes(shape, dtype, count));
  return b;
}

std::vector<std::size_t> Batch::dims() const {
  std::vector<std::size_t> d{count, shape.channels};
  if (shape.volume) d.push_back(shape.depth);
  d.push_back(shape.height);
  d.push_back(shape.width);
  return d;
}

Batch make_batch(std::vector<Sample>&& samples, BufferPool& pool) {
  // Consumes the samples whatever happens, as the signature promises.
  const std::vector<Sample> in = std::move(samples);
  check_batchable(in);
  return collate(in, in.front().dtype, pool, [bytes = in.front().data.size()](const Sample& s, std::byte* out) {
    if (bytes) std::memcpy(out, s.data.data(), bytes);
  });
}

Batch make_batch(std::vector<Sample>&& samples, const Normalizer& normalize, BufferPool& pool) {
  const std::vector<Sample> in = std::move(samples);
  check_batchable(in);
  const Shape& shape = in.front().shape;
  normalize.check(shape, "make_batch");
  const Window whole{0, 0, 0, shape.depth, shape.height, shape.width};
  return collate(in, DType::f32, pool, [&](const Sample& s, std::byte* out) {
    crop_mirror_normalize_into(s, whole, {}, normalize, {reinterpret_cast<float*>(out), shape.elements()});
  });
}

}  // namespace stoker
