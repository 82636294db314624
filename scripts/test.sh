#!/usr/bin/env bash
# The test command: installs dependencies, builds with warnings as errors, runs every test.
#   scripts/test.sh             Release build in build/
#   scripts/test.sh --sanitize  ASan + UBSan build in build-asan/
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh

build=build
extra=(-DCMAKE_BUILD_TYPE=Release)
if [ "${1:-}" = "--sanitize" ]; then
  build=build-asan
  extra=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DFUSEKIT_SANITIZE=ON -DFUSEKIT_BUILD_BENCHMARKS=OFF)
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fi
cmake -S . -B "$build" -G Ninja -DFUSEKIT_WERROR=ON -UFUSEKIT_OPS "${extra[@]}" >/dev/null  # every operator
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" -j "$(nproc)" --output-on-failure
