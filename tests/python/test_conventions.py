# SPDX-License-Identifier: Apache-2.0
"""torchvision's and the DataLoader's conventions where a torchvision user looks for them: the
normalization as torchvision spells it, int64 labels, len(), a batch that unpacks, arrays that
torch and NumPy take without a copy, int sizes, a repr for every class, and errors that name the
file, option or value."""

import inspect
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import stoker

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def crops_pipeline(data, batch=100, labels=None, drop=False, epochs=1):
    b = (stoker.PipelineBuilder().threads(2).epochs(epochs)
         .source("read", stoker.IdxReader(data))
         .flat_map("crops", stoker.RandomCrops(size=24, count=2, mirror=True), fanout=2)
         .batch("batch", batch, drop_remainder=drop)
         .map("collate", stoker.Collate(normalize=stoker.Normalizer(mean=0.286, std=0.353))))
    return b.build() if labels is None else b.build(labels=labels)


# -- normalization ------------------------------------------------------------------------------


def test_normalizer_in_torchvision_units_gives_what_torchvision_gives():
    pixels = np.arange(0, 256, dtype=np.uint8).reshape(1, 16, 16)
    image = np.repeat(pixels, 3, axis=0)  # [3, 16, 16]
    data = stoker.IdxDataset(np.repeat(pixels[None, 0], 4, axis=0), np.zeros(4, dtype=np.int32))
    ours = (stoker.PipelineBuilder().threads(1).epochs(1)
            .source("read", stoker.IdxReader(data))
            .map("norm", stoker.Normalize(stoker.Normalizer(mean=[0.5], std=[0.25])))
            .batch("batch", 4).map("collate", stoker.Collate()).build())
    x = torch.as_tensor(next(iter(ours)).samples)
    tv = (torch.as_tensor(pixels, dtype=torch.float32) / 255 - 0.5) / 0.25  # ToTensor, Normalize
    assert torch.allclose(x[0], tv, atol=1e-6)
    n = stoker.Normalizer(mean=MEAN, std=STD)
    assert n.scale == 255 and n.mean == pytest.approx(MEAN)
    assert image.dtype == np.uint8


def test_normalizer_values_in_pixel_units_without_a_scale_are_refused_naming_the_option():
    with pytest.raises(ValueError, match=r"mean .*123\.7.* 0-1 units.*scale=1"):
        stoker.Normalizer(mean=[123.7, 116.3, 103.5], std=[58.4, 57.1, 57.4])
    with pytest.raises(ValueError, match=r"std .*58\.4"):
        stoker.Normalizer(mean=[0.5], std=[58.4])
    # Pixel units said explicitly are what they say.
    n = stoker.Normalizer(mean=[123.7, 116.3, 103.5], std=[58.4, 57.1, 57.4], scale=1)
    assert n.scale == 1
    with pytest.raises(ValueError, match="scale"):
        stoker.Normalizer(mean=[0.5], std=[0.5], scale=0)


def test_normalizer_takes_a_number_for_one_channel_and_names_what_it_cannot_take():
    assert stoker.Normalizer(mean=0.286, std=0.353).mean == pytest.approx([0.286])
    with pytest.raises(TypeError, match=r"Normalizer: mean .*'abc'") as e:
        stoker.Normalizer(mean="abc", std=[0.5])
    assert "incompatible" not in str(e.value)  # not pybind11's overload list


# -- labels, len, unpacking ---------------------------------------------------------------------


def test_labels_are_int64_by_default_and_cross_entropy_takes_them(small):
    pipe = crops_pipeline(small)
    images, labels = next(iter(pipe))  # a batch unpacks as (images, labels)
    x, y = torch.as_tensor(images), torch.as_tensor(labels)
    assert y.dtype == torch.int64 and x.dtype == torch.float32
    F.cross_entropy(torch.zeros(len(y), 10), y)  # what failed with int32
    pipe.stop()
    y32 = torch.as_tensor(crops_pipeline(small, labels="int32").next().labels)
    assert y32.dtype == torch.int32 and torch.equal(y32.long()[:5], y32.long()[:5])


def test_len_of_a_pipeline_and_of_an_epoch_counts_batches(small):
    # 2,000 images x 2 crops = 4,000 items: 40 batches of 100, or 39 + a short one of 60 for 102.
    assert len(crops_pipeline(small)) == 40
    pipe = crops_pipeline(small, batch=102, epochs=2)
    assert len(pipe) == 40
    epoch = pipe.epoch()
    assert len(epoch) == 40
    next(epoch), next(epoch)
    assert len(epoch) == 38  # the rest of the epoch
    assert sum(1 for _ in epoch) == 38
    assert len(pipe.epoch()) == 40  # the next epoch, whole
    assert len(crops_pipeline(small, batch=102, drop=True)) == 39


def test_len_is_a_type_error_saying_why_where_it_is_unknown(small):
    pipe = (stoker.PipelineBuilder().threads(1).epochs(1)
            .source("read", stoker.IdxReader(small))
            .flat_map("twice", lambda s: [s, s])
            .build())
    with pytest.raises(TypeError, match=r"'twice'.*fanout"):
        len(pipe)
    pipe.stop()


def test_arrays_go_to_torch_and_numpy_without_a_copy(small):
    pipe = crops_pipeline(small)
    batch = pipe.next()
    for a in (batch.samples, batch.labels):
        address = np.asarray(a).__array_interface__["data"][0]
        assert torch.as_tensor(a).data_ptr() == address
        assert torch.from_dlpack(a).data_ptr() == address
        assert np.asarray(a).ctypes.data == address
    assert np.asarray(batch.samples).shape == (100, 1, 24, 24)
    pipe.stop()


# -- sizes, reprs, errors -----------------------------------------------------------------------


def test_an_int_size_is_a_square_wherever_a_size_is_taken():
    assert stoker.RandomResizedCrop(224).output_size == (224, 224)
    assert stoker.RandomResizedCropOptions(size=224).size == (224, 224)
    assert stoker.RandomCrops(24).size == (24, 24)
    assert stoker.CenterCrop(20).size == (20, 20)
    assert stoker.Resize(shorter=256, crop=224).crop == (224, 224)
    with pytest.raises(ValueError, match=r"size must be .* not \(1, 2, 3, 4\)"):
        stoker.RandomResizedCrop((1, 2, 3, 4))
    with pytest.raises(TypeError, match=r"size must be .* not 'big'"):
        stoker.RandomCrops("big")


def public_classes(module):
    for name, obj in vars(module).items():
        if inspect.isclass(obj) and not name.startswith("_") and not issubclass(obj, BaseException):
            yield name, obj


def test_every_class_has_a_repr_of_its_own(fashion):
    made = {
        "Normalizer": stoker.Normalizer(mean=MEAN, std=STD),
        "RandomCrops": stoker.RandomCrops(24, count=5, mirror=True),
        "Collate": stoker.Collate(),
        "ShuffleOptions": stoker.ShuffleOptions(),
        "Shape": stoker.Shape(1, 1, 28, 28),
        "RandomResizedCrop": stoker.RandomResizedCrop(224),
        "IdxDataset": fashion,
        "ImageDecoder": stoker.ImageDecoder(),
        "DecodeOptions": stoker.DecodeOptions(),
        "MirrorOptions": stoker.MirrorOptions(),
        "PipelineBuilder": stoker.PipelineBuilder().threads(2),
    }
    for name, obj in made.items():
        text = repr(obj)
        assert text.startswith(f"stoker.{name}("), text
        assert " object at 0x" not in text
    assert "mean=[0.485, 0.456, 0.406]" in repr(made["Normalizer"])
    # No class of the module keeps the default repr.
    for module in (stoker, stoker.gpu):
        for name, cls in public_classes(module):
            if cls.__module__.startswith("stoker") and name not in ("ImageLoader",):
                assert cls.__repr__ is not object.__repr__, f"{module.__name__}.{name} has no repr"


def test_a_file_that_is_not_a_list_is_named_not_a_unicode_error(tmp_path):
    jpeg = tmp_path / "x.jpg"
    jpeg.write_bytes(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\xff\xfe\x80\x81garbage")
    with pytest.raises(stoker.DataError) as e:
        stoker.ImageDataset.open(jpeg)
    assert str(jpeg) in str(e.value) and "JPEG" in str(e.value)
    assert e.value.file == str(jpeg)
    listing = tmp_path / "odd.txt"
    listing.write_bytes(b"caf\xe9 x\n")  # Latin-1, not UTF-8: named, with the bytes escaped
    with pytest.raises(stoker.DataError, match=re.escape(str(listing))):
        stoker.ImageDataset.open(listing)

