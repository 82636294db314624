#!/usr/bin/env bash
# The main job: installs dependencies, builds fusekit, runs each operator's single-operator flow
# (NumPy golden -> .bin files -> aclnn executable -> verifier) and prints a summary with speeds.
#   scripts/main.sh            the seeds' shapes (ApplyAdamWQuant: 4096 x 4096, its seed example being 1 x 256)
#   scripts/main.sh --small    reduced shapes (seconds instead of minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
size=default  # each operator's main size (the seed's shape unless its golden module says otherwise)
[ "${1:-}" = "--small" ] && size=small
bash scripts/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -UFUSEKIT_OPS >/dev/null  # every operator
cmake --build build -j "$(nproc)"

status=0
ops=()
for op in $(grep -E '^[a-z0-9_]+$' operators.txt); do  # the operator list
  [ -f "golden/$op.py" ] && [ -x "build/tools/run_$op" ] || continue
  ops+=("$op")
  echo "=== $op ($size) ==="
  python3 golden/run_flow.py "$op" --build build --out "out/$op" --size "$size" || status=1
done

echo
echo "=== fusekit summary ($(date -u +%Y-%m-%d), $(nproc) threads, $(lscpu | sed -n 's/^Model name: *//p')) ==="
printf '%-20s %-5s %-36s %13s %18s  %s\n' operator check shape time rate outputs
for op in "${ops[@]}"; do cat "out/$op/summary.txt"; done
exit $status
