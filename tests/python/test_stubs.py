# SPDX-License-Identifier: Apache-2.0
"""The type stubs in the tree are what python/stubgen.py makes of the built module, and mypy reads
them: a program that uses the builder as documented type-checks, and one that misuses it does
not."""

import importlib.util
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def stubgen():
    spec = importlib.util.spec_from_file_location("stubgen", ROOT / "python" / "stubgen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_stubs_in_the_tree_are_those_of_the_built_module():
    made = stubgen().stubs()
    assert set(made) == {"_stoker.pyi", "gpu.pyi"}
    for name, text in made.items():
        path = ROOT / "python" / "stoker" / name
        assert path.read_text() == text, (
            f"{path} is out of date: PYTHONPATH=build/python python3 python/stubgen.py rewrites it")
    top = made["_stoker.pyi"]
    # Builder methods name the builder (an IDE completes the chain), and no C++ name leaks.
    assert "def threads(self, n: int) -> PipelineBuilder" in top
    assert "def build(self, labels: Optional[str] = ...) -> Pipeline" in top
    for text in made.values():
        leaks = [line for line in text.splitlines() if line.strip().startswith("def ") and "::" in line]
        assert not leaks, f"C++ type names in signatures: {leaks}"


@pytest.mark.timeout(300)
def test_mypy_checks_a_program_against_the_stubs(tmp_path):
    program = tmp_path / "user.py"
    program.write_text(textwrap.dedent("""
        import stoker

        def run(path: str) -> int:
            pipe = (stoker.PipelineBuilder().threads(2).seed(7).epochs(1)
                    .source("read", stoker.ImageSource(stoker.ImageDataset.open(path)))
                    .map("decode_crop", stoker.DecodeCropWindow(
                        crop=stoker.RandomResizedCropOptions(size=224, mirror=True,
                                                             normalize=stoker.Normalizer(mean=0.5, std=0.25))))
                    .batch("batch", 16)
                    .map("collate", stoker.Collate())
                    .build())
            n: int = len(pipe)
            loader = stoker.ImageLoader(path, batch_size=8)
            return n + len(loader) + loader.epoch

        device: stoker.gpu.Device = stoker.gpu.Device.open("cpu")
        wrong: str = stoker.PipelineBuilder().threads(2)
        """))
    # torch's own sources take mypy 40 s to read and say nothing about stoker's stubs: skipped.
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n[mypy-torch.*]\nfollow_imports = skip\n")
    env = dict(os.environ, MYPYPATH=str(ROOT / "python"))
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(config), "--no-incremental",
                           "--ignore-missing-imports", "--follow-imports=silent", str(program)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=280)
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    # The one misuse, and nothing else: the stubs were read (an untyped module gives no error).
    assert len(errors) == 1, done.stdout + done.stderr
    assert "user.py:18" in errors[0] and '"PipelineBuilder"' in errors[0] and '"str"' in errors[0], errors
