#!/usr/bin/env bash
# stoker-train killed with SIGKILL mid-epoch and resumed from its last checkpoint ends with
# exactly the weights, optimizer state and test accuracy of the run that was never stopped.
#   kill_resume.sh STOKER_TRAIN WORK_DIR     (exit 77, skipped, without Fashion-MNIST)
set -euo pipefail
# shellcheck source=../await_checkpoint.sh
source "$(dirname "${BASH_SOURCE[0]}")/../await_checkpoint.sh"
train=$1
work=$2
if [[ ! -d /usr/share/datasets/fashion-mnist ]]; then
  echo "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): skipped"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
common=(--limit 2000 --epochs 8 --deterministic --device cpu --seed 3 --json)
accuracy() { tail -n 1 "$1" | sed -E 's/.*"test_accuracy":([0-9.]+).*/\1/'; }

# The run that is never stopped; its checkpoint at the end holds the final weights.
"$train" "${common[@]}" --threads 2 --checkpoint "$work/whole" >"$work/whole.out"

# The same run, killed once it has written a checkpoint and trained on past it.
"$train" "${common[@]}" --threads 2 --checkpoint "$work/run" --checkpoint-every 7 >"$work/killed.out" &
pid=$!
await_checkpoint "$work/run/checkpoint"
kill -KILL "$pid"
status=0
wait "$pid" || status=$?
if [[ $status -ne 137 ]]; then
  echo "FAIL: the run was not killed mid-run (exit status $status): it ended before the kill" >&2
  exit 1
fi
consumed=$(head -n 1 "$work/run/checkpoint" | sed -E 's/.*"consumed":([0-9]+).*/\1/')
epoch=$(head -n 1 "$work/run/checkpoint" | sed -E 's/.*"epoch":([0-9]+).*/\1/')
echo "killed; the last checkpoint stands at batch $consumed of epoch $((epoch + 1))"
if [[ $consumed -eq 0 ]]; then
  echo "FAIL: the checkpoint is at an epoch's start, not mid-epoch" >&2
  exit 1
fi

# Resumed with other thread counts: the pipeline yields the same batches all the same.
"$train" "${common[@]}" --threads 1 --crop-threads 1 --checkpoint "$work/run" --checkpoint-every 7 \
  --resume "$work/run" >"$work/resumed.out"
want=$(accuracy "$work/whole.out")
got=$(accuracy "$work/resumed.out")
echo "test accuracy: uninterrupted $want, killed and resumed $got"
[[ "$want" == "$got" ]] || { echo "FAIL: the test accuracies differ" >&2; exit 1; }
cmp "$work/whole/checkpoint" "$work/run/checkpoint" ||
  { echo "FAIL: the final checkpoints (weights, momenta, counters, pipeline state) differ" >&2; exit 1; }
echo "the final checkpoints are byte for byte the same"
