# SPDX-License-Identifier: Apache-2.0
# Generated from the built module by python/stubgen.py: do not edit by hand.
"""stoker: multi-stage input pipelines for training, run in C++, consumed from Python."""

from typing import Iterator, List, Optional, Sequence, Tuple, Union
from . import gpu as gpu
import numpy
import os

class Batch:
    """A collated batch: (images, labels) as it unpacks, `samples`
    [N, C, (D,) H, W] (or [N, (D,) H, W, C] channels last) and `labels` [N] over the batch's one
    buffer, without a copy: NumPy arrays for host and pinned memory (torch.as_tensor,
    torch.from_numpy, torch.from_dlpack and numpy.asarray take them as they are), and
    stoker.gpu.DeviceTensor for CUDA memory. The buffer goes back to its pool when the batch, its
    arrays and every tensor made of them are gone, on whatever thread."""
    def __getitem__(self, index: int) -> object: ...
    def __iter__(self) -> Iterator:
        """images, labels = batch"""
        ...
    def __len__(self) -> int:
        """2: a batch is (images, labels); count is its samples."""
        ...
    @property
    def count(self) -> int: ...
    @property
    def labels(self) -> object: ...
    @property
    def memory(self) -> str: ...
    def record_stream(self, stream: object) -> None:
        """As torch.Tensor.record_stream: `stream` (a torch.cuda.Stream, a stoker.gpu.Stream or a CUDA stream handle) uses the batch's buffer, which is not reused before that stream has passed the point where the batch is released. For a copy out of a pinned batch on a stream other than the default one (x.to('cuda', non_blocking=True)), or device work on another stream than the one given to __dlpack__."""
        ...
    @property
    def samples(self) -> object: ...
    @staticmethod
    def storage_bytes(shape: Shape, dtype: str, count: int) -> int:
        """Bytes a batch of `count` samples of `shape` takes in its pool: the size of a staging buffer."""
        ...


class BufferPool:
    """Recycled byte buffers, by size: where samples
    and batches get their memory. Thread-safe."""
    @property
    def allocations(self) -> int: ...
    @staticmethod
    def create(max_cached_bytes: int = ...) -> BufferPool: ...
    @property
    def memory(self) -> str: ...
    @property
    def reuses(self) -> int: ...
    @property
    def waits(self) -> bool: ...


class CenterCrop:
    """The crop in the middle of each sample (a map stage)."""
    def __init__(self, size: Union[int, Sequence[int]], normalize: Optional[Normalizer] = ..., pool: BufferPool = ...) -> None: ...
    @property
    def size(self) -> tuple: ...


class Collate:
    """A list of samples, deferred crops or deferred resizes (after .batch())
    into one contiguous stoker.Batch (a map stage); with normalize, cast to float32 and
    normalized on the way. layout: 'planar' [N, C, H, W] or 'channels_last' [N, H, W, C];
    decoded (channels-last) images are converted on the way. pool: where batches are made,
    e.g. a pinned staging pool."""
    def __init__(self, pool: BufferPool = ..., normalize: Optional[Normalizer] = ..., layout: str = ...) -> None: ...
    @property
    def layout(self) -> str: ...
    @property
    def pool(self) -> BufferPool: ...


class Counters:
    """Counters kept outside the graph, for PipelineBuilder.counters()."""


class DataError(RuntimeError):
    file: str


class DecodeCropWindow:
    """DecodeResizedCrop with the resize left to Collate
    (a map stage): it gives stoker.DeferredResize, and Collate, after .batch(), resizes,
    mirrors and normalizes each crop straight into the batch. The same arguments."""
    def __init__(self, crop: RandomResizedCropOptions, decode: DecodeOptions = ..., dct_scaling: bool = ..., scratch: BufferPool = ...) -> None: ...
    @property
    def output_dtype(self) -> str: ...
    @property
    def output_shape(self) -> Shape: ...


class DecodeOptions:
    """color: 'rgb' (3 channels) or 'gray' (1); images whose
    header claims more than max_pixels pixels are refused before anything is allocated."""
    def __init__(self, color: str = ..., max_pixels: int = ...) -> None: ...
    @property
    def color(self) -> str: ...
    @property
    def max_pixels(self) -> int: ...


class DecodeResizedCrop:
    """Decode and RandomResizedCrop in one map stage:
    the crop is drawn from the header, only its window is decoded (JPEG: at the smallest DCT
    scale that serves it, unless dct_scaling=False), then resized into the output Sample.
    crop: a RandomResizedCropOptions; decode: a DecodeOptions; scratch: where windows go."""
    def __init__(self, crop: RandomResizedCropOptions, decode: DecodeOptions = ..., dct_scaling: bool = ..., scratch: BufferPool = ...) -> None: ...
    @property
    def output_dtype(self) -> str: ...
    @property
    def output_shape(self) -> Shape: ...


class DeferredCrop:
    """A crop RandomCrops has drawn but not cut: where it lies in its
    sample and the axes it reverses. Collate cuts it into its batch."""
    @property
    def flips(self) -> dict: ...
    @property
    def id(self) -> int: ...
    @property
    def label(self) -> int: ...
    @property
    def window(self) -> dict: ...


class DeferredResize:
    """A crop DecodeCropWindow
    has drawn and whose window it has decoded, not yet resized: Collate resizes it straight into
    its batch."""
    @property
    def flips(self) -> dict: ...
    @property
    def id(self) -> int: ...
    @property
    def label(self) -> int: ...
    @property
    def scale(self) -> tuple: ...
    @property
    def window(self) -> dict: ...


class EncodedImage:
    """One image file's bytes as
    ImageSource reads them, with its label, id and name (the file, or "shard.tar:member"):
    what ImageDecoder and DecodeCropWindow take."""
    def __len__(self) -> int: ...
    def bytes(self) -> bytes:
        """A copy of the file's bytes."""
        ...
    @property
    def id(self) -> int: ...
    @property
    def label(self) -> int: ...
    @property
    def name(self) -> str: ...


class Epoch:
    """The rest of an epoch: an iterator of its items."""
    def __iter__(self) -> Epoch: ...
    def __len__(self) -> int:
        """Items the epoch has left."""
        ...
    def __next__(self) -> object: ...


class EpochCut:
    """Where a run that goes on from the middle of an epoch starts it:
    the first `taken` positions of epoch `epoch`'s order were taken before, by any number of ranks
    (ImageSource's resume_at, with PipelineBuilder.first_epoch)."""
    def __init__(self, epoch: int, taken: int) -> None: ...
    @property
    def epoch(self) -> int: ...
    @property
    def taken(self) -> int: ...


class Epochs:
    """The epochs until the run is over."""
    def __iter__(self) -> Epochs: ...
    def __next__(self) -> Epoch: ...


class IdxDataset:
    """IDX images and their labels (MNIST,
    Fashion-MNIST), decoded into memory once."""
    def __init__(self, images: numpy.ndarray, labels: numpy.ndarray) -> None:
        """A data set of these images and labels (copied)."""
        ...
    def __len__(self) -> int: ...
    @property
    def images(self) -> numpy.ndarray: ...
    @property
    def labels(self) -> numpy.ndarray: ...
    @property
    def shape(self) -> Shape: ...


class ImageDataset:
    """Where the images of a data set
    are and what their labels are: a list file of `path label` lines, a folder per class, or
    WebDataset tar shards. Images have ids 0 .. len - 1. Immutable: share one between sources.
    Opening one reads folders or tar headers without the GIL."""
    def __len__(self) -> int: ...
    @property
    def classes(self) -> List[str]: ...
    def fingerprint(self) -> str: ...
    @staticmethod
    def from_folder(root: Union[str, os.PathLike]) -> ImageDataset:
        """A subfolder per class, as torchvision's ImageFolder: labels in the classes' name order."""
        ...
    @staticmethod
    def from_list(list: Union[str, os.PathLike], remote: RemoteOptions = ...) -> ImageDataset:
        """`path label` lines, paths relative to the list's folder unless absolute; the list and its paths may be URLs, read as `remote` says."""
        ...
    @staticmethod
    def from_tars(shards: List[Union[str, os.PathLike]], remote: RemoteOptions = ...) -> ImageDataset:
        """WebDataset tar shards: each sample an image and its .cls label; shards at a URL read as `remote` says."""
        ...
    def name(self, id: int) -> str:
        """The file (or shard.tar:member) of image `id`."""
        ...
    @staticmethod
    def open(path: Union[str, os.PathLike], remote: RemoteOptions = ...) -> ImageDataset:
        """A folder (from_folder), a .tar file (from_tars) or a list file (from_list); a URL or a name with braces stands for tar shards, read as `remote` says."""
        ...
    def remote_counts(self) -> dict:
        """What the reads of its remote shards did so far (all 0 for local data): requests, retries, bytes, cache_hits, cache_fetches, cache_evictions, cache_skipped, peak_bytes_in_flight."""
        ...
    @property
    def shards(self) -> int: ...
    def subset(self, ids: List[int]) -> ImageDataset:
        """The images `ids` (strictly increasing) as a data set of their own."""
        ...


class ImageDecoder:
    """Decodes an EncodedImage (JPEG or PNG) into a uint8 Sample,
    channels last ([H, W, C] through DLPack), with its label and id (a map stage). A bad image
    is a stoker.DataError naming the file."""
    def __init__(self, color: str = ..., max_pixels: int = ..., pool: BufferPool = ...) -> None: ...
    @property
    def pool(self) -> BufferPool: ...


class ImageSource:
    """A pipeline source of one rank's images of an ImageDataset, as
    stoker.EncodedImage (the file's bytes, label, id, name), for a map stage to decode on many
    threads. order: 'shuffle' (a new order of all images each epoch), 'shards' (a new order of
    the tar shards, each read front to back) or 'fixed'. pool: where the bytes go. max_file_bytes:
    a larger file is a DataError naming it, refused before it is read."""
    def __init__(self, data: ImageDataset, shard: ShardOptions = ..., order: str = ..., pool: BufferPool = ..., resume_at: Optional[EpochCut] = ..., max_file_bytes: int = ...) -> None: ...
    def __len__(self) -> int:
        """Images this rank reads per epoch (a whole one's)."""
        ...
    def id_at(self, seed: int, epoch: int, k: int) -> int:
        """The id of this rank's k-th image in an epoch of a pipeline seeded with `seed`."""
        ...
    @property
    def pool(self) -> BufferPool: ...
    def size_of(self, epoch: int) -> int:
        """Images this rank reads in epoch `epoch`: len(), but in the epoch of resume_at."""
        ...


class MirrorOptions:
    """Mirror along `axis` with probability `p`."""
    def __init__(self, axis: str = ..., p: float = ..., salt: int = ...) -> None: ...
    @property
    def axis(self) -> str: ...
    @property
    def p(self) -> float: ...


class MixedImageSource:
    """A pipeline source of one rank's images from several
    ImageDatasets, each draw choosing one by `weights` (one per data set, above 0; their scale does not
    matter). stop: 'first_exhausted' (the epoch ends at the draw that takes a data set's last image),
    'all_exhausted' (every image once; used-up data sets drop out of the draw) or 'resample' (the epoch
    is `epoch_images` draws, default the sizes summed; a used-up data set starts another pass in a new
    order). The draws follow from the pipeline's seed and the epoch; the k-th goes to rank k % world;
    resume_at goes on after the first `taken` draws at any number of ranks. An image's id is
    offset(part) + its id in its data set."""
    def __init__(self, parts: List[ImageDataset], weights: List[float], stop: str = ..., epoch_images: int = ..., shard: ShardOptions = ..., pool: BufferPool = ..., resume_at: Optional[EpochCut] = ..., max_file_bytes: int = ...) -> None: ...
    def counts(self, seed: int, epoch: int) -> List[int]:
        """How many draws of that epoch, all ranks together, take each data set."""
        ...
    def draw_at(self, seed: int, epoch: int, k: int) -> Tuple[int, int]:
        """(data set, id in it) of this rank's k-th image of that epoch."""
        ...
    def epoch_draws(self, seed: int, epoch: int) -> int:
        """Draws in that epoch of a pipeline seeded with `seed`, all ranks together."""
        ...
    def offset(self, part: int) -> int:
        """Where data set `part`'s ids begin."""
        ...
    def size_of(self, seed: int, epoch: int) -> int:
        """Images this rank reads in that epoch."""
        ...


class Normalize:
    """Cast to float32 and normalize (a map stage)."""
    def __init__(self, normalize: Normalizer, pool: BufferPool = ...) -> None: ...


class Normalizer:
    """y = (x / scale - mean[c]) / std[c], in float32: torchvision's
    Normalize(mean, std) after ToTensor(). Without scale, mean and std are in torchvision's 0-1
    units of 8-bit pixels (scale 255), and values above 1 are refused as ambiguous; scale=1 takes
    pixel units, and is what samples of float data need."""
    def __init__(self, mean: Union[float, Sequence[float]], std: Union[float, Sequence[float]], *, scale: Optional[float] = ...) -> None: ...
    @property
    def mean(self) -> list: ...
    @property
    def scale(self) -> float: ...
    @property
    def std(self) -> list: ...


class Pipeline:
    """A running pipeline. The thread that iterates it is its
    consumer. While it waits for an item it releases the GIL and checks for signals every 50 ms,
    so Ctrl-C raises KeyboardInterrupt (the item is not taken). Use it in a `with` block, or call
    stop(), to stop its threads."""
    def __enter__(self) -> Pipeline: ...
    def __exit__(self, *args) -> bool: ...
    def __iter__(self) -> Epoch: ...
    def __len__(self) -> int:
        """Items of the current epoch, whole: batches per epoch when it ends with a batch stage. A TypeError saying why where it is not known (a Python source without __len__, a flat_map without fanout)."""
        ...
    @property
    def current_epoch(self) -> int: ...
    def epoch(self) -> Epoch:
        """The rest of the current epoch."""
        ...
    def epochs(self) -> Epochs:
        """The epochs until the run is over, each the rest of the current epoch."""
        ...
    @property
    def finished(self) -> bool: ...
    def next(self) -> object:
        """The next item of the epoch, or None at its end (and the run's)."""
        ...
    def state(self) -> str:
        """Where the run stands, as JSON: PipelineBuilder.resume_from(state) goes on from there."""
        ...
    def stop(self) -> None:
        """Stops every stage and waits for their bodies. Idempotent."""
        ...
    def summary(self) -> dict:
        """Counters of every stage (python: True for a Python stage) and queue, as a dict."""
        ...
    def summary_table(self) -> str:
        """The summary as stoker's fixed-width table."""
        ...


class PipelineBuilder:
    """Builds a pipeline as the C++ builder does: options, then a
    source, then map / flat_map / shuffle / batch steps, then build(). Every call returns the
    builder. Stage functions are stoker's classes (run in C++, on the pipeline's threads) or
    Python callables (which hold the GIL: one call at a time, whatever their threads)."""
    def __init__(self) -> None: ...
    def autotune(self, threads: int = ..., interval_ms: int = ...) -> PipelineBuilder:
        """Moves threads between the map and flat_map stages as the pipeline runs."""
        ...
    def batch(self, name: str, size: int, drop_remainder: bool = ..., queue: int = ...) -> PipelineBuilder:
        """Groups `size` items into a list."""
        ...
    def budget(self, budget: ThreadBudget) -> PipelineBuilder:
        """A ThreadBudget shared with other pipelines; threads then default to its."""
        ...
    def build(self, labels: Optional[str] = ...) -> Pipeline:
        """Starts the pipeline. labels: 'int64' (the default for host batches: what torch.nn.functional.cross_entropy takes) or 'int32' (the batches' own; device batches have only these)."""
        ...
    def counters(self, counters: Counters) -> PipelineBuilder: ...
    def deterministic(self, on: bool = ...) -> PipelineBuilder:
        """The same output, in the same order, whatever the threads."""
        ...
    def epochs(self, n: int) -> PipelineBuilder:
        """Epochs to run; 0 = until stopped, or until an epoch yields nothing."""
        ...
    def first_epoch(self, n: int) -> PipelineBuilder:
        """The epoch the run starts at, for a run that goes on by a count its caller keeps (ImageSource's resume_at): not with resume_from."""
        ...
    def flat_map(self, name: str, fn: object, output: object = ..., threads: int = ..., queue: int = ..., max_chunk: int = ..., on_error: str = ..., copy_per_body: bool = ..., autotune: bool = ..., fanout: int = ...) -> PipelineBuilder:
        """1 -> k. output: the item class to emit (stoker.Sample, stoker.DeferredCrop, ...) where the function can emit several; a Python callable returns an iterable."""
        ...
    def log_label(self, key: str, value: str) -> PipelineBuilder: ...
    def map(self, name: str, fn: object, threads: int = ..., queue: int = ..., max_chunk: int = ..., on_error: str = ..., copy_per_body: bool = ..., autotune: bool = ...) -> PipelineBuilder:
        """1 -> 1: fn(item) is the output."""
        ...
    def occupancy_log(self, path: str, interval_ms: int = ...) -> PipelineBuilder:
        """A JSON Lines log of the queues, for stoker-inspect."""
        ...
    def resume_from(self, state: str) -> PipelineBuilder:
        """Go on from where a run stood: a JSON string from Pipeline.state()."""
        ...
    def seed(self, seed: int) -> PipelineBuilder: ...
    def shuffle(self, name: str, capacity: int = ..., min_after_dequeue: int = ..., seed: Optional[int] = ...) -> PipelineBuilder:
        """Makes the queue after the last stage a random-shuffle buffer."""
        ...
    def source(self, name: str, fn: object, queue: int = ..., max_chunk: int = ..., on_error: str = ...) -> PipelineBuilder:
        """A reader (IdxReader, NpyReader, RawVolumeReader, SyntheticSource), a ShuffledShard, an ImageSource, or a Python callable returning an item, or None at the end of each epoch."""
        ...
    def threads(self, n: int) -> PipelineBuilder:
        """The pipeline's own threads; 0 = one per core."""
        ...
    def timeline(self, timeline: Timeline) -> PipelineBuilder: ...
    def trace(self, path: str) -> PipelineBuilder:
        """A Chrome trace event file of the run (Perfetto's UI)."""
        ...


class RandomCrops:
    """1 -> count random crops of each sample (a flat_map stage).
    With mirror or normalize it cuts each crop mirrored and normalized in one pass; as a
    flat_map whose output is stoker.DeferredCrop (the default without normalize) it only draws
    the crops, and Collate cuts them into the batch."""
    def __init__(self, size: Union[int, Sequence[int]], count: int = ..., mirror: object = ..., normalize: Optional[Normalizer] = ..., pool: BufferPool = ..., salt: int = ...) -> None: ...
    @property
    def count(self) -> int: ...
    @property
    def size(self) -> tuple: ...


class RandomMirror:
    """Mirrors a sample in place with probability p (a map stage)."""
    def __init__(self, axis: str = ..., p: float = ..., salt: int = ...) -> None: ...


class RandomResizedCrop:
    """torchvision's RandomResizedCrop of a decoded image
    (a map stage), with the keyword arguments of RandomResizedCropOptions. Keeps the label and
    id; each sample's draw follows from the pipeline's seed, the epoch and its id."""
    def __init__(self, size: Union[int, Sequence[int]], scale: List[float] = ..., ratio: List[float] = ..., attempts: int = ..., antialias: bool = ..., mirror: object = ..., normalize: Optional[Normalizer] = ..., layout: Optional[str] = ..., pool: BufferPool = ..., salt: int = ...) -> None: ...
    @property
    def output_size(self) -> tuple: ...


class RandomResizedCropOptions:
    """torchvision's RandomResizedCrop: the
    output's size (height, width), scale (of the area) and ratio (width / height) ranges,
    attempts before the centred fallback, antialias, and, fused into the same write, mirror
    (None, a bool or a MirrorOptions) and normalize (a Normalizer: float32 out); layout
    ('planar' or 'channels_last'; the input's unless set); pool: where outputs go."""
    def __init__(self, size: Union[int, Sequence[int]], scale: List[float] = ..., ratio: List[float] = ..., attempts: int = ..., antialias: bool = ..., mirror: object = ..., normalize: Optional[Normalizer] = ..., layout: Optional[str] = ..., pool: BufferPool = ..., salt: int = ...) -> None: ...
    @property
    def antialias(self) -> bool: ...
    @property
    def ratio(self) -> List[float]: ...
    @property
    def scale(self) -> List[float]: ...
    @property
    def size(self) -> tuple: ...


class Reader:
    """A data set of samples with ids 0 to
    dataset_size - 1, of which the reader yields one shard: a pipeline source."""
    def __len__(self) -> int: ...
    @property
    def dataset_size(self) -> int: ...
    def fingerprint(self) -> str: ...
    @property
    def num_shards(self) -> int: ...
    @property
    def pool(self) -> BufferPool: ...
    def read(self, id: int) -> Sample:
        """Sample `id` of the whole data set."""
        ...
    @property
    def shard_index(self) -> int: ...


class IdxReader(Reader):
    def __init__(self, data: IdxDataset, shard_index: int = ..., num_shards: int = ..., pool: BufferPool = ...) -> None: ...


class NpyReader(Reader):
    def __init__(self, files: List[Tuple[Union[str, os.PathLike], int]], shard_index: int = ..., num_shards: int = ..., pool: BufferPool = ...) -> None:
        """files: (path, label) pairs."""
        ...
    @staticmethod
    def from_directory(dir: Union[str, os.PathLike], labels_csv: Optional[Union[str, os.PathLike]] = ..., shard_index: int = ..., num_shards: int = ..., pool: BufferPool = ...) -> NpyReader:
        """The files listed in labels_csv (`file,label` lines), or every *.npy file in dir, in name order, labelled 0."""
        ...


class RawVolumeReader(Reader):
    def __init__(self, file: Union[str, os.PathLike], shape: Shape, dtype: str, label: int = ..., shard_index: int = ..., num_shards: int = ..., pool: BufferPool = ...) -> None: ...


class RemoteOptions:
    """How a data set's remote shards (http://, https://, s3://) are
    read (docs/remote.md): a request's timeout (seconds), retries with backoff (seconds, full jitter) on
    timeouts, dropped connections, 429 and 5xx, a retry budget for the data set, the https
    certificates (ca_file), a cache of whole shards on the local disk (cache_dir, cache_bytes: both
    or neither), how many shards ahead are fetched into it in shard order (prefetch), and the most
    bytes of answers in flight at once (max_bytes_in_flight)."""
    def __init__(self, *, timeout: float = ..., retries: int = ..., backoff: float = ..., max_backoff: float = ..., retry_budget: int = ..., ca_file: str = ..., cache_dir: Optional[Union[str, os.PathLike]] = ..., cache_bytes: int = ..., prefetch: int = ..., max_bytes_in_flight: int = ...) -> None: ...
    @property
    def backoff(self) -> float: ...
    @property
    def ca_file(self) -> str: ...
    @property
    def cache_bytes(self) -> int: ...
    @property
    def cache_dir(self) -> Optional[Union[str, os.PathLike]]: ...
    @property
    def max_backoff(self) -> float: ...
    @property
    def max_bytes_in_flight(self) -> int: ...
    @property
    def prefetch(self) -> int: ...
    @property
    def retries(self) -> int: ...
    @property
    def retry_budget(self) -> int: ...
    @property
    def timeout(self) -> float: ...


class Resize:
    """A resize of the whole image, then optionally its centre crop, for
    evaluation (a map stage): torchvision's Resize(256) + CenterCrop(224) is
    Resize(shorter=256, crop=(224, 224)); Resize(size=(h, w)) resizes to exactly that."""
    def __init__(self, shorter: int = ..., size: Optional[Union[int, Sequence[int]]] = ..., crop: Optional[Union[int, Sequence[int]]] = ..., antialias: bool = ..., normalize: Optional[Normalizer] = ..., layout: Optional[str] = ..., pool: BufferPool = ...) -> None: ...
    @property
    def crop(self) -> object: ...


class Sample:
    """An array of up to four dimensions with a label and an id.
    A DLPack producer: numpy.from_dlpack(sample) or torch.from_dlpack(sample) view it without
    a copy, as [C, (D,) H, W] (or [(D,) H, W, C] when its channels come last)."""
    @property
    def __array_interface__(self) -> dict: ...
    def __dlpack__(self, stream: object = ...) -> object: ...
    def __dlpack_device__(self) -> tuple: ...
    @property
    def dtype(self) -> str: ...
    @property
    def id(self) -> int: ...
    @property
    def label(self) -> int: ...
    @property
    def shape(self) -> tuple: ...


class Shape:
    """Channels, depth, height, width of a sample."""
    def __eq__(self, other: object) -> bool: ...
    def __init__(self, channels: int = ..., depth: int = ..., height: int = ..., width: int = ..., volume: bool = ..., channels_last: bool = ...) -> None: ...
    channels: int
    channels_last: bool
    depth: int
    def elements(self) -> int: ...
    height: int
    volume: bool
    width: int


class ShardOptions:
    """This rank's share of each epoch: the epoch's k-th sample
    goes to rank k % world; remainder 'drop' or 'pad'."""
    def __init__(self, rank: int = ..., world: int = ..., remainder: str = ...) -> None: ...
    @property
    def rank(self) -> int: ...
    @property
    def world(self) -> int: ...


class ShuffleOptions:
    """A random-shuffle buffer's capacity, min_after_dequeue and seed."""
    def __init__(self, capacity: int = ..., min_after_dequeue: int = ..., seed: Optional[int] = ...) -> None: ...
    @property
    def capacity(self) -> int: ...
    @property
    def min_after_dequeue(self) -> int: ...
    @property
    def seed(self) -> Optional[int]: ...


class ShuffledShard:
    """One rank's share of a data set, reshuffled every epoch from
    the pipeline's seed: the source of a data-parallel job."""
    def __init__(self, reader: Reader, rank: int = ..., world: int = ..., remainder: str = ...) -> None: ...
    def __len__(self) -> int: ...


class StageError(RuntimeError):
    stage: str


class StateError(ValueError):
    ...


class SyntheticSource(Reader):
    def __init__(self, shape: Shape = ..., dtype: str = ..., count: int = ..., seed: int = ..., num_classes: int = ..., shard_index: int = ..., num_shards: int = ..., pool: BufferPool = ...) -> None: ...


class ThreadBudget:
    """One thread budget for several
    pipelines (PipelineBuilder.budget, ImageLoader's budget): together they run at most `threads`
    stage calls at once, e.g. a training and an evaluation loader on one machine's cores. A
    pipeline nobody iterates holds none of its turns. 0 = one per core."""
    def __init__(self, threads: int = ...) -> None: ...
    @property
    def running(self) -> int: ...
    @property
    def threads(self) -> int: ...
    @property
    def waiting(self) -> int: ...


class Timeline:
    """Work timed outside the graph, for PipelineBuilder.timeline()."""


def fashion_mnist(dir: Union[str, os.PathLike] = ..., split: str = ...) -> IdxDataset:
    """Fashion-MNIST's 'train' (60,000 images) or 't10k' (10,000) split, from the Debian package dataset-fashion-mnist by default."""
    ...

def load_idx(images: Union[str, os.PathLike], labels: Union[str, os.PathLike]) -> IdxDataset: ...

__version__: str
