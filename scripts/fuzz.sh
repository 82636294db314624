#!/usr/bin/env bash
# The fuzzing campaign: builds the libFuzzer targets of fuzz/ with clang 14, ASan and UBSan in
# build-clang-asan/ (clang installed if missing) and runs each target on its corpus.
#   scripts/fuzz.sh [seconds]   seconds per target (default 60)
# Environment:
#   FUSEKIT_FUZZ_TARGETS="lazy_adam add_lora"   a subset (default: every target that is built)
#   FUSEKIT_FUZZ_AVOID=name,...                 known findings to step around (docs/fuzzing.md)
#   FUSEKIT_FUZZ_JOBS=2                         build parallelism and targets run at once
#                                               (default: nproc)
#   FUSEKIT_OPS="lazy_adam;add_lora"            build a subset of operators
# New inputs go to build-clang-asan/corpus/<target>/ (the committed fuzz/corpus/ is only read).
# Each crash is minimized; the reproducers are left in build-clang-asan/artifacts/<target>/. Prints
# libFuzzer's final statistics per target and exits 1 when any target found something.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
jobs=${FUSEKIT_FUZZ_JOBS:-$(nproc)}
if ! command -v clang++-14 >/dev/null 2>&1 ||
   ! ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  bash scripts/install_deps.sh --clang
else
  bash scripts/install_deps.sh
fi

# The clang ASan + UBSan build of scripts/test.sh --clang-sanitize, which carries the fuzz targets
# (scripts/configure.sh): after that test run, nothing is compiled again here.
build=$(bash scripts/configure.sh clang-sanitize | tail -1)

all=(create_tensor lazy_adam apply_adam_w_quant add_lora lazy_adam_quant embedding_bag_lazy_adam)
read -r -a wanted <<<"${FUSEKIT_FUZZ_TARGETS:-${all[*]}}"
built=$(ninja -C "$build" -t targets all 2>/dev/null)
targets=()
for t in "${wanted[@]}"; do
  if grep -q "^fuzz/fuzz_$t:" <<<"$built"; then
    targets+=("$t")
  else
    echo "[fuzz] fuzz_$t is not built (its operator is not in FUSEKIT_OPS)"
  fi
done
((${#targets[@]})) || { echo "[fuzz] no target to run"; exit 1; }
nice cmake --build "$build" -j "$jobs" --target "${targets[@]/#/fuzz_}"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# fuzz_one TARGET: one target's run (and the minimization of a crash); its report goes to
# $build/fuzz_TARGET.report, its summary line to $build/fuzz_TARGET.summary, libFuzzer's exit
# status to $build/fuzz_TARGET.rc.
fuzz_one() {
  local t=$1 work="$build/corpus/$1" art="$build/artifacts/$1" log="$build/fuzz_$1.log"
  local rc=0 done_line execs rate cov ft corp line crash min
  mkdir -p "$work" "$art"
  {
    echo "[fuzz] fuzz_$t: ${secs}s on fuzz/corpus/$t (log: $log)"
    nice "$build/fuzz/fuzz_$t" -max_total_time="$secs" -timeout=20 -rss_limit_mb=4096 \
      -use_value_profile=1 -print_final_stats=1 -artifact_prefix="$art/" \
      "$work" "fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
    done_line=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    cov=$(echo "$done_line" | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
    ft=$(echo "$done_line" | sed -n 's/.*ft: \([0-9]*\).*/\1/p')
    corp=$(echo "$done_line" | sed -n 's/.*corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p')
    line=$(printf '%-20s %4ss  executions %-9s exec/s %-6s cov %-6s ft %-7s corpus %s' "$t" \
      "$secs" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}")
    grep -E '^stat::' "$log" | awk '!seen[$0]++' || true
    echo "$done_line"
    if [ "$rc" -ne 0 ]; then
      crash=$(ls -t "$art"/crash-* "$art"/leak-* "$art"/timeout-* "$art"/oom-* 2>/dev/null |
        head -1 || true)
      grep -E 'INVARIANT VIOLATED|runtime error|ERROR: AddressSanitizer|ERROR: LeakSanitizer|SUMMARY' \
        "$log" | head -5 || true
      if [ -n "$crash" ] && [[ "$crash" == */crash-* ]]; then
        echo "[fuzz] minimizing $crash"
        min="$art/minimized-$(basename "$crash")"
        nice "$build/fuzz/fuzz_$t" -minimize_crash=1 -max_total_time=60 -runs=100000 \
          -exact_artifact_path="$min" "$crash" >"$log.min" 2>&1 || true
        [ -f "$min" ] && echo "[fuzz] minimized reproducer: $min ($(wc -c <"$min") bytes)"
      fi
      line+="  FINDING (rc $rc): ${crash:-see $log}"
    fi
  } >"$build/fuzz_$t.report"
  echo "$line" >"$build/fuzz_$t.summary"
  echo "$rc" >"$build/fuzz_$t.rc"
}

# The targets run $jobs at a time (one per core): each is single-threaded.
for t in "${targets[@]}"; do
  rm -f "$build/fuzz_$t.rc"
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  fuzz_one "$t" &
done
wait
failed=()
summary=()
for t in "${targets[@]}"; do
  [ "$(cat "$build/fuzz_$t.rc" 2>/dev/null)" = 0 ] || failed+=("$t")
  cat "$build/fuzz_$t.report"
  summary+=("$(cat "$build/fuzz_$t.summary")")
done

echo
echo "[fuzz] summary ($(date -u +%Y-%m-%d), ${secs}s per target${FUSEKIT_FUZZ_AVOID:+, avoiding $FUSEKIT_FUZZ_AVOID})"
printf '  %s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "[fuzz] findings in: ${failed[*]} (reproduce: $build/fuzz/fuzz_<target> <file>)"
  exit 1
fi
echo "[fuzz] no findings"
