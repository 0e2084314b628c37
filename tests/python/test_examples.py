# SPDX-License-Identifier: Apache-2.0
"""examples/python runs, with both loaders, and reports what docs/python.md says it does."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "fashion_train.py"


@pytest.mark.parametrize("loader", ["stoker", "dataloader"])
def test_the_training_example_trains_with_either_loader(fashion, loader):
    done = subprocess.run([sys.executable, str(EXAMPLE), "--loader", loader, "--workers", "1", "--images", "1000",
                           "--json"], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["loader"] == loader and result["samples"] == 5000 and result["batches"] == 20
    assert result["samples_per_s"] > 0 and 0 <= result["starvation_pct"] <= 100
    assert 0.1 < result["test_accuracy"] <= 1  # better than chance after 20 steps


def test_the_example_refuses_a_bad_argument():
    done = subprocess.run([sys.executable, str(EXAMPLE), "--loader", "numpy"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "invalid choice: 'numpy'" in done.stderr


IMAGES_EXAMPLE = EXAMPLE.with_name("train_images.py")


@pytest.fixture(scope="module")
def class_folder(tmp_path_factory):
    """60 JPEGs of 3 classes, each class its own colour, in torchvision's ImageFolder layout."""
    import numpy as np
    from PIL import Image
    root = tmp_path_factory.mktemp("classes")
    rng = np.random.default_rng(2)
    for i in range(60):
        c = i % 3
        pixels = np.clip(rng.normal(60 + 70 * c, 30, (48, 56, 3)), 0, 255).astype(np.uint8)
        pixels[..., c] = 220
        (root / f"class{c}").mkdir(exist_ok=True)
        Image.fromarray(pixels).save(root / f"class{c}" / f"{i:03d}.jpg", quality=90)
    return root


@pytest.mark.parametrize("loader", ["stoker", "torchvision"])
def test_the_image_example_trains_on_a_class_folder_with_either_loader(class_folder, loader):
    done = subprocess.run([sys.executable, str(IMAGES_EXAMPLE), str(class_folder), "--loader", loader,
                           "--workers", "1", "--epochs", "3", "--batch-size", "9", "--size", "32", "--lr", "0.02",
                           "--json"], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["loader"] == loader and result["train_images"] == 54 and result["test_images"] == 6
    assert result["steps"] == 3 * (54 // 9) and result["classes"] == 3
    assert result["images_per_s"] > 0 and 0 <= result["starvation_pct"] <= 100
    assert result["test_accuracy"] >= 2 / 3  # three colours, told apart


def test_the_image_example_names_a_folder_that_is_not_one(tmp_path):
    done = subprocess.run([sys.executable, str(IMAGES_EXAMPLE), str(tmp_path / "none")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and str(tmp_path / "none") in done.stderr
