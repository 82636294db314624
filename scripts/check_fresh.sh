#!/usr/bin/env bash
# What a new machine sees, before you stop: a fresh clone of HEAD (committed work only) in a
# temporary folder, and the README's two commands run there with empty Python environments
# (FUSEKIT_VENV inside the temporary folder), so that nothing installed by hand, in the base
# interpreter or in this machine's cached environments, can make them pass.
#   scripts/check_fresh.sh [--small] [--keep]
#     --small   the main job at reduced sizes (scripts/main.sh --small)
#     --keep    leave the temporary folder (its path is printed)
# pip's download cache is still used (it holds downloads, not installed packages); set
# PIP_NO_CACHE_DIR=1 to download everything again. Debian packages are installed as the scripts
# install them (scripts/install_deps.sh), on this machine.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
main_args=()
keep=0
for a in "$@"; do
  case $a in
    --small) main_args+=(--small) ;;
    --keep) keep=1 ;;
    *)
      echo "check_fresh.sh: unknown option $a" >&2
      exit 2
      ;;
  esac
done
[ -z "$(git -C "$src" status --porcelain)" ] ||
  echo "[fresh] note: uncommitted changes in $src are not part of the check"
tmp=$(mktemp -d /tmp/fusekit-fresh.XXXXXX)
((keep)) || trap 'rm -rf "$tmp"' EXIT
git clone -q "$src" "$tmp/fusekit"
# The seeds and specs sit beside the repository (../shared), as they do beside CI's clone.
[ -d "$src/../shared" ] && ln -s "$(cd "$src/../shared" && pwd)" "$tmp/shared"
export FUSEKIT_VENV=$tmp/venvs
unset PYTHONPATH PYTHONHOME
cd "$tmp/fusekit"
echo "[fresh] clone of $(git rev-parse --short HEAD) in $tmp/fusekit, Python environments in $FUSEKIT_VENV"
status=0
t0=$(date +%s)
bash scripts/main.sh ${main_args[@]+"${main_args[@]}"} || status=1
t1=$(date +%s)
bash scripts/test.sh || status=2
t2=$(date +%s)
echo "[fresh] scripts/main.sh ${main_args[*]}: $((t1 - t0)) s; scripts/test.sh: $((t2 - t1)) s"
((keep)) && echo "[fresh] kept $tmp"
if ((status)); then
  echo "[fresh] FAILED: $([ $status = 1 ] && echo scripts/main.sh || echo scripts/test.sh)"
  exit 1
fi
echo "[fresh] both commands passed in a fresh clone"
