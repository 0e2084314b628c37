#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs missing dependencies, then configures (once) and builds stoker incrementally.
# Shared by test.sh, demo.sh and .ci/run.
#
#   STOKER_BUILD_DIR    build directory, relative to the repository root or absolute (default: build)
#   STOKER_CMAKE_ARGS   extra cmake arguments, space-separated, e.g. "-DSTOKER_CUDA=OFF"
#   STOKER_BUILD_TARGET build only this target (default: all)
#   STOKER_JOBS         parallel build jobs (default: all cores)
#
# The tree is configured only when it is not configured yet, and afresh when
# STOKER_CMAKE_ARGS changed since the last configure; otherwise `cmake --build` alone reruns
# cmake if a CMakeLists.txt changed, so repeated runs rebuild only what changed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=deps.sh
source "$root/scripts/deps.sh"
stoker_deps

build_dir="${STOKER_BUILD_DIR:-build}"
jobs="${STOKER_JOBS:-$(nproc)}"
extra_args=()
read -r -a extra_args <<<"${STOKER_CMAKE_ARGS:-}"
args_stamp="$build_dir/.stoker-cmake-args"

configure_args=(-G Ninja -DCMAKE_BUILD_TYPE=Release "${extra_args[@]}")  # later -D wins
if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  echo "build: configuring $build_dir ${extra_args[*]}"
  cmake -S . -B "$build_dir" "${configure_args[@]}"
elif [[ ! -f "$build_dir/build.ninja" ]]; then
  # A configure that failed half-way (or another generator's tree) leaves nothing to build from.
  echo "build: $build_dir is not a complete Ninja tree, configuring it afresh"
  cmake --fresh -S . -B "$build_dir" "${configure_args[@]}"
elif [[ "$(cat "$args_stamp" 2>/dev/null)" != "${STOKER_CMAKE_ARGS:-}" ]]; then
  # --fresh drops the old cache, so an option left out now goes back to its default; ninja
  # still rebuilds only the objects whose command lines changed.
  echo "build: STOKER_CMAKE_ARGS changed, configuring $build_dir afresh ${extra_args[*]}"
  cmake --fresh -S . -B "$build_dir" "${configure_args[@]}"
fi
printf '%s\n' "${STOKER_CMAKE_ARGS:-}" >"$args_stamp"

target_args=()
if [[ -n "${STOKER_BUILD_TARGET:-}" ]]; then
  target_args=(--target "$STOKER_BUILD_TARGET")
fi
echo "build: building $build_dir with $jobs jobs"
cmake --build "$build_dir" --parallel "$jobs" "${target_args[@]}"
