// SPDX-License-Identifier: Apache-2.0
// Device batches handed to another framework as DLPack tensors, without a copy.
//
//   for (auto& b : pipe.epoch()) {
//     auto stream = at::cuda::getCurrentCUDAStream();
//     // The framework's stream waits for the copy (or the kernels) that filled the batch;
//     // the host does not.
//     cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(b.ready().native_handle()), 0);
//     auto t = stoker::to_dlpack(std::move(b));
//     at::Tensor x = at::fromDLPack(t.samples), y = at::fromDLPack(t.labels);
//     train_step(x, y);
//     stream.synchronize();  // before x and y go: their buffer is reused at once (see below)
//   }
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
/// second deleter runs, once the work that filled it (ready()) has passed: unlike a
/// DeviceBatch, whose streams are known (use_on, release_after), a deleter cannot know which
/// device work still reads the tensors. The consumer releases them only after that work
/// is done (it synchronizes its stream, or keeps the tensors until a later step is known done),
/// or the next batch may be copied into memory it is still reading. Tensors held count against
/// the device pool as DeviceBatches do: the stage that fills the pool waits while none is free.
///
/// Readiness: the batch is complete only once `batch.ready()` is done. Take the event before
/// the export (an empty batch has none) and make the consuming stream wait on it, with
/// Stream::wait or, on a framework's own stream, cudaStreamWaitEvent on
/// `ready().native_handle()`; on the CPU backend (null handle) synchronize() it. The event
/// stays valid, and is not recorded again, until the tensors are released.
///
/// Throws std::invalid_argument for an empty batch, std::bad_alloc when out of memory;
/// `batch` is unchanged when it throws.
DLPackBatch to_dlpack(gpu::DeviceBatch&& batch);

}  // namespace stoker
