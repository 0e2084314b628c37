# SPDX-License-Identifier: Apache-2.0
"""Pipelines of every kind built from Python, their items, and the type checks at build time."""

import pathlib

import numpy as np
import pytest
import torch

import stoker

FASHION = stoker.Normalizer(scale=255, mean=[0.286], std=[0.353])


README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_readme_example_runs_as_written(fashion):
    text = README.read_text()
    marker = "<!-- tests/python/test_pipelines.py runs this example -->\n```python\n"
    code = text[text.index(marker) + len(marker):]
    code = code[:code.index("```")]
    scope = {}
    exec(compile(code, str(README), "exec"), scope)  # as written
    pipe, x, y = scope["pipe"], scope["x"], scope["y"]
    assert pipe.finished
    assert x.dtype == torch.float32 and x.shape[1:] == (1, 24, 24)
    assert y.dtype == torch.int64 and y.shape == (x.shape[0],)
    summary = pipe.summary()
    crops = next(s for s in summary["stages"] if s["name"] == "crops")["items_out"]
    assert crops == 5 * len(fashion)
    assert summary["consumed"] == -(-crops // 255)  # every crop, in batches of 255


def center_crops(dataset, size):
    off = (dataset.shape.height - size) // 2
    return dataset.images[:, off:off + size, off:off + size]


def test_a_map_pipeline_of_samples_gives_each_sample_cut_and_normalized(small):
    pipe = (stoker.PipelineBuilder().threads(2).epochs(1).deterministic()
            .source("read", stoker.IdxReader(small))
            .map("center", stoker.CenterCrop(size=(20, 20), normalize=FASHION), threads=2)
            .build())
    expected = (center_crops(small, 20).astype(np.float32) / np.float32(255) - np.float32(0.286)) / np.float32(0.353)
    n = 0
    for sample in pipe.epoch():
        assert isinstance(sample, stoker.Sample)
        assert sample.shape == (1, 20, 20) and sample.dtype == "float32"
        assert sample.label == small.labels[sample.id]
        np.testing.assert_array_equal(np.from_dlpack(sample)[0], expected[sample.id])
        n += 1
    assert n == len(small)


def test_mirror_and_normalize_stages_after_crops_cut_in_the_crop_stage(small):
    pipe = (stoker.PipelineBuilder().threads(2).epochs(1)
            .source("read", stoker.IdxReader(small))
            .flat_map("crops", stoker.RandomCrops(size=(24, 24), count=2), output=stoker.Sample, threads=2)
            .map("mirror", stoker.RandomMirror(p=1.0))
            .map("normalize", stoker.Normalize(FASHION))
            .batch("batch", 100)
            .map("collate", stoker.Collate())
            .build())
    total = 0
    for batch in pipe:
        x = torch.from_dlpack(batch.samples)
        assert x.dtype == torch.float32 and x.shape[1:] == (1, 24, 24)
        total += batch.count
    assert total == 2 * len(small)


def test_crops_normalized_in_the_crop_stage_are_samples_by_default(small):
    pipe = (stoker.PipelineBuilder().threads(2).epochs(1)
            .source("read", stoker.IdxReader(small))
            .flat_map("crops", stoker.RandomCrops(size=(24, 24), count=1, normalize=FASHION))
            .batch("batch", 500)
            .map("collate", stoker.Collate())
            .build())
    assert sum(b.count for b in pipe) == len(small)


def test_npy_and_raw_volume_readers(tmp_path):
    for i in range(6):
        np.save(tmp_path / f"v{i}.npy", np.full((4, 5, 6), i, dtype=np.uint16))
    (tmp_path / "labels.csv").write_text("file,label\n" + "".join(f"v{i}.npy,{i % 3}\n" for i in range(6)))
    npy = stoker.NpyReader.from_directory(tmp_path, tmp_path / "labels.csv")
    raw_file = tmp_path / "volumes.raw"
    np.arange(3 * 2 * 3 * 4, dtype=np.float32).tofile(raw_file)
    raw = stoker.RawVolumeReader(raw_file, stoker.Shape(channels=1, depth=2, height=3, width=4, volume=True),
                                 "float32", label=7)
    for reader, count, shape in ((npy, 6, (1, 4, 5, 6)), (raw, 3, (1, 2, 3, 4))):
        pipe = stoker.PipelineBuilder().epochs(1).deterministic().source("read", reader).build()
        samples = list(pipe)
        assert [s.id for s in samples] == list(range(count))
        assert all(s.shape == shape for s in samples)
    assert np.from_dlpack(samples[1]).ravel()[0] == 24  # the second raw volume starts at element 24
    assert samples[0].label == 7


def test_synthetic_source_and_shuffled_shards_cover_the_data_set_once():
    data = stoker.SyntheticSource(shape=stoker.Shape(1, 1, 8, 8), count=1000, seed=3)
    seen = []
    for rank in range(2):
        pipe = (stoker.PipelineBuilder().seed(11).epochs(1)
                .source("read", stoker.ShuffledShard(data, rank=rank, world=2))
                .build())
        seen += [s.id for s in pipe]
    assert sorted(seen) == list(range(1000))


def test_python_stages_take_and_give_python_objects_and_show_in_the_summary(small):
    pipe = (stoker.PipelineBuilder().threads(2).epochs(1)
            .source("read", stoker.IdxReader(small))
            .batch("batch", 100)
            .map("collate", stoker.Collate())
            .map("to_torch", lambda b: (torch.from_dlpack(b.samples).float().mean(), b.count), threads=2)
            .flat_map("split", lambda pair: [pair[1]] * 2)
            .batch("pairs", 2)
            .map("sum", sum)
            .build())
    assert sum(pipe) == 2 * len(small)
    stages = {s["name"]: s for s in pipe.summary()["stages"]}
    assert [n for n, s in stages.items() if s["python"]] == ["to_torch", "split", "sum"]
    assert stages["to_torch"]["items_in"] == len(small) // 100
    assert stages["to_torch"]["busy_s"] > 0


def test_a_python_source_and_its_epochs():
    items = iter(range(10))
    pipe = (stoker.PipelineBuilder().epochs(1)
            .source("count", lambda: next(items, None))
            .map("square", lambda x: x * x)
            .build())
    assert sorted(pipe) == [x * x for x in range(10)]


def test_to_device_on_the_cpu_backend_hands_over_device_batches(small):
    device = stoker.gpu.Device.open("cpu")
    bytes_per_batch = stoker.Batch.storage_bytes(stoker.Shape(1, 1, 24, 24), "float32", 100)
    to_device = stoker.gpu.ToDevice(device, bytes=bytes_per_batch, device_buffers=5)
    pipe = (stoker.PipelineBuilder().threads(2).epochs(1).counters(stoker.gpu.transfer_counters(device))
            .source("read", stoker.IdxReader(small))
            .flat_map("crops", stoker.RandomCrops(size=(24, 24), count=1))
            .batch("batch", 100)
            .map("collate", stoker.Collate(pool=to_device.staging(), normalize=FASHION), queue=2)
            .map("h2d", to_device, queue=2)
            .build())
    total = 0
    for batch in pipe:
        assert isinstance(batch, stoker.gpu.DeviceBatch)
        x = torch.from_dlpack(batch.samples)  # the CPU backend's device memory is host memory
        assert x.shape == (100, 1, 24, 24) and batch.labels.dtype == "int32"
        # The CPU backend's device memory is host memory: NumPy arrays, once the host waited for the copy.
        assert isinstance(batch.labels, np.ndarray) and batch.memory == "host"
        total += batch.count
    assert total == len(small)
    assert pipe.summary()["counters"]["h2d_copies"] == len(small) // 100
    assert device.transfers()["d2h_copies"] == 0


def test_gpu_augment_on_the_cpu_backend(small):
    device = stoker.gpu.Device.open("cpu")
    augment = stoker.gpu.GpuAugment(device, stoker.RandomCrops(size=(24, 24), count=5, mirror=True,
                                                                normalize=FASHION),
                                    batch_size=255, image=stoker.Shape(1, 1, 28, 28), max_images=256,
                                    shuffle=stoker.ShuffleOptions(capacity=3000, min_after_dequeue=1000, seed=7))
    pipe = (stoker.PipelineBuilder().threads(2).epochs(1)
            .source("read", stoker.IdxReader(small))
            .batch("images", 256)
            .map("collate", stoker.Collate(pool=augment.staging()), queue=1)
            .flat_map("gpu_augment", augment, queue=1)
            .build())
    counts = [torch.from_dlpack(b.samples).shape[0] for b in pipe]
    assert sum(counts) == 5 * len(small)


def test_int64_labels_on_request_equal_the_int32_ones(small):
    def run(labels):
        pipe = (stoker.PipelineBuilder().threads(2).seed(5).epochs(1).deterministic()
                .source("read", stoker.IdxReader(small))
                .flat_map("crops", stoker.RandomCrops(size=(24, 24), count=2, mirror=True), fanout=2)
                .shuffle("shuffle", capacity=1000, min_after_dequeue=200)
                .batch("batch", 128)
                .map("collate", stoker.Collate(normalize=FASHION))
                .build(labels=labels))
        return [(torch.from_dlpack(b.samples).clone(), torch.from_dlpack(b.labels)) for b in pipe]

    narrow, wide = run("int32"), run("int64")
    assert len(narrow) == len(wide)
    for (x32, y32), (x64, y64) in zip(narrow, wide):
        assert y32.dtype == torch.int32 and y64.dtype == torch.int64
        assert torch.equal(y32.long(), y64) and torch.equal(x32, x64)
    torch.nn.functional.cross_entropy(torch.zeros(len(wide[0][1]), 10), wide[0][1])  # takes them as they are


@pytest.mark.parametrize("step, message", [
    (lambda b: b.map("mirror", stoker.RandomMirror()),
     "map 'mirror': RandomMirror takes Sample, but 'crops' gives DeferredCrop"),
    (lambda b: b.map("collate", stoker.Collate()),
     "map 'collate': Collate takes list of Sample or list of DeferredCrop or list of DeferredResize, but 'crops' "
     "gives DeferredCrop "
     "(a .batch() before it makes lists)"),
    (lambda b: b.map("collate", 42), "map 'collate': a int is not a stage function"),
    (lambda b: b.flat_map("again", stoker.RandomCrops(size=(4, 4))),
     "flat_map 'again': RandomCrops takes Sample, but 'crops' gives DeferredCrop"),
    (lambda b: b.batch("b", 2).map("c", stoker.Collate()).batch("bb", 2),
     "batch 'bb': the items of 'c' are Batch, which a Python pipeline does not batch"),
])
def test_a_stage_that_cannot_take_the_items_before_it_is_a_type_error_at_build_time(small, step, message):
    builder = (stoker.PipelineBuilder()
               .source("read", stoker.IdxReader(small))
               .flat_map("crops", stoker.RandomCrops(size=(24, 24), count=5)))
    with pytest.raises(TypeError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        step(builder)


def test_flat_map_output_must_be_one_the_function_gives(small):
    builder = stoker.PipelineBuilder().source("read", stoker.IdxReader(small))
    with pytest.raises(TypeError, match="RandomCrops gives Sample or DeferredCrop from Sample, not <class 'int'>"):
        builder.flat_map("crops", stoker.RandomCrops(size=(24, 24)), output=int)


def test_bad_options_name_the_option(small):
    builder = stoker.PipelineBuilder()
    with pytest.raises(ValueError, match="a pipeline starts with its source"):
        builder.map("x", stoker.Collate())
    with pytest.raises(ValueError, match="on_error must be one of 'fail', 'skip', not 'ignore'"):
        builder.source("read", stoker.IdxReader(small), on_error="ignore")
    with pytest.raises(ValueError, match="build\\(\\): the pipeline has no source"):
        builder.build()
    builder.source("read", stoker.IdxReader(small))
    with pytest.raises(ValueError, match="min_after_dequeue \\(20\\) must be less than capacity \\(10\\)"):
        builder.shuffle("s", capacity=10, min_after_dequeue=20)
    with pytest.raises(ValueError, match="labels must be one of 'int32', 'int64'"):
        builder.build(labels="int16")
    with pytest.raises(ValueError, match="size must be"):
        stoker.RandomCrops(size=(1, 2, 3, 4))
    with pytest.raises(ValueError, match="scale"):
        stoker.Normalizer(mean=[0.5], std=[0.5], scale=0)


def test_the_module_says_its_version():
    assert stoker.__version__.count(".") == 2
