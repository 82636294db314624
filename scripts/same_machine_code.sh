#!/usr/bin/env bash
# Whether two object files hold the same machine code, instruction by instruction (addresses and
# offsets of symbols normalized away). For changes to kernels this machine cannot run (the AVX-512
# VBMI ones on a CPU without it): build the object before and after, and compare.
#   scripts/same_machine_code.sh before.o after.o     exit 0: the same; 1: a diff is printed
set -euo pipefail
[[ $# -eq 2 ]] || { echo "usage: $0 before.o after.o" >&2; exit 2; }
norm() {
  objdump -d --no-show-raw-insn -C "$1" | tail -n +4 |
    sed -E 's/^ *[0-9a-f]+:[[:space:]]*//; s/[0-9a-f]+ <([^>+]*)(\+0x[0-9a-f]+)?>/<\1>/g; s/^[0-9a-f]{16} //' |
    grep -v '^$'
}
if diff <(norm "$1") <(norm "$2") > /tmp/same_machine_code.$$; then
  echo "same machine code: $(norm "$1" | wc -l) lines"
  rm -f /tmp/same_machine_code.$$
else
  head -40 /tmp/same_machine_code.$$
  echo "... $(wc -l < /tmp/same_machine_code.$$) diff lines"
  rm -f /tmp/same_machine_code.$$
  exit 1
fi
