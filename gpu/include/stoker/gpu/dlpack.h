// SPDX-License-Identifier: Apache-2.0
// Device batches handed to another framework as DLPack tensors, without a copy.
//
//   // The framework's stream, as stoker sees it (at::cuda::getCurrentCUDAStream().stream(); its
//   // default stream is the null stream, CUDA's legacy default one: 1 in DLPack's numbering).
//   auto consumer = device->borrow_stream(torch_stream ? reinterpret_cast<std::uintptr_t>(torch_stream) : 1);
//   for (auto& b : pipe.epoch()) {
//     b.use_on(*consumer);  // the framework's stream waits for the copy; the host does not
//     auto t = stoker::to_dlpack(std::move(b));
//     at::Tensor x = at::fromDLPack(t.samples), y = at::fromDLPack(t.labels);
//     train_step(x, y);
//   }  // x and y go: the buffer comes back once the consumer's stream has passed that point
#pragma once

#include "stoker/gpu/staging.h"
#include "stoker/stages/dlpack.h"

namespace stoker {

/// Exports a device batch without copying: `samples` in the batch's dtype (float32 from
/// ToDevice of a normalized batch and from GpuAugment), [count, C, (D,) H, W], and `labels`,
/// int32 [count], both in the batch's device buffer, laid out as in to_dlpack(Batch&&).
/// Device: kDLCUDA with the device's id on the CUDA backend, kDLCPU on the CPU backend (its
/// device memory is host memory).
///
/// Ownership: takes the buffer (`batch` is empty afterwards; its host_labels stay). The two
/// tensors share it and each must be released exactly once by calling its deleter, directly
/// or through the framework it was handed to. The buffer goes back to its device pool when the
/// second deleter runs, once the work that filled it (ready()) has passed and, on every stream
/// the batch was used on (DeviceBatch::use_on, before the export) and every stream named to
/// its pool since (SlotPool::record_stream, the DLPack stream protocol's consumer stream), the
/// work issued up to that release: as PyTorch's record_stream, so that the consumer may free
/// the tensors while its kernels are still queued. Tensors held count against the device pool
/// as DeviceBatches do: the stage that fills the pool waits while none is free.
///
/// Readiness: the batch is complete only once `batch.ready()` is done: use_on() the consuming
/// stream before the export (it waits for ready() on the device, and is remembered for the
/// release), or make a stream wait on `ready().native_handle()` (cudaStreamWaitEvent) and name
/// it with SlotPool::record_stream; on the CPU backend (null handle) synchronize() it. The
/// event stays valid, and is not recorded again, until the tensors are released.
///
/// Throws std::invalid_argument for an empty batch, std::bad_alloc when out of memory;
/// `batch` is unchanged when it throws.
DLPackBatch to_dlpack(gpu::DeviceBatch&& batch);

}  // namespace stoker
