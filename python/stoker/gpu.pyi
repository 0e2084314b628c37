# SPDX-License-Identifier: Apache-2.0
# Generated from the built module by python/stubgen.py: do not edit by hand.
"""Devices (CUDA, or the CPU backend that emulates one), pinned staging and the device stages."""

from typing import Any, Callable
import stoker

class Device:
    """A device: CUDA, or the CPU backend, whose
    streams and events are emulated on host threads."""
    @property
    def backend(self) -> str: ...
    def make_stream(self) -> Stream:
        """A stream of the device's own: an in-order queue of device work (on the CPU backend, a worker thread)."""
        ...
    @property
    def name(self) -> str: ...
    @staticmethod
    def open(backend: str = ...) -> Device:
        """'auto' (CUDA when a GPU is visible, else the CPU backend), 'cpu', 'cpu:sticky' (the CPU backend that stops on a fault as a GPU does), 'cuda' or 'cuda:N'."""
        ...
    @property
    def ordinal(self) -> int: ...
    def transfers(self) -> dict: ...


class DeviceBatch(stoker.Batch):
    """A batch in device memory: its samples and labels
    stoker.gpu.DeviceTensor on CUDA, whose export makes the consumer's stream wait for the copy or
    kernels that filled them and keeps the buffer until that stream has passed their release; on the
    CPU backend, NumPy arrays of its host memory, once the host waited for the copy. Labels int32."""


class DeviceError(RuntimeError):
    ...


class DeviceTensor:
    """One tensor of a batch in CUDA memory, for any DLPack consumer
    (torch.from_dlpack, cupy.from_dlpack) or CUDA array interface consumer (torch.as_tensor),
    without a copy. __dlpack__(stream=s) makes the consumer's stream wait for the copy or kernels
    that filled the batch (the host does not) and keeps the buffer from reuse until that stream has
    passed the point where the batch is released: PyTorch's record_stream, done for it."""
    def __array__(self, *args, **kwargs) -> object: ...
    @property
    def __cuda_array_interface__(self) -> dict: ...
    def __dlpack__(self, stream: object = ...) -> object: ...
    def __dlpack_device__(self) -> tuple: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> tuple: ...


class GpuAugment:
    """Random crops, shuffled and batched on the device (a flat_map
    stage, one thread) from batches of whole images collated into staging()."""
    def __init__(self, device: Device, crops: stoker.RandomCrops, batch_size: int, image: stoker.Shape, max_images: int, drop_remainder: bool = ..., shuffle: stoker.ShuffleOptions = ..., dtype: str = ..., staging_buffers: int = ..., output_buffers: int = ..., wait_limit_ms: int = ...) -> None:
        """crops: a stoker.RandomCrops whose options it draws by (its normalize included)."""
        ...
    def staging(self) -> SlotPool: ...


class PoolTimeout(DeviceError):
    ...


class SlotPool(stoker.BufferPool):
    """A fixed number of equal
    buffers of pinned host memory or of device memory; acquiring waits while all are in use."""
    @staticmethod
    def create(device: Device, kind: str, slots: int, slot_bytes: int, name: str = ..., wait_limit_ms: int = ...) -> SlotPool: ...  # type: ignore[override]
    def in_use(self) -> int:
        """Buffers held, or waiting for the device work on them."""
        ...
    @property
    def slot_bytes(self) -> int: ...
    @property
    def slots(self) -> int: ...


class Stream:
    """A device's stream (Device.make_stream()): an in-order queue of
    device work, which a batch's buffer can be told to wait for (Batch.record_stream)."""
    def host_task(self, fn: Callable[..., Any]) -> None:
        """Calls fn() on a host thread once the work issued before it is done; later work waits."""
        ...
    @property
    def native_handle(self) -> object: ...
    def synchronize(self) -> None:
        """Waits for everything issued so far; raises the failure of a host task or of device work."""
        ...


class ToDevice:
    """The host-to-device stage (map, one thread): one asynchronous copy
    per batch from a pinned staging buffer (collate into staging()) to a device buffer."""
    def __init__(self, device: Device, bytes: int, staging_buffers: int = ..., device_buffers: int = ..., wait_limit_ms: int = ...) -> None: ...
    def device_pool(self) -> SlotPool: ...
    def staging(self) -> SlotPool: ...


def built_with_cuda() -> bool: ...

def cuda_device_count() -> int: ...

def device_timeline(device: Device) -> stoker.Timeline:
    """The device's copies and kernels, for PipelineBuilder.trace() with .timeline()."""
    ...

def transfer_counters(device: Device) -> stoker.Counters:
    """The device's copies, for PipelineBuilder.counters()."""
    ...
