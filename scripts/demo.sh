#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds stoker into build/ (incrementally), trains the demo classifier on Fashion-MNIST
# through a full pipeline (on the GPU when there is one, else on the CPU), then reads the
# run's queue-occupancy log with stoker-inspect. Arguments go to stoker-train,
# e.g. `scripts/demo.sh --epochs 2` or `scripts/demo.sh --device cpu`.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

build_dir="${STOKER_BUILD_DIR:-build}"
case "$build_dir" in /*) ;; *) build_dir="$root/$build_dir" ;; esac
export STOKER_BUILD_DIR="$build_dir"

train="$build_dir/apps/stoker-train/stoker-train"
inspect="$build_dir/apps/stoker-inspect/stoker-inspect"

# Help answers at once: a first build takes minutes.
for arg in "$@"; do
  if [[ $arg == -h || $arg == --help ]]; then
    echo "usage: scripts/demo.sh [stoker-train options]"
    echo "Builds stoker into \$STOKER_BUILD_DIR (default build/), runs stoker-train with these options and an"
    echo "occupancy log, then stoker-inspect on the log, which it draws to $build_dir/demo.occupancy.svg."
    if [[ -x "$train" ]]; then
      echo
      "$train" --help
    else
      echo "stoker-train's options: docs/train.md (stoker-train is not built in $build_dir yet)."
    fi
    exit 0
  fi
done

bash "$root/scripts/build.sh"
for app in "$train" "$inspect"; do
  if [[ ! -x "$app" ]]; then
    echo "demo: $app was not built (is STOKER_BUILD_APPS off in $build_dir?)" >&2
    exit 1
  fi
done

log="$build_dir/demo.occupancy.jsonl"
plot="$build_dir/demo.occupancy.svg"
echo "demo: stoker-train --occupancy-log $log $*" >&2
"$train" --occupancy-log "$log" "$@"
echo
echo "demo: stoker-inspect $log --plot $plot" >&2
"$inspect" "$log" --plot "$plot"
echo "demo: queue fill over time drawn in $plot (open it in a browser)" >&2
