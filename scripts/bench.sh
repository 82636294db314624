#!/usr/bin/env bash
# Runs every operator's benchmark (Release build in build/) and keeps the JSON in out/bench/.
#   scripts/bench.sh [extra Google Benchmark flags, e.g. --benchmark_filter=D:32]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -UFUSEKIT_OPS >/dev/null  # every operator
cmake --build build -j "$(nproc)"
mkdir -p out/bench
for b in build/benchmarks/*_bench; do
  name=$(basename "$b")
  echo "=== $name ($(date -u +%FT%TZ), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) threads) ==="
  "$b" --benchmark_out="out/bench/$name.json" --benchmark_out_format=json "$@"
done
