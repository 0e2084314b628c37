#!/usr/bin/env bash
# Builds stoker into build/ (incrementally), runs every test, then proves that
# find_package(stoker) works from an install prefix with the consumer in tests/consumer.
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
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "test.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

build_dir="${STOKER_BUILD_DIR:-build}"
case "$build_dir" in /*) ;; *) build_dir="$root/$build_dir" ;; esac
export STOKER_BUILD_DIR="$build_dir"

# libtorch's CPU build, for the example client (apps/stoker-torch-example), which is tested
# when it is found, and PyTorch, pytest and NumPy for the Python module's tests; the demo needs
# none of them.
export STOKER_EXTRA_PACKAGES="${STOKER_EXTRA_PACKAGES:-} libtorch-dev chromium python3-torch python3-pytest python3-pytest-timeout python3-numpy"
bash "$root/scripts/build.sh"

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

  echo "test: building tests/consumer against $prefix"
  # --fresh: find_package must succeed from scratch every time, not from a cached stoker_DIR.
  # The package registry is off so that only the install prefix can satisfy it.
  cmake --fresh -S tests/consumer -B "$consumer_dir" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
  cmake --build "$consumer_dir"
  "$consumer_dir/stoker-consumer"
  echo "test: running README's example pipeline, as built against $prefix"
  (cd "$consumer_dir" && ./stoker-readme-example)
  if [[ -n "${python:-}" ]]; then
    echo "test: importing the Python module installed in $prefix"
    site="$(sed -n 's/^STOKER_PYTHON_INSTALL_DIR:STRING=//p' "$build_dir/CMakeCache.txt")"
    (cd / && PYTHONPATH="$prefix/$site" "$python" -c 'import stoker; stoker.PipelineBuilder()')
  fi
fi

echo "test.sh: PASSED ($([[ $consumer == 1 ]] && echo "tests and find_package consumer" || echo "tests") in ${build_dir#"$root"/})"
