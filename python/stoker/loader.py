# SPDX-License-Identifier: Apache-2.0
"""ImageLoader: torchvision's ImageFolder, the standard ImageNet transforms and a DataLoader in one
call, with stoker's decode-and-crop stages underneath. docs/python.md shows it beside the
torchvision code it replaces.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple, Union

from . import _stoker

#: torchvision's ImageNet normalization, in its 0-1 units (what ``transforms.Normalize`` takes).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_STATE_VERSION = 1


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover: the tests run with torch
        raise ImportError("stoker.ImageLoader gives torch tensors: install PyTorch (Debian: python3-torch)") from e
    return torch


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover: not Linux
        return os.cpu_count() or 1


def _distributed() -> Tuple[int, int]:
    """(rank, world size) from torch.distributed when it is initialised, else (0, 1)."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return 0, 1
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class ImageLoader:
    """Batches of ``(images, labels)`` torch tensors from image files, one epoch per iteration.

    What a torchvision user writes as::

        train = ImageFolder(root, transforms.Compose([
            transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
            transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]))
        loader = DataLoader(train, batch_size=64, shuffle=True, drop_last=True, pin_memory=True)

    is ``stoker.ImageLoader(root, batch_size=64, drop_last=True, device="cuda")``; with
    ``train=False``, ``Resize(256)`` + ``CenterCrop(224)`` + ``ToTensor()`` + ``Normalize``
    in a fixed order (``shuffle=False``).

    data: a folder per class (ImageFolder's layout), a list file of ``path label`` lines, a
    ``.tar`` shard, a list of ``.tar`` shards, or a ``stoker.ImageDataset``. Shards and lists may
    be URLs (``http(s)://``, ``s3://``, with WebDataset's braces), read as ``remote`` (a
    ``stoker.RemoteOptions``: timeouts, retries, a cache on the local disk) says. A dict of
    data sets (any of these) to weights, ``{"web/train-{000..099}.tar": 0.7, "curated.txt":
    0.3}``, is a mixture (``stoker.MixedImageSource``): each image drawn from a data set chosen by
    the weights, the epoch ending as ``mix`` says (``"first_exhausted"``, ``"all_exhausted"``, or
    ``"resample"`` after ``mix_images`` draws); its draws follow from the seed, so ``len()``,
    ``set_epoch`` and ``state_dict`` work as for one data set (with ``"first_exhausted"`` an
    epoch's length depends on the epoch, and ``len()`` is the next epoch's). For training only
    (``shuffle=True``).

    images: float32 ``[batch, 3, size, size]`` (``gray=True``: 1 channel), normalized as
    torchvision's ``Normalize(mean, std)`` after ``ToTensor()``; ``channels_last=True`` gives
    them in ``torch.channels_last`` memory format. labels: int64 ``[batch]`` (``labels=torch.int32``
    on request). On ``device="cuda"`` (or ``"cuda:N"``) both are on the GPU: each batch is
    collated into pinned memory and copied by stoker in one copy; the stream current when a batch
    is handed over waits for the copy, and the buffer is not reused before that stream has passed
    the point where the tensors were freed (the DLPack stream protocol; other streams:
    ``torch.Tensor.record_stream`` on a copy). ``pin_memory=True`` with ``device="cpu"`` gives
    pinned CPU tensors for the loop to copy itself, on the stream current when it gets them.

    threads: the pipeline's threads (default: every core this process may run on, or the
    budget's). budget: a ``stoker.ThreadBudget`` shared with other loaders (training and
    evaluation): together they run at most its threads' stage calls at once. seed: the
    crops, flips and orders of every epoch follow from it; two loaders with the same seed and
    data give the same batches whatever their threads. rank, world_size: this process's share
    of each epoch (by default from ``torch.distributed`` when it is initialised): the epoch's
    k-th image goes to rank ``k % world_size``; with ``drop_last=False`` every image is used,
    the last ranks taking a few of the epoch's first again (as ``DistributedSampler``), with
    ``drop_last=True`` the few that do not divide are left out, and each rank's short last batch
    too.

    ``len(loader)`` is the batches of an epoch for this rank; ``set_epoch(n)`` makes the next
    iteration epoch ``n`` (each iteration is otherwise the next epoch); ``state_dict()`` /
    ``load_state_dict()`` resume mid-epoch exactly, at the same or another world size, as
    torchdata's ``StatefulDataLoader`` spells them (with ``on_error="fail"``: images skipped with
    ``"skip"`` shift the positions a state counts). ``close()`` (or a ``with`` block) stops the
    pipeline's threads.
    """

    def __init__(
        self,
        data: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]], "_stoker.ImageDataset", Dict[Any, float]],
        batch_size: int = 64,
        *,
        train: bool = True,
        shuffle: Optional[bool] = None,
        drop_last: bool = False,
        size: Union[int, Tuple[int, int]] = 224,
        resize_size: Optional[int] = None,
        scale: Tuple[float, float] = (0.08, 1.0),
        ratio: Tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        hflip: float = 0.5,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        gray: bool = False,
        device: Any = "cpu",
        pin_memory: bool = False,
        channels_last: bool = False,
        labels: Any = None,
        threads: Optional[int] = None,
        budget: Optional["_stoker.ThreadBudget"] = None,
        seed: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        on_error: str = "fail",
        remote: Optional["_stoker.RemoteOptions"] = None,
        mix: str = "first_exhausted",
        mix_images: int = 0,
    ) -> None:
        torch = _torch()
        if isinstance(data, dict):
            if not data:
                raise ValueError("ImageLoader: a mixture (a dict of data sets to weights) needs a data set")
            parts = [d if isinstance(d, _stoker.ImageDataset) else _open(d, remote) for d in data]
            self._data: Any = _Mixture(parts, [float(w) for w in data.values()], mix, int(mix_images))
        else:
            self._data = _Single(data if isinstance(data, _stoker.ImageDataset) else _open(data, remote))
        self.dataset = getattr(self._data, "dataset", None)  # one data set: it; a mixture: None
        self.datasets = self._data.datasets
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"ImageLoader: batch_size must be a whole number of at least 1, not {batch_size!r}")
        self.batch_size = batch_size
        self.train = bool(train)
        self.shuffle = self.train if shuffle is None else bool(shuffle)
        if isinstance(self._data, _Mixture) and not self.shuffle:
            raise ValueError("ImageLoader: a mixture draws its images at random: it needs shuffle=True (train=True)")
        self.drop_last = bool(drop_last)
        self.size = _size(size)
        if resize_size is None:  # torchvision's evaluation: Resize(256) before CenterCrop(224)
            resize_size = round(max(self.size) * 256 / 224)
        self.resize_size = int(resize_size)
        if not 0.0 <= hflip <= 1.0:
            raise ValueError(f"ImageLoader: hflip is a probability, from 0 to 1, not {hflip!r}")
        self.hflip = float(hflip)
        self.scale, self.ratio = tuple(scale), tuple(ratio)
        self.gray = bool(gray)
        channels = 1 if self.gray else 3
        if len(mean) not in (1, channels) or len(std) not in (1, channels):
            raise ValueError(f"ImageLoader: mean and std need 1 or {channels} values for {'gray' if gray else 'RGB'} "
                             f"images, not {len(mean)} and {len(std)}")
        self.normalizer = _stoker.Normalizer(mean=list(mean), std=list(std))
        self.channels_last = bool(channels_last)
        self.budget = budget
        self.threads = int(threads) if threads is not None else budget.threads if budget is not None else _cores()
        if self.threads < 1:
            raise ValueError(f"ImageLoader: threads must be at least 1, not {threads!r}")
        self.seed = int(seed)
        self.on_error = on_error
        if labels is None or labels == torch.int64 or labels == "int64":
            self.labels = torch.int64
        elif labels == torch.int32 or labels == "int32":
            self.labels = torch.int32
        else:
            raise ValueError(f"ImageLoader: labels must be torch.int64 or torch.int32, not {labels!r}")

        d_rank, d_world = _distributed()
        self.rank = d_rank if rank is None else int(rank)
        self.world_size = d_world if world_size is None else int(world_size)
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"ImageLoader: rank {self.rank} is not one of world_size {self.world_size}")

        self.device = torch.device(device)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"ImageLoader: device must be 'cpu', 'cuda' or 'cuda:N', not {device!r}")
        cuda = _stoker.gpu.cuda_device_count() > 0
        if self.device.type == "cuda":
            if not cuda:
                raise RuntimeError(
                    f"ImageLoader(device={str(self.device)!r}): no CUDA device is visible to stoker "
                    f"(stoker.gpu.cuda_device_count() is 0{'' if _stoker.gpu.built_with_cuda() else '; this build has no CUDA'})")
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            self.device = torch.device("cuda", index)
        self.pin_memory = bool(pin_memory) and self.device.type == "cpu"
        if self.pin_memory and not (cuda and torch.cuda.is_available()):
            warnings.warn("ImageLoader: pin_memory=True, but no CUDA device is visible (to stoker and to PyTorch): "
                          "batches are in pageable memory", stacklevel=2)
            self.pin_memory = False
        self._pin_device = torch.cuda.current_device() if self.pin_memory else None

        self._epoch = 0          # the epoch the next iteration yields
        self._cut = 0            # of that epoch, positions of its order taken before (a resume)
        self._batches = 0        # batches this rank took of the epoch being iterated
        self._iterating = False  # an iteration took a batch and has not reached the epoch's end
        self._pipe = None        # the running pipeline, and the (epoch, cut) it was built for
        self._pipe_start: Optional[Tuple[int, int]] = None
        self._gpu: Dict[str, Any] = {}

    # -- DataLoader's conventions --------------------------------------------------------------

    def __len__(self) -> int:
        """Batches per epoch for this rank (a whole epoch's, as DataLoader's len()): of the epoch the
        next iteration yields, where epochs differ (a mixture that ends at the first exhausted)."""
        return self._batches_of(self._per_rank(self._epoch, 0))

    def set_epoch(self, epoch: int) -> None:
        """The next iteration yields epoch ``epoch`` (DistributedSampler.set_epoch)."""
        if epoch < 0:
            raise ValueError(f"ImageLoader.set_epoch: epoch must not be negative, not {epoch}")
        if epoch != self._epoch or self._iterating:
            self._epoch, self._cut, self._iterating, self._batches = int(epoch), 0, False, 0

    @property
    def epoch(self) -> int:
        """The epoch the next iteration yields (or the one being iterated)."""
        return self._epoch

    @property
    def classes(self):
        """Class names, label i being classes[i] (a folder per class; empty otherwise)."""
        return self._data.classes

    def __iter__(self) -> Iterator[Tuple[Any, Any]]:
        if self._iterating:  # an iteration left before the epoch's end: a new one is the next epoch
            self._epoch, self._cut, self._iterating, self._batches = self._epoch + 1, 0, False, 0
        return self._iterate()

    def _iterate(self):
        start = (self._epoch, self._cut)
        if self._pipe is None or self._pipe_start != start:
            self._build(*start)
        pipe = self._pipe
        self._pipe_start = None  # no longer at an epoch's start, until this one ends
        self._batches = 0
        self._iterating = True
        for batch in pipe.epoch():
            images, labels = self._tensors(batch)
            del batch
            self._batches += 1
            yield images, labels
        # The epoch's end: the pipeline has started the next one, which the next iteration takes.
        self._iterating = False
        self._epoch, self._cut, self._batches = self._epoch + 1, 0, 0
        self._pipe_start = (self._epoch, 0)

    # -- torchdata's StatefulDataLoader conventions ---------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """Where the loader stands: after the batches this rank took, as a dict of plain values.

        Data-parallel ranks take batches in step, so the positions of the epoch's order all of
        them took follow from this rank's count: a resume at another world size goes on with the
        same images, and each image with the same crop and flip."""
        epoch, cut = self._epoch, self._cut
        if self._iterating:
            if self._batches >= self._batches_of(self._per_rank(epoch, cut)):
                epoch, cut = epoch + 1, 0  # every batch of the epoch was taken
            else:
                cut = min(cut + self._batches * self.batch_size * self.world_size, self._data.images(self.seed, epoch))
        return {
            "version": _STATE_VERSION,
            "epoch": epoch,
            "taken": cut,
            "dataset": self._data.fingerprint(),
            "images": self._data.images(self.seed, epoch),
            "seed": self.seed,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "train": self.train,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Goes on from a state_dict(): the next iteration yields the rest of its epoch."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError("ImageLoader.load_state_dict: not a state of ImageLoader.state_dict() "
                             f"(version {_STATE_VERSION}): {json.dumps(state, default=str)[:200]}")
        mine = self.state_dict()
        for key in ("dataset", "seed", "train", "shuffle"):
            if state[key] != mine[key]:
                raise ValueError(f"ImageLoader.load_state_dict: the state's {key} is {state[key]!r}, "
                                 f"this loader's {mine[key]!r}")
        taken, images = int(state["taken"]), self._data.images(self.seed, int(state["epoch"]))
        if not 0 <= taken < images:
            raise ValueError(f"ImageLoader.load_state_dict: taken {taken} is not a position of the "
                             f"{images} images' order")
        self._epoch, self._cut, self._iterating, self._batches = int(state["epoch"]), taken, False, 0

    # -- the pipeline ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stops the pipeline's threads; a later iteration starts them again."""
        if self._pipe is not None:
            self._pipe.stop()
        self._pipe, self._pipe_start = None, None

    def __enter__(self) -> "ImageLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover: the interpreter is exiting
            pass

    def __repr__(self) -> str:
        return (f"stoker.ImageLoader({self._data}, batch_size={self.batch_size}, "
                f"train={self.train}, shuffle={self.shuffle}, drop_last={self.drop_last}, size={self.size}, "
                f"device={str(self.device)!r}, threads={self.threads}, rank={self.rank}, "
                f"world_size={self.world_size}, epoch={self._epoch})")

    def _per_rank(self, epoch: int, cut: int) -> int:
        rest = self._data.images(self.seed, epoch) - cut
        if self.drop_last:
            return rest // self.world_size
        return -(-rest // self.world_size)

    def _batches_of(self, images: int) -> int:
        if self.drop_last:
            return images // self.batch_size
        return -(-images // self.batch_size)

    def _build(self, epoch: int, cut: int) -> None:
        self.close()
        s = _stoker
        n = self.threads
        layout = "channels_last" if self.channels_last else "planar"
        color = "gray" if self.gray else "rgb"
        source = self._data.source(
            shard=s.ShardOptions(rank=self.rank, world=self.world_size,
                                 remainder="drop" if self.drop_last else "pad"),
            order="shuffle" if self.shuffle else "fixed",
            resume_at=s.EpochCut(epoch=epoch, taken=cut) if cut else None)
        b = s.PipelineBuilder()
        if self.budget is not None:
            b.budget(self.budget)
        b = (b.threads(n).seed(self.seed).deterministic().first_epoch(epoch)
             .source("read", source, queue=max(8, 2 * n), max_chunk=1))
        # Resizing in the collate (DecodeCropWindow), a quarter of the threads keep up with the
        # decoders: the layout of the C++ image job (docs/benchmarks.md, "The image job").
        if self.train:
            mirror = s.MirrorOptions(p=self.hflip) if self.hflip > 0 else None
            crop = s.RandomResizedCropOptions(size=self.size, scale=self.scale, ratio=self.ratio,
                                              mirror=mirror, normalize=self.normalizer)
            b.map("decode_crop", s.DecodeCropWindow(crop=crop, decode=s.DecodeOptions(color=color)),
                  threads=n, queue=max(8, 2 * n), max_chunk=1, on_error=self.on_error)
        else:
            b.map("decode", s.ImageDecoder(color=color), threads=n, queue=max(8, 2 * n), max_chunk=1,
                  on_error=self.on_error)
            b.map("resize", s.Resize(shorter=self.resize_size, crop=self.size, normalize=self.normalizer),
                  threads=n, queue=max(8, 2 * n), max_chunk=1)
        b.batch("batch", self.batch_size, drop_remainder=self.drop_last, queue=1)
        collate_threads = (n + 3) // 4
        pool = None
        if self.device.type == "cuda":
            to_device = self._to_device(collate_threads)
            pool = to_device.staging()
        elif self.pin_memory:
            pool = self._pinned_pool(collate_threads)
        b.map("collate", s.Collate(pool=pool, layout=layout), threads=collate_threads, queue=2, max_chunk=1)
        if self.device.type == "cuda":
            b.map("h2d", to_device, queue=2)
        self._pipe = b.build(labels="int32" if self.device.type == "cuda" else _label_name(self.labels))
        self._pipe_start = (epoch, cut)

    def _batch_bytes(self) -> int:
        shape = _stoker.Shape(1 if self.gray else 3, 1, self.size[0], self.size[1])
        return _stoker.Batch.storage_bytes(shape, "float32", self.batch_size)

    # Buffers by stoker's sizing rule (stoker.gpu.OutputSizing): those the stage before holds,
    # those queued, and those the training loop holds at once (the batch it works on, the one it
    # asks for meanwhile, and one whose device work may still be queued).
    def _to_device(self, collate_threads: int):
        key = ("to_device", collate_threads)
        if key not in self._gpu:
            device = _stoker.gpu.Device.open(f"cuda:{self.device.index}")
            self._gpu[key] = _stoker.gpu.ToDevice(device, self._batch_bytes(),
                                                  staging_buffers=collate_threads + 2 + 1,
                                                  device_buffers=1 + 2 + 3)
        return self._gpu[key]

    def _pinned_pool(self, collate_threads: int):
        key = ("pinned", collate_threads)
        if key not in self._gpu:
            device = _stoker.gpu.Device.open(f"cuda:{self._pin_device}")
            self._gpu[key] = _stoker.gpu.SlotPool.create(device, "pinned", collate_threads + 2 + 3,
                                                         self._batch_bytes(), name="ImageLoader pinned batches")
        return self._gpu[key]

    def _tensors(self, batch):
        torch = _torch()
        if self.device.type == "cuda":
            images = torch.from_dlpack(batch.samples)  # the current stream waits for the copy
            labels = torch.from_dlpack(batch.labels).to(self.labels)
        else:
            if self.pin_memory:  # the loop's copies on its current stream: the buffer waits for them
                batch.record_stream(torch.cuda.current_stream(self._pin_device))
            images = torch.as_tensor(batch.samples)
            labels = torch.as_tensor(batch.labels)
        if self.channels_last:  # [N, H, W, C] in memory: NCHW in torch.channels_last format
            images = images.permute(0, 3, 1, 2)
        return images, labels


class _Single:
    """One data set, as the loader reads it."""

    def __init__(self, dataset: "_stoker.ImageDataset") -> None:
        self.dataset, self.datasets = dataset, [dataset]

    def images(self, seed: int, epoch: int) -> int:
        return len(self.dataset)

    def fingerprint(self) -> str:
        return self.dataset.fingerprint()

    @property
    def classes(self):
        return self.dataset.classes

    def source(self, **options):
        return _stoker.ImageSource(self.dataset, **options)

    def __str__(self) -> str:
        return f"{len(self.dataset)} images"


class _Mixture:
    """Data sets drawn by weights (stoker.MixedImageSource), as the loader reads them."""

    def __init__(self, parts, weights, stop: str, epoch_images: int) -> None:
        self.datasets, self.weights, self.stop, self.epoch_images = parts, weights, stop, epoch_images
        self._plan = self._make()  # checks the weights and the stop; the draws of every epoch
        self._draws: Dict[Tuple[int, int], int] = {}  # epoch_draws makes the epoch's plan: kept

    def _make(self, **options):
        return _stoker.MixedImageSource(self.datasets, self.weights, stop=self.stop,
                                        epoch_images=self.epoch_images, **options)

    def images(self, seed: int, epoch: int) -> int:
        if (seed, epoch) not in self._draws:
            if len(self._draws) > 8:
                self._draws.clear()
            self._draws[(seed, epoch)] = self._plan.epoch_draws(seed, epoch)
        return self._draws[(seed, epoch)]

    def fingerprint(self) -> str:
        return repr(self._plan)

    @property
    def classes(self):
        first = self.datasets[0].classes
        return first if all(d.classes == first for d in self.datasets) else []

    def source(self, order: str, **options):
        return self._make(**options)

    def __str__(self) -> str:
        return (f"a mixture of {len(self.datasets)} data sets of "
                f"{'+'.join(str(len(d)) for d in self.datasets)} images, {self.stop}")


def _open(data, remote) -> "_stoker.ImageDataset":
    remote = _stoker.RemoteOptions() if remote is None else remote
    if isinstance(data, (str, os.PathLike)):
        return _stoker.ImageDataset.open(data, remote)
    if isinstance(data, Sequence) and data and all(isinstance(p, (str, os.PathLike)) for p in data):
        return _stoker.ImageDataset.from_tars(list(data), remote)
    raise TypeError("ImageLoader: data must be a folder, a list file, a .tar shard, a list of .tar shards "
                    f"or a stoker.ImageDataset, not {type(data).__name__}")


def _size(size) -> Tuple[int, int]:
    if isinstance(size, int) and not isinstance(size, bool):
        size = (size, size)
    if (not isinstance(size, Sequence) or len(size) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in size)):
        raise ValueError(f"ImageLoader: size must be a whole number or (height, width) of them, above 0, not {size!r}")
    return int(size[0]), int(size[1])


def _label_name(dtype) -> str:
    return "int64" if str(dtype) == "torch.int64" else "int32"
