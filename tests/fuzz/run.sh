#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the libFuzzer targets (tests/fuzz) with clang in their own build tree and runs
# each for a bounded time, starting from a small seed corpus of valid files.
#
#   tests/fuzz/run.sh [SECONDS]      seconds per target (default: $STOKER_FUZZ_SECONDS or 60)
#
#   STOKER_FUZZ_BUILD_DIR   build directory (default: build-fuzz)
#
# Inputs libFuzzer finds interesting accumulate in $STOKER_FUZZ_BUILD_DIR/corpus/, so later
# runs start where earlier ones stopped. An input that crashes is saved as
# $STOKER_FUZZ_BUILD_DIR/artifacts/<target>-crash-*; reproduce with `<fuzzer> <that file>`.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
seconds="${1:-${STOKER_FUZZ_SECONDS:-60}}"
build_dir="${STOKER_FUZZ_BUILD_DIR:-build-fuzz}"

# shellcheck source=../../scripts/deps.sh
source "$root/scripts/deps.sh"
stoker_deps clang libclang-rt-14-dev  # libclang-rt: libFuzzer and the sanitizer runtimes

if [[ ! -f "$build_dir/build.ninja" ]]; then
  CC=clang CXX=clang++ cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSTOKER_FUZZ=ON -DSTOKER_CUDA=OFF -DSTOKER_BUILD_APPS=OFF
fi
cmake --build "$build_dir" --target fuzz_idx fuzz_npy fuzz_state fuzz_image image_seeds

# --- seed corpus: a few small valid files of each kind -----------------------------------
byte() { printf "\\x$(printf %02x "$1")"; }
le16() { byte $(($1 & 255)); byte $(($1 >> 8 & 255)); }
le32() { le16 $(($1 & 65535)); le16 $(($1 >> 16)); }
be32() { byte $(($1 >> 24 & 255)); byte $(($1 >> 16 & 255)); byte $(($1 >> 8 & 255)); byte $(($1 & 255)); }
pattern() { head -c "$1" /dev/zero | tr '\0' '\7'; }

idx_seed() {  # FILE MAGIC DIM...: an IDX file of unsigned bytes with those dimensions
  local file=$1 magic=$2 total=1 d
  shift 2
  {
    be32 "$magic"
    for d in "$@"; do be32 "$d"; total=$((total * d)); done
    pattern "$total"
  } >"$file"
}

npy_seed() {  # FILE VERSION DICT DATA_BYTES: a .npy file, header padded as numpy pads it
  local file=$1 version=$2 header=$3 data_bytes=$4
  local preamble=$((version == 1 ? 10 : 12))
  while (((preamble + ${#header} + 1) % 64 != 0)); do header+=" "; done
  header+=$'\n'
  {
    printf '\x93NUMPY'
    byte "$version"
    byte 0
    if ((version == 1)); then le16 ${#header}; else le32 ${#header}; fi
    printf '%s' "$header"
    pattern "$data_bytes"
  } >"$file"
}

seeds="$build_dir/seeds"
rm -rf "$seeds"
mkdir -p "$seeds/idx" "$seeds/npy" "$seeds/state" "$seeds/image"
idx_seed "$seeds/idx/images" $((0x803)) 2 3 4
idx_seed "$seeds/idx/labels" $((0x801)) 5
gzip -9 -n -c "$seeds/idx/images" >"$seeds/idx/images.gz"
gzip -9 -n -c "$seeds/idx/labels" >"$seeds/idx/labels.gz"
npy_seed "$seeds/npy/u8-2d.npy" 1 "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 4), }" 12
npy_seed "$seeds/npy/u16-3d.npy" 1 "{'descr': '<u2', 'fortran_order': False, 'shape': (2, 3, 2), }" 24
npy_seed "$seeds/npy/f32-3d-v2.npy" 2 "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2, 2), }" 32
printf '%s' '{"consumed":13,"data":"2000 samples, shard 0 of 1","epoch":3,"format":"stoker-pipeline-state","seed":3,"shuffle_inputs":{"shuffle":10000},"stages":[{"name":"read","what":"source"},{"name":"crops","what":"flat_map fanout 5"},{"name":"shuffle","what":"shuffle window 2001 seed 3"},{"name":"batch","what":"batch 255"}],"version":1}' >"$seeds/state/state.json"
printf '%s' '{"consumed":13,"data":"2000 samples, shard 0 of 1","epoch":3,"format":"stoker-pipeline-state","order":"free","seed":3,"shuffle_inputs":{},"stages":[{"name":"read","what":"source"},{"name":"crops","what":"flat_map fanout 5"},{"name":"shuffle","what":"shuffle"},{"name":"batch","what":"batch 255"}],"taken":{"below":4000,"except":[17,3,1,250,9],"queue":"shuffle"},"version":2}' >"$seeds/state/free.json"

# JPEGs of every kind and PNGs, written by stoker's own encoders.
"$build_dir/tests/fuzz/image_seeds" "$seeds/image"

# --- run ----------------------------------------------------------------------------------
mkdir -p "$build_dir/artifacts"
for kind in idx npy state image; do
  corpus="$build_dir/corpus/$kind"
  mkdir -p "$corpus"
  echo "fuzz: fuzz_$kind for ${seconds}s"
  # -timeout: one input taking 10 s is a hang; -rss_limit_mb: the parsers must not
  # allocate beyond what their input justifies.
  log="$build_dir/fuzz_$kind.log"
  if ! "$build_dir/tests/fuzz/fuzz_$kind" "$corpus" "$seeds/$kind" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -dict="tests/fuzz/$kind.dict" -artifact_prefix="$build_dir/artifacts/fuzz_$kind-" \
    -print_final_stats=1 >"$log" 2>&1; then
    tail -n 80 "$log" >&2
    echo "fuzz: fuzz_$kind FAILED; full log $log, the input is in $build_dir/artifacts/" >&2
    exit 1
  fi
  grep -E '^(INFO: seed corpus|#[0-9]+[[:space:]]+DONE|stat::(number_of_executed_units|new_units_added|peak_rss_mb))' "$log" || true
done
echo "fuzz: PASSED (${seconds}s per target)"
