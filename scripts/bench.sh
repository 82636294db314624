#!/usr/bin/env bash
# Runs every operator's benchmark (Release build in build/) and keeps the JSON in out/bench/.
#   scripts/bench.sh [extra Google Benchmark flags, e.g. --benchmark_filter=D:32]
#   scripts/bench.sh --busy [--repetitions N] [--ops a,b]   the co-tenant benchmark: each operator
#       idle, beside a spinning process pinned to one core, and beside one spinning process per
#       core (benchmarks/busy.py; out/bench/busy.md)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
build=$(bash scripts/configure.sh release | tail -1)  # every operator
cmake --build "$build" -j "$(nproc)"
mkdir -p out/bench
if [ "${1:-}" = "--busy" ]; then
  shift
  exec python3 benchmarks/busy.py --build build "$@"
fi
for b in build/benchmarks/*_bench; do
  name=$(basename "$b")
  echo "=== $name ($(date -u +%FT%TZ), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) threads) ==="
  "$b" --benchmark_out="out/bench/$name.json" --benchmark_out_format=json "$@"
done
