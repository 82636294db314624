#!/usr/bin/env bash
# The type check: mypy over the package, the examples and tests/typing (pyproject.toml [tool.mypy];
# docs/python.md, "Typing"); tests/typing again against the package as an installed one (where
# py.typed decides); then a run of tests/typing/public_api.py (the typed calls work).
#   scripts/typecheck.sh
# mypy reads the package as the build lays it out, build/python/fusekit: the sources, py.typed and
# the extension's stub _fusekit.pyi, which nanobind's stub generator writes from the built module
# (python/CMakeLists.txt). So this script first builds what that needs in build/, configured as
# scripts/test.sh configures it (after CI's test stage nothing is left to compile; on a fresh
# clone the library and the extension are compiled here). Errors are printed with their paths in
# python/fusekit (the copies are the sources, line for line). Prints each step's wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
unset PYTHONPATH PYTHONHOME  # nothing from the caller's Python leaks in
t_start=$(date +%s)
stage_t=$t_start
stage() {  # stage NAME: the time since the last stage, printed
  local now
  now=$(date +%s)
  echo "[typecheck] $1: $((now - stage_t)) s"
  stage_t=$now
}

bash scripts/install_deps.sh
MYPY_PY=$(bash scripts/python_env.sh typecheck | tail -1)  # mypy alone (requirements/typecheck.txt)
# The test environment: the build's Python, as scripts/test.sh has it, and the packages mypy checks
# against (torch, NumPy, ...), read from its site-packages (--python-executable).
PY=$(bash scripts/python_env.sh test | tail -1)
export FUSEKIT_CMAKE_PYTHON=$PY
stage "environments"

build=$(bash scripts/configure.sh release --python "$PY" | tail -1)
[ "$build" = build ] || { echo "typecheck.sh: pyproject.toml's mypy_path reads build/, not $build" >&2; exit 1; }
cmake --build "$build" --target fusekit_stub fusekit_python_sources -j "$(nproc)"
for f in py.typed _fusekit.pyi; do
  [ -f "$build/python/fusekit/$f" ] || { echo "typecheck.sh: the build wrote no $build/python/fusekit/$f" >&2; exit 1; }
done
stage "build (the package copy and the extension's stub)"

echo "[typecheck] $("$MYPY_PY" -m mypy --version) on $build/python/fusekit examples tests/typing"
rc=0
"$MYPY_PY" -m mypy --python-executable "$PY" "$build/python/fusekit" examples tests/typing 2>&1 |
  sed "s#^$build/python/fusekit/#python/fusekit/#" || rc=$?
stage "mypy"
if [ "$rc" != 0 ]; then
  echo "[typecheck] mypy failed (exit $rc); total: $(($(date +%s) - t_start)) s"
  exit "$rc"
fi

# As a user sees the package: installed (on the interpreter's path, not mypy's source path), where
# mypy reads it only because of py.typed; the project's settings on the command line instead.
PYTHONPATH="$PWD/$build/python" "$MYPY_PY" -m mypy --config-file "" --python-executable "$PY" \
  --cache-dir "$build/mypy-cache-installed" --check-untyped-defs --warn-unused-ignores \
  tests/typing/public_api.py
stage "mypy: tests/typing against the package as installed"

PYTHONPATH="$PWD/$build/python" "$PY" tests/typing/public_api.py
stage "tests/typing/public_api.py"
echo "[typecheck] total: $(($(date +%s) - t_start)) s"
