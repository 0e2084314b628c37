#!/usr/bin/env bash
# Runs tests/cluster/mpi_ranks on N ranks of this machine.
#   mpi_test.sh MPIEXEC MPI_RANKS N MODE [STOKER_INSPECT]
# mpirun's settings for a test machine live here, not in the user's environment: CI runs as
# root (Open MPI refuses that unless told), and on 2 cores 4 ranks oversubscribe it.
set -euo pipefail
mpiexec=$1 program=$2 ranks=$3 mode=$4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run=("$mpiexec" --oversubscribe -np "$ranks" "$program" "$mode")
if [[ "$mode" == straggler* ]]; then
  # stoker-inspect, given every rank's log, must name rank 1, which is slow, and say why, in its
  # report and in its JSON.
  #   mpi_test.sh MPIEXEC MPI_RANKS N straggler STOKER_INSPECT step|input
  #   mpi_test.sh MPIEXEC MPI_RANKS N straggler_remote STOKER_INSPECT
  inspect=$5 slow=${6:-} why=
  case "$mode:$slow" in
    straggler:step) why="its training step itself is slower" ;;
    straggler:input) why="its input is slow" ;;
    straggler_remote:) why="rank 1 sent" ;;
    *) echo "mpi_test.sh: unknown straggler case '$mode' '$slow'" >&2; exit 2 ;;
  esac
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
  "${run[@]}" "$dir" $slow
  report=$("$inspect" "$dir"/run.rank*.jsonl)
  sed -n '/^==== the job/,$p' <<<"$report"
  grep -q "^straggler:  rank 1$" <<<"$report" || { echo "FAIL: rank 1 was not named the straggler" >&2; exit 1; }
  grep -q "$why" <<<"$report" || { echo "FAIL: the evidence does not say '$why'" >&2; exit 1; }
  json=$("$inspect" --json "$dir"/run.rank*.jsonl | tail -n 1)
  grep -q '"straggler":"rank 1"' <<<"$json" || { echo "FAIL: the JSON does not name rank 1: $json" >&2; exit 1; }
  exit 0
fi
if [[ "$mode" != throw ]]; then
  exec "${run[@]}"
fi
# A rank that throws must end every rank, within a bounded time, naming itself.
start=$SECONDS
status=0
output=$(timeout 60 "${run[@]}" 2>&1) || status=$?
echo "$output"
if ((status == 0)); then
  echo "FAIL: the job succeeded though rank 1 threw" >&2
  exit 1
fi
if ((status == 124)); then
  echo "FAIL: the other ranks still waited after 60 s" >&2
  exit 1
fi
if ! grep -q "rank 1 of $ranks: error: stage 'read' failed: a deliberate failure of rank 1" <<<"$output"; then
  echo "FAIL: the error does not name rank 1 and its failure" >&2
  exit 1
fi
echo "every rank ended $((SECONDS - start)) s after rank 1 threw (exit status $status), the failure named"
