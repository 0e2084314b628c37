// Batches handed to another framework (libtorch, CuPy, JAX, ...) as DLPack tensors, without a
// copy: the tensors point into the batch's own buffer and hold it until they are released.
//
//   auto t = stoker::to_dlpack(std::move(batch));
//   at::Tensor x = at::fromDLPack(t.samples);  // libtorch now owns t.samples' release
//   at::Tensor y = at::fromDLPack(t.labels);
#pragma once

#include <dlpack/dlpack.h>

#include "stoker/stages/batch.h"

namespace stoker {

/// A batch as two DLPack tensors over one buffer. The pointers are owned by whoever holds this:
/// each must be released exactly once, by calling its own deleter (`t->deleter(t)`), or by
/// handing it to a consumer that does so (at::fromDLPack, cupy.from_dlpack). A tensor that is
/// neither handed on nor deleted keeps its batch's buffer out of the pool for good.
struct DLPackBatch {
  DLManagedTensor* samples = nullptr;  ///< the batch's dtype, [count, C, (D,) H, W]
  DLManagedTensor* labels = nullptr;   ///< int32 [count]
};

/// Exports `batch` without copying. Takes the batch's buffer (`batch.storage` is empty
/// afterwards): the two tensors share it, and it goes back to its pool once, when the second
/// of the two deleters has run, in either order, from any thread. That may be long after the
/// pipeline that made the batch, and the pool's owner, are gone: the buffer keeps its pool
/// alive until then.
///
/// - `samples`: Batch::dims(), compact row-major with explicit strides (in elements), dtype
///   u8 -> kDLUInt 8, u16 -> kDLUInt 16, f32 -> kDLFloat 32, lanes 1; data is the buffer's
///   start.
/// - `labels`: int32 [count], stride 1; data points at the labels themselves
///   (Batch::labels_offset() into the buffer).
/// - byte_offset is 0 in both: consumers such as libtorch ignore it.
/// - device: where the pool's memory is (BufferPool::memory_kind()): kDLCPU for host memory,
///   kDLCUDAHost for pinned memory, kDLCUDA for device memory, with BufferPool::device_id().
///
/// The ids of the batch are not exported (they stay in the buffer, after the labels).
/// Throws std::invalid_argument for a batch without storage or with less storage than its
/// samples and labels, and std::bad_alloc when out of memory; `batch` is unchanged when it
/// throws. Each tensor may be deleted from any thread.
DLPackBatch to_dlpack(Batch&& batch);

}  // namespace stoker
