#!/usr/bin/env bash
# Checks that every tracked C++ file is formatted as .clang-format says (clang-format from Debian,
# installed if missing). Prints the files that are not and exits 1; `--fix` rewrites them.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null 2>&1; then
  echo "[deps] installing Debian package: clang-format"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang-format >/dev/null
fi
# The tree is formatted with Debian 12's clang-format 14; another major version may break lines
# differently, so it only warns.
major=$(clang-format --version | sed -n 's/.*version \([0-9]*\).*/\1/p')
strict=1
if [ "$major" != "14" ]; then
  echo "[format] clang-format $major, not 14: differences are reported but do not fail"
  strict=0
fi
mapfile -t files < <(git ls-files '*.cc' '*.h')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "not formatted (scripts/check_format.sh --fix rewrites them):"
  printf '  %s\n' "${bad[@]}"
  exit "$strict"
fi
echo "[format] ${#files[@]} files formatted as .clang-format says"
