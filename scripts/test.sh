#!/usr/bin/env bash
# The test command: installs dependencies, builds with warnings as errors, runs every test.
#   scripts/test.sh             Release build in build/, then the Python package: installed with
#                               `pip install .` (scripts/install_python_deps.sh first) and its
#                               pytest suite (tests/python)
#   scripts/test.sh --sanitize  ASan + UBSan build in build-asan/
#   scripts/test.sh --clang     clang 14 Release build in build-clang/ (warnings as errors too)
#   scripts/test.sh --clang-sanitize   clang 14 ASan + UBSan build in build-clang-asan/
#   scripts/test.sh --tsan      clang 14 ThreadSanitizer build in build-tsan/: every test of
#                               in-tree programs, with no suppressions (any report fails)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  --clang | --clang-sanitize | --tsan) bash scripts/install_deps.sh --clang ;;  # clang on demand
  *) bash scripts/install_deps.sh ;;
esac

build=build
extra=(-DCMAKE_BUILD_TYPE=Release)
ctest_extra=()
if [ "${1:-}" = "--sanitize" ]; then
  build=build-asan
  extra=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DFUSEKIT_SANITIZE=ON -DFUSEKIT_BUILD_BENCHMARKS=OFF)
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
elif [ "${1:-}" = "--clang" ]; then
  build=build-clang
  export CC=clang-14 CXX=clang++-14
  extra=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++-14)
elif [ "${1:-}" = "--clang-sanitize" ]; then
  build=build-clang-asan
  export CC=clang-14 CXX=clang++-14
  extra=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-14 -DFUSEKIT_SANITIZE=ON
         -DFUSEKIT_BUILD_BENCHMARKS=OFF)
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # The install consumer and the seeds' examples are built by the test with the compiler of the
  # build; they need clang's sanitizer runtime, which FUSEKIT_CONSUMER_FLAGS passes.
elif [ "${1:-}" = "--tsan" ]; then
  build=build-tsan
  export CC=clang-14 CXX=clang++-14
  tsan=(-fsanitize=thread -fno-omit-frame-pointer)
  # lazy_adam_no_alloc_test replaces operator new, which TSan's static runtime defines too: the
  # program links with TSan's kept (that test is left out below). LLVM 14's shared TSan runtime
  # (-shared-libsan) is no way out: it crashes at start-up.
  link="-fsanitize=thread -Wl,--allow-multiple-definition"
  extra=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-14
         -DFUSEKIT_BUILD_BENCHMARKS=OFF "-DCMAKE_CXX_FLAGS=${tsan[*]}"
         "-DCMAKE_EXE_LINKER_FLAGS=$link" -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread)
  export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
  # Not here: the install consumer and the seeds' examples (built outside this build, without
  # TSan's runtime, they cannot load a TSan library), and LazyAdamNoAlloc (its replacement of
  # operator new loses to TSan's own, so it would test nothing). They run in the other modes.
  ctest_extra=(-E "^(install\.|seed_example\.|LazyAdamNoAlloc\.)")
fi
cmake -S . -B "$build" -G Ninja -DFUSEKIT_WERROR=ON -UFUSEKIT_OPS "${extra[@]}" >/dev/null  # every operator
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" -j "$(nproc)" --output-on-failure ${ctest_extra[@]+"${ctest_extra[@]}"}

# The Python package and its tests (the default mode only: the sanitizer and clang modes test the
# C++ library, which the package links as it is).
if [ -z "${1:-}" ]; then
  bash scripts/install_python_deps.sh
  echo "[python] pip install . (build folder: build/python-*)"
  python3 -m pip install --quiet --disable-pip-version-check --no-build-isolation . 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check --no-build-isolation \
      --break-system-packages .
  python3 -m pytest -q -p no:cacheprovider tests/python
fi
