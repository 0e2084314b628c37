#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs stoker's GPU checks and GPU figures on a machine with a CUDA device, from programs built
# elsewhere and packed with ../shared/tools/gpu-carry.sh into .gpu/ (bin/, lib/, and data/ with
# the Fashion-MNIST files). Each step has its own time limit, and a failed step does not stop
# the others; logs go to $OUT/logs.tar.gz (or ./gpu-out), a table of verdicts is printed last.
#
#   scripts/gpu-check.sh [STEP...]     steps: tests python faults sanitizer transfer train bench images
#                                      (default: all)
#   STOKER_GPU_CROP_THREADS="4 8"      train also with --augment cpu at these crop threads
#   STOKER_GPU_FAULT_RUNS=20           faults: how many times each own-process fault case runs
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bin="$root/.gpu/bin"
data="$root/.gpu/data"
final="${OUT:-$root/gpu-out}"
out="$(mktemp -d)"
mkdir -p "$final"
export LD_LIBRARY_PATH="$root/.gpu/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="/usr/local/cuda/bin:$PATH"

# A CUDA half of a test that skips here means CUDA did not start: a failure, not a green skip
# (tests/cuda_cases.h). Each test process prints how many CUDA halves ran; the table shows it.
export STOKER_REQUIRE_CUDA=1

steps=("$@")
((${#steps[@]})) || steps=(tests python faults sanitizer transfer train bench images)
verdicts=()

# run NAME LIMIT_S CMD...: output to $out/NAME.log, its tail on the console.
run() {
  local name="$1" limit="$2"
  shift 2
  local n=2
  while [[ -e "$out/$name.log" ]]; do name="${name%-[0-9]*}-$n"; n=$((n + 1)); done  # a step given twice
  local start=$SECONDS status=0
  echo "==== $name: $*"
  timeout --kill-after=10s "$limit" "$@" >"$out/$name.log" 2>&1 || status=$?
  tail -n "${STOKER_GPU_TAIL:-3}" "$out/$name.log"
  local halves
  halves="$(grep -o 'CUDA halves: [0-9]* ran, [0-9]* skipped' "$out/$name.log" | tail -n 1)"
  verdicts+=("$(printf '%-28s exit %-3s %4ds  %s' "$name" "$status" $((SECONDS - start)) "$halves")")
  # The logs so far, after every step: a run cut short by its caller's limit keeps them.
  printf '%s\n' "${verdicts[@]}" >"$out/verdicts.txt"
  tar -C "$out" -czf "$final/logs.tar.gz" .
}

# The cases of test program $1 whose names match the doctest filter $2, one per line.
cases_of() {
  "$1" --list-test-cases --no-version=true --test-case="$2" | grep -v -e '^\[doctest\]' -e '^=*$' -e '^$'
}

# python: the module is built on this machine, for its python3 (whose torch has CUDA; the module
# built elsewhere is for Debian's Python), from the tree's sources against the carried stoker
# libraries, whose public headers need only Python's, pybind11's and DLPack's. The machine's own
# C++ runtime is used, not the carried one: it is newer, and its torch needs it.
python_module() {
  local py=python3 lib="$out/python/lib" pkg="$out/python/stoker" obj="$out/python/obj" ext
  mkdir -p "$lib" "$pkg" "$obj"
  for f in "$root"/.gpu/lib/*; do
    case "${f##*/}" in libstdc++* | libgcc_s*) ;; *) ln -sf "$f" "$lib/" ;; esac
  done
  cp python/stoker/*.py python/stoker/*.pyi python/stoker/py.typed "$pkg/"
  ext="$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')" || return
  local version
  version="$(sed -n 's/^project(stoker VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)"
  local flags=(-O2 -fPIC -fvisibility=hidden -std=c++20 "-DSTOKER_VERSION=\"$version\"" -Iinclude -Icore/include
    -I"$root/.gpu/include" -Istages/include -Igpu/include -Icluster/include $("$py" -m pybind11 --includes))
  echo "$py $("$py" --version 2>&1), $(g++ --version | head -n 1), module $ext"
  local pids=() src status=0
  for src in python/src/*.cpp; do
    g++ "${flags[@]}" -c "$src" -o "$obj/$(basename "$src").o" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  ((status == 0)) || return 1
  g++ -shared -o "$pkg/_stoker$ext" "$obj"/*.o -L"$lib" -l:libstoker_gpu.so.0 -l:libstoker_cluster.so.0 \
    -l:libstoker_stages.so.0 -l:libstoker_core.so.0 -Wl,-rpath,"$lib"
}
export -f python_module
export out root

# The tests and the trainer look for Fashion-MNIST where Debian installs it.
if [[ ! -d /usr/share/datasets/fashion-mnist && -d "$data" ]]; then
  mkdir -p /usr/share/datasets && ln -s "$data" /usr/share/datasets/fashion-mnist
fi

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$out/gpu.txt"
nproc | sed 's/^/cpu cores: /' | tee -a "$out/gpu.txt"

for step in "${steps[@]}"; do
  case "$step" in
    tests)
      # A case that makes a sticky CUDA fault on purpose leaves the process without a device:
      # each runs in a process of its own, after the others.
      for t in test_gpu test_augment test_train; do
        run "$t" 300 "$bin/$t" --duration=true --test-case-exclude='*own process*'
      done
      for t in test_gpu test_augment; do
        while IFS= read -r fault; do
          # doctest's filters take wildcards: the name's brackets and commas would be read as such.
          run "$t-fault" 60 "$bin/$t" --test-case="$(printf '%s' "$fault" | tr '[],' '???')"
        done < <(cases_of "$bin/$t" '*own process*')
      done
      ;;
    python)
      run python-build 300 bash -c python_module
      run python-tests 300 env PYTHONPATH="$out/python" LD_LIBRARY_PATH="$out/python/lib:/usr/local/cuda/lib64" PYTHONUNBUFFERED=1 python3 -m pytest -q -p no:cacheprovider \
        --timeout=120 -rs tests/python --ignore=tests/python/test_stubs.py
      # (test_stubs.py compares the stubs with what Debian's pybind11 writes and runs Debian's mypy:
      # the machine's pybind11 writes other signatures, and it has no mypy.)
      ;;
    faults)
      # Each own-process fault case, again and again, each run given 20 s: a run that times out
      # is a hang (the fault should reach the consumer as a StageError at once).
      for t in test_gpu test_augment; do
        while IFS= read -r fault; do
          hangs=0 fails=0
          for ((i = 0; i < ${STOKER_GPU_FAULT_RUNS:-20}; i++)); do
            s=0
            timeout --kill-after=5s 20 "$bin/$t" --test-case="$(printf '%s' "$fault" | tr '[],' '???')" \
              >>"$out/faults-$t.log" 2>&1 || s=$?
            if ((s == 124 || s == 137)); then hangs=$((hangs + 1)); elif ((s != 0)); then fails=$((fails + 1)); fi
          done
          verdicts+=("$(printf '%-28s %d runs: %d hung, %d failed: %s' "faults-$t" "$i" "$hangs" "$fails" "$fault")")
          echo "${verdicts[-1]}"
        done < <(cases_of "$bin/$t" '*own process*')
      done
      ;;
    sanitizer)
      # Each compute-sanitizer tool over the cases with a CUDA half: memcheck (kernel bounds, no
      # host memory read that was not pinned), synccheck (barriers), racecheck (shared memory
      # hazards) and initcheck (device memory read before it was written). The 512^3 volume
      # (9 GB of crops) and the deliberate fault are left to the tests step, and so are the cases
      # that hold a stream with a gate kernel (test suite "gate"): under each of the four tools the
      # work that should run beside a gate spinning on the host's flag did not start, and these
      # cases hung (seen on an H100, 2026-11-24).
      # Every case of test_gpu and test_augment but those (the CUDA work of a case that runs on
      # both backends is what the tools look at; its CPU half costs them nothing), and the cases
      # of test_train that use CUDA.
      cases_train='*CUDA*,*augment gpu*,*past 2^20*'
      for tool in memcheck synccheck racecheck initcheck; do
        run "$tool-gpu" 600 compute-sanitizer --tool "$tool" --error-exitcode 9 \
          "$bin/test_gpu" --test-case-exclude='*own process*' --test-suite-exclude=gate
        run "$tool-augment" 600 compute-sanitizer --tool "$tool" --error-exitcode 9 \
          "$bin/test_augment" --test-case-exclude='*own process*,*512^3*' --test-suite-exclude=gate
        run "$tool-train" 600 compute-sanitizer --tool "$tool" --error-exitcode 9 \
          "$bin/test_train" --test-case="$cases_train"
      done
      ;;
    transfer)
      run transfer 300 "$bin/stoker-bench" transfer --json
      ;;
    train)
      for mode in pipelined sync; do
        # --device cuda: a trainer that cannot start CUDA fails here, naming why, rather than
        # training on the CPU.
        run "train-cpu-$mode" 300 "$bin/stoker-train" --device cuda --augment cpu --mode "$mode" --json
        for resident in yes no; do
          run "train-gpu-$mode-resident-$resident" 300 "$bin/stoker-train" --device cuda --augment gpu \
            --resident "$resident" --mode "$mode" --json
        done
      done
      for n in ${STOKER_GPU_CROP_THREADS:-}; do
        run "train-cpu-pipelined-crop-threads-$n" 300 "$bin/stoker-train" --device cuda --augment cpu \
          --crop-threads "$n" --json
      done
      ;;
    bench)
      run augment 300 "$bin/stoker-bench" augment --json
      run pipeline 300 "$bin/stoker-bench" pipeline --json
      ;;
    images)
      # GpuResizedCrop against a device-to-device copy of its bytes and the CPU crop on all cores.
      run gpu_resize 300 "$bin/stoker-bench" gpu_resize --device cuda --json
      ;;
    *) echo "gpu-check: unknown step '$step'" >&2; exit 2 ;;
  esac
done

printf '%s\n' "${verdicts[@]}" >"$out/verdicts.txt"
tar -C "$out" -czf "$final/logs.tar.gz" .
echo
echo "==== verdicts (logs in logs.tar.gz)"
printf '%s\n' "${verdicts[@]}"
