#!/usr/bin/env bash
# Puts the SPDX line `SPDX-License-Identifier: Apache-2.0` (the license of LICENSE) at the top of
# every source file git tracks that lacks it, as a comment of the file's language: C++ and CUDA,
# CMake, shell and Python. Markdown, JSON and data files get none.
#
#   scripts/spdx.sh            add the line where it is missing
#   scripts/spdx.sh --check    list the files that lack it; exit status 1 if any do
#
# The line goes first, or second after a `#!` line. A file that has it anywhere in its first
# five lines is left as it is.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

check=0
case "${1:-}" in
  --check) check=1 ;;
  "") ;;
  -h|--help) awk 'NR > 1 && /^#/ { if (!/^# SPDX-License-Identifier:/) { sub(/^# ?/, ""); print } next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
  *) echo "spdx.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
esac

tag="SPDX-License-Identifier: Apache-2.0"

comment_of() {
  case "$1" in
    *.h|*.hpp|*.cpp|*.cc|*.cu|*.cuh|*.h.in) echo "//" ;;
    CMakeLists.txt|*/CMakeLists.txt|*.cmake|*.cmake.in|*.sh|*.py|run|*/run) echo "#" ;;
    *) echo "" ;;
  esac
}

missing=()
while IFS= read -r -d '' file; do
  [[ -f "$file" ]] || continue
  prefix="$(comment_of "$file")"
  [[ -n "$prefix" ]] || continue
  head -n 5 "$file" | grep -q "SPDX-License-Identifier:" && continue
  missing+=("$file")
  ((check)) && continue
  line="$prefix $tag"
  if head -n 1 "$file" | grep -q '^#!'; then
    { head -n 1 "$file"; echo "$line"; tail -n +2 "$file"; } >"$file.spdx"
  else
    { echo "$line"; cat "$file"; } >"$file.spdx"
  fi
  chmod --reference="$file" "$file.spdx"
  mv "$file.spdx" "$file"
done < <(git ls-files -z)

if ((check)); then
  if ((${#missing[@]} > 0)); then
    for file in "${missing[@]}"; do echo "spdx: $file lacks the line '$tag' (scripts/spdx.sh adds it)" >&2; done
    exit 1
  fi
  echo "spdx: every source file has the line '$tag'"
else
  echo "spdx: added the line to ${#missing[@]} files"
fi
