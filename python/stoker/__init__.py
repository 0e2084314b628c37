# SPDX-License-Identifier: Apache-2.0
"""stoker: multi-stage input pipelines for training, run in C++, consumed from Python.

The pipeline builder, stages and batches come from the compiled module (``stoker._stoker``);
``stoker.ImageLoader`` (``stoker.loader``) is the one-call loader for image folders, lists and
tar shards that a torchvision user reaches for first. docs/python.md.
"""

import sys as _sys

from . import _stoker
from ._stoker import *  # noqa: F401,F403 (the module's public names, listed in its __all__)
from ._stoker import __version__, gpu
from .loader import IMAGENET_MEAN, IMAGENET_STD, ImageLoader

# `import stoker.gpu` finds the compiled submodule.
_sys.modules[__name__ + ".gpu"] = gpu

__all__ = list(_stoker.__all__) + ["gpu", "ImageLoader", "IMAGENET_MEAN", "IMAGENET_STD"]
