// SPDX-License-Identifier: Apache-2.0
// Batches handed to another framework (libtorch, CuPy, JAX, ...) as DLPack tensors, without a
// copy: the tensors point into the batch's own buffer and hold it until they are released.
//
//   auto t = stoker::to_dlpack(std::move(batch));
//   at::Tensor x = at::fromDLPack(t.samples);  // libtorch now owns t.samples' release
//   at::Tensor y = at::fromDLPack(t.labels);
#pragma once

#include <dlpack/dlpack.h>

#include <cstdint>
#include <memory>

#include "stoker/stages/batch.h"

namespace stoker {

/// A batch as two DLPack tensors over one buffer. The pointers are owned by whoever holds this:
/// each must be released exactly once, by calling its own deleter (`t->deleter(t)`), or by
/// handing it to a consumer that does so (at::fromDLPack, cupy.from_dlpack). A tensor that is
/// neither handed on nor deleted keeps its batch's buffer out of the pool for good.
struct DLPackBatch {
  DLManagedTensor* samples = nullptr;  ///< the batch's dtype, [count, C, (D,) H, W]
  DLManagedTensor* labels = nullptr;   ///< int32 [count], or int64 (DLPackOptions::labels)
};

/// The element type of exported labels.
enum class LabelType : std::uint8_t {
  i32,  ///< the batch's own labels, in place
  i64,  ///< what libtorch's cross_entropy and nll_loss take, and no other
};

struct DLPackOptions {
  /// int64 labels are written, at the export, over the batch's ids, which are not exported and
  /// take exactly as many bytes: still no allocation, and for a batch in pinned memory, labels in
  /// pinned memory too. A batch in device memory has int32 labels only.
  LabelType labels = LabelType::i32;
};

/// Exports `batch` without copying its samples. Takes the batch's buffer (`batch.storage` is
/// empty afterwards): the two tensors share it, and it goes back to its pool once, when the
/// second of the two deleters has run, in either order, from any thread. That may be long after
/// the pipeline that made the batch, and the pool's owner, are gone: the buffer keeps its pool
/// alive until then.
///
/// - `samples`: Batch::dims(), compact row-major with explicit strides (in elements), dtype
///   u8 -> kDLUInt 8, u16 -> kDLUInt 16, f32 -> kDLFloat 32, lanes 1; data is the buffer's
///   start.
/// - `labels`: int32 [count], stride 1; data points at the labels themselves
///   (Batch::labels_offset() into the buffer). With LabelType::i64, int64 [count] where the ids
///   were.
/// - byte_offset is 0 in both: consumers such as libtorch ignore it.
/// - device: where the pool's memory is (BufferPool::memory_kind()): kDLCPU for host memory and
///   for pinned host memory, kDLCUDA for device memory, with BufferPool::device_id(). Pinned
///   memory is host memory that a device copies from asynchronously; DLPack's kDLCUDAHost would
///   say so, but libtorch (1.13: at::fromDLPack, torch.from_dlpack) refuses it, and NumPy and
///   CuPy treat it as host memory anyway. The pool says whether it is pinned
///   (`batch.storage.pool()->memory_kind()`, before the export); a pinned batch's tensors can
///   then be copied to the device with non_blocking=true.
///
/// Throws std::invalid_argument for a batch without storage or with less storage than its
/// samples and labels (with int64 labels: than Batch::storage_bytes()), and for int64 labels of
/// a batch in device memory; std::bad_alloc when out of memory; `batch` is unchanged when it
/// throws. Each tensor may be deleted from any thread.
DLPackBatch to_dlpack(Batch&& batch, DLPackOptions options = {});

/// A sample as one DLPack tensor that shares it: [C, (D,) H, W], or [(D,) H, W, C] when its
/// channels come last, in its dtype, compact row-major, device kDLCPU. The tensor holds `sample`
/// until its deleter runs (on any thread); the sample must not change meanwhile. Throws
/// std::invalid_argument for a null or empty sample.
DLManagedTensor* to_dlpack(std::shared_ptr<const Sample> sample);

}  // namespace stoker
