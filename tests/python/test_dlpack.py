# SPDX-License-Identifier: Apache-2.0
"""Batches leave through DLPack without a copy, and their buffers go back to the pool when the
last reference drops, from any thread."""

import ctypes
import gc
import threading

import numpy as np
import pytest
import torch

import stoker

FASHION = stoker.Normalizer(scale=255, mean=[0.286], std=[0.353])
SHAPE = stoker.Shape(1, 1, 24, 24)


def crops_pipeline(data, collate, batch=100, epochs=1, labels="int32"):
    return (stoker.PipelineBuilder().threads(2).epochs(epochs)
            .source("read", stoker.IdxReader(data))
            .flat_map("crops", stoker.RandomCrops(size=(24, 24), count=1, mirror=True))
            .batch("batch", batch)
            .map("collate", collate, queue=2)
            .build(labels=labels))


def test_torch_and_numpy_see_the_batch_s_own_memory(small):
    pipe = crops_pipeline(small, stoker.Collate(normalize=FASHION))
    batch = pipe.next()
    assert batch.samples.shape == (100, 1, 24, 24) and batch.samples.dtype == "float32"
    assert batch.labels.shape == (100,) and batch.labels.dtype == "int32"
    assert batch.samples.__dlpack_device__() == (1, 0)  # kDLCPU
    x, y = torch.from_dlpack(batch.samples), torch.from_dlpack(batch.labels)
    assert x.data_ptr() == batch.samples.ctypes.data
    assert y.data_ptr() == batch.labels.ctypes.data
    a = np.from_dlpack(batch.samples)
    assert a.__array_interface__["data"][0] == batch.samples.ctypes.data
    x[0, 0, 0, 0] = 123.0  # one memory: the numpy view sees the write
    assert a[0, 0, 0, 0] == 123.0
    assert batch.labels.ctypes.data - batch.samples.ctypes.data == 100 * 24 * 24 * 4  # labels follow the samples
    pipe.stop()


def test_each_export_is_a_fresh_dltensor_capsule_and_unused_ones_are_freed(small):
    pool = stoker.BufferPool.create()
    pipe = crops_pipeline(small, stoker.Collate(pool=pool, normalize=FASHION), batch=500)
    batches = [pipe.next() for _ in range(4)]
    assert pipe.next() is None  # 2,000 images, one epoch
    capsule = batches[0].samples.__dlpack__()
    assert type(capsule).__name__ == "PyCapsule" and "dltensor" in repr(capsule)
    t1, t2 = torch.from_dlpack(batches[0].samples), torch.from_dlpack(batches[0].samples)
    assert t1.data_ptr() == t2.data_ptr()
    del capsule, t1, t2, batches  # an unused capsule frees its tensor too
    gc.collect()
    # Every buffer is back: four batches of the same size, all held at once, reuse them.
    allocations = pool.allocations
    pipe = crops_pipeline(small, stoker.Collate(pool=pool, normalize=FASHION), batch=500)
    assert [b.count for b in list(pipe)] == [500] * 4
    assert pool.allocations == allocations


def pinned_pool(slots):
    device = stoker.gpu.Device.open("cpu")
    bytes_per_batch = stoker.Batch.storage_bytes(SHAPE, "float32", 100)
    return stoker.gpu.SlotPool.create(device, "pinned", slots, bytes_per_batch)


def test_a_buffer_returns_to_its_pool_when_the_last_tensor_over_it_dies(small):
    pool = pinned_pool(slots=20)
    pipe = crops_pipeline(small, stoker.Collate(pool=pool, normalize=FASHION))
    held = []
    for batch in pipe:
        held.append((torch.from_dlpack(batch.samples), torch.from_dlpack(batch.labels)))
    del batch
    assert pool.in_use() == 20  # every batch is held by its tensors, and nothing else
    x, y = held.pop()
    assert pool.in_use() == 20
    del x
    assert pool.in_use() == 20  # the labels still hold the buffer
    del y
    assert pool.in_use() == 19
    held.clear()
    assert pool.in_use() == 0


def test_a_tensor_s_deleter_runs_on_another_thread_without_the_gil(small):
    pool = pinned_pool(slots=20)
    pipe = crops_pipeline(small, stoker.Collate(pool=pool))
    batch = pipe.next()
    pipe.stop()
    del pipe
    capsule = batch.samples.__dlpack__()
    del batch  # the capsule alone holds the buffer now
    gc.collect()
    assert pool.in_use() == 1

    # Take the tensor as a consumer would (renaming the capsule), then call its deleter through
    # ctypes, which drops the GIL for the call, from a thread of its own.
    api = ctypes.pythonapi
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
    managed = api.PyCapsule_GetPointer(capsule, b"dltensor")
    assert api.PyCapsule_SetName(capsule, b"used_dltensor") == 0
    # DLManagedTensor: DLTensor (data, device, ndim, dtype, shape, strides, byte_offset: 48 bytes),
    # manager_ctx, deleter.
    deleter_address = ctypes.c_void_p.from_address(managed + 48 + 8).value
    deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(deleter_address)
    thread = threading.Thread(target=deleter, args=(managed,))
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert pool.in_use() == 0
    del capsule  # renamed: its destructor leaves the tensor alone
    assert pool.in_use() == 0


def test_pinned_batches_are_host_memory_to_torch(small):
    if stoker.gpu.cuda_device_count() == 0:
        pytest.skip("no CUDA device: the CPU backend's pinned pools are ordinary host memory "
                    "(tests/stages/test_dlpack.cpp and stoker-torch-example's test cover the export)")
    device = stoker.gpu.Device.open("cuda")
    pool = stoker.gpu.SlotPool.create(device, "pinned", 4, stoker.Batch.storage_bytes(SHAPE, "float32", 100))
    pipe = crops_pipeline(small, stoker.Collate(pool=pool, normalize=FASHION))
    batch = pipe.next()
    assert batch.memory == "pinned" and batch.samples.__dlpack_device__() == (1, 0)
    x = torch.from_dlpack(batch.samples)
    assert x.device.type == "cpu" and x.data_ptr() == batch.samples.ctypes.data
    pipe.stop()


def test_a_sample_is_a_dlpack_producer_too(small):
    reader = stoker.IdxReader(small)
    sample = reader.read(7)
    a = np.from_dlpack(sample)
    assert a.shape == (1, 28, 28) and a.dtype == np.uint8
    np.testing.assert_array_equal(a[0], small.images[7])
    assert torch.from_dlpack(sample).data_ptr() == a.__array_interface__["data"][0]
