#!/usr/bin/env bash
# Builds stoker into build/ (incrementally) and runs the demo.
# Until the demo trainer exists this is the queue benchmark; arguments go to it,
# e.g. `scripts/demo.sh --json`.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

build_dir="${STOKER_BUILD_DIR:-build}"
case "$build_dir" in /*) ;; *) build_dir="$root/$build_dir" ;; esac
export STOKER_BUILD_DIR="$build_dir"

bash "$root/scripts/build.sh"

bench="$build_dir/apps/stoker-bench/stoker-bench"
if [[ ! -x "$bench" ]]; then
  echo "demo: $bench was not built (is STOKER_BUILD_APPS off in $build_dir?)" >&2
  exit 1
fi
echo "demo: stoker-bench queues $*" >&2
exec "$bench" queues "$@"
