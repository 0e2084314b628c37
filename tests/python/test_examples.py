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
