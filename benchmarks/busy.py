#!/usr/bin/env python3
"""Co-tenant benchmark: each operator's benchmark idle, beside a neighbour on one core, and beside
a neighbour that loads the whole machine; prints the medians and the busy/idle ratios.

  python3 benchmarks/busy.py --build build [--repetitions 3] [--ops lazy_adam,add_lora]

The neighbours are plain spinning processes (`sh -c 'while :; do :; done'`): one pinned to CPU 0
with taskset, then one per CPU, unpinned. The benchmarks run with the library's default thread
count. Results go to out/bench/busy.json and out/bench/busy.md.
"""
import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent

# The operator cases of each benchmark (not the ceilings, floors or arithmetic references that
# some of them also measure).
CASES = {
    "lazy_adam": r"^BM_LazyAdam(/|WithRepeats/|PlanReuse)",
    "adam_w": r"^BM_AdamW(/|PlanReuse)",
    "apply_adam_w_quant": r"^BM_ApplyAdamWQuant(/|PlanReuse)",
    "add_lora": r"^BM_AddLora(Prefill|Decode|PlanReuse)",
    "lazy_adam_quant": r"^BM_LazyAdamQuant(/(float32|bfloat16)/packed/(fp8/)?D:32/|PlanReuse)",
    "embedding_bag_lazy_adam_quant": r"^BM_EmbeddingBagLazyAdamQuant/1/4/",
}

SPIN = ["sh", "-c", "while :; do :; done"]


def operators():
    text = (ROOT / "operators.txt").read_text()
    return [l.strip() for l in text.splitlines() if re.fullmatch(r"[a-z0-9_]+", l.strip())]


def start_neighbours(kind):
    procs = []
    if kind == "one_core":
        procs.append(subprocess.Popen(["taskset", "-c", "0"] + SPIN))
    elif kind == "all_cores":
        for _ in range(os.cpu_count() or 2):
            procs.append(subprocess.Popen(SPIN))
    time.sleep(0.2)
    return procs


def stop(procs):
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def run_bench(binary, pattern, repetitions):
    cmd = [str(binary), f"--benchmark_filter={pattern}", f"--benchmark_repetitions={repetitions}",
           "--benchmark_report_aggregates_only=true", "--benchmark_format=json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    medians = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("error_occurred"):
            continue
        if b.get("aggregate_name") == "median" or (repetitions == 1 and
                                                   b.get("run_type") == "iteration"):
            medians[b.get("run_name", b["name"])] = (b["real_time"], b["time_unit"])
    return medians


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--ops", default="")
    args = ap.parse_args()
    build = pathlib.Path(args.build)
    ops = [o for o in operators() if not args.ops or o in args.ops.split(",")]
    conditions = ["idle", "one_core", "all_cores"]
    results = {}
    for op in ops:
        binary = build / "benchmarks" / f"{op}_bench"
        if not binary.exists() or op not in CASES:
            continue
        for cond in conditions:
            print(f"[busy] {op}: {cond}", file=sys.stderr, flush=True)
            procs = start_neighbours(cond)
            try:
                medians = run_bench(binary, CASES[op], args.repetitions)
            finally:
                stop(procs)
            for name, value in medians.items():
                results.setdefault(f"{op}:{name}", {})[cond] = value
    out_dir = ROOT / "out" / "bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "busy.json").write_text(json.dumps(results, indent=1))
    lines = ["| case | idle | one core busy | ratio | all cores busy | ratio |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    worst = {"one_core": 0.0, "all_cores": 0.0}
    for case, by in results.items():
        if "idle" not in by:
            continue
        idle, unit = by["idle"]
        cells = [case, f"{idle:.4g} {unit}"]
        for cond in ("one_core", "all_cores"):
            if cond in by:
                ratio = by[cond][0] / idle
                worst[cond] = max(worst[cond], ratio)
                cells += [f"{by[cond][0]:.4g} {unit}", f"{ratio:.2f}"]
            else:
                cells += ["-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"worst ratio: one core busy {worst['one_core']:.2f} (target <= 2.5), "
                 f"all cores busy {worst['all_cores']:.2f} (target <= 4)")
    text = "\n".join(lines)
    (out_dir / "busy.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
