#!/usr/bin/env bash
# Installs everything fusekit needs on a fresh Debian 12 machine. Safe to run any number of times:
# it installs only what is missing.
#   scripts/install_deps.sh           what the default build and tests need (GCC)
#   scripts/install_deps.sh --clang   that, and clang 14 with its sanitizer runtimes (libFuzzer,
#                                     TSan) and OpenMP: for test.sh --clang / --tsan and fuzz.sh
set -euo pipefail

# python3-venv and python3-dev: the project's Python environments (scripts/python_env.sh) and the
# extension's headers, for Debian's python3 (a python3 of its own, pyenv's say, carries both).
apt_packages=(build-essential cmake ninja-build libhwy-dev libgtest-dev libgmock-dev googletest
              libbenchmark-dev python3 python3-venv python3-dev)
if [ "${1:-}" = "--clang" ]; then
  apt_packages+=(clang-14 libclang-rt-14-dev libomp-14-dev)
fi
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[deps] installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Python packages are not installed here: scripts/python_env.sh builds the project's own virtual
# environments from requirements/ (NumPy for the golden scripts among them).
