#!/usr/bin/env bash
# The wheel as a user gets it: installs WHEEL into a fresh virtual environment that holds only
# NumPy (at the pin of requirements/core.txt) and the wheel, hides the system's Highway from the
# loader, and runs tests/wheel/check_import.py there (import, where the extension and Highway were
# loaded from, one AdamW step against NumPy float64).
#   scripts/check_wheel.sh [--no-hide] WHEEL
# Hiding: in a private mount namespace (unshare --mount, needs root), an empty file is bind-mounted
# over every libhwy*.so* file the loader could find, so dlopen of the system's libhwy fails with
# "file too short"; the check first proves that it does. Nothing outside the namespace changes. A
# machine without Highway installed has nothing to hide. --no-hide runs the same check without it.
set -euo pipefail
cd "$(dirname "$0")/.."
hide=1
if [ "${1:-}" = --no-hide ]; then hide=0; shift; fi
if [ $# != 1 ] || [ ! -f "$1" ]; then
  echo "usage: scripts/check_wheel.sh [--no-hide] WHEEL" >&2
  exit 2
fi
wheel=$(realpath "$1")
root=$PWD
base=${FUSEKIT_BASE_PYTHON:-python3}
log() { echo "[check-wheel] $*"; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
t0=$(date +%s)
"$base" -m venv "$tmp/venv"
py=$tmp/venv/bin/python
"$py" -m pip install --quiet --disable-pip-version-check --no-input --no-deps \
  -r requirements/core.txt "$wheel"
"$py" -m pip check  # the wheel's declared dependencies are what the environment has
log "environment with $(basename "$wheel") and NumPy: $(($(date +%s) - t0)) s"

# Every Highway library file the loader could pick: the ld.so cache's and the usual folders'.
hwy=()
if [ "$hide" = 1 ]; then
  mapfile -t hwy < <( { ldconfig -p 2>/dev/null | awk '/libhwy/ {print $NF}';
                        ls /lib/*/libhwy*.so* /usr/lib/*/libhwy*.so* /usr/local/lib/libhwy*.so* \
                          2>/dev/null; } | xargs -r realpath -e 2>/dev/null | sort -u)
fi
cd "$tmp"  # outside the clone: nothing of the source tree or a build folder on sys.path
if [ ${#hwy[@]} = 0 ]; then
  if [ "$hide" = 0 ]; then log "not hiding the system's libhwy (--no-hide)"; else log "no system libhwy to hide"; fi
  env -u PYTHONPATH -u LD_LIBRARY_PATH "$py" "$root/tests/wheel/check_import.py"
else
  log "hiding ${hwy[*]}"
  if ! unshare --mount --propagation private true 2>/dev/null; then
    echo "check_wheel.sh: hiding the system's libhwy needs a private mount namespace" \
      "(unshare --mount, as root); --no-hide checks without hiding" >&2
    exit 1
  fi
  : >"$tmp/empty"
  # shellcheck disable=SC2016  # expanded by the inner shell
  env -u PYTHONPATH -u LD_LIBRARY_PATH FUSEKIT_EXPECT_HWY_HIDDEN=1 \
    unshare --mount --propagation private bash -c '
      set -e
      empty=$1 py=$2 check=$3
      shift 3
      for f in "$@"; do mount --bind "$empty" "$f"; done
      exec "$py" "$check"' bash "$tmp/empty" "$py" "$root/tests/wheel/check_import.py" "${hwy[@]}"
fi
log "passed in $(($(date +%s) - t0)) s"
