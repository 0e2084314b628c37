# SPDX-License-Identifier: Apache-2.0
# Sourced by the tests that kill a training run mid-epoch (tests/train/kill_resume.sh,
# tests/cluster/train_ranks.sh).
#   await_checkpoint FILE   waits up to 10 s for FILE to appear, then lets the run train on
#                           past it for 0.2 s; fails when it never appears
await_checkpoint() {
  local _
  for _ in $(seq 1000); do
    if [[ -f "$1" ]]; then
      sleep 0.2
      return 0
    fi
    sleep 0.01
  done
  echo "FAIL: no checkpoint $1 after 10 s" >&2
  return 1
}
