#!/usr/bin/env bash
# mpirun -np N stoker-train: data-parallel training on N ranks of this machine learns, reports
# every rank, and ends with the same weights on every rank (stoker-train checks that itself,
# and fails when they differ); a step that does not divide among the ranks is refused once.
#   train_ranks.sh MPIEXEC STOKER_TRAIN        (exit 77, skipped, without Fashion-MNIST)
set -euo pipefail
mpiexec=$1 train=$2
if [[ ! -d /usr/share/datasets/fashion-mnist ]]; then
  echo "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): skipped"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
common=(--limit 2000 --epochs 2 --device cpu --json)
field() { sed -E "s/.*\"$1\":([0-9.]+).*/\\1/" <<<"$2"; }

for ranks in 2 3; do
  batch=$((ranks == 2 ? 256 : 255))
  json=$("$mpiexec" --oversubscribe -np "$ranks" "$train" "${common[@]}" --batch-size "$batch" | tail -n 1)
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
done

status=0
errors=$("$mpiexec" --oversubscribe -np 2 "$train" "${common[@]}" --batch-size 255 2>&1 >/dev/null) || status=$?
echo "np 2, --batch-size 255: exit status $status: $errors"
[[ $status -ne 0 ]] || { echo "FAIL: an odd batch was not refused on 2 ranks" >&2; exit 1; }
[[ $(grep -c "does not divide among 2 ranks" <<<"$errors") == 1 ]] ||
  { echo "FAIL: the refusal is not said once, by rank 0" >&2; exit 1; }
