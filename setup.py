# SPDX-License-Identifier: Apache-2.0
"""Builds the extension module stoker._stoker with CMake for `pip install .` / `pip wheel .`.

The libraries are built static (position-independent) and linked into the module, so that the
installed package needs none of stoker's own shared libraries beside it. CMake's options go in
STOKER_PIP_CMAKE_ARGS (space-separated, e.g. "-DSTOKER_CUDA=OFF"); the build tree in
STOKER_PIP_BUILD_DIR (default: setuptools' temporary folder), which a later build reuses.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def version() -> str:
    text = (ROOT / "CMakeLists.txt").read_text()
    match = re.search(r"project\(stoker VERSION ([0-9.]+)", text)
    if not match:
        sys.exit("setup.py: no 'project(stoker VERSION x.y.z' in CMakeLists.txt")
    return match.group(1)


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        build = Path(os.environ.get("STOKER_PIP_BUILD_DIR") or Path(self.build_temp) / "cmake").resolve()
        build.mkdir(parents=True, exist_ok=True)
        configure = [
            "cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DPython_EXECUTABLE={sys.executable}",
            "-DSTOKER_PYTHON=ON",
            "-DSTOKER_BUILD_TESTS=OFF",
            "-DSTOKER_BUILD_APPS=OFF",
            "-DSTOKER_MPI=OFF",  # the module runs one process; MPI jobs use stoker-train
            "-DSTOKER_SHARED=OFF",
            "-DCMAKE_POSITION_INDEPENDENT_CODE=ON",
            *shlex.split(os.environ.get("STOKER_PIP_CMAKE_ARGS", "")),
        ]
        try:  # pybind11 from pip keeps its CMake package inside site-packages, where CMake does not look
            import pybind11
            configure.append(f"-Dpybind11_DIR={pybind11.get_cmake_dir()}")
        except ImportError:
            pass
        jobs = os.environ.get("STOKER_JOBS") or str(os.cpu_count() or 1)
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(build), "--target", "stoker_python", "--parallel", jobs], check=True)
        built = sorted((build / "python" / "stoker").glob("_stoker.*.so"))
        if len(built) != 1:
            sys.exit(f"setup.py: expected one module _stoker.*.so in {build / 'python' / 'stoker'}, found {built}")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        self.copy_file(str(built[0]), str(target))


setup(version=version(), ext_modules=[CMakeExtension("stoker._stoker")], cmdclass={"build_ext": CMakeBuild})
