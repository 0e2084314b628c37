#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs tests/cluster/mpi_ranks on N ranks of this machine.
#   mpi_test.sh MPIEXEC MPI_RANKS N MODE [STOKER_INSPECT]
# mpirun's settings for a test machine live here, not in the user's environment: CI runs as
# root (Open MPI refuses that unless told), and on 2 cores 4 ranks oversubscribe it.
set -euo pipefail
mpiexec=$1 program=$2 ranks=$3 mode=$4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run=("$mpiexec" --oversubscribe -np "$ranks" "$program" "$mode")
if [[ "$mode" == remote_killed* ]]; then
  # A rank killed by a signal ends an Open MPI 4.1 job unless mpirun is told to go on.
  run=("$mpiexec" --oversubscribe --enable-recovery -np "$ranks" "$program" "$mode")
fi
if [[ "$mode" == setup_stopped ]]; then
  # The setup timeout, on every rank (mpirun passes on what -x names).
  export STOKER_SETUP_TIMEOUT=3
  run=("$mpiexec" --oversubscribe -x STOKER_SETUP_TIMEOUT -np "$ranks" "$program" "$mode")
fi
if [[ "$mode" == elastic || "$mode" == remote_checkpoint ]]; then
  # $ranks ranks checkpoint mid-epoch (data-parallel ranks; a trainer and its workers); 2 and 4
  # ranks go on from there, each from the same checkpoint.
  prefix=${mode%_checkpoint}
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
  "$mpiexec" --oversubscribe -np "$ranks" "$program" "${prefix}_save" "$dir"
  for resumed in 2 4; do
    "$mpiexec" --oversubscribe -np "$resumed" "$program" "${prefix}_resume" "$dir"
  done
  exit 0
fi
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
# A job that must fail, within a bounded time, with a message matching $1 (grep -E).
expect_failure() {
  local start=$SECONDS status=0
  output=$(timeout 60 "${run[@]}" 2>&1) || status=$?
  echo "$output"
  if ((status == 0)); then
    echo "FAIL: the job succeeded" >&2
    exit 1
  fi
  if ((status == 124)); then
    echo "FAIL: the job still ran after 60 s" >&2
    exit 1
  fi
  local pattern
  for pattern in "$@"; do
    if ! grep -qE "$pattern" <<<"$output"; then
      echo "FAIL: the output does not say: $pattern" >&2
      exit 1
    fi
  done
  # No rank outlives mpirun (a stopped one included): 2 s for the last ones to go.
  local left=
  for _ in $(seq 20); do
    left=$(pgrep -f -x "$program $mode" || true)
    [[ -z $left ]] && break
    sleep 0.1
  done
  if [[ -n $left ]]; then
    ps -o pid,stat,etime,args -p "${left//$'\n'/,}" >&2 || true
    kill -KILL $left 2>/dev/null || true  # this job's ranks, by their ids
    echo "FAIL: ranks of the job outlived mpirun (pids $left)" >&2
    exit 1
  fi
  if ((SECONDS - start > ${within:-60})); then
    echo "FAIL: the job ended $((SECONDS - start)) s after the start, not within $within s" >&2
    exit 1
  fi
  echo "every rank ended $((SECONDS - start)) s after the start (exit status $status), as expected"
}
# After a timeout, one report (its summary line ends with a colon, its lines about the ranks
# follow), however many ranks gave up.
one_report() {
  local reports
  reports=$(grep -cE "\(the rank timeout\).*:$" <<<"$output" || true)
  if ((reports != 1)); then
    echo "FAIL: $reports reports of the timeout, not one" >&2
    exit 1
  fi
}
case "$mode" in
  throw)  # a rank that throws ends every rank, naming itself
    expect_failure "rank 1 of $ranks: error: stage 'read' failed: a deliberate failure of rank 1" ;;
  stopped)  # a stopped rank: the others give up after the timeout, naming it
    expect_failure "gave up after 2\.[0-9] s \(the rank timeout\) while this rank was: epoch 1, step 35" \
      "rank 1 stopped answering" "rank 1 did not answer within 2 s"
    one_report ;;
  stopped_first)  # rank 0 stopped: rank 1 reports, once. Whether ranks 2 and 3 get to say that
    # they leave the report to rank 1 is timing: rank 1's MPI_Abort may end them first.
    expect_failure "rank 1 of $ranks: MPI_Allreduce #2 .* gave up after 2\.[0-9] s .*; rank 0 stopped answering:$" \
      "rank 0 did not answer within 2 s" "ranks 2, 3 wait in it too"
    if grep -E "rank [23] of $ranks: .*reports why" <<<"$output" | grep -vq "rank 1, which waits in it too"; then
      echo "FAIL: rank 2 or 3 left the report to a rank other than rank 1" >&2
      exit 1
    fi
    one_report ;;
  setup_stopped)  # a rank stopped before MPI starts: the others end after the setup timeout
    bad=$(STOKER_SETUP_TIMEOUT=soon "$mpiexec" -np 1 "$program" collectives 2>&1) &&
      { echo "FAIL: STOKER_SETUP_TIMEOUT=soon was taken" >&2; exit 1; }
    grep -q "STOKER_SETUP_TIMEOUT: 'soon' is not a number of seconds" <<<"$bad" ||
      { echo "FAIL: STOKER_SETUP_TIMEOUT=soon: $bad" >&2; exit 1; }
    expect_failure "rank 0 of $ranks: MPI_Init_thread has not returned after 3\.[0-9] s \(the setup timeout, STOKER_SETUP_TIMEOUT\)" ;;
  remote_trainer_stopped)  # the workers' waits for a stopped trainer end at one deadline
    within=10 expect_failure \
      "rank [12] of $ranks: .*the trainer \(rank 0\) has sent nothing for 2\.000 s \(twice the lease\) while this worker waited for it: it is stuck or stopped" ;;
  stuck)  # a rank that never comes: named as such (it answers), with what it said it was doing
    expect_failure "\(the rank timeout\) while this rank was: .*; rank 1 has not reached it:$" \
      "rank 1 has not reached it: 1 collectives done, the last [0-9.]+ s ago; it was: epoch 1, step 34: waiting for its pipeline's next batch"
    one_report ;;
  remote_killed*)
    # mpirun --enable-recovery exits 0 whatever its ranks do (docs/scale-out.md): the trainer's
    # own line, printed only once it took every id of both epochs once, is the verdict. The
    # large batches' case depends on when the kill falls: it runs 4 times.
    runs=1
    [[ "$mode" == remote_killed_large ]] && runs=4
    for ((i = 1; i <= runs; ++i)); do
      status=0
      output=$(timeout 60 "${run[@]}" 2>&1) || status=$?
      echo "$output"
      ((status != 124)) || { echo "FAIL: run $i: the job still ran after 60 s" >&2; exit 1; }
      grep -q "every id of both epochs once" <<<"$output" ||
        { echo "FAIL: run $i: the trainer did not finish (mpirun's exit status: $status)" >&2; exit 1; }
    done ;;
  *) exec "${run[@]}" ;;
esac
