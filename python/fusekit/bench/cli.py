"""The command line: python -m fusekit.bench [options] (run), and --from-json (the table and
chart of a saved report). See the package's docstring for the sections and the options."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from typing import Any, Callable, Dict, List, Optional

import fusekit

from . import report as _report
from .adam8bit import bench_adam8bit
from .embedding_bag import bench_embedding_bag
from .lazy import bench_lazy_adam
from .lora import bench_lora
from .machine import machine_info
from .offload import bench_offload
from .omp import bench_omp, omp_probe
from .torchrec_ebc import bench_torchrec
from .overhead import bench_overhead
from .report import _matplotlib_missing, markdown_table, plot, print_table
from .results import SECTIONS, Comparison, Config, Recorder, Result, Skip
from .timing import _free


def run(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Run the benchmark as the command line does; returns the report as a dict (what --json
    writes) with "table" (the markdown table) added."""
    ap = _parser()
    args = ap.parse_args(argv)
    if args.plot and not args.no_plot:  # a chart asked for by name: refused before anything runs
        missing = _matplotlib_missing()
        if missing:
            ap.error(f"--plot {args.plot}: {missing}")
    if args.from_json:
        return _replay(args)
    if args.omp_probe:
        print("OMP_PROBE " + json.dumps(omp_probe(args.quick, args.repeats)), flush=True)
        return {}
    import torch

    saved_threads = torch.get_num_threads()
    if args.threads:
        fusekit.set_num_threads(args.threads)
        torch.set_num_threads(args.threads)
    try:
        return _run(args, argv, torch)
    finally:
        if args.threads:  # leave the process as it was (the smoke test runs inside pytest)
            fusekit.set_num_threads(0)
            torch.set_num_threads(saved_threads)


def _run(args: argparse.Namespace, argv: Optional[List[str]], torch: Any) -> Dict[str, Any]:
    if args.only:
        only = tuple(s.strip() for s in args.only.split(",") if s.strip())
        bad = [s for s in only if s not in SECTIONS]
        if bad:
            raise SystemExit(f"--only: unknown section(s) {bad}; choose from {list(SECTIONS)}")
    else:
        only = tuple(s for s in SECTIONS if not (args.quick and s == "omp"))
    try:
        offload_sizes = tuple(float(x) for x in args.offload_sizes.split(",") if x.strip())
    except ValueError:
        raise SystemExit(f"--offload-sizes: a comma-separated list of numbers, got "
                         f"{args.offload_sizes!r}")
    if not offload_sizes or any(not 0 < x <= 4096 for x in offload_sizes):
        raise SystemExit(f"--offload-sizes: each in (0, 4096] million parameters, got "
                         f"{args.offload_sizes!r}")
    cfg = Config(quick=args.quick, repeats=args.repeats or (2 if args.quick else 7), only=only,
                 offload_sizes=offload_sizes)
    meta = machine_info(torch)
    meta["quick"] = cfg.quick
    meta["repeats"] = cfg.repeats
    meta["command"] = "python -m fusekit.bench " + " ".join(
        argv if argv is not None else sys.argv[1:])
    print(f"fusekit.bench: {meta['cpu']}, {meta['cpus_allowed']} CPUs, fusekit threads "
          f"{meta['fusekit_threads']}, torch threads {meta['torch_threads']}, THP "
          f"{meta['thp_enabled']}, OMP_WAIT_POLICY {meta['OMP_WAIT_POLICY']}, load "
          f"{meta['loadavg_at_start']}{', QUICK (small shapes)' if cfg.quick else ''}", flush=True)
    rec = Recorder()
    meta["sections"] = {}
    t0 = time.perf_counter()
    fns: Dict[str, Callable[[Recorder, Config], None]] = {
        "lazy_adam": bench_lazy_adam, "embedding_bag": bench_embedding_bag,
        "torchrec": bench_torchrec, "adam8bit": bench_adam8bit, "offload": bench_offload,
        "lora": bench_lora, "overhead": bench_overhead, "omp": bench_omp}
    with torch.no_grad():
        for s in SECTIONS:
            if s in cfg.only:
                load = os.getloadavg()[0]
                ts = time.perf_counter()
                fns[s](rec, cfg)
                _free()
                meta["sections"][s] = {"loadavg_1min_before": round(load, 2),
                                       "loadavg_1min_after": round(os.getloadavg()[0], 2),
                                       "wall_s": round(time.perf_counter() - ts, 1)}
    meta["wall_s"] = round(time.perf_counter() - t0, 1)
    meta["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print_table(rec, meta)
    print(f"\n{meta['wall_s']} s, load average at the end {meta['loadavg_at_end']}")
    report = {"meta": meta, "results": [asdict(r) for r in rec.results],
              "comparisons": [asdict(c) for c in rec.comparisons],
              "skipped": [asdict(s) for s in rec.skips], "omp": rec.omp,
              "table": markdown_table(rec)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.json}")
    if not args.no_plot:
        path = args.plot or _report.default_plot_path()
        missing = _matplotlib_missing()
        if missing:  # only the default chart gets here without it (--plot was refused up front)
            print(f"chart not written: {missing}")
        else:
            try:
                plot(rec, meta, path)
                print(f"wrote {path}")
            except Exception as e:  # noqa: BLE001
                print(f"plot not written: {type(e).__name__}: {e}")
    return report


def _replay(args: argparse.Namespace) -> Dict[str, Any]:
    """Prints the table of a saved report (--json) and redraws its chart; runs nothing."""
    with open(args.from_json) as f:
        report = json.load(f)
    rec = Recorder(verbose=False)
    rec.results = [Result(**r) for r in report["results"]]
    rec.comparisons = [Comparison(**c) for c in report["comparisons"]]
    rec.skips = [Skip(**k) for k in report.get("skipped", [])]
    rec.omp = report.get("omp", {})
    print_table(rec, report["meta"])
    if not args.no_plot:
        path = args.plot or _report.default_plot_path()
        missing = _matplotlib_missing()
        if missing:
            print(f"chart not written: {missing}")
        else:
            plot(rec, report["meta"], path)
            print(f"wrote {path}")
    return report


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m fusekit.bench",
                                 description="fusekit against torch, bitsandbytes, torchao and "
                                             "vLLM's torch LoRA path, on the C++ benchmarks' "
                                             "shapes")
    ap.add_argument("--quick", action="store_true", help="small shapes, a few seconds (smoke test)")
    ap.add_argument("--only", default="", help=f"comma-separated sections of {','.join(SECTIONS)}")
    ap.add_argument("--repeats", type=int, default=0, help="timed repeats per case (default 7, "
                                                           "2 with --quick)")
    ap.add_argument("--plot", default="", help="bar chart path (default: docs/python_bench.png in "
                                             "a checkout, else ./python_bench.png)")
    ap.add_argument("--no-plot", action="store_true", help="write no chart")
    ap.add_argument("--json", default="", help="write the report as JSON here")
    ap.add_argument("--offload-sizes", default="64,512", metavar="M,M",
                    help="offload section: parameter counts in millions (2^20; default 64,512)")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads for fusekit and torch (default: each library's own)")
    ap.add_argument("--omp-wait-policy", default="inherit",
                    choices=("inherit", "passive", "active", "unset"),
                    help="re-run this process with OMP_WAIT_POLICY set (or unset) before torch is "
                         "imported (default: the environment's)")
    ap.add_argument("--from-json", default="", metavar="PATH",
                    help="print the table of a report saved with --json and redraw its chart "
                         "(--plot); runs nothing")
    ap.add_argument("--omp-probe", action="store_true", help=argparse.SUPPRESS)
    return ap


def main(argv: Optional[List[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    want = args.omp_wait_policy
    have = os.environ.get("OMP_WAIT_POLICY")
    if want != "inherit" and "torch" not in sys.modules:
        target = None if want == "unset" else want.upper()
        if (have.upper() if have else None) != target:
            env = dict(os.environ)
            env.pop("OMP_WAIT_POLICY", None)
            if target is not None:
                env["OMP_WAIT_POLICY"] = target
            # OpenMP reads the variable when torch's runtime loads: re-exec before importing it.
            os.execve(sys.executable, [sys.executable, "-m", "fusekit.bench"] + argv, env)
    run(argv)
