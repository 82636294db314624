#!/usr/bin/env python3
"""The single-operator golden flow: generate inputs and golden outputs with NumPy, run the operator
from its executable (aclnn API, .bin files), verify with the operator's rule, write a summary.

    python3 golden/run_flow.py lazy_adam --build build --out out/lazy_adam [--size small]
    python3 golden/run_flow.py lazy_adam_quant --sizes small   # the sizes scripts/main.sh runs

--sizes MODE prints the sizes the main job runs for MODE ("default", or "small" for --small), one a
line, and runs nothing: the module's main size (DEFAULT_SIZE, or the seed's; "small"), then the
module's EXTRA_SIZES[MODE] (the 8-bit optimizers' FP8 state format at the same shape).

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
    ap.add_argument("--sizes", metavar="MODE", default=None)
    args = ap.parse_args()
    out = args.out or os.path.join("out", args.op)
    mod = importlib.import_module(f"golden.{args.op}")
    gate = mod.GATE
    if args.sizes is not None:
        main_size = getattr(mod, "DEFAULT_SIZE", "seed") if args.sizes == "default" else args.sizes
        for size in [main_size] + list(getattr(mod, "EXTRA_SIZES", {}).get(args.sizes, [])):
            print(size)
        return 0
    if args.size == "default":  # the main job's size: the operator's choice, else the seed's shape
        args.size = getattr(mod, "DEFAULT_SIZE", "seed")
    os.makedirs(os.path.join(out, "output"), exist_ok=True)

    t0 = time.time()
    mod.generate(out, size=args.size, seed=args.seed)
    gen_s = time.time() - t0
    label = flow_label(out, args.op)
    runner = os.path.join(args.build, "tools", f"run_{args.op}")
    proc = subprocess.run([runner, out], text=True, capture_output=True)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        print(f"[FAIL] {label}: {runner} exited with {proc.returncode}")
        write_summary(out, label, False, gate, {}, [])
        return 1
    stats = read_params(os.path.join(out, "run_stats.txt"))
    results = mod.verify(out)
    ok = all(r[1] for r in results)
    for name, passed, detail in results:
        print(f"[{'PASS' if passed else 'FAIL'}] {label} {name} ({gate}): {detail}")
    print(f"[INFO] {label}: gate {gate}; golden generated in {gen_s:.1f} s")
    write_summary(out, label, ok, gate, stats, results)
    return 0 if ok else 1


def flow_label(out, op):
    """The summary's name of a flow: the operator, with the state format when params.txt names one
    other than the default (apply_adam_w_quant/fp8)."""
    fmt = read_params(os.path.join(out, "params.txt")).get("state_format", "dynamic_map")
    return op if fmt == "dynamic_map" else f"{op}/{fmt}"


def write_summary(out, op, ok, gate, stats, results):
    outputs = " ".join(f"{n}:{'pass' if p else 'FAIL'}" for n, p, _ in results) or "-"
    # time and rate: the median of the runner's steady calls; first: its first (checked) call
    gate = "bitwise" if gate == "bitwise" else "bound"  # (the column's width; printed whole above)
    line = (f"{op:<28} {'PASS' if ok else 'FAIL':<5} {gate:<8} {stats.get('shape', '-'):<36} "
            f"{stats.get('time_ms', '-'):>10} ms {stats.get('rate', '-'):>18} "
            f"{stats.get('first_call_ms', '-'):>10} ms  {outputs}")
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write(line + "\n")


if __name__ == "__main__":
    sys.exit(main())
