#!/usr/bin/env bash
# The main job: installs what is missing, builds fusekit, runs each operator's single-operator flow
# (NumPy golden -> .bin files -> aclnn executable -> verifier) and prints a summary with speeds.
#   scripts/main.sh            the seeds' shapes (ApplyAdamWQuant: 4096 x 4096, its seed example being 1 x 256)
#   scripts/main.sh --small    reduced shapes (seconds instead of minutes)
# The summary's time and rate are each operator's steady speed: the median of repeated calls after
# a warm-up (tools/bin_io.h, steady_seconds); "first call" is the checked call, cold. The golden
# scripts run in the project's own Python environment (scripts/python_env.sh core: NumPy only).
# Each flow gates on its operator's documented promise (golden/<op>.py GATE): bitwise where the doc
# says bitwise (LazyAdam, ApplyAdamWQuant, LazyAdamQuant: one element off by one ulp fails the job),
# the stated tolerance elsewhere (AddLora); the job exits non-zero when any flow fails.
# An operator runs its main size, then the extra sizes its golden module names (EXTRA_SIZES: the
# 8-bit optimizers' FP8 state format at the same shape, golden/fp8_state.py the golden, gated
# bitwise too; docs/fp8_state.md), each into out/<op> (the main size) or out/<op>.<size>.
set -euo pipefail
cd "$(dirname "$0")/.."
size=default  # each operator's main size (the seed's shape unless its golden module says otherwise)
[ "${1:-}" = "--small" ] && size=small
unset PYTHONPATH PYTHONHOME
t0=$(date +%s)
bash scripts/install_deps.sh
PY=$(bash scripts/python_env.sh core | tail -1)
# The extension is test.sh's business (it needs the test environment's nanobind): off here, which
# recompiles nothing when the two commands alternate on the same build folder.
build=$(FUSEKIT_CMAKE_PYTHON=$PY bash scripts/configure.sh release -DFUSEKIT_PYTHON=OFF | tail -1)
cmake --build "$build" -j "$(nproc)"
echo "[main.sh] set-up and build: $(($(date +%s) - t0)) s"

status=0
outs=()
for op in $(grep -E '^[a-z0-9_]+$' operators.txt); do  # the operator list
  [ -f "golden/$op.py" ] && [ -x "$build/tools/run_$op" ] || continue
  # the main size, then the extras
  sizes=$("$PY" golden/run_flow.py "$op" --sizes "$size") || { echo "[FAIL] $op: no sizes"; status=1; continue; }
  first=1
  for s in $sizes; do
    out=out/$op
    [ "$first" = 1 ] || out=out/$op.$s
    first=0
    outs+=("$out")
    echo "=== $op ($s) ==="
    ts=$(date +%s)
    "$PY" golden/run_flow.py "$op" --build "$build" --out "$out" --size "$s" || status=1
    echo "[main.sh] $op ($s): $(($(date +%s) - ts)) s"
  done
done

echo
echo "=== fusekit summary ($(date -u +%Y-%m-%d), $(nproc) threads, $(lscpu | sed -n 's/^Model name: *//p')) ==="
echo "(time, rate: median of the steady calls after a warm-up; first call: the checked one, cold;"
echo " gate: bitwise = every output element bit for bit and every code exact, as the operator's doc"
echo " promises; bound = the tolerance its doc states: golden/<op>.py GATE)"
printf '%-28s %-5s %-8s %-36s %13s %18s %13s  %s\n' \
  operator check gate shape time rate "first call" outputs
for out in "${outs[@]}"; do cat "$out/summary.txt"; done
echo "[main.sh] total: $(($(date +%s) - t0)) s"
exit $status
