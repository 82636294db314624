"""The report: the table of comparisons (printed, and as markdown for docs/python_bench.md) and the
bar chart (matplotlib, optional: --plot)."""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

from .results import Comparison, Recorder, _fmt_time

# python/fusekit/bench/report.py -> the checkout's docs/
_CHECKOUT_DOCS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                              os.pardir, os.pardir, os.pardir, "docs"))


def default_plot_path() -> str:
    """docs/python_bench.png of the checkout when this file runs from one (editable install),
    else python_bench.png in the working directory."""
    if os.path.isfile(os.path.join(_CHECKOUT_DOCS, "benchmarks.md")):
        return os.path.join(_CHECKOUT_DOCS, "python_bench.png")
    return os.path.abspath("python_bench.png")


def print_table(rec: Recorder, meta: Dict[str, Any]) -> None:
    print()
    print(f"fusekit {meta['versions']['fusekit']} vs peers, {meta['date']}, {meta['cpu']} "
          f"({meta['cpus_allowed']} CPUs), threads fusekit {meta['fusekit_threads']} / torch "
          f"{meta['torch_threads']}, THP {meta['thp_enabled']}, OMP_WAIT_POLICY "
          f"{meta['OMP_WAIT_POLICY']}")
    hdr = f"{'case':<40} {'fusekit':<38} {'peer':<40} {'speed-up':>9}  {'target':<24} met"
    print(hdr)
    print("-" * len(hdr))
    for c in rec.comparisons:
        fk = f"{c.fusekit} {_fmt_time(c.fusekit_s)}"
        peer = f"{c.peer} {_fmt_time(c.peer_s)}"
        met = {True: "yes", False: "NO", None: ""}[c.met]
        print(f"{c.case[:40]:<40} {fk[:38]:<38} {peer[:40]:<40} {c.speedup:>8.2f}x  "
              f"{c.target[:24]:<24} {met}")
    for s in rec.skips:
        print(f"skipped: {s.case}: {s.impl}: {s.reason}")


def markdown_table(rec: Recorder) -> str:
    lines = ["| case | fusekit | peer | speed-up | target | met |",
             "| --- | --- | --- | ---: | --- | --- |"]
    for c in rec.comparisons:
        met = {True: "yes", False: "**no**", None: ""}[c.met]
        lines.append(f"| {c.case} | {c.fusekit} {_fmt_time(c.fusekit_s)} | {c.peer} "
                     f"{_fmt_time(c.peer_s)} | {c.speedup:.2f}x | {c.target} | {met} |")
    return "\n".join(lines)


def _matplotlib_missing() -> str:
    """Why the chart cannot be drawn here ("" when it can): matplotlib is optional."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        return (f"matplotlib is not installed ({e}): pip install matplotlib, or pass --no-plot "
                "(it is in the project's test environment: scripts/python_env.sh test)")
    return ""


def plot(rec: Recorder, meta: Dict[str, Any], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401

    speed = [c for c in rec.comparisons if c.section != "overhead" and c.target != "page effect"]
    over = [r for r in rec.results if r.section == "overhead"]
    fig, (ax1, ax2) = plt.subplots(
        1, 2, figsize=(16.5, max(4.5, 0.32 * max(len(speed), len(over)) + 1.8)),
        gridspec_kw={"width_ratios": [1.6, 1]})

    def short(c: Comparison) -> str:
        head = c.section
        if c.section == "lora":
            head = c.case.replace("add_lora ", "").split(" B=")[0] + " " + c.case.split()[-1]
        fk = c.fusekit.replace("fusekit.torch.", "").replace("fusekit.", "")
        return f"{head}: {fk} vs {c.peer.replace('torch.optim.', 'torch ')}"

    labels = [short(c) for c in speed]
    vals = [c.speedup for c in speed]
    colors = ["tab:green" if c.met else ("tab:red" if c.met is False else "tab:gray")
              for c in speed]
    ypos = range(len(speed))
    ax1.barh(list(ypos), vals, color=colors)
    for i, c in enumerate(speed):
        tgt: Optional[float] = {">= 10x": 10.0, "> 1x": 1.0, ">= 3x": 3.0}.get(
            c.target.split(" (")[0])
        if c.target.startswith("within 1.6x"):
            tgt = 1 / 1.6
        if tgt:
            ax1.plot([tgt, tgt], [i - 0.4, i + 0.4], color="black", lw=2)
        ax1.text(c.speedup * 1.05, i, f"{c.speedup:.2f}x", va="center", fontsize=7)
    ax1.set_yticks(list(ypos))
    ax1.set_yticklabels(labels, fontsize=7)
    ax1.invert_yaxis()
    ax1.set_xscale("log")
    ax1.axvline(1.0, color="gray", lw=0.8, ls="--")
    ax1.set_xlabel("speed-up of fusekit (peer time / fusekit time, log); black tick = target")
    ax1.set_title("fusekit vs peers (green: target met, red: not met)", fontsize=9)
    olabels = [f"{r.case.split(',')[0]}: {r.impl}" for r in over]
    ax2.barh(range(len(over)), [r.seconds * 1e6 for r in over],
             color=["tab:blue" if r.impl.startswith("fusekit") else "tab:gray" for r in over])
    ax2.set_yticks(range(len(over)))
    ax2.set_yticklabels(olabels, fontsize=7)
    ax2.invert_yaxis()
    ax2.set_xscale("log")
    ax2.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax2.axvline(10.0, color="tab:red", lw=1, ls="--", label="10 us target (ops)")
    ax2.legend(fontsize=7)
    ax2.set_xlabel("microseconds per call, tiny problems (log)")
    ax2.set_title("per-call overhead", fontsize=9)
    fig.suptitle(f"fusekit {meta['versions']['fusekit']}, {meta['date']}, {meta['cpu']}, "
                 f"{meta['cpus_allowed']} CPUs, threads fusekit {meta['fusekit_threads']} / "
                 f"torch {meta['torch_threads']}, OMP_WAIT_POLICY {meta['OMP_WAIT_POLICY']}",
                 fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
