#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# stoker-train killed with SIGKILL mid-epoch and resumed from its last checkpoint:
# - deterministic: ends with exactly the weights, optimizer state and test accuracy of the run
#   that was never stopped;
# - free: trains on as many samples and batches in all as that run (every crop of each epoch
#   once: the pipeline's own tests check which), and learns.
#   kill_resume.sh STOKER_TRAIN WORK_DIR [deterministic|free]   (exit 77, skipped, without Fashion-MNIST)
set -euo pipefail
# shellcheck source=../await_checkpoint.sh
source "$(dirname "${BASH_SOURCE[0]}")/../await_checkpoint.sh"
train=$1
work=$2
mode=${3:-deterministic}
if [[ ! -d /usr/share/datasets/fashion-mnist ]]; then
  echo "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): skipped"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
common=(--limit 2000 --epochs 8 --device cpu --seed 3 --json)
[[ $mode == deterministic ]] && common+=(--deterministic)
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
# The digest of the (epoch, crop) pairs trained: the same pairs, each once, the part before the
# checkpoint included.
digest() { tail -n 1 "$1" | grep -o '"digest":"[0-9a-f]*"' | sed -n 1p | cut -d'"' -f4; }
echo "digest: uninterrupted $(digest "$work/whole.out"), killed and resumed $(digest "$work/resumed.out")"
[[ "$(digest "$work/whole.out")" =~ ^[0-9a-f]{16}$ && "$(digest "$work/whole.out")" == "$(digest "$work/resumed.out")" ]] ||
  { echo "FAIL: the digests of the samples trained differ" >&2; exit 1; }
if [[ $mode == free ]]; then
  # Every epoch the resumed run reports, the one it resumed in included, trained on all 10,000
  # crops (2,000 images x 5): none lost, none twice (the pipeline's tests check which).
  per_epoch() { tail -n 1 "$1" | sed 's/.*"per_epoch"://' | grep -o '"samples":[0-9]*' | sort | uniq -c | xargs; }
  echo "samples per epoch: uninterrupted $(per_epoch "$work/whole.out"), killed and resumed $(per_epoch "$work/resumed.out")"
  [[ "$(per_epoch "$work/resumed.out")" =~ ^[0-9]+\ samples:10000$ ]] ||
    { echo "FAIL: an epoch of the resumed run trained on another number of samples than 10000" >&2; exit 1; }
  awk -v a="$got" 'BEGIN { exit !(a >= 0.6) }' || { echo "FAIL: the resumed run did not learn" >&2; exit 1; }
  exit 0
fi
[[ "$want" == "$got" ]] || { echo "FAIL: the test accuracies differ" >&2; exit 1; }
cmp "$work/whole/checkpoint" "$work/run/checkpoint" ||
  { echo "FAIL: the final checkpoints (weights, momenta, counters, pipeline state) differ" >&2; exit 1; }
echo "the final checkpoints are byte for byte the same"
