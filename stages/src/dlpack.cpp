#include "stoker/stages/dlpack.h"

#include <array>
#include <cstdint>
#include <memory>
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
  std::shared_ptr<Buffer> storage;
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

DLDevice dl_device(const BufferPool& pool) noexcept {
  switch (pool.memory_kind()) {
    case MemoryKind::pinned:
      return {kDLCUDAHost, pool.device_id()};
    case MemoryKind::device:
      return {kDLCUDA, pool.device_id()};
    case MemoryKind::host:
      break;
  }
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

DLPackBatch to_dlpack(Batch&& batch) {
  if (batch.storage.empty() || batch.storage.pool() == nullptr)
    throw std::invalid_argument("to_dlpack: the batch has no storage");
  if (batch.storage.size() < batch.payload_bytes())
    throw std::invalid_argument("to_dlpack: the batch's storage (" + std::to_string(batch.storage.size()) +
                                " bytes) is smaller than its samples and labels (" +
                                std::to_string(batch.payload_bytes()) + ")");
  const DLDataType type = dl_type(batch.dtype);
  const std::vector<std::size_t> dims = batch.dims();
  const std::vector<std::size_t> label_dims{batch.count};
  if (dims.size() > kMaxDims) throw std::logic_error("to_dlpack: a batch has at most 5 dimensions");
  const std::size_t labels_offset = batch.labels_offset();
  const DLDevice device = dl_device(*batch.storage.pool());

  // Everything that can throw comes before the buffer leaves `batch`.
  auto samples = std::make_unique<ExportedTensor>();
  auto labels = std::make_unique<ExportedTensor>();
  auto storage = std::make_shared<Buffer>();
  *storage = std::move(batch.storage);

  std::byte* base = storage->data();
  describe(*samples, base, device, type, dims);
  describe(*labels, base + labels_offset, device, DLDataType{kDLInt, 32, 1}, label_dims);
  samples->storage = storage;
  labels->storage = std::move(storage);
  return {&samples.release()->managed, &labels.release()->managed};
}

}  // namespace stoker
