# SPDX-License-Identifier: Apache-2.0
"""Image files from Python: data sets of JPEG and PNG files, their source, the decoders and the
colour transforms, batches of them into PyTorch, and bad files as errors naming them."""

import collections
import pathlib
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

import stoker

IMAGENET = stoker.Normalizer(scale=255, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"
COUNT = 24


def picture(rng, height, width):
    """Smooth content with some noise, as photographs have: what JPEG is made for."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (width + height)], axis=-1)
    return np.clip(base + rng.integers(-20, 20, base.shape), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """COUNT images of 48 to 160 pixels a side, every fourth a PNG, some gray, listed in train.txt
    with labels 0 to 2, and the same files in a folder per class."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(1)
    lines = []
    for i in range(COUNT):
        pixels = picture(rng, int(rng.integers(48, 160)), int(rng.integers(48, 160)))
        image = Image.fromarray(pixels)
        if i % 5 == 4:
            image = image.convert("L")
        name = f"img{i:02d}." + ("png" if i % 4 == 0 else "jpg")
        image.save(root / name, quality=90)
        label = i % 3
        lines.append(f"{name} {label}")
        folder = root / "classes" / f"class{label}"
        folder.mkdir(parents=True, exist_ok=True)
        image.save(folder / name, quality=90)
    (root / "train.txt").write_text("\n".join(lines) + "\n")
    return root


def labels_of(root):
    return [int(line.split()[1]) for line in (root / "train.txt").read_text().splitlines()]


def decode_crop_pipeline(data, size=(32, 32), **collate):
    return (stoker.PipelineBuilder().threads(2).seed(7).epochs(1).deterministic()
            .source("read", stoker.ImageSource(data))
            .map("decode_crop", stoker.DecodeCropWindow(
                crop=stoker.RandomResizedCropOptions(size=size, mirror=True, normalize=IMAGENET)), threads=2)
            .batch("batch", 10)
            .map("collate", stoker.Collate(**collate))
            .build())


def test_the_docs_example_runs_as_written(images, monkeypatch):
    text = DOCS.read_text()
    marker = "<!-- tests/python/test_images.py runs this example -->\n```python\n"
    code = text[text.index(marker) + len(marker):]
    code = code[:code.index("```")]
    monkeypatch.chdir(images)  # it opens train.txt
    scope = {}
    exec(compile(code, str(DOCS), "exec"), scope)
    pipe, x, y = scope["pipe"], scope["x"], scope["y"]
    assert pipe.finished
    assert x.dtype == torch.float32 and x.shape == (COUNT - 16, 3, 224, 224)  # the last batch: 24 = 16 + 8
    assert y.dtype == torch.int64 and y.shape == (COUNT - 16,)


def test_decode_crop_window_batches_every_image_once_with_its_label_without_a_copy(images):
    data = stoker.ImageDataset.open(images / "train.txt")
    assert len(data) == COUNT and data.classes == [] and data.name(3).endswith("img03.jpg")
    pipe = decode_crop_pipeline(data)
    labels = collections.Counter()
    for batch in pipe:
        x, y = torch.from_dlpack(batch.samples), torch.from_dlpack(batch.labels)
        assert x.dtype == torch.float32 and x.shape[1:] == (3, 32, 32)
        assert x.data_ptr() == batch.samples.ctypes.data and y.data_ptr() == batch.labels.ctypes.data
        assert torch.isfinite(x).all() and x.abs().max() < 3  # normalized: (x/255 - mean)/std
        labels.update(y.tolist())
    assert labels == collections.Counter(labels_of(images))
    assert pipe.summary()["consumed"] == 3  # 10, 10, 4


def test_the_two_stage_form_decodes_then_crops(images):
    data = stoker.ImageDataset.open(images / "train.txt")
    pipe = (stoker.PipelineBuilder().threads(2).seed(7).epochs(1)
            .source("read", stoker.ImageSource(data))
            .map("decode", stoker.ImageDecoder(), threads=2, on_error="skip")
            .map("crop", stoker.RandomResizedCrop(size=(32, 32), mirror=True, normalize=IMAGENET))
            .batch("batch", 10)
            .map("collate", stoker.Collate())
            .build())
    batches = list(pipe)
    assert [b.count for b in batches] == [10, 10, 4]
    for b in batches:
        x = torch.from_dlpack(b.samples)
        assert x.dtype == torch.float32 and x.shape[1:] == (3, 32, 32)


def test_decoded_images_are_channels_last_and_a_png_is_its_pixels(images):
    data = stoker.ImageDataset.open(images / "train.txt")
    pipe = (stoker.PipelineBuilder().epochs(1)
            .source("read", stoker.ImageSource(data, order="fixed"))
            .map("decode", stoker.ImageDecoder())
            .build())
    labels = labels_of(images)
    ids = []
    for sample in pipe:
        ids.append(sample.id)
        assert sample.dtype == "uint8" and sample.label == labels[sample.id]
        name = data.name(sample.id)
        expected = np.asarray(Image.open(name).convert("RGB"))
        assert sample.shape == expected.shape  # (H, W, 3)
        pixels = np.from_dlpack(sample)
        if name.endswith(".png"):
            np.testing.assert_array_equal(pixels, expected)
        else:  # libjpeg-turbo both, up to the IDCT and upsampling they pick
            assert np.abs(pixels.astype(int) - expected).mean() < 2
    assert ids == list(range(COUNT))  # order="fixed": the data set's order


def test_decode_crop_window_equals_decode_resized_crop_then_collate(images):
    data = stoker.ImageDataset.open(images / "train.txt")
    crop = stoker.RandomResizedCropOptions(size=(40, 30), mirror=True, normalize=IMAGENET)

    def run(stage):
        pipe = (stoker.PipelineBuilder().threads(2).seed(3).epochs(1).deterministic()
                .source("read", stoker.ImageSource(data))
                .map("decode_crop", stage, threads=2)
                .batch("batch", 8)
                .map("collate", stoker.Collate())
                .build())
        return [torch.from_dlpack(b.samples).clone() for b in pipe]

    window = run(stoker.DecodeCropWindow(crop=crop))
    resized = run(stoker.DecodeResizedCrop(crop=crop))
    assert len(window) == len(resized) == 3
    for a, b in zip(window, resized):
        assert a.shape == (8, 3, 40, 30) and torch.equal(a, b)


def test_gray_decodes_layouts_and_resize(images):
    data = stoker.ImageDataset.open(images / "train.txt")
    gray = stoker.Normalizer(scale=255, mean=[0.5], std=[0.25])
    pipe = (stoker.PipelineBuilder().epochs(1)
            .source("read", stoker.ImageSource(data))
            .map("decode_crop", stoker.DecodeCropWindow(crop=stoker.RandomResizedCropOptions(size=(16, 16)),
                                                         decode=stoker.DecodeOptions(color="gray")))
            .batch("batch", COUNT)
            .map("collate", stoker.Collate(normalize=gray, layout="channels_last"))
            .build())
    (batch,) = list(pipe)
    assert batch.samples.shape == (COUNT, 16, 16, 1) and batch.samples.dtype == "float32"

    pipe = (stoker.PipelineBuilder().epochs(1)
            .source("read", stoker.ImageSource(data))
            .map("decode", stoker.ImageDecoder(color="gray"))
            .map("resize", stoker.Resize(shorter=40, crop=(32, 32), layout="planar"))
            .build())
    for sample in pipe:
        assert sample.shape == (1, 32, 32) and sample.dtype == "uint8"

    pipe = (stoker.PipelineBuilder().epochs(1)
            .source("read", stoker.ImageSource(data))
            .map("decode", stoker.ImageDecoder())
            .map("resize", stoker.Resize(size=(20, 24), normalize=IMAGENET))
            .batch("batch", COUNT)
            .map("collate", stoker.Collate())
            .build())
    (batch,) = list(pipe)
    assert batch.samples.shape == (COUNT, 3, 20, 24) and batch.samples.dtype == "float32"


def test_gray_of_a_colour_jpeg_is_within_a_level_of_pils_luma_on_average(images):
    """docs/images.md: gray from a colour JPEG is the JPEG's own Y, not PIL's luma of the decoded
    RGB; the two differ by under a level on average, by more at single pixels."""
    names = [line.split()[0] for line in (images / "train.txt").read_text().splitlines()]
    data = stoker.ImageDataset.open(images / "train.txt")
    pipe = (stoker.PipelineBuilder().epochs(1)
            .source("read", stoker.ImageSource(data))
            .map("decode", stoker.ImageDecoder(color="gray"))
            .build())
    differences = []
    for sample in pipe:
        path = images / names[sample.id]
        with Image.open(path) as image:
            if path.suffix != ".jpg" or image.mode != "RGB":
                continue
            expected = np.asarray(image.convert("L"), dtype=np.int16)
        view = np.asarray(sample)  # through __array_interface__, without a copy
        assert view.shape == sample.shape and view.dtype == np.uint8
        got = view.reshape(expected.shape).astype(np.int16)
        differences.append(np.abs(got - expected).ravel())
    assert len(differences) >= COUNT // 2  # most of the fixture's images are colour JPEGs
    differences = np.concatenate(differences)
    assert differences.mean() < 1.0, f"mean {differences.mean():.3f}, max {differences.max()}"


def test_a_folder_per_class_gives_the_classes_in_name_order(images):
    data = stoker.ImageDataset.open(images / "classes")
    assert data.classes == ["class0", "class1", "class2"] and len(data) == COUNT
    pipe = (stoker.PipelineBuilder().epochs(1)
            .source("read", stoker.ImageSource(data))
            .build())
    items = list(pipe)
    assert all(isinstance(e, stoker.EncodedImage) for e in items)
    for e in items:
        assert e.name == data.name(e.id) and f"class{e.label}" in e.name
        assert e.bytes() == pathlib.Path(e.name).read_bytes() and len(e) == len(e.bytes())
    first = data.subset([0, 5])
    assert len(first) == 2 and first.name(1) == data.name(5)


def test_webdataset_tar_shards_give_each_sample_its_cls_label(images, tmp_path):
    labels = labels_of(images)
    with tarfile.open(tmp_path / "shard-0.tar", "w") as tar:
        for i, line in enumerate((images / "train.txt").read_text().splitlines()):
            name = line.split()[0]
            tar.add(images / name, arcname=f"s{i:02d}" + name[name.index("."):])
            cls = tmp_path / f"s{i:02d}.cls"
            cls.write_text(str(labels[i]))
            tar.add(cls, arcname=cls.name)
    data = stoker.ImageDataset.open(tmp_path / "shard-0.tar")
    assert len(data) == COUNT and data.shards == 1 and data.name(2).endswith("shard-0.tar:s02.jpg")
    pipe = (stoker.PipelineBuilder().threads(2).epochs(1)
            .source("read", stoker.ImageSource(data, order="shards"))
            .map("decode", stoker.ImageDecoder(), threads=2)
            .build())
    got = {s.id: s.label for s in pipe}
    assert got == dict(enumerate(labels))


def test_ranks_read_disjoint_shares_of_every_epoch(images):
    data = stoker.ImageDataset.open(images / "train.txt")

    def ids(rank):
        source = stoker.ImageSource(data, shard=stoker.ShardOptions(rank=rank, world=2))
        assert len(source) == COUNT // 2
        pipe = stoker.PipelineBuilder().seed(5).epochs(1).source("read", source).build()
        return [e.id for e in pipe]

    a, b = ids(0), ids(1)
    assert len(a) == len(b) == COUNT // 2
    assert sorted(a + b) == list(range(COUNT))
    with pytest.raises(ValueError, match="rank"):
        stoker.ImageSource(data, shard=stoker.ShardOptions(rank=2, world=2))


def test_a_mixture_draws_from_its_data_sets_by_weight_and_reads_each_image_from_its_own(images):
    data = stoker.ImageDataset.open(images / "train.txt")
    first, rest = data.subset(list(range(8))), data.subset(list(range(8, COUNT)))
    mix = stoker.MixedImageSource([first, rest], weights=[1, 2], stop="all_exhausted")
    assert "all exhausted" in repr(mix)
    assert mix.counts(seed=5, epoch=0) == [8, COUNT - 8]
    pipe = (stoker.PipelineBuilder().seed(5).epochs(2).threads(2)
            .source("read", mix).map("decode", stoker.ImageDecoder(), threads=2).build())
    assert len(pipe) == COUNT  # all_exhausted: every image once, whatever the seed
    for epoch in pipe.epochs():
        ids = []
        for image in epoch:
            ids.append(image.id)  # offset(part) + the id in its data set: here, the list's own
            assert image.label == labels_of(images)[image.id]
        assert sorted(ids) == list(range(COUNT))

    resampled = stoker.MixedImageSource([first, rest], weights=[1, 1], stop="resample", epoch_images=200)
    counts = resampled.counts(seed=1, epoch=0)
    assert sum(counts) == 200 and 70 < counts[0] < 130  # half of them, the small one repeating
    lengthless = stoker.PipelineBuilder().source("read", stoker.MixedImageSource([first, rest], weights=[1, 1])).build()
    with pytest.raises(TypeError, match="depends on the pipeline's seed"):
        len(lengthless)
    with pytest.raises(ValueError, match="stop"):
        stoker.MixedImageSource([first, rest], weights=[1, 1], stop="never")
    with pytest.raises(ValueError, match=r"weights\[1\] is 0"):
        stoker.MixedImageSource([first, rest], weights=[1, 0])


@pytest.fixture()
def truncated(images, tmp_path):
    """The list with its sixth image cut to half its bytes."""
    lines = []
    for i, line in enumerate((images / "train.txt").read_text().splitlines()):
        name, label = line.split()
        if i == 5:
            whole = (images / name).read_bytes()
            (tmp_path / "cut.jpg").write_bytes(whole[:len(whole) // 2])
            lines.append(f"{tmp_path / 'cut.jpg'} {label}")
        else:
            lines.append(f"{images / name} {label}")
    (tmp_path / "train.txt").write_text("\n".join(lines) + "\n")
    return stoker.ImageDataset.open(tmp_path / "train.txt")


@pytest.mark.parametrize("stage", [stoker.ImageDecoder(),
                                   stoker.DecodeCropWindow(crop=stoker.RandomResizedCropOptions(size=(8, 8)))])
def test_a_truncated_image_is_a_stage_error_naming_the_file_or_skipped_and_counted(truncated, stage):
    pipe = (stoker.PipelineBuilder().epochs(1)
            .source("read", stoker.ImageSource(truncated, order="fixed"))
            .map("decode", stage)
            .build())
    with pytest.raises(stoker.StageError) as e:
        list(pipe)
    assert e.value.stage == "decode"
    assert isinstance(e.value.__cause__, stoker.DataError)
    assert e.value.__cause__.file.endswith("cut.jpg") and "cut.jpg" in str(e.value)

    pipe = (stoker.PipelineBuilder().threads(2).epochs(1)
            .source("read", stoker.ImageSource(truncated))
            .map("decode", stage, threads=2, on_error="skip")
            .build())
    assert len(list(pipe)) == COUNT - 1
    decode = next(s for s in pipe.summary()["stages"] if s["name"] == "decode")
    assert decode["skipped"] == 1 and decode["items_out"] == COUNT - 1


def test_a_missing_list_is_a_data_error_naming_it(tmp_path):
    with pytest.raises(stoker.DataError) as e:
        stoker.ImageDataset.open(tmp_path / "nothing.txt")
    assert e.value.file.endswith("nothing.txt")


@pytest.mark.parametrize("step, message", [
    (lambda b: b.map("collate", stoker.Collate()),
     "map 'collate': Collate takes list of Sample or list of DeferredCrop or list of DeferredResize, "
     "but 'decode_crop' gives DeferredResize (a .batch() before it makes lists)"),
    (lambda b: b.map("decode", stoker.ImageDecoder()),
     "map 'decode': ImageDecoder takes EncodedImage, but 'decode_crop' gives DeferredResize"),
])
def test_an_image_stage_that_cannot_take_the_items_before_it_is_a_type_error(images, step, message):
    builder = (stoker.PipelineBuilder()
               .source("read", stoker.ImageSource(stoker.ImageDataset.open(images / "train.txt")))
               .map("decode_crop", stoker.DecodeCropWindow(crop=stoker.RandomResizedCropOptions(size=(8, 8)))))
    with pytest.raises(TypeError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        step(builder)


def test_bad_image_options_name_the_option(images):
    with pytest.raises(ValueError, match="layout must be one of 'planar', 'channels_last', not 'nchw'"):
        stoker.Collate(layout="nchw")
    with pytest.raises(ValueError, match="color must be one of 'rgb', 'gray', not 'cmyk'"):
        stoker.ImageDecoder(color="cmyk")
    with pytest.raises(ValueError, match="order must be one of"):
        stoker.ImageSource(stoker.ImageDataset.open(images / "train.txt"), order="random")
    with pytest.raises(TypeError):
        stoker.ImageSource(None)
    with pytest.raises(ValueError, match="scale"):
        stoker.RandomResizedCrop(size=(8, 8), scale=(1.0, 0.5))
    with pytest.raises(ValueError, match="normaliz"):  # gray images, three channels' normalization
        stoker.DecodeResizedCrop(crop=stoker.RandomResizedCropOptions(size=(8, 8), normalize=IMAGENET),
                                 decode=stoker.DecodeOptions(color="gray"))
