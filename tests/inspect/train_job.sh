#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# mpirun stoker-train --occupancy-log: every rank writes its log, labelled with its rank (and, with
# remote workers, its role) and of one job, data-parallel ranks with their wait in the gradient
# exchange; stoker-inspect reads them as one job, and stoker-train's JSON has each worker's samples.
#   train_job.sh MPIEXEC STOKER_TRAIN STOKER_INSPECT     (exit 77, skipped, without Fashion-MNIST)
set -euo pipefail
mpiexec=$1 train=$2 inspect=$3
if [[ ! -d /usr/share/datasets/fashion-mnist ]]; then
  echo "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): skipped"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--limit 600 --epochs 1 --device cpu --json)
fail() { echo "FAIL: $*" >&2; exit 1; }

"$mpiexec" --oversubscribe -np 2 "$train" "${common[@]}" --batch-size 256 --occupancy-log "$dir/dp.jsonl" >/dev/null
for rank in 0 1; do
  log="$dir/dp.rank$rank.jsonl"
  first=$(head -n 1 "$log")
  grep -q '"type":"run"' <<<"$first" && grep -q '"program":"stoker-train"' <<<"$first" ||
    fail "$log does not start with its run record"
  head -n 1 "$log" | grep -q "\"rank\":\"$rank\"" || fail "$log is not labelled rank $rank"
  grep -q '"exchange_wait_ns":' "$log" || fail "$log has no exchange_wait_ns counter"
done
jobs=$(head -q -n 1 "$dir"/dp.rank*.jsonl | sed -E 's/.*"job":"([^"]*)".*/\1/' | sort -u | wc -l)
[[ $jobs == 1 ]] || fail "the ranks' logs name $jobs jobs"
json=$("$inspect" --json "$dir"/dp.rank*.jsonl | tail -n 1)
[[ $(grep -o '"exchange_wait_pct":[0-9]' <<<"$json" | wc -l) -ge 2 ]] && ! grep -q '"exchange_wait_pct":null' <<<"$json" ||
  fail "not every rank's exchange wait: $json"
grep -q '"mode":"data-parallel"' <<<"$json" || fail "not read as a data-parallel job"
echo "data-parallel: 2 logs of one job, each with its exchange wait, read together"

out=$("$mpiexec" --oversubscribe -np 3 "$train" "${common[@]}" --remote-workers --occupancy-log "$dir/rw.jsonl" |
  tail -n 1)
workers=$(grep -o '"workers":\[[^]]*\]' <<<"$out")
[[ $(grep -o '"images":' <<<"$workers" | wc -l) == 2 ]] || fail "stoker-train's JSON has not both workers' images: $out"
for rank in 0 1 2; do
  role=$([[ $rank == 0 ]] && echo trainer || echo worker)
  head -n 1 "$dir/rw.rank$rank.jsonl" | grep -q "\"role\":\"$role\"" || fail "rank $rank's log is not labelled $role"
done
json=$("$inspect" --json "$dir"/rw.rank*.jsonl | tail -n 1)
grep -q '"mode":"remote workers"' <<<"$json" || fail "not read as a job with remote workers: $json"
echo "remote workers: $workers; 3 logs (a trainer, 2 workers) read together"

# Logs of two runs are not one job.
status=0
err=$("$inspect" "$dir/dp.rank0.jsonl" "$dir/rw.rank1.jsonl" 2>&1 >/dev/null) || status=$?
[[ $status == 2 ]] && grep -q "are logs of different runs" <<<"$err" || fail "logs of two runs were read as one job: $err"
echo "logs of two runs refused: $err"
