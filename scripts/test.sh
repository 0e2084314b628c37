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
# when it is found; the demo does not need it.
export STOKER_EXTRA_PACKAGES="${STOKER_EXTRA_PACKAGES:-} libtorch-dev chromium"
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
fi

echo "test.sh: PASSED ($([[ $consumer == 1 ]] && echo "tests and find_package consumer" || echo "tests") in ${build_dir#"$root"/})"
