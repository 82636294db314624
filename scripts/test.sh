#!/usr/bin/env bash
# The test command: installs what is missing, builds with warnings as errors, runs every test.
#   scripts/test.sh             Release build in build/ with the Python extension; every C++ test
#                               with CTest, then the Python tests with pytest, in the project's own
#                               virtual environment (scripts/python_env.sh test: built from
#                               requirements/ only, outside the clone) against the package as this
#                               build made it (build/python)
#   scripts/test.sh --sanitize  GCC ASan + UBSan build in build-asan/
#   scripts/test.sh --clang     clang 14 Release build in build-clang/
#   scripts/test.sh --clang-sanitize   clang 14 ASan + UBSan build in build-clang-asan/ (with the
#                               fuzz targets, which scripts/fuzz.sh then runs)
#   scripts/test.sh --tsan      clang 14 ThreadSanitizer build in build-tsan/: every test of
#                               in-tree programs, with no suppressions (any report fails)
# The build configurations are scripts/configure.sh. Prints each stage's wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
unset PYTHONPATH PYTHONHOME  # nothing from the caller's Python leaks in
t_start=$(date +%s)
stage_t=$t_start
stage() {  # stage NAME: the time since the last stage, printed
  local now
  now=$(date +%s)
  echo "[test.sh ${mode:-default}] $1: $((now - stage_t)) s"
  stage_t=$now
}

case $mode in
  --clang | --clang-sanitize | --tsan) bash scripts/install_deps.sh --clang ;;  # clang on demand
  "" | --sanitize) bash scripts/install_deps.sh ;;
  *)
    echo "test.sh: unknown mode '$mode'" >&2
    exit 2
    ;;
esac
# The Python every test runs with, golden flows and seed examples included: the test environment.
PY=$(bash scripts/python_env.sh test | tail -1)
export FUSEKIT_CMAKE_PYTHON=$PY
stage "dependencies"

ctest_extra=()
case $mode in
  "") build=$(bash scripts/configure.sh release --python "$PY" | tail -1) ;;
  --sanitize)
    build=$(bash scripts/configure.sh sanitize | tail -1)
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    ;;
  --clang) build=$(bash scripts/configure.sh clang | tail -1) ;;
  --clang-sanitize)
    build=$(bash scripts/configure.sh clang-sanitize | tail -1)
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    ;;
  --tsan)
    build=$(bash scripts/configure.sh tsan | tail -1)
    export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
    # Not here: the install consumer and the seeds' examples (built outside this build, without
    # TSan's runtime, they cannot load a TSan library), LazyAdamNoAlloc (its replacement of
    # operator new loses to TSan's own, so it would test nothing), and the accuracy run (a
    # training loop of the same plan runs that the thread-count tests cover: 117 s under TSan,
    # half of this mode's test time). They run in the other modes.
    ctest_extra=(-E "^(install\.|seed_example\.|LazyAdamNoAlloc\.|accuracy\.)")
    ;;
esac
cmake --build "$build" -j "$(nproc)"
stage "build ($build)"
ctest --test-dir "$build" -j "$(nproc)" --output-on-failure ${ctest_extra[@]+"${ctest_extra[@]}"}
stage "ctest"

# The Python package and its tests (the default mode only: the sanitizer and clang modes test the
# C++ library, which the package links as it is). FUSEKIT_TEST_BUILD tells the tests which copy of
# the package they must be running (tests/python/test_environment.py).
if [ -z "$mode" ]; then
  echo "[python] pytest with $PY, the package from $build/python"
  FUSEKIT_TEST_BUILD="$PWD/$build/python" PYTHONPATH="$PWD/$build/python" \
    "$PY" -m pytest -q -p no:cacheprovider tests/python
  stage "pytest"
fi
echo "[test.sh ${mode:-default}] total: $(($(date +%s) - t_start)) s"
