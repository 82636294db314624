#!/usr/bin/env bash
# fusekit's build configurations, written once: every script that builds (test.sh, main.sh,
# bench.sh, fuzz.sh) configures its folder here, so that two scripts sharing a folder never flip
# its flags (which would recompile everything).
#   scripts/configure.sh MODE [--python PY] [-DVAR=VALUE ...]
# Prints the build folder as its last line. Warnings are errors in every mode (the project's
# compilers are Debian 12's GCC 12 and clang 14): the same flags whichever script configures a
# folder first, so main.sh and test.sh sharing build/ never recompile it for each other. For
# another compiler, pass -DFUSEKIT_WERROR=OFF (arguments after the mode come last and win).
#   release          build/             Release (GCC): the library, tests, examples, tools,
#                                       benchmarks; --python PY adds the extension fusekit._fusekit
#                                       (build/python/fusekit is then a runnable copy of the
#                                       package: PYTHONPATH=build/python)
#   sanitize         build-asan/        GCC, ASan + UBSan, -O1; no benchmarks
#   clang            build-clang/       clang 14, Release
#   clang-sanitize   build-clang-asan/  clang 14, ASan + UBSan, -O1, with the libFuzzer
#                                       targets (the library carries libFuzzer's coverage
#                                       instrumentation: fuzz.sh runs this build's fuzzers) and the
#                                       benchmarks compiled (not run), so that clang's warnings
#                                       cover every source
#   tsan             build-tsan/        clang 14, ThreadSanitizer, -O1; no benchmarks
# Every mode builds every operator of operators.txt unless FUSEKIT_OPS="a;b" asks for a subset.
# Python for the CMake-run tests (golden flows, seed examples): $FUSEKIT_CMAKE_PYTHON when set.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:?usage: configure.sh MODE [--python PY] [-D...]}
shift
args=()
while (($#)); do
  case $1 in
    --python)
      args+=(-DFUSEKIT_PYTHON=ON "-DPython_EXECUTABLE=$2")
      shift
      ;;
    *) args+=("$1") ;;
  esac
  shift
done
ops=(-UFUSEKIT_OPS)  # every operator, unless a subset is asked for (the cache keeps none)
[ -n "${FUSEKIT_OPS:-}" ] && ops=("-DFUSEKIT_OPS=${FUSEKIT_OPS}")
[ -n "${FUSEKIT_CMAKE_PYTHON:-}" ] && args+=("-DPython3_EXECUTABLE=$FUSEKIT_CMAKE_PYTHON")

clang=(-DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14)
# The sanitizer builds compile at -O1 (what the sanitizers' own docs advise): half of -O2's
# compile time under ASan (GCC 12: 54 -> 34 s for the largest test, 17 -> 9 s for a plan file),
# and the tests still run at a few times the speed of unoptimized code. The line tables for the
# reports' file and line come from CMakeLists.txt (-g1).
sanitizer_opt=("-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -DNDEBUG")
case $mode in
  release)
    build=build
    cfg=(-DCMAKE_BUILD_TYPE=Release)
    ;;
  sanitize)
    build=build-asan
    cfg=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "${sanitizer_opt[@]}" -DFUSEKIT_SANITIZE=ON
         -DFUSEKIT_BUILD_BENCHMARKS=OFF)
    ;;
  clang)
    build=build-clang
    cfg=(-DCMAKE_BUILD_TYPE=Release "${clang[@]}")
    ;;
  clang-sanitize)
    build=build-clang-asan
    cfg=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "${sanitizer_opt[@]}" "${clang[@]}"
         -DFUSEKIT_SANITIZE=ON -DFUSEKIT_BUILD_FUZZERS=ON)
    ;;
  tsan)
    build=build-tsan
    # lazy_adam_no_alloc_test replaces operator new, which TSan's static runtime defines too: the
    # program links with TSan's kept (test.sh leaves that test out). LLVM 14's shared TSan runtime
    # (-shared-libsan) is no way out: it crashes at start-up.
    cfg=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "${sanitizer_opt[@]}" "${clang[@]}"
         -DFUSEKIT_BUILD_BENCHMARKS=OFF
         "-DCMAKE_CXX_FLAGS=-fsanitize=thread -fno-omit-frame-pointer"
         "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread -Wl,--allow-multiple-definition"
         -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread)
    ;;
  *)
    echo "configure.sh: unknown mode '$mode'" >&2
    exit 2
    ;;
esac
cmake -S . -B "$build" -G Ninja -DFUSEKIT_WERROR=ON "${ops[@]}" "${cfg[@]}" ${args[@]+"${args[@]}"} \
  >/dev/null
echo "$build"
