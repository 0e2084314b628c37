# SPDX-License-Identifier: Apache-2.0
"""The Python module's tests: run by scripts/test.sh with PYTHONPATH=<build>/python, or by hand:

    PYTHONPATH=build/python /usr/bin/python3 -m pytest tests/python
"""

import os

import pytest

import stoker

FASHION = "/usr/share/datasets/fashion-mnist"


@pytest.fixture(scope="session")
def fashion():
    if not os.path.isdir(FASHION):
        pytest.skip(f"Fashion-MNIST is not installed at {FASHION} (Debian: dataset-fashion-mnist)")
    return stoker.fashion_mnist()


@pytest.fixture(scope="session")
def small(fashion):
    """The first 2,000 training images."""
    return stoker.IdxDataset(fashion.images[:2000], fashion.labels[:2000])
