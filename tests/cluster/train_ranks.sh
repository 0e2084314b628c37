#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# mpirun -np N stoker-train: data-parallel training on N ranks of this machine learns, reports
# every rank, and ends with the same weights on every rank (stoker-train checks that itself,
# and fails when they differ); the default batch divides among 2 and 3 ranks, and a step
# given that does not divide among the ranks is refused once;
# a job killed mid-epoch resumes exactly on as many ranks, and a deterministic one is refused on
# another number, while one in free order goes on at any number, every sample once;
# with --remote-workers, rank 0 trains on every sample of every epoch, which the others made, and
# a checkpoint of 2 workers goes on with 1 and with 3.
#   train_ranks.sh MPIEXEC STOKER_TRAIN        (exit 77, skipped, without Fashion-MNIST)
set -euo pipefail
# shellcheck source=../await_checkpoint.sh
source "$(dirname "${BASH_SOURCE[0]}")/../await_checkpoint.sh"
mpiexec=$1 train=$2
if [[ ! -d /usr/share/datasets/fashion-mnist ]]; then
  echo "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): skipped"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
common=(--limit 2000 --device cpu --json)
field() { sed -E "s/.*\"$1\":([0-9.]+).*/\\1/" <<<"$2"; }
# The run's digest of the (epoch, crop) pairs it trained: the first "digest", before the ranks'
# and the epochs' (sed, unlike head, reads all of grep's output: no SIGPIPE under pipefail).
digest() { grep -o '"digest":"[0-9a-f]*"' <<<"$1" | sed -n 1p | cut -d'"' -f4; }

for ranks in 2 3; do
  # The default batch, 255, divides among 3 ranks, and is rounded to 256 for 2.
  output=$("$mpiexec" --oversubscribe -np "$ranks" "$train" "${common[@]}" --epochs 2)
  json=$(tail -n 1 <<<"$output")
  batch=$(field batch_size "$json")
  [[ $batch == $((ranks == 2 ? 256 : 255)) ]] || { echo "FAIL: a batch of $batch on $ranks ranks" >&2; exit 1; }
  if ((ranks == 2)); then
    grep -q "batches of 256 (the default 255 rounded to a multiple of 2 ranks)" <<<"$output" ||
      { echo "FAIL: the rounded default batch is not said" >&2; exit 1; }
  fi
  world=$(field world_size "$json")
  accuracy=$(field test_accuracy "$json")
  entries=$(grep -o '"rank":' <<<"$json" | wc -l)
  echo "np $ranks: world_size $world, $entries rank entries, test accuracy $accuracy"
  [[ $world == "$ranks" && $entries == "$ranks" ]] || { echo "FAIL: not every rank reported" >&2; exit 1; }
  awk -v a="$accuracy" 'BEGIN { exit !(a > 0.6) }' || { echo "FAIL: accuracy $accuracy, chance is 0.1" >&2; exit 1; }
  # Every rank trained on its share: 2 epochs of 2000 images x 5 crops, less the remainder.
  samples=$(field samples "$(sed -E 's/"per_epoch".*//; s/"ranks".*//' <<<"$json")")
  want=$((2 * (2000 / ranks) * ranks * 5))
  [[ $samples == "$want" ]] || { echo "FAIL: $samples samples in all, $want expected" >&2; exit 1; }
  # On 2 ranks every crop of the 2,000 images: what every run below that trains them all matches.
  ((ranks == 2)) && all=$(digest "$json")
done
[[ $all =~ ^[0-9a-f]{16}$ ]] || { echo "FAIL: no digest in the report" >&2; exit 1; }

# Remote workers: 2 ranks make the batches, rank 0 trains on them; every sample exactly once.
json=$("$mpiexec" --oversubscribe -np 3 "$train" "${common[@]}" --epochs 2 --remote-workers | tail -n 1)
accuracy=$(field test_accuracy "$json")
samples=$(field samples "$(sed -E 's/"per_epoch".*//' <<<"$json")")
echo "np 3, --remote-workers: world_size $(field world_size "$json"), $(field remote_workers "$json") workers, \
$samples samples, test accuracy $accuracy, peak in flight $(field remote_peak_in_flight "$json")"
[[ $(field world_size "$json") == 3 && $(field remote_workers "$json") == 2 ]] ||
  { echo "FAIL: not 2 workers in a world of 3" >&2; exit 1; }
[[ $samples == $((2 * 2000 * 5)) ]] || { echo "FAIL: $samples samples, 20000 expected" >&2; exit 1; }
[[ $(digest "$json") == "$all" ]] ||
  { echo "FAIL: digest $(digest "$json"), not the data-parallel job's $all: other crops trained" >&2; exit 1; }
awk -v a="$accuracy" 'BEGIN { exit !(a > 0.6) }' || { echo "FAIL: accuracy $accuracy, chance is 0.1" >&2; exit 1; }
# A worker that cannot read its data: every rank refuses before the first step, naming it.
status=0
errors=$(timeout 60 "$mpiexec" --oversubscribe -np 1 "$train" "${common[@]}" --remote-workers : \
  -np 1 "$train" "${common[@]}" --remote-workers --data /nonexistent 2>&1 >/dev/null) || status=$?
echo "np 2, --remote-workers, rank 1 without data: exit status $status"
[[ $status -ne 0 && $status -ne 124 ]] || { echo "FAIL: the job did not fail promptly ($status)" >&2; exit 1; }
grep -q "^stoker-train: the ranks differ: its setup: rank 0 has 'ok', rank 1 has '/nonexistent/train-images" \
  <<<"$errors" || { echo "FAIL: the refusal does not name rank 1 and its error: $errors" >&2; exit 1; }
status=0
errors=$("$mpiexec" --oversubscribe -np 1 "$train" "${common[@]}" --remote-workers 2>&1 >/dev/null) || status=$?
echo "np 1, --remote-workers: exit status $status: $errors"
grep -q "^stoker-train: --remote-workers needs 2 or more ranks" <<<"$errors" ||
  { echo "FAIL: remote workers on one rank were not refused" >&2; exit 1; }

status=0
errors=$("$mpiexec" --oversubscribe -np 2 "$train" "${common[@]}" --epochs 2 --batch-size 255 2>&1 >/dev/null) || status=$?
echo "np 2, --batch-size 255: exit status $status: $errors"
[[ $status -ne 0 ]] || { echo "FAIL: an odd batch was not refused on 2 ranks" >&2; exit 1; }
[[ $(grep -c "does not divide among 2 ranks" <<<"$errors") == 1 ]] ||
  { echo "FAIL: the refusal is not said once, by rank 0" >&2; exit 1; }

# Two ranks killed (SIGKILL) mid-epoch and resumed on two ranks end with the checkpoint, byte for
# byte, of the job that was never stopped; on three ranks the deterministic checkpoint is
# refused (its states do not say which samples each rank took).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Kills the job of "$@" (mpirun's arguments) once it has written DIR/checkpoint, mid-epoch.
kill_mid_epoch() {
  local dir=$1 pid status=0 consumed
  shift
  "$mpiexec" "$@" >/dev/null 2>&1 &
  pid=$!
  await_checkpoint "$dir/checkpoint"
  pkill -KILL -f "^$train .*--checkpoint $dir " || { echo "FAIL: the ranks had ended before the kill" >&2; exit 1; }
  wait "$pid" || status=$?
  consumed=$(head -n 1 "$dir/checkpoint" | sed -E 's/.*"consumed":([0-9]+).*/\1/')
  echo "the ranks killed (mpirun exit status $status); the last checkpoint stands at batch $consumed of an epoch"
  [[ $status -ne 0 && $consumed -ne 0 ]] || { echo "FAIL: not killed mid-epoch" >&2; exit 1; }
}
# 40 steps an epoch: no checkpoint every 7 steps falls on an epoch's end.
job=(--oversubscribe -np 2 "$train" "${common[@]}" --epochs 6 --batch-size 256 --deterministic)
"$mpiexec" "${job[@]}" --checkpoint "$work/whole" >/dev/null
kill_mid_epoch "$work/run" "${job[@]}" --checkpoint "$work/run" --checkpoint-every 7
cp -r "$work/run" "$work/mid"
"$mpiexec" "${job[@]}" --checkpoint "$work/run" --checkpoint-every 7 --resume "$work/run" >/dev/null
cmp "$work/whole/checkpoint" "$work/run/checkpoint" ||
  { echo "FAIL: the resumed job's final checkpoint differs from the uninterrupted job's" >&2; exit 1; }
echo "resumed on 2 ranks: the final checkpoints are byte for byte the same"
status=0
errors=$("$mpiexec" --oversubscribe -np 3 "$train" "${common[@]}" --epochs 6 --batch-size 255 --deterministic \
  --resume "$work/mid" 2>&1 >/dev/null) || status=$?
echo "resumed on 3 ranks: exit status $status: $errors"
grep -q "the checkpoint is of a deterministic job of 2 ranks, taken mid-epoch, and this job has 3" <<<"$errors" ||
  { echo "FAIL: a deterministic checkpoint of 2 ranks taken mid-epoch was not refused on 3" >&2; exit 1; }
# Each rank resuming another checkpoint of the same step (one weight changed in the other's copy):
# refused before the first step, the checkpoint named.
cp -r "$work/mid" "$work/other"
last=$(($(stat -c %s "$work/other/checkpoint") - 1))
byte=$(tail -c 1 "$work/other/checkpoint" | od -An -tu1)
printf "\\x$(printf %02x $(((byte + 1) % 256)))" | dd of="$work/other/checkpoint" bs=1 seek="$last" conv=notrunc status=none
cmp -s "$work/mid/checkpoint" "$work/other/checkpoint" && { echo "FAIL: the copy was not changed" >&2; exit 1; }
status=0
errors=$("$mpiexec" --oversubscribe -np 1 "$train" "${common[@]}" --epochs 6 --batch-size 256 --deterministic \
  --resume "$work/mid" : -np 1 "$train" "${common[@]}" --epochs 6 --batch-size 256 --deterministic \
  --resume "$work/other" 2>&1 >/dev/null) || status=$?
echo "2 ranks resuming two checkpoints: exit status $status: $(head -n 1 <<<"$errors")"
grep -q "^stoker-train: the ranks differ: the checkpoint resumed: rank 0 has 'step .*', rank 1 has" <<<"$errors" ||
  { echo "FAIL: ranks resuming different checkpoints were not refused before training" >&2; exit 1; }

# Elastic: 3 ranks killed mid-epoch (free order) go on at 2 and at 4. Every sample of the cut
# epoch not trained before is trained now, once (fewer than a sample per rank may be left out
# when the rest does not divide among the ranks), and then every epoch after at 2 or 4 ranks.
# 42 steps an epoch: no checkpoint every 5 steps falls on an epoch's end.
job=(--oversubscribe -np 3 "$train" "${common[@]}" --epochs 2 --batch-size 240)
kill_mid_epoch "$work/at3" "${job[@]}" --checkpoint "$work/at3" --checkpoint-every 5
header=$(head -n 1 "$work/at3/checkpoint")
epoch=$(grep -o '"epoch":[0-9]*' <<<"$header" | head -n 1 | cut -d: -f2)  # from 0
before=$(($(sed -E 's/.*"samples":([0-9]+).*/\1/' <<<"$header") * 3))  # of it, by the 3 ranks
for ranks in 2 4; do
  json=$("$mpiexec" --oversubscribe -np "$ranks" "$train" "${common[@]}" --epochs 2 --batch-size 240 \
    --resume "$work/at3" | tail -n 1)
  trained=$(field trained_samples "$json")
  accuracy=$(field test_accuracy "$json")
  first=$((2000 / 3 * 3 * 5 - before))  # what the cut epoch had left at 3 ranks
  second=$(((1 - epoch) * 2000 / ranks * ranks * 5))
  echo "3 ranks cut after $before samples of epoch $((epoch + 1)), resumed on $ranks: $trained samples trained," \
    "test accuracy $accuracy, digest $(digest "$json")"
  ((trained <= first + second && trained > first + second - ranks)) ||
    { echo "FAIL: $trained samples trained, $((first + second)) expected (less fewer than $ranks)" >&2; exit 1; }
  awk -v a="$accuracy" 'BEGIN { exit !(a > 0.6) }' || { echo "FAIL: accuracy $accuracy, chance is 0.1" >&2; exit 1; }
  elastic[$ranks]="$trained $(digest "$json")"
done
# As many crops trained at 2 and at 4 ranks (none of the rest left out at either): the same
# crops, each once.
if [[ ${elastic[2]% *} == "${elastic[4]% *}" && ${elastic[2]} != "${elastic[4]}" ]]; then
  echo "FAIL: as many crops trained at 2 and 4 ranks, but digests ${elastic[2]#* } and ${elastic[4]#* }" >&2
  exit 1
fi

# Remote workers: 2 workers cut mid-epoch (SIGKILL, every rank) go on with 1 and with 3; the
# samples trained are those the cut epoch had left, and every one of the next.
job=(--oversubscribe -np 3 "$train" "${common[@]}" --epochs 2 --remote-workers)
kill_mid_epoch "$work/remote" "${job[@]}" --checkpoint "$work/remote" --checkpoint-every 5
header=$(head -n 1 "$work/remote/checkpoint")
epoch=$(grep -o '"epoch":[0-9]*' <<<"$header" | head -n 1 | cut -d: -f2)
before=$(sed -E 's/.*"samples":([0-9]+).*/\1/' <<<"$header")  # of the cut epoch, by rank 0
for ranks in 2 4; do
  cp -r "$work/remote" "$work/remote$ranks"
  json=$("$mpiexec" --oversubscribe -np "$ranks" "$train" "${common[@]}" --epochs 2 --remote-workers \
    --resume "$work/remote$ranks" | tail -n 1)
  trained=$(field trained_samples "$json")
  want=$((2000 * 5 - before + (1 - epoch) * 2000 * 5))
  echo "2 workers cut after $before samples of epoch $((epoch + 1)), resumed with $((ranks - 1)): $trained samples" \
    "trained, test accuracy $(field test_accuracy "$json"), digest $(digest "$json")"
  [[ $trained == "$want" ]] || { echo "FAIL: $trained samples trained, $want expected" >&2; exit 1; }
  # Every crop of both epochs once, those before the cut included.
  [[ $(digest "$json") == "$all" ]] || { echo "FAIL: digest $(digest "$json"), $all expected" >&2; exit 1; }
done
