// SPDX-License-Identifier: Apache-2.0
#include "stoker/stages/dlpack.h"

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace stoker {

namespace {

constexpr std::size_t kMaxDims = 5;  // N, C, D, H, W

// One allocation per tensor, freed by its own deleter, so that the two tensors of a batch may
// be released in either order and on different threads; the buffer itself is shared.
struct ExportedTensor {
  DLManagedTensor managed{};
  std::shared_ptr<const void> storage;  // a batch's Buffer, or a shared Sample
  std::array<std::int64_t, kMaxDims> shape{}, strides{};
};

void delete_exported(DLManagedTensor* self) noexcept {
  if (self) delete static_cast<ExportedTensor*>(self->manager_ctx);
}

DLDataType dl_type(DType t) {
  switch (t) {
    case DType::u8:
      return {kDLUInt, 8, 1};
    case DType::u16:
      return {kDLUInt, 16, 1};
    case DType::f32:
      return {kDLFloat, 32, 1};
  }
  throw std::invalid_argument("to_dlpack: unsupported dtype " + std::to_string(static_cast<int>(t)));
}

// Pinned memory is host memory: kDLCPU, which every consumer takes (dlpack.h says why not
// kDLCUDAHost).
DLDevice dl_device(const BufferPool& pool) noexcept {
  if (pool.memory_kind() == MemoryKind::device) return {kDLCUDA, pool.device_id()};
  return {kDLCPU, 0};
}

// Compact row-major, in elements.
void describe(ExportedTensor& t, std::byte* data, DLDevice device, DLDataType type,
              const std::vector<std::size_t>& dims) noexcept {
  const auto ndim = static_cast<int>(dims.size());
  std::int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    t.shape[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(dims[static_cast<std::size_t>(i)]);
    t.strides[static_cast<std::size_t>(i)] = stride;
    stride *= t.shape[static_cast<std::size_t>(i)];
  }
  DLTensor& d = t.managed.dl_tensor;
  d.data = data;
  d.device = device;
  d.ndim = ndim;
  d.dtype = type;
  d.shape = t.shape.data();
  d.strides = t.strides.data();
  // The offset goes into `data` itself: libtorch's fromDLPack, among others, ignores byte_offset.
  d.byte_offset = 0;
  t.managed.manager_ctx = &t;
  t.managed.deleter = &delete_exported;
}

}  // namespace

DLPackBatch to_dlpack(Batch&& batch, DLPackOptions options) {
  if (batch.storage.empty() || batch.storage.pool() == nullptr)
    throw std::invalid_argument("to_dlpack: the batch has no storage");
  const bool wide_labels = options.labels == LabelType::i64;
  const std::size_t needed =
      wide_labels ? Batch::storage_bytes(batch.shape, batch.dtype, batch.count) : batch.payload_bytes();
  if (batch.storage.size() < needed)
    throw std::invalid_argument("to_dlpack: the batch's storage (" + std::to_string(batch.storage.size()) +
                                " bytes) is smaller than its samples and labels" + (wide_labels ? " and ids" : "") +
                                " (" + std::to_string(needed) + ")");
  const DLDevice device = dl_device(*batch.storage.pool());
  if (wide_labels && device.device_type == kDLCUDA)
    throw std::invalid_argument("to_dlpack: int64 labels are made on the host, and this batch is in device memory");
  const DLDataType type = dl_type(batch.dtype);
  const std::vector<std::size_t> dims = batch.dims();
  const std::vector<std::size_t> label_dims{batch.count};
  if (dims.size() > kMaxDims) throw std::logic_error("to_dlpack: a batch has at most 5 dimensions");

  // Everything that can throw comes before the buffer leaves `batch`.
  auto samples = std::make_unique<ExportedTensor>();
  auto labels = std::make_unique<ExportedTensor>();
  auto storage = std::make_shared<Buffer>();

  std::byte* label_data = reinterpret_cast<std::byte*>(batch.label_values().data());
  DLDataType label_type{kDLInt, 32, 1};
  if (wide_labels) {
    // Over the ids (same size), in place: a signed view of the uint64 slots may alias them.
    auto* wide = reinterpret_cast<std::int64_t*>(batch.id_values().data());
    const std::span<const std::int32_t> narrow = batch.label_values();
    for (std::size_t i = 0; i < batch.count; ++i) wide[i] = narrow[i];
    label_data = reinterpret_cast<std::byte*>(wide);
    label_type = DLDataType{kDLInt, 64, 1};
  }
  *storage = std::move(batch.storage);

  describe(*samples, storage->data(), device, type, dims);
  describe(*labels, label_data, device, label_type, label_dims);
  samples->storage = storage;
  labels->storage = std::move(storage);
  return {&samples.release()->managed, &labels.release()->managed};
}

DLManagedTensor* to_dlpack(std::shared_ptr<const Sample> sample) {
  if (!sample || sample->data.empty()) throw std::invalid_argument("to_dlpack: the sample is empty");
  const Shape& s = sample->shape;
  if (sample->data.size() < s.elements() * dtype_size(sample->dtype))
    throw std::invalid_argument("to_dlpack: the sample's storage is smaller than its shape " + s.str());
  std::vector<std::size_t> dims;
  if (!s.channels_last) dims.push_back(s.channels);
  if (s.volume) dims.push_back(s.depth);
  dims.push_back(s.height);
  dims.push_back(s.width);
  if (s.channels_last) dims.push_back(s.channels);
  auto t = std::make_unique<ExportedTensor>();
  // DLPack's data is mutable; a consumer must leave a shared sample as it is (see the header).
  describe(*t, const_cast<std::byte*>(sample->data.data()), DLDevice{kDLCPU, 0}, dl_type(sample->dtype), dims);
  t->storage = std::move(sample);
  return &t.release()->managed;
}

}  // namespace stoker
