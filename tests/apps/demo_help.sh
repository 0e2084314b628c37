#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/demo.sh --help answers at once and builds nothing: given a build directory that does
# not exist, it prints its usage within seconds and leaves that directory unmade.
#   demo_help.sh DEMO_SH WORK_DIR
set -euo pipefail
demo=$1
work=$2
rm -rf "$work"
mkdir -p "$work"
status=0
STOKER_BUILD_DIR="$work/build" timeout 20 bash "$demo" --help >"$work/out" 2>&1 || status=$?
if [[ $status -ne 0 ]]; then
  echo "FAIL: scripts/demo.sh --help exited with status $status (124: still busy after 20 s)" >&2
  cat "$work/out" >&2
  exit 1
fi
grep -q "^usage: scripts/demo.sh" "$work/out" || { echo "FAIL: no usage line" >&2; cat "$work/out" >&2; exit 1; }
[[ ! -e "$work/build" ]] || { echo "FAIL: --help started a build in $work/build" >&2; exit 1; }
echo "scripts/demo.sh --help answered without building"
