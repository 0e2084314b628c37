#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Makes sure the Debian packages stoker needs are installed.
#
#   scripts/deps.sh [EXTRA_PACKAGE...]      or      source scripts/deps.sh; stoker_deps [EXTRA...]
#
# Extra packages may also come from STOKER_EXTRA_PACKAGES (space-separated).
# As root the missing ones are installed with apt-get; otherwise the exact command
# is printed on stderr and the script fails, so nothing is half-configured.

STOKER_PACKAGES=(
  cmake g++ ninja-build
  libtbb-dev libspdlog-dev doctest-dev libcli11-dev nlohmann-json3-dev
  zlib1g-dev libopenblas-dev libdlpack-dev libopenmpi-dev openmpi-bin
  libturbojpeg0-dev libjpeg62-turbo-dev libspng-dev
  python3-dev python3-pybind11
  libcurl4-openssl-dev
  dataset-fashion-mnist
  nginx-light openssl
)

stoker_package_installed() {
  # A removed package keeps a "deinstall ok config-files" status, so match the full phrase.
  [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" == "install ok installed" ]]
}

stoker_deps() {
  local wanted=("${STOKER_PACKAGES[@]}" "$@")
  if [[ -n "${STOKER_EXTRA_PACKAGES:-}" ]]; then
    local extra
    read -r -a extra <<<"$STOKER_EXTRA_PACKAGES"
    wanted+=("${extra[@]}")
  fi
  if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "deps: dpkg-query not found; this script knows Debian only. Install the equivalents of: ${wanted[*]}" >&2
    return 1
  fi

  local missing=() p
  for p in "${wanted[@]}"; do
    stoker_package_installed "$p" || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    echo "deps: all ${#wanted[@]} packages present"
    return 0
  fi

  if [[ "$(id -u)" -ne 0 ]]; then
    echo "deps: missing Debian packages: ${missing[*]}" >&2
    echo "deps: install them with:" >&2
    echo "sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
    return 1
  fi

  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update </dev/null || return 1
  apt-get install -y --no-install-recommends "${missing[@]}" </dev/null || return 1
  for p in "${missing[@]}"; do
    if ! stoker_package_installed "$p"; then
      echo "deps: $p is still not installed after apt-get install" >&2
      return 1
    fi
  done
}

# Run when executed, only define the functions when sourced.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  stoker_deps "$@"
fi
