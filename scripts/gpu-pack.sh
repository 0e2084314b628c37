#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Packs what scripts/gpu-check.sh needs on a GPU machine into .gpu-pack/ (ignored by git): the
# GPU test programs, stoker-train, stoker-bench and the Python module with their shared libraries
# (../shared/tools/gpu-carry.sh), the headers that the module's build there needs beside the
# tree's (the generated ones, DLPack's), compressed, and the Fashion-MNIST files. Build first
# (scripts/build.sh). On the GPU machine:
#   mkdir -p .gpu && tar -C .gpu -xJf .gpu-pack/bin.tar.xz && ln -s ../.gpu-pack/data .gpu/data
#   scripts/gpu-check.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${STOKER_BUILD_DIR:-build}"
carry="$root/../shared/tools/gpu-carry.sh"
[[ -x "$carry" ]] || { echo "gpu-pack: $carry not found" >&2; exit 1; }
rm -rf .gpu .gpu-pack
mkdir -p .git/info .gpu-pack
grep -qx '/.gpu-pack/' .git/info/exclude 2>/dev/null || echo '/.gpu-pack/' >>.git/info/exclude
"$carry" "$build"/tests/test_gpu "$build"/tests/test_augment "$build"/tests/test_train \
  "$build"/apps/stoker-bench/stoker-bench "$build"/apps/stoker-train/stoker-train "$build"/python/stoker/_stoker.*.so
mkdir -p .gpu/include
cp -r "$build"/generated/include/stoker /usr/include/dlpack .gpu/include/
tar -C .gpu -cJf .gpu-pack/bin.tar.xz bin lib include
rm -rf .gpu
cp -r /usr/share/datasets/fashion-mnist .gpu-pack/data
du -sh .gpu-pack
