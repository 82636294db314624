#!/usr/bin/env python3
"""The single-operator golden flow: generate inputs and golden outputs with NumPy, run the operator
from its executable (aclnn API, .bin files), verify with the operator's rule, write a summary.

    python3 golden/run_flow.py lazy_adam --build build --out out/lazy_adam [--size small]

Exits non-zero when any output fails its operator's gate (unlike Rec SDK's verifier): the
module's GATE, "bitwise" where the operator's doc promises bitwise equality to the golden (then a
single element off by one ulp fails), else the tolerance its doc states."""
import argparse
import importlib
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from golden.common import read_params  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("op")
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default=None)
    ap.add_argument("--size", default="default")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = args.out or os.path.join("out", args.op)
    mod = importlib.import_module(f"golden.{args.op}")
    gate = mod.GATE
    if args.size == "default":  # the main job's size: the operator's choice, else the seed's shape
        args.size = getattr(mod, "DEFAULT_SIZE", "seed")
    os.makedirs(os.path.join(out, "output"), exist_ok=True)

    t0 = time.time()
    mod.generate(out, size=args.size, seed=args.seed)
    gen_s = time.time() - t0
    runner = os.path.join(args.build, "tools", f"run_{args.op}")
    proc = subprocess.run([runner, out], text=True, capture_output=True)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        print(f"[FAIL] {args.op}: {runner} exited with {proc.returncode}")
        write_summary(out, args.op, False, gate, {}, [])
        return 1
    stats = read_params(os.path.join(out, "run_stats.txt"))
    results = mod.verify(out)
    ok = all(r[1] for r in results)
    for name, passed, detail in results:
        print(f"[{'PASS' if passed else 'FAIL'}] {args.op} {name} ({gate}): {detail}")
    print(f"[INFO] {args.op}: gate {gate}; golden generated in {gen_s:.1f} s")
    write_summary(out, args.op, ok, gate, stats, results)
    return 0 if ok else 1


def write_summary(out, op, ok, gate, stats, results):
    outputs = " ".join(f"{n}:{'pass' if p else 'FAIL'}" for n, p, _ in results) or "-"
    # time and rate: the median of the runner's steady calls; first: its first (checked) call
    gate = "bitwise" if gate == "bitwise" else "bound"  # (the column's width; printed whole above)
    line = (f"{op:<20} {'PASS' if ok else 'FAIL':<5} {gate:<8} {stats.get('shape', '-'):<36} "
            f"{stats.get('time_ms', '-'):>10} ms {stats.get('rate', '-'):>18} "
            f"{stats.get('first_call_ms', '-'):>10} ms  {outputs}")
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write(line + "\n")


if __name__ == "__main__":
    sys.exit(main())
