# SPDX-License-Identifier: Apache-2.0
"""A batch handed to a consumer is not reused while the work the consumer queued on it is still
to run: its buffer goes back to its pool only once every stream the consumer named has passed
the point where the batch was released (PyTorch's record_stream; the DLPack stream protocol).

On the CPU backend the consumer's "stream" is a stoker.gpu.Stream held busy by a host task; on a
GPU it is a real CUDA stream held by torch.cuda._sleep. Each test reads the batch on the
consumer's stream after the pipeline has gone on: without the wait it reads the next batch's
values."""

import ctypes
import threading

import numpy as np
import pytest
import torch

import stoker

ELEMENTS = 64  # a batch of one 8x8 image, each image all one value: its number


def numbered(count):
    """IDX images 0..count-1, image i all i."""
    images = np.repeat(np.arange(count, dtype=np.uint8)[:, None, None], 8, axis=1).repeat(8, axis=2)
    return stoker.IdxDataset(images, np.zeros(count, dtype=np.int32))


def pipeline(device, stages):
    """Image i as batch i (uint8 [1, 1, 8, 8]), collated into pinned staging and copied to the
    device: few buffers, so that the pipeline reuses a buffer as soon as it comes back."""
    to_device = stoker.gpu.ToDevice(device, stoker.Batch.storage_bytes(stoker.Shape(1, 1, 8, 8), "uint8", 1),
                                    staging_buffers=2, device_buffers=2, wait_limit_ms=20_000)
    b = (stoker.PipelineBuilder().threads(2).epochs(1).deterministic()
         .source("read", stoker.IdxReader(numbered(12)))
         .batch("batch", 1, queue=1)
         .map("collate", stoker.Collate(pool=to_device.staging()), queue=1, max_chunk=1))
    if stages == "device":
        b.map("h2d", to_device, queue=1)
    return b.build()


class Busy:
    """A consumer stream on the CPU backend, which hold() keeps busy with a host task until
    release()."""

    def __init__(self, device):
        self.stream = device.make_stream()
        self.gate = threading.Event()

    def hold(self):
        self.stream.host_task(lambda: self.gate.wait(30))

    def release(self):
        self.gate.set()


@pytest.mark.parametrize("stages", ["pinned", "device"])
def test_cpu_backend_a_batch_waits_for_the_consumer_stream_it_was_recorded_on(stages):
    device = stoker.gpu.Device.open("cpu")
    pipe = pipeline(device, stages)
    busy = Busy(device)
    batch = pipe.next()
    data = np.asarray(batch.samples)
    assert data.flat[0] == 0
    # What a kernel holds: the address, not a reference that would keep the buffer.
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * ELEMENTS).from_address(data.ctypes.data))
    read = []
    # The stream is named while idle (a point it passes at once); the consumer's work is issued
    # after that, behind a busy task: it reads the buffer later, after the batch is released.
    batch.record_stream(busy.stream)
    busy.stream.synchronize()
    busy.hold()
    busy.stream.host_task(lambda: read.append(raw.copy()))
    del batch, data  # the loop lets go of the batch: the buffer is the consumer stream's until it passes
    timer = threading.Timer(0.5, busy.release)
    timer.start()
    later = [int(np.asarray(pipe.next().samples).flat[0]) for _ in range(4)]
    busy.stream.synchronize()
    timer.join()
    assert later == [1, 2, 3, 4]
    assert len(read) == 1 and (read[0] == 0).all(), "the consumer read a buffer the pipeline reused"
    pipe.stop()


def test_record_stream_names_what_it_cannot_take():
    device = stoker.gpu.Device.open("cpu")
    pipe = pipeline(device, "device")
    batch = pipe.next()
    with pytest.raises(TypeError, match="record_stream"):
        batch.record_stream("the default one")
    with pytest.raises(ValueError, match="CPU backend"):
        batch.record_stream(1)
    plain = (stoker.PipelineBuilder().threads(1).epochs(1).source("read", stoker.IdxReader(numbered(2)))
             .batch("batch", 1).map("collate", stoker.Collate()).build()).next()
    with pytest.raises(ValueError, match="not from a stoker.gpu.SlotPool"):
        plain.record_stream(device.make_stream())
    pipe.stop()


@pytest.mark.skipif(stoker.gpu.cuda_device_count() == 0, reason="no CUDA device visible: the GPU half is skipped")
@pytest.mark.parametrize("how", ["dlpack", "non_blocking"])
def test_cuda_a_batch_waits_for_torch_s_stream_before_it_is_reused(how):
    device = stoker.gpu.Device.open("cuda")
    pipe = pipeline(device, "device" if how == "dlpack" else "pinned")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        batch = pipe.next()
        torch.cuda._sleep(200_000_000)  # about 0.1-0.2 s of the stream held
        if how == "dlpack":
            x = torch.from_dlpack(batch.samples)  # the stream is passed: recorded for the release
        else:
            x = torch.as_tensor(batch.samples).to("cuda", non_blocking=True)
            batch.record_stream(side)
        total = x.float().sum()  # queued behind the sleep
        del x, batch
    for _ in range(4):  # each let go at once: the pipeline reuses the first batch's buffer
        pipe.next()
    side.synchronize()
    assert int(total.item()) == 0, "the stream read a buffer the pipeline reused"
    pipe.stop()
