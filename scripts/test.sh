#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds stoker into build/ (incrementally), runs every test, then installs it and proves that
# the install works: every installed program starts (--help, --version), and tests/consumer
# builds against it with find_package(stoker) and its components (every installed header, every
# C++ block of README.md and docs/) and with pkg-config; then installs the Python package with pip
# into a venv, from a fresh copy of the tree, runs it, builds a wheel, and uninstalls it.
#
#   scripts/test.sh [--no-consumer]
#
#   --no-consumer       run ctest only, skip the install and consumer step (sanitizer builds)
#   STOKER_BUILD_DIR    build directory (default: build)
#   STOKER_CMAKE_ARGS   extra cmake arguments, space-separated (reconfigures when they change)
#   STOKER_CTEST_JOBS   tests run in parallel (default: all cores)
#   STOKER_CTEST_ARGS   extra ctest arguments, space-separated, e.g. "-R test_core"
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

consumer=1
for arg in "$@"; do
  case "$arg" in
    --no-consumer) consumer=0 ;;
    -h|--help) awk 'NR > 1 && /^#/ { if (!/^# SPDX-License-Identifier:/) { sub(/^# ?/, ""); print } next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "test.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

# Every source file says its license (scripts/spdx.sh adds the line where it is missing).
bash "$root/scripts/spdx.sh" --check

build_dir="${STOKER_BUILD_DIR:-build}"
case "$build_dir" in /*) ;; *) build_dir="$root/$build_dir" ;; esac
export STOKER_BUILD_DIR="$build_dir"

# libtorch's CPU build, for the example client (apps/stoker-torch-example), which is tested
# when it is found, and PyTorch, pytest and NumPy for the Python module's tests; the demo needs
# none of them.
export STOKER_EXTRA_PACKAGES="${STOKER_EXTRA_PACKAGES:-} libtorch-dev chromium pkgconf python3-torch python3-torchvision python3-pil python3-pytest python3-pytest-timeout python3-numpy python3-venv python3-pip python3-setuptools python3-wheel python3-mypy curl"
bash "$root/scripts/build.sh"

# s3rver, the S3 server test_remote reads from (tests/remote/serve.py starts it): from the npm
# registry, once, into the build tree. npm comes with Node.js (Debian's npm package where the
# machine has no npm).
s3rver_dir="$build_dir/node"
if [[ ! -x "$s3rver_dir/node_modules/.bin/s3rver" ]]; then
  if ! command -v npm >/dev/null 2>&1; then
    # shellcheck source=deps.sh
    source "$root/scripts/deps.sh"
    stoker_deps npm
  fi
  echo "test: installing s3rver 3.7.1 into $s3rver_dir"
  npm install --no-audit --no-fund --prefix "$s3rver_dir" s3rver@3.7.1
fi

ctest_args=()
read -r -a ctest_args <<<"${STOKER_CTEST_ARGS:-}"
echo "test: running ctest in $build_dir ${ctest_args[*]}"
ctest --test-dir "$build_dir" --output-on-failure --no-tests=error \
  -j "${STOKER_CTEST_JOBS:-$(nproc)}" "${ctest_args[@]}"

# The libtorch example is optional (apps/CMakeLists.txt, STOKER_TORCH): say whether it was part of this run.
if grep -q '^STOKER_HAVE_TORCH:INTERNAL=ON$' "$build_dir/CMakeCache.txt" 2>/dev/null; then
  torch_tests="$(ctest --test-dir "$build_dir" -N "${ctest_args[@]}" | grep -c 'Test *#[0-9]*: stoker-torch-example: ' || true)"
  if ((torch_tests > 0)); then
    echo "test: libtorch found: the libtorch example (stoker-torch-example) was built and tested ($torch_tests ctest runs passed)"
  else
    echo "test: libtorch found: the libtorch example (stoker-torch-example) was built; STOKER_CTEST_ARGS left out its tests"
  fi
else
  echo "test: libtorch not found (or STOKER_TORCH=OFF, or a sanitizer build): the libtorch example was not built"
fi

# The Python module is optional too (python/CMakeLists.txt, STOKER_PYTHON): its pytest suite
# runs against the module in the build tree, with the Python it was built for. A test that hangs
# fails after 120 s; one that hangs holding the GIL (which pytest-timeout then cannot break)
# fails the suite after 20 minutes.
if grep -q '^STOKER_HAVE_PYTHON:INTERNAL=ON$' "$build_dir/CMakeCache.txt" 2>/dev/null; then
  python="$(sed -n 's/^Python_EXECUTABLE:FILEPATH=//p' "$build_dir/CMakeCache.txt")"
  echo "test: running the Python module's tests (tests/python) with $python"
  PYTHONPATH="$build_dir/python${PYTHONPATH:+:$PYTHONPATH}" timeout --kill-after=30s 20m \
    "$python" -m pytest -q -p no:cacheprovider --timeout=120 --timeout-method=thread tests/python
else
  echo "test: the Python module was not built (STOKER_PYTHON=OFF, a sanitizer build, or no pybind11): its tests did not run"
fi

if ((consumer)); then
  prefix="$build_dir/install"
  consumer_dir="$build_dir/consumer"
  echo "test: installing into $prefix"
  # A clean prefix, so that a header or target removed from the project cannot linger there.
  rm -rf "$prefix"
  cmake --install "$build_dir" --prefix "$prefix"

  echo "test: every installed program starts from $prefix/bin (--help, --version)"
  for program in stoker-train stoker-inspect stoker-bench; do
    [[ -x "$prefix/bin/$program" ]] || { echo "test: $program was not installed in $prefix/bin" >&2; exit 1; }
  done
  for program in "$prefix"/bin/*; do
    name="$(basename "$program")"
    # The install must find its libraries by itself, not through the build tree's RUNPATH.
    if readelf -d "$program" | grep -F "$build_dir" | grep -v -F "$prefix" >&2; then
      echo "test: the installed $name still names the build tree in its RUNPATH" >&2
      exit 1
    fi
    if ! help="$(env -u LD_LIBRARY_PATH "$program" --help 2>"$build_dir/program.err")"; then
      echo "test: the installed $name --help failed:" >&2
      cat "$build_dir/program.err" >&2
      exit 1
    fi
    # The page of the docs a --help points to is one the install has, named by its path there.
    for page in $(grep -o 'See [^ ]*\.md' <<<"$help" | cut -c5- || true); do
      if [[ "$page" != /*/share/doc/stoker/docs/* || ! -f "$page" ]]; then
        echo "test: the installed $name --help points to $page, not to a page of the install's docs" >&2
        exit 1
      fi
    done
    version="$(env -u LD_LIBRARY_PATH "$program" --version)"
    if [[ "$version" != "$name "[0-9]* ]]; then
      echo "test: the installed $name --version printed '$version'" >&2
      exit 1
    fi
    echo "  ${version//$'\n'/; }"
  done

  echo "test: building tests/consumer against $prefix (CMake components, every header, every docs block)"
  # --fresh: find_package must succeed from scratch every time, not from a cached stoker_DIR.
  # The package registry is off so that only the install prefix can satisfy it. Unoptimized
  # (build type None): what it proves is that they compile, link and run against the install.
  cmake --fresh -S tests/consumer -B "$consumer_dir" -G Ninja \
    -DCMAKE_BUILD_TYPE=None \
    -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
  cmake --build "$consumer_dir" --parallel "${STOKER_JOBS:-$(nproc)}"
  echo "test: running the consumer and the docs' programs"
  ctest --test-dir "$consumer_dir" --output-on-failure --no-tests=error

  # README says what stoker-inspect makes of the example's log: its training loop does nothing
  # and waits for nearly every batch, so the verdict names a part of the input, or none, and
  # never the training loop.
  inspect="$build_dir/apps/stoker-inspect/stoker-inspect"
  if [[ -x $inspect ]]; then
    report=$("$inspect" --json "$consumer_dir/run.occupancy.jsonl")
    json=$(tail -n 1 <<<"$report")
    verdict=$(sed -E 's/.*"verdict":"([a-z]+)".*/\1/' <<<"$json")
    waited=$(sed -E 's/.*"waited_pct":([0-9.]+).*/\1/' <<<"$json")
    grep '^bottleneck:' <<<"$report"
    if [[ $verdict == training ]] || ! awk -v w="$waited" 'BEGIN { exit !(w > 50) }'; then
      echo "test: FAIL: README's example: the training loop waited $waited% of the run, and the verdict is '$verdict'" >&2
      exit 1
    fi
  else
    echo "test: stoker-inspect not built (STOKER_BUILD_APPS=OFF): README's example verdict not checked"
  fi

  echo "test: a component the install does not have fails find_package, naming it"
  missing_dir="$build_dir/consumer-missing"
  rm -rf "$missing_dir" && mkdir -p "$missing_dir/src"
  printf '%s\n' 'cmake_minimum_required(VERSION 3.25)' 'project(missing LANGUAGES CXX)' \
    'find_package(stoker REQUIRED COMPONENTS core no_such_component)' >"$missing_dir/src/CMakeLists.txt"
  if cmake -S "$missing_dir/src" -B "$missing_dir/build" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >"$missing_dir/log" 2>&1 ||
      ! grep -q "no component 'no_such_component'" "$missing_dir/log"; then
    echo "test: find_package(stoker COMPONENTS no_such_component) did not fail as it should:" >&2
    cat "$missing_dir/log" >&2
    exit 1
  fi

  echo "test: building the consumer (and running it) and README's first example with pkg-config (stoker.pc)"
  pc_file="$(find "$prefix" -name stoker.pc)"
  export PKG_CONFIG_PATH="$(dirname "$pc_file")"
  read -r -a pc_cflags <<<"$(pkg-config --cflags stoker)"
  read -r -a pc_libs <<<"$(pkg-config --libs stoker)"
  readme_example="$(ls "$consumer_dir"/docs/readme_*.cpp | sort -t_ -k2 -n | head -1)"
  for source in tests/consumer/main.cpp "$readme_example"; do
    out="$consumer_dir/pkgconfig-$(basename "$source" .cpp)"
    "${CXX:-c++}" -std=c++20 -O1 "$source" "${pc_cflags[@]}" "${pc_libs[@]}" -o "$out"
  done
  # stoker.pc's flags carry the install's lib/ as the program's RUNPATH: no LD_LIBRARY_PATH.
  env -u LD_LIBRARY_PATH "$consumer_dir/pkgconfig-main"
  if [[ -n "${python:-}" ]]; then
    echo "test: importing the Python module installed in $prefix"
    site="$(sed -n 's/^STOKER_PYTHON_INSTALL_DIR:STRING=//p' "$build_dir/CMakeCache.txt")"
    (cd / && PYTHONPATH="$prefix/$site" "$python" -c 'import stoker; stoker.PipelineBuilder()')
  fi
fi

# The pip path, as a Python user takes it (docs/python.md, "Installing with pip"): a fresh copy of
# the tree (what a clone has: tracked files and untracked ones git does not ignore), a venv that
# sees Debian's packages, `pip install --no-build-isolation .`, a pipeline run from another
# folder with the module found inside the venv, a wheel, and `pip uninstall`. Its CMake tree is
# kept in $build_dir/pip-build (STOKER_PIP_BUILD_DIR), so that later runs rebuild what changed.
if ((consumer)) && [[ -n "${python:-}" ]]; then
  pip_dir="$build_dir/pip"
  echo "test: pip install --no-build-isolation of a fresh copy of the tree into a venv ($pip_dir)"
  rm -rf "$pip_dir" && mkdir -p "$pip_dir/src"
  if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$root" && git ls-files -z --cached --others --exclude-standard |
      tar --null -T - --ignore-failed-read -cf -) 2>/dev/null | tar -xf - -C "$pip_dir/src"
  else  # an unpacked archive: everything but build trees
    (cd "$root" && tar -cf - --exclude='./build*' --exclude='./.git' .) | tar -xf - -C "$pip_dir/src"
  fi
  "$python" -m venv --system-site-packages "$pip_dir/venv"
  # Without CUDA and unoptimized (build type None: no -O) unless asked: the build above compiled
  # the kernels and the optimized code, and they are most of this build's time (264 s of CI's
  # limited time, against 100 s); what this step proves is the packaging.
  export STOKER_PIP_BUILD_DIR="$build_dir/pip-build" \
    STOKER_PIP_CMAKE_ARGS="${STOKER_PIP_CMAKE_ARGS:--DSTOKER_CUDA=OFF -DCMAKE_BUILD_TYPE=None}"
  started=$SECONDS
  "$pip_dir/venv/bin/pip" install --no-build-isolation --no-index --quiet "$pip_dir/src"
  echo "test: pip install took $((SECONDS - started)) s"
  (cd "$pip_dir" && env -u PYTHONPATH -u LD_LIBRARY_PATH "$pip_dir/venv/bin/python" - "$pip_dir/venv" <<'PY'
import pathlib, sys
import numpy, stoker
venv = pathlib.Path(sys.argv[1]).resolve()
where = pathlib.Path(stoker._stoker.__file__).resolve()
assert venv in where.parents, f"stoker was imported from {where}, not from the venv {venv}"
assert (where.parent / "py.typed").exists() and (where.parent / "_stoker.pyi").exists(), "no type stubs installed"
data = stoker.IdxDataset(numpy.zeros((64, 8, 8), numpy.uint8), numpy.arange(64, dtype=numpy.int32) % 10)
pipe = (stoker.PipelineBuilder().threads(2).epochs(1).source("read", stoker.IdxReader(data))
        .flat_map("crops", stoker.RandomCrops(6, count=2, mirror=True), fanout=2).batch("batch", 16)
        .map("collate", stoker.Collate(normalize=stoker.Normalizer(mean=0.5, std=0.25))).build())
batches = [(x.shape, y.dtype) for x, y in pipe]
assert len(batches) == len(pipe) == 8 and batches[0] == ((16, 1, 6, 6), numpy.int64), batches
print(f"test: the venv's stoker {stoker.__version__} ({where}) ran a pipeline of {len(batches)} batches")
PY
  )
  "$pip_dir/venv/bin/pip" wheel --no-build-isolation --no-index --no-deps --quiet -w "$pip_dir/wheels" "$pip_dir/src"
  wheel="$(ls "$pip_dir"/wheels/stoker-*.whl)"
  # The listing whole, then searched: `zipfile -l | grep -q` fails under pipefail when grep
  # leaves at its first match and the listing's writer gets a broken pipe.
  listing="$("$pip_dir/venv/bin/python" -m zipfile -l "$wheel")"
  grep -q 'stoker/_stoker\..*\.so' <<<"$listing" ||
    { echo "test: the wheel $wheel holds no compiled module" >&2; exit 1; }
  echo "test: pip wheel made $(basename "$wheel")"
  "$pip_dir/venv/bin/pip" uninstall --yes --quiet stoker
  if (cd "$pip_dir" && env -u PYTHONPATH "$pip_dir/venv/bin/python" -c 'import stoker' 2>/dev/null); then
    echo "test: stoker can still be imported after pip uninstall" >&2
    exit 1
  fi
  echo "test: pip uninstall removed it"
fi

echo "test.sh: PASSED ($([[ $consumer == 1 ]] && echo "tests and find_package consumer" || echo "tests") in ${build_dir#"$root"/})"
