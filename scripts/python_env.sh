#!/usr/bin/env bash
# The project's Python environments: a virtual environment per requirements file, outside the
# clone, built only from the pins in requirements/ and reused while they stay the same.
#   scripts/python_env.sh [core|test|examples|...]    (default: test)
# Prints the environment's interpreter as its last line of output (messages go to stderr), so a
# script does  PY=$(bash scripts/python_env.sh test).
#
# requirements/<name>.txt is a complete lock (with the files it includes by `-r`): every package
# pinned, installed with --no-deps, so that nothing unpinned comes in. The environment lives in
#   ${FUSEKIT_VENV:-${XDG_CACHE_HOME:-~/.cache}/fusekit}/venv-<name>-<key>
# where <key> hashes the lock files, this script and the base interpreter (python3 on PATH, or
# $FUSEKIT_BASE_PYTHON): a second run reuses it, a change of pins builds a new one (and removes
# the old). It never sees the base interpreter's site-packages or the user's: whatever was
# installed there by hand stays invisible to the tests. An environment is used only once it is
# complete (a stamp written last); an interrupted build is started again.
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:-test}
lock=requirements/$name.txt
[ -f "$lock" ] || { echo "python_env.sh: no such lock file: $lock" >&2; exit 2; }
base=${FUSEKIT_BASE_PYTHON:-python3}
log() { echo "[python-env] $*" >&2; }

# The lock and every file it includes (-r), in order.
locks=()
add_lock() {
  local f=$1 inc
  locks+=("$f")
  while read -r inc; do
    add_lock "$(dirname "$f")/$inc"
  done < <(sed -n 's/^-r[[:space:]]*\([^[:space:]#]*\).*/\1/p' "$f")
}
add_lock "$lock"

base_id=$("$base" -c 'import sys, os; print(sys.version.replace("\n", " ")); print(os.path.realpath(sys.executable))')
key=$( { echo "$base_id"; cat "$0"; for f in "${locks[@]}"; do echo "== $f"; cat "$f"; done; } |
       sha256sum | cut -c1-12)
root=${FUSEKIT_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fusekit}
env_dir=$root/venv-$name-$key
stamp=$env_dir/.fusekit-complete
mkdir -p "$root"

exec 9>"$root/.lock-$name"
flock 9  # one build of an environment at a time

if [ ! -f "$stamp" ]; then
  t0=$(date +%s)
  log "building $env_dir (from ${locks[*]}; base $(head -1 <<<"$base_id" | cut -d' ' -f1))"
  rm -rf "$env_dir"
  if ! "$base" -m venv "$env_dir" >&2; then
    log "'$base -m venv' failed: on Debian, install python3-venv (scripts/install_deps.sh does)"
    exit 1
  fi
  py=$env_dir/bin/python
  pip=("$py" -m pip install --quiet --disable-pip-version-check --no-input)
  "${pip[@]}" --no-deps -r "$lock" >&2
  # torch the small way (requirements/test.txt explains): where it does not load like that, the
  # same version with the dependencies it declares.
  torch_pin=$(cat "${locks[@]}" | sed -n 's/^\(torch==[^[:space:]#]*\).*/\1/p' | head -1)
  if [ -n "$torch_pin" ] && ! "$py" -c "import torch" 2>/dev/null; then
    log "$torch_pin does not load without its CUDA wheels here: installing them too"
    "${pip[@]}" "$torch_pin" >&2
  fi
  "$py" -c "import sys; assert sys.prefix != sys.base_prefix" # a virtual environment, not the base
  echo "$key" >"$stamp"
  log "built in $(($(date +%s) - t0)) s"
  for old in "$root"/venv-"$name"-*; do  # environments of earlier pins
    [ "$old" = "$env_dir" ] || rm -rf "$old"
  done
else
  log "reusing $env_dir"
fi
echo "$env_dir/bin/python"
