"""fusekit against the peers a PyTorch user would pick, in one run, on the C++ benchmarks' shapes.

    python -m fusekit.bench [--quick] [--only lazy_adam,adam8bit,offload,lora,overhead,omp]
                            [--repeats N] [--plot PATH] [--json PATH] [--no-plot]
                            [--omp-wait-policy inherit|passive|active|unset] [--threads N]
                            [--offload-sizes 64,512]
    python -m fusekit.bench --from-json PATH [--plot PATH]   # table and chart of a saved run

Sections (``--only`` picks some; all by default, ``omp`` not in ``--quick``):

- ``lazy_adam``: one SparseAdam step on an ``nn.Embedding``-like table, 2,000,000 x 32 float32,
  sparse gradient over 564,096 unique random rows: ``torch.optim.SparseAdam`` against
  ``fusekit.torch.SparseAdam`` (which gives the table huge pages in place), the raw
  :func:`fusekit.lazy_adam` on torch's 4 KiB-page tensors and on huge pages, and torch's fused
  dense Adam over the whole table with a dense gradient.
- ``adam8bit``: one AdamW step on 64M float32 parameters: ``torch.optim.AdamW`` (foreach, fused),
  bitsandbytes' and torchao's ``AdamW8bit`` on the CPU (skipped, with the reason, where they do
  not run), ``fusekit.torch.AdamW8bit`` and the raw :func:`fusekit.apply_adam_w_quant`.
- ``offload``: one AdamW step of offloaded training (FSDP2's ``CPUOffloadPolicy``, DeepSpeed
  ZeRO-Offload) on 64M and 512M float32 parameters (512M where ~16 GiB is free):
  ``fusekit.torch.AdamW`` and ``AdamW8bit`` against ``torch.optim.AdamW`` (fused, foreach) and
  ``DeepSpeedCPUAdam`` (when deepspeed is importable: the environment of
  requirements/deepspeed.txt; it compiles its op once), on plain tensors and as one-rank DTensors
  (FSDP2's parameters); GB/s, and its ratio to a streaming yardstick measured in the same run
  (torch's ``a += s * b``). At 512M each peer runs beside ``fusekit.torch.AdamW`` in turn.
- ``lora``: multi-LoRA add, prefill (B=4096, H1=H2=4096, R=16, W=4) and decode (B=32, W=32, 8
  layers stepped in turn), float16 and bfloat16: ``fusekit.torch.add_lora_`` against vLLM's torch
  path (``vllm/lora/ops/torch_ops``: gather each row's A and B, einsum, a float32 shrink buffer as
  vLLM's CPU punica wrapper uses; its sgmv ops expand to the same bgmv), the sgmv style (rows
  grouped by adapter, one matmul pair per group) and a grouped bmm, both in the dtype.
- ``overhead``: microseconds per call on 1-element / 1-row problems through the Python API, with
  torch's ``x.add_(1)`` on a 1-element tensor as the yardstick; and tiny optimizer steps.
- ``omp``: whether ``OMP_WAIT_POLICY`` matters: the same short probe (a torch op, then a fusekit
  op) in child processes with the variable unset and ``passive``.

Times are medians of ``--repeats`` after a warm-up; the implementations of a case are timed in
turn, round by round (the machine is shared: a change of load reaches all of them), with a 30 ms
pause before each (torch's OpenMP threads spin ~8 ms after a parallel region) and one untimed
call (each is timed in its own steady state). The table prints each fusekit case against
each peer with the speed-up (peer time / fusekit time) and the target; ``--plot`` writes a bar
chart (default docs/python_bench.png when run from the checkout, else ./python_bench.png),
``--json`` everything.
``--quick`` runs small shapes in a few seconds (a smoke test; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional

import fusekit

SECTIONS = ("lazy_adam", "adam8bit", "offload", "lora", "overhead", "omp")
_CHECKOUT_DOCS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                              os.pardir, os.pardir, "docs"))


def _default_plot_path() -> str:
    """docs/python_bench.png of the checkout when this file runs from one (editable install),
    else python_bench.png in the working directory."""
    if os.path.isfile(os.path.join(_CHECKOUT_DOCS, "benchmarks.md")):
        return os.path.join(_CHECKOUT_DOCS, "python_bench.png")
    return os.path.abspath("python_bench.png")


# ---- results -------------------------------------------------------------------------------------
@dataclass
class Result:
    section: str
    case: str
    impl: str
    seconds: float  # median per step / call
    repeats: int
    metrics: Dict[str, Any] = field(default_factory=dict)  # GB/s, GFLOP/s, state bytes, ...
    note: str = ""


@dataclass
class Comparison:
    section: str
    case: str
    fusekit: str  # impl name of the fusekit row
    peer: str
    fusekit_s: float
    peer_s: float
    speedup: float  # peer_s / fusekit_s
    target: str = ""
    met: Optional[bool] = None


@dataclass
class Skip:
    section: str
    case: str
    impl: str
    reason: str


class Recorder:
    def __init__(self, verbose: bool = True):
        self.results: List[Result] = []
        self.comparisons: List[Comparison] = []
        self.skips: List[Skip] = []
        self.omp: Dict[str, Any] = {}
        self.verbose = verbose

    def add(self, r: Result) -> Result:
        self.results.append(r)
        if self.verbose:
            extra = "".join(f", {k} {_fmt_metric(v)}" for k, v in r.metrics.items())
            print(f"  {r.case:<34} {r.impl:<44} {_fmt_time(r.seconds):>10} (n={r.repeats}{extra})",
                  flush=True)
        return r

    def skip(self, section, case, impl, reason):
        self.skips.append(Skip(section, case, impl, reason))
        if self.verbose:
            print(f"  {case:<34} {impl:<44}    skipped: {reason}", flush=True)

    def compare(self, fk: Optional[Result], peer: Optional[Result], *, min_speedup=None,
                max_us=None, target: str = "") -> Optional[Comparison]:
        """Speed-up of ``fk`` over ``peer``; ``min_speedup``: the target as peer/fusekit >= x;
        ``max_us``: an absolute target on fusekit's time per call."""
        if fk is None or peer is None:
            return None
        speedup = peer.seconds / fk.seconds if fk.seconds > 0 else float("inf")
        met = None
        if min_speedup is not None:
            met = speedup >= min_speedup
        if max_us is not None:
            met = fk.seconds * 1e6 < max_us
        c = Comparison(fk.section, fk.case, fk.impl, peer.impl, fk.seconds, peer.seconds,
                       speedup, target, met)
        self.comparisons.append(c)
        return c


def _fmt_time(s: float) -> str:
    if s != s:  # NaN
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.2f} us" if s < 1e-4 else f"{s * 1e6:.0f} us"
    if s < 1.0:
        return f"{s * 1e3:.2f} ms" if s < 0.1 else f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def _fmt_metric(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


# ---- timing --------------------------------------------------------------------------------------
def measure(fn: Callable[[], Any], repeats: int, *, inner: int = 1, warmup: int = 2,
            slow_s: float = 0.5, slow_repeats: int = 3, very_slow_s: float = 2.0):
    """Median seconds per call of ``fn``: ``warmup`` untimed calls (at most two when they take
    longer than ``slow_s``), then ``repeats`` timings of ``inner`` calls each (a case whose last
    warm-up call took longer than ``slow_s`` gets at most ``slow_repeats``, one call each; longer
    than ``very_slow_s``: one warm-up and one timed call). Returns (median, repeats done)."""
    first = 0.0
    for i in range(max(1, warmup)):
        t0 = time.perf_counter()
        fn()
        first = time.perf_counter() - t0  # the last warm-up call (the first may set things up)
        if first > very_slow_s or (first > slow_s and i >= 1):
            break
    if first > slow_s:
        repeats = min(repeats, 1 if first > very_slow_s else slow_repeats)
        inner = 1
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times), len(times)


def _free():
    gc.collect()


# ---- machine -------------------------------------------------------------------------------------
def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def machine_info(torch) -> Dict[str, Any]:
    cpu = "unknown"
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    flags = ""
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("flags"):
            f = set(line.split(":", 1)[1].split())
            flags = " ".join(x for x in ("avx2", "avx512f", "avx512bw", "avx512_bf16",
                                         "avx512_fp16", "amx_tile") if x in f)
            break
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count()
    versions = {"python": platform.python_version(), "fusekit": fusekit.__version__,
                "torch": torch.__version__}
    try:
        import numpy
        versions["numpy"] = numpy.__version__
    except ImportError:
        pass
    for mod in ("bitsandbytes", "torchao"):
        try:
            versions[mod] = __import__("importlib.metadata").metadata.version(mod)
        except Exception:
            versions[mod] = "not installed"
    thp = _read("/sys/kernel/mm/transparent_hugepage/enabled")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cpu_flags": flags,
        "cpus_allowed": cpus,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "thp_enabled": thp,
        "fusekit_threads": fusekit.get_num_threads(),
        "torch_threads": torch.get_num_threads(),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "(unset)"),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "versions": versions,
        "implementations": {op: fusekit.implementations(op) for op in
                            ("lazy_adam", "adam_w", "apply_adam_w_quant", "add_lora")
                            if _has_impls(op)},
    }


def _has_impls(op):
    try:
        fusekit.implementations(op)
        return True
    except Exception:
        return False


def _fusekit_torch(name: str):
    """``fusekit.torch.<name>``, or (None, reason) while that module is missing or broken."""
    try:
        import fusekit.torch as ft
        return getattr(ft, name), ""
    except Exception as e:  # noqa: BLE001 (a helper's module may be half-written)
        return None, f"fusekit.torch.{name} not importable: {type(e).__name__}: {e}"


def _tensor_bytes(t) -> int:
    import torch
    if type(t) is not torch.Tensor and hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()  # e.g. torchao's OptimState8bit: codes, scale, qmap
        return sum(_tensor_bytes(getattr(t, n)) for n in names)
    if torch.is_tensor(t):
        return t.numel() * t.element_size()
    return int(getattr(t, "nbytes", 0))


def state_bytes(opt) -> int:
    total = 0
    for st in opt.state.values():
        for v in st.values():
            if hasattr(v, "nbytes") or hasattr(v, "__tensor_flatten__") or hasattr(v, "numel"):
                try:
                    total += _tensor_bytes(v)
                except Exception:  # noqa: BLE001
                    pass
    return total


# ---- interleaved timing --------------------------------------------------------------------------
@dataclass
class Impl:
    """One way of doing a case's step: ``fn`` runs it once (``inner`` calls per timing)."""

    name: str
    fn: Callable[[], Any]
    inner: int = 1
    metrics: Callable[[float], Dict[str, Any]] = lambda t: {}
    note: str = ""


def measure_interleaved(impls: List[Impl], repeats: int, *, warmup: int = 2, gap_s: float = 0.03,
                        slow_s: float = 0.5, slow_repeats: int = 3, very_slow_s: float = 2.0
                        ) -> Dict[str, tuple]:
    """Times several implementations of one case in turn, round by round, so that a change in the
    machine's load (it is shared) reaches all of them alike. Each gets ``warmup`` untimed calls
    first (the first may create state); then each round, for each implementation: a pause of
    ``gap_s`` (the previous one's threads stop spinning: torch's OpenMP threads spin ~8 ms after
    a parallel region with the default OMP_WAIT_POLICY), one untimed call when it is fast (its
    own steady state: threads awake, caches warm), then ``inner`` timed calls. An implementation
    slower than ``slow_s`` per call takes part in at most ``slow_repeats`` rounds (``very_slow_s``:
    one), one call each. Returns {name: (median seconds per call, timings taken)}."""
    per_call = {}
    for im in impls:
        last = 0.0
        for i in range(max(1, warmup)):
            t0 = time.perf_counter()
            im.fn()
            last = time.perf_counter() - t0
            if last > very_slow_s or (last > slow_s and i >= 1):
                break
        per_call[im.name] = last
    budget = {}
    for im in impls:
        t = per_call[im.name]
        budget[im.name] = (repeats if t <= slow_s else
                           min(repeats, 1 if t > very_slow_s else slow_repeats))
    times: Dict[str, List[float]] = {im.name: [] for im in impls}
    for r in range(max(1, repeats)):
        for im in impls:
            if r >= budget[im.name]:
                continue
            slow = per_call[im.name] > slow_s
            time.sleep(gap_s)
            if not slow:
                im.fn()
            inner = 1 if slow else im.inner
            t0 = time.perf_counter()
            for _ in range(inner):
                im.fn()
            times[im.name].append((time.perf_counter() - t0) / inner)
    return {k: (statistics.median(v), len(v)) for k, v in times.items()}


def run_case(rec: Recorder, section: str, case: str, impls: List[Impl], repeats: int
             ) -> Dict[str, Result]:
    out = {}
    for name, (t, n) in measure_interleaved(impls, repeats).items():
        im = next(i for i in impls if i.name == name)
        out[name] = rec.add(Result(section, case, name, t, n, im.metrics(t), im.note))
    return out


# ---- SparseAdam / LazyAdam -----------------------------------------------------------------------
def bench_lazy_adam(rec: Recorder, cfg) -> None:
    import torch
    import fusekit.torch as ft
    from fusekit.torch._memory import zeros_hugepage

    R, N, D = (4_000, 1_128, 32) if cfg.quick else (2_000_000, 564_096, 32)
    case = f"SparseAdam step {R:,}x{D}, {N:,} rows"
    print(f"[lazy_adam] {case}", flush=True)
    sec = "lazy_adam"
    g = torch.Generator().manual_seed(1)
    idx = torch.randperm(R, generator=g)[:N]  # unique rows, in batch (unsorted) order
    values = torch.randn(N, D, generator=g)
    init = torch.randn(R, D, generator=g) * 0.01
    moved_bytes = N * D * 4 * 7 + N * 8  # var, m, v read + written, grad read; the index

    def gbps(t):
        return {"GB/s": moved_bytes / t / 1e9}

    def sparse_grad():  # as nn.Embedding(sparse=True) makes it: uncoalesced, batch order
        return torch.sparse_coo_tensor(idx.unsqueeze(0), values, (R, D), check_invariants=False)

    impls, keep = [], []
    # torch.optim.SparseAdam.
    p = torch.nn.Parameter(init.clone())
    p.grad = sparse_grad()
    opt = torch.optim.SparseAdam([p], lr=1e-3)
    keep.append((p, opt))
    impls.append(Impl("torch.optim.SparseAdam", opt.step, metrics=gbps))
    # fusekit.torch.SparseAdam (gives the table huge pages in place on its first step).
    SparseAdam, why = _fusekit_torch("SparseAdam")
    fk_param = None
    if SparseAdam is not None:
        fk_param = torch.nn.Parameter(init.clone())
        fk_param.grad = sparse_grad()
        opt = SparseAdam([fk_param], lr=1e-3)
        keep.append((fk_param, opt))
        impls.append(Impl("fusekit.torch.SparseAdam", opt.step,
                          metrics=lambda t: {**gbps(t), "huge pages":
                                             f"{ft.hugepage_backed_fraction(fk_param.data):.0%}"}))
    else:
        rec.skip(sec, case, "fusekit.torch.SparseAdam", why)
    # fusekit.torch.SparseAdam8bit: the same step with 8-bit state (2 D + 8 bytes a row, packed).
    SparseAdam8bit, why8 = _fusekit_torch("SparseAdam8bit")
    if SparseAdam8bit is not None:
        p8 = torch.nn.Parameter(init.clone())
        p8.grad = sparse_grad()
        opt8 = SparseAdam8bit([p8], lr=1e-3)
        keep.append((p8, opt8))
        impls.append(Impl("fusekit.torch.SparseAdam8bit", opt8.step,
                          metrics=lambda t, o=opt8: {"state B/row": f"{o.state_bytes() / R:.1f}"}))
    else:
        rec.skip(sec, case, "fusekit.torch.SparseAdam8bit", why8)
    # The raw operator on torch's tensors (4 KiB pages unless THP is "always") and on huge pages.
    for label, alloc in (("4 KiB pages", torch.zeros), ("huge pages", zeros_hugepage)):
        var, m, v = alloc((R, D)), alloc((R, D)), alloc((R, D))
        var.copy_(init)
        keep.append((var, m, v))
        frac = ft.hugepage_backed_fraction(var)
        impls.append(Impl(f"fusekit.lazy_adam ({label})",
                          (lambda var=var, m=m, v=v:
                           fusekit.lazy_adam(var, values, idx, m, v, step=0, lr=1e-3)),
                          metrics=lambda t, frac=frac: {**gbps(t), "huge pages": f"{frac:.0%}"}))
    # torch's fused dense Adam over the whole table, with a dense gradient.
    p = torch.nn.Parameter(init.clone())
    p.grad = torch.zeros(R, D)
    p.grad.index_copy_(0, idx, values)
    try:
        opt = torch.optim.Adam([p], lr=1e-3, fused=True)
        keep.append((p, opt))
        impls.append(Impl("torch.optim.Adam(fused) dense", opt.step,
                          metrics=lambda t: {"GB/s (dense 28 B/elem)": R * D * 28 / t / 1e9}))
    except Exception as e:  # noqa: BLE001
        rec.skip(sec, case, "torch.optim.Adam(fused) dense", f"{type(e).__name__}: {e}")
    del p, opt
    res = run_case(rec, sec, case, impls, cfg.repeats)
    del keep, impls, fk_param
    _free()

    raw4k, rawhp = res["fusekit.lazy_adam (4 KiB pages)"], res["fusekit.lazy_adam (huge pages)"]
    fk = res.get("fusekit.torch.SparseAdam", rawhp)
    rec.compare(fk, res["torch.optim.SparseAdam"], min_speedup=10, target=">= 10x")
    rec.compare(fk, res.get("torch.optim.Adam(fused) dense"), min_speedup=1.0, target="> 1x")
    rec.compare(res.get("fusekit.torch.SparseAdam8bit"), fk, min_speedup=1.0,
                target="8-bit state no slower than float32 (#11)")
    rec.compare(res.get("fusekit.torch.SparseAdam8bit"), res["torch.optim.SparseAdam"])
    rec.compare(raw4k, res["torch.optim.SparseAdam"])
    rec.compare(rawhp, raw4k, target="page effect")


# ---- 8-bit AdamW ---------------------------------------------------------------------------------
def bench_adam8bit(rec: Recorder, cfg) -> None:
    import torch

    n_el = (1 << 16) if cfg.quick else (64 << 20)
    case = f"AdamW step {n_el / 2**20:g}M float32"
    print(f"[adam8bit] {case}", flush=True)
    sec = "adam8bit"
    g = torch.Generator().manual_seed(2)
    init = torch.randn(n_el, generator=g) * 0.01
    grad = torch.randn(n_el, generator=g) * 0.01
    blocks = fusekit.quant_blocks(n_el)
    bytes_8 = n_el * (4 + 4 + 4 + 1 + 1 + 1 + 1) + blocks * 4 * 4  # var rw, grad, codes rw, absmax
    bytes_32 = n_el * 28  # var rw, grad r, m rw, v rw
    hp = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    impls, opts = [], {}

    def add_opt(label, make, bytes_moved, first_step=True):
        p = torch.nn.Parameter(init.clone())
        p.grad = grad
        try:
            opt = make([p])
            if first_step:
                opt.step()  # creates the state (and, for torchao, compiles): refused here if at all
        except Exception as e:  # noqa: BLE001
            rec.skip(sec, case, label, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
            return
        opts[label] = (p, opt)
        impls.append(Impl(label, opt.step, metrics=lambda t, o=opt: {
            "GB/s": bytes_moved / t / 1e9, "state B/param": state_bytes(o) / n_el}))

    add_opt("torch.optim.AdamW(foreach)",
            lambda ps: torch.optim.AdamW(ps, foreach=True, **hp), bytes_32)
    add_opt("torch.optim.AdamW(fused)", lambda ps: torch.optim.AdamW(ps, fused=True, **hp),
            bytes_32)
    peers8 = []
    try:
        import bitsandbytes as bnb
        add_opt("bitsandbytes AdamW8bit (CPU)", lambda ps: bnb.optim.AdamW8bit(ps, **hp), bytes_8)
        peers8.append("bitsandbytes AdamW8bit (CPU)")
    except Exception as e:  # noqa: BLE001
        rec.skip(sec, case, "bitsandbytes AdamW8bit (CPU)", f"{type(e).__name__}: {e}")
    label = "torchao AdamW8bit (CPU, compiled)"
    if cfg.quick:
        rec.skip(sec, case, label, "skipped in --quick (torch.compile takes seconds)")
    else:
        try:
            from torchao.optim import AdamW8bit as AoAdamW8bit
            add_opt(label, lambda ps: AoAdamW8bit(ps, **hp), bytes_8)
            peers8.append(label)
        except Exception as e:  # noqa: BLE001
            rec.skip(sec, case, label, f"{type(e).__name__}: {e}")
    AdamW8bit, why = _fusekit_torch("AdamW8bit")
    if AdamW8bit is not None:
        add_opt("fusekit.torch.AdamW8bit", lambda ps: AdamW8bit(ps, **hp), bytes_8)
    else:
        rec.skip(sec, case, "fusekit.torch.AdamW8bit", why)
    # The raw operator on torch tensors.
    var = init.clone()
    m = torch.zeros(n_el, dtype=torch.uint8)
    v = torch.zeros(n_el, dtype=torch.uint8)
    qm = torch.from_numpy(fusekit.create_dynamic_map(True))
    qv = torch.from_numpy(fusekit.create_dynamic_map(False))
    am, av = torch.zeros(blocks), torch.zeros(blocks)
    step = [0]

    def raw_step():
        fusekit.apply_adam_w_quant(var, grad, m, v, qm, qv, am, av, step=step[0], lr=1e-3,
                                   weight_decay=0.01)
        step[0] += 1

    impls.append(Impl("fusekit.apply_adam_w_quant", raw_step, metrics=lambda t: {
        "GB/s": bytes_8 / t / 1e9, "state B/param": (2 * n_el + 2 * blocks * 4) / n_el}))
    res = run_case(rec, sec, case, impls, cfg.repeats)
    del impls, opts, var, m, v, am, av
    _free()

    fk = res.get("fusekit.torch.AdamW8bit", res["fusekit.apply_adam_w_quant"])
    for name in peers8:
        rec.compare(fk, res.get(name), min_speedup=10, target=">= 10x")
    rec.compare(fk, res.get("torch.optim.AdamW(fused)"), min_speedup=1 / 1.6,
                target="within 1.6x (>= 0.625)")
    rec.compare(fk, res.get("torch.optim.AdamW(foreach)"))


# ---- offloaded training: the CPU optimizer step ---------------------------------------------------
def _mem_available() -> int:
    try:
        for line in _read("/proc/meminfo").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except Exception:  # noqa: BLE001
        pass
    return 0


def _dtensor_mesh():
    """A one-rank gloo process group and CPU mesh (this process), for DTensor parameters as
    FSDP2 makes them; (mesh, "") or (None, reason)."""
    try:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        if not dist.is_initialized():
            import socket
            with socket.socket() as sk:
                sk.bind(("127.0.0.1", 0))
                port = sk.getsockname()[1]
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                    world_size=1)
        return init_device_mesh("cpu", (dist.get_world_size(),)), ""
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"


def _deepspeed_cpu_adam():
    """DeepSpeedCPUAdam's class, its op built (DeepSpeed compiles it just in time, once, into
    ~/.cache/torch_extensions); or (None, reason)."""
    try:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        return DeepSpeedCPUAdam, ""
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"


def bench_offload(rec: Recorder, cfg) -> None:
    """One optimizer step of offloaded training (FSDP2 CPUOffloadPolicy, DeepSpeed ZeRO-Offload):
    float32 parameters, gradients and moments in host memory. Every optimizer steps the same
    parameter tensor (each with its own state): the timings need no copies of it. A DTensor case
    steps the same memory as a one-rank FSDP2-style DTensor (Shard(0) on a gloo mesh)."""
    import torch

    sizes = [1 << 16] if cfg.quick else [int(m * (1 << 20)) for m in cfg.offload_sizes]
    sec = "offload"
    hp = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    AdamW, why_fk = _fusekit_torch("AdamW")
    AdamW8bit, why_8 = _fusekit_torch("AdamW8bit")
    DSAdam, why_ds = _deepspeed_cpu_adam()
    mesh, why_mesh = _dtensor_mesh()
    for n_el in sizes:
        case = f"AdamW step {n_el / 2**20:g}M float32"
        # parameter, gradient, and at most two float32 states at a time (the large case runs the
        # peers one by one beside fusekit.torch.AdamW), plus a temporary of the size
        need = n_el * 4 * (2 + 2 * 2 + 2)
        if not cfg.quick and _mem_available() < need:
            rec.skip(sec, case, "*", f"needs ~{need / 2**30:.0f} GiB of free memory, "
                     f"{_mem_available() / 2**30:.1f} GiB available")
            continue
        print(f"[offload] {case}", flush=True)
        g = torch.Generator().manual_seed(3)
        p = torch.nn.Parameter(torch.randn(n_el, generator=g) * 0.01)
        p.grad = torch.randn(n_el, generator=g) * 0.01
        bytes_32 = n_el * 28  # var rw, grad r, m rw, v rw
        blocks = fusekit.quant_blocks(n_el)
        bytes_8 = n_el * (4 + 4 + 4 + 1 + 1 + 1 + 1) + blocks * 4 * 4

        # A streaming yardstick measured in the same run: torch's a += s * b on two float32 arrays
        # of the size (read 8 B, write 4 B per element). Not a hard ceiling: a fused step over
        # seven streams can beat it (more misses in flight per core), as it beats memcpy's GB/s in
        # the C++ benchmark (benchmarks/adam_w_bench.cc, "of_copy").
        ca, cb = torch.empty(n_el).fill_(1.0), torch.empty(n_el).fill_(2.0)
        t_triad = measure(lambda: ca.add_(cb, alpha=1e-9), max(3, cfg.repeats))[0]
        stream = 12 * n_el / t_triad / 1e9
        del ca, cb
        print(f"  stream yardstick (torch a += s*b, {n_el / 2**20:g}M): {stream:.1f} GB/s",
              flush=True)

        def impl(label, make, bytes_moved, params=(p,)):
            try:
                opt = make(list(params))
                opt.step()  # creates the state (DeepSpeed: builds its op on first use)
            except Exception as e:  # noqa: BLE001
                rec.skip(sec, case, label, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
                return None
            return Impl(label, opt.step, metrics=lambda t, o=opt: {
                "GB/s": bytes_moved / t / 1e9, "of a+=s*b": bytes_moved / t / 1e9 / stream,
                "state B/param": state_bytes(o) / n_el})

        fk = impl("fusekit.torch.AdamW", lambda ps: AdamW(ps, **hp), bytes_32) \
            if AdamW is not None else rec.skip(sec, case, "fusekit.torch.AdamW", why_fk)
        peers = [
            ("torch.optim.AdamW(fused)", lambda ps: torch.optim.AdamW(ps, fused=True, **hp),
             bytes_32, (p,)),
            ("torch.optim.AdamW(foreach)", lambda ps: torch.optim.AdamW(ps, foreach=True, **hp),
             bytes_32, (p,)),
        ]
        if DSAdam is not None:
            peers.append(("DeepSpeedCPUAdam", lambda ps: DSAdam(ps, adamw_mode=True, **hp),
                          bytes_32, (p,)))
        else:
            rec.skip(sec, case, "DeepSpeedCPUAdam", f"deepspeed not usable here ({why_ds}); run "
                     "in the environment of requirements/deepspeed.txt")
        if AdamW8bit is not None:
            peers.append(("fusekit.torch.AdamW8bit", lambda ps: AdamW8bit(ps, **hp), bytes_8,
                          (p,)))
        else:
            rec.skip(sec, case, "fusekit.torch.AdamW8bit", why_8)
        if mesh is not None:
            from torch.distributed.tensor import DTensor, Shard
            dp = torch.nn.Parameter(DTensor.from_local(p.data, mesh, [Shard(0)],
                                                       run_check=False))
            dp.grad = DTensor.from_local(p.grad, mesh, [Shard(0)], run_check=False)
            if AdamW is not None:
                peers.append(("fusekit.torch.AdamW (DTensor)", lambda ps: AdamW(ps, **hp),
                              bytes_32, (dp,)))
            if AdamW8bit is not None:
                peers.append(("fusekit.torch.AdamW8bit (DTensor)",
                              lambda ps: AdamW8bit(ps, **hp), bytes_8, (dp,)))
            peers.append(("torch.optim.AdamW(fused) (DTensor)",
                          lambda ps: torch.optim.AdamW(ps, fused=True, **hp), bytes_32, (dp,)))
        else:
            rec.skip(sec, case, "DTensor cases", why_mesh)

        res: Dict[str, Result] = {}
        if n_el <= (64 << 20):  # everything at once, interleaved
            impls = [fk] + [impl(*pe) for pe in peers]
            res = run_case(rec, sec, case, [i for i in impls if i is not None], cfg.repeats)
        else:  # memory: each peer interleaved with fusekit.torch.AdamW, then freed
            for pe in peers:
                other = impl(*pe)
                if other is None:
                    continue
                pair = [i for i in (fk, other) if i is not None]
                got = measure_interleaved(pair, cfg.repeats)
                for im in pair:
                    t, n = got[im.name]
                    r = Result(sec, case, im.name, t, n, im.metrics(t))
                    if im is fk:  # fusekit's rows: the median over the pairs
                        res.setdefault("_fk_times", []).append(t)
                    else:
                        res[im.name] = rec.add(r)
                del other, pair
                _free()
            if fk is not None and res.get("_fk_times"):
                t = statistics.median(res.pop("_fk_times"))
                res[fk.name] = rec.add(Result(sec, case, fk.name, t, cfg.repeats, fk.metrics(t),
                                              "median over its rounds beside each peer"))
        base = res.get("fusekit.torch.AdamW")
        rec.compare(base, res.get("DeepSpeedCPUAdam"), min_speedup=1.5, target=">= 1.5x")
        rec.compare(base, res.get("torch.optim.AdamW(fused)"), min_speedup=1.3,
                    target=">= 1.3x")
        rec.compare(base, res.get("torch.optim.AdamW(foreach)"))
        rec.compare(res.get("fusekit.torch.AdamW8bit"), res.get("DeepSpeedCPUAdam"),
                    min_speedup=1.0, target="no slower (8-bit vs float32)")
        rec.compare(res.get("fusekit.torch.AdamW (DTensor)"), base, min_speedup=1 / 1.05,
                    target="DTensor within 1.05x of plain")
        del p, fk, peers, res
        _free()


# ---- multi-LoRA ----------------------------------------------------------------------------------
def vllm_bgmv_shrink(x, lora_a, out, idx, scale):
    """vLLM's torch ``bgmv_shrink`` (vllm/lora/ops/torch_ops): per-row gathered A, converted to
    the output's dtype (float32: the CPU punica wrapper's buffer), einsum, scaled, stored."""
    import torch
    a = lora_a[idx].to(dtype=out.dtype)
    if a.dim() == 4:
        a = a.squeeze(dim=1)
    t = torch.einsum("bi, boi -> bo", x.to(dtype=out.dtype), a)
    out[:, :t.shape[1]] = scale * t


def vllm_bgmv_expand(t, lora_b, y, idx):
    """vLLM's torch ``bgmv_expand`` with ``add_inputs=True``: per-row gathered B in y's dtype."""
    import torch
    b = lora_b[idx].to(dtype=y.dtype)
    if b.dim() == 4:
        b = b.squeeze(dim=1)
    u = torch.einsum("bi, boi -> bo", t.to(dtype=y.dtype), b)
    n = min(u.shape[1], y.shape[1])
    y[:, :n] += u[:, :n]


def vllm_add_lora(y, x, lora_a4, lora_b4, idx, scale):
    """vLLM's CPU punica ``add_lora_linear`` on its torch ops (one slice): a float32 [B, R]
    buffer, shrink, expand. (vLLM's sgmv ops repeat the segment indices per token and call these
    same bgmv ops, so prefill runs this too.)"""
    import torch
    buf = torch.zeros((x.size(0), lora_a4.size(-2)), dtype=torch.float32)
    vllm_bgmv_shrink(x, lora_a4, buf, idx, scale)
    vllm_bgmv_expand(buf, lora_b4, y, idx)


class Groups:
    """Rows grouped by adapter, computed once per batch (as vLLM's metadata is)."""

    def __init__(self, idx, w):
        import torch
        self.rows = [torch.nonzero(idx == a).flatten() for a in range(w)]
        counts = [len(r) for r in self.rows]
        self.m = max(counts)
        self.grp = torch.cat([torch.full((c,), a, dtype=torch.long) for a, c in enumerate(counts)])
        self.slot = torch.cat([torch.arange(c) for c in counts])
        self.perm = torch.cat(self.rows)
        self.w = w


def sgmv_matmul(y, x, a, b, groups: Groups, scale):
    """The sgmv style in torch: per adapter, gather its rows, two matmuls, scatter-add."""
    for w, rows in enumerate(groups.rows):
        if len(rows) == 0:
            continue
        u = (x.index_select(0, rows) @ a[w].t()) @ b[w].t()
        y.index_add_(0, rows, u, alpha=scale)


def grouped_bmm(y, x, a, b, groups: Groups, scale):
    """Rows packed per adapter into [W, M, H1] (zero-padded), two bmm, scatter-add back."""
    import torch
    xg = x.new_zeros((groups.w, groups.m, x.shape[1]))
    xg[groups.grp, groups.slot] = x.index_select(0, groups.perm)
    u = torch.bmm(torch.bmm(xg, a.transpose(1, 2)), b.transpose(1, 2))
    y.index_add_(0, groups.perm, u[groups.grp, groups.slot], alpha=scale)


def bench_lora(rec: Recorder, cfg) -> None:
    import torch

    sec = "lora"
    reps = cfg.repeats
    add_lora_, why = _fusekit_torch("add_lora_")
    fk_name = "fusekit.torch.add_lora_" if add_lora_ is not None else "fusekit.add_lora"
    if add_lora_ is None:
        rec.skip(sec, "add_lora", "fusekit.torch.add_lora_", why + " (timing fusekit.add_lora)")
    H = 256 if cfg.quick else 4096
    R = 16
    shapes = [("prefill", 64 if cfg.quick else 4096, 4, 1),
              ("decode", 32, 32, 2 if cfg.quick else 8)]
    scale = 0.5
    for dtype in (torch.float16, torch.bfloat16):
        dname = str(dtype).replace("torch.", "")
        for kind, B, W, L in shapes:
            case = f"add_lora {kind} B={B} H={H} R={R} W={W} {dname}"
            print(f"[lora] {case}", flush=True)
            g = torch.Generator().manual_seed(3)
            x = (torch.rand(B, H, generator=g) * 2 - 1).to(dtype)
            y = (torch.rand(B, H, generator=g) * 2 - 1).to(dtype)
            wa = ((torch.rand(W, L, R, H, generator=g) * 2 - 1) * 0.02).to(dtype)
            wb = ((torch.rand(W, L, H, R, generator=g) * 2 - 1) * 0.02).to(dtype)
            idx = (torch.arange(B) % W)[torch.randperm(B, generator=g)]  # int64, as vLLM's
            groups = Groups(idx, W)
            # Per-layer contiguous weights for the torch paths ([W, R, H1], [W, H2, R]).
            a_l = [wa[:, l].contiguous() for l in range(L)]
            b_l = [wb[:, l].contiguous() for l in range(L)]
            a4_l = [t.unsqueeze(1) for t in a_l]  # vLLM's lora_a_stacked [W, 1, R, H1]
            b4_l = [t.unsqueeze(1) for t in b_l]
            flops = 2 * B * R * (H + H)
            wbytes = len(set(idx.tolist())) * R * (H + H) * x.element_size()
            inner = L * (4 if kind == "decode" and not cfg.quick else 1)

            def metrics(t):
                m = {"GFLOP/s": flops / t / 1e9}
                if kind == "decode":
                    m["GB/s of weights"] = wbytes / t / 1e9
                return m

            def cycler(f):  # one call per layer in turn, on y in place
                state = [0]

                def call():
                    l = state[0]
                    state[0] = (l + 1) % L
                    f(y, l)
                return call

            if add_lora_ is not None:
                def fk(out, l):
                    add_lora_(out, x, wb, idx, wa, l, scale)
            else:
                def fk(out, l):
                    fusekit.add_lora(out, x, wb, idx, wa, layer_idx=l, scale=scale)
            peers = {
                "vLLM torch bgmv (gather+einsum)":
                    lambda out, l: vllm_add_lora(out, x, a4_l[l], b4_l[l], idx, scale),
                "sgmv-style per-adapter matmul":
                    lambda out, l: sgmv_matmul(out, x, a_l[l], b_l[l], groups, scale),
                "grouped bmm":
                    lambda out, l: grouped_bmm(out, x, a_l[l], b_l[l], groups, scale),
            }
            # Check once that every path computes fusekit's update (on y = 0, layer 0).
            fk_out = torch.zeros_like(y)
            fk(fk_out, 0)
            checks = {}
            for name, f in peers.items():
                if name == "vLLM torch bgmv (gather+einsum)" and not cfg.quick:
                    continue  # seconds at full size; checked by --quick and the smoke test
                ref = torch.zeros_like(y)
                f(ref, 0)
                err = (fk_out.float() - ref.float()).abs().max().item()
                tol = 0.03 * ref.float().abs().max().item() + 1e-3
                checks[name] = err <= tol
                if err > tol:
                    print(f"  WARNING: {name} differs from fusekit by {err:.3g} (tol {tol:.3g})")
                del ref
            del fk_out

            impls = [Impl(fk_name, cycler(fk), inner, metrics)]
            impls += [Impl(name, cycler(f), inner, metrics,
                           "" if checks.get(name, True) else "MISMATCH")
                      for name, f in peers.items()]
            res = run_case(rec, sec, case, impls, reps)
            r_fk = res.pop(fk_name)
            for name, r in res.items():
                if kind == "prefill" and name != "grouped bmm":
                    rec.compare(r_fk, r, min_speedup=10, target=">= 10x (vLLM torch path)")
                elif kind == "decode":
                    rec.compare(r_fk, r, min_speedup=3, target=">= 3x")
                else:
                    rec.compare(r_fk, r)
            del x, y, wa, wb, a_l, b_l, a4_l, b4_l, groups
            _free()


# ---- per-call overhead ---------------------------------------------------------------------------
def bench_overhead(rec: Recorder, cfg) -> None:
    import torch

    sec = "overhead"
    reps = 3 if cfg.quick else max(cfg.repeats, 7)
    inner = 50 if cfg.quick else 2000
    print(f"[overhead] tiny problems, {inner} calls x {reps}", flush=True)

    def per_call(case, impl, fn, n_inner=inner):
        t, n = measure(fn, reps, inner=n_inner, warmup=50)
        return rec.add(Result(sec, case, impl, t, n, {"us/call": t * 1e6}))

    one = torch.zeros(1)
    yard = per_call("yardstick", "torch x.add_(1), 1 element", lambda: one.add_(1))

    # LazyAdam: 1 row of 1 element.
    g1, idx1 = torch.ones(1, 1), torch.zeros(1, dtype=torch.int64)
    m1, v1, var1 = torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1)
    r = per_call("lazy_adam, 1 row x 1", "fusekit.lazy_adam",
                 lambda: fusekit.lazy_adam(var1, g1, idx1, m1, v1, step=0, lr=1e-3))
    rec.compare(r, yard, max_us=10, target="< 10 us")

    # AdamW on float32 moments, 1 element.
    a_var, a_g, a_m, a_v = torch.zeros(1), torch.ones(1), torch.zeros(1), torch.zeros(1)
    r = per_call("adam_w, 1 element", "fusekit.adam_w",
                 lambda: fusekit.adam_w(a_var, a_g, a_m, a_v, step=0))
    rec.compare(r, yard, max_us=10, target="< 10 us")

    # 8-bit AdamW, 1 element (one block).
    q_var, q_g = torch.zeros(1), torch.ones(1)
    q_m, q_v = torch.zeros(1, dtype=torch.uint8), torch.zeros(1, dtype=torch.uint8)
    qm = torch.from_numpy(fusekit.create_dynamic_map(True))
    qv = torch.from_numpy(fusekit.create_dynamic_map(False))
    q_am, q_av = torch.zeros(1), torch.zeros(1)
    r = per_call("apply_adam_w_quant, 1 element", "fusekit.apply_adam_w_quant",
                 lambda: fusekit.apply_adam_w_quant(q_var, q_g, q_m, q_v, qm, qv, q_am, q_av,
                                                    step=0))
    rec.compare(r, yard, max_us=10, target="< 10 us")

    # AddLora: 1 token, H = 64, R = 16, W = 4, float16 (the C++ benchmark's tiny shape).
    h, rr, w = 64, 16, 4
    lx = torch.randn(1, h).half()
    ly = torch.zeros(1, h).half()
    lwa = (torch.randn(w, 1, rr, h) * 0.02).half()
    lwb = (torch.randn(w, 1, h, rr) * 0.02).half()
    lidx = torch.tensor([1])
    case = "add_lora, 1 token H=64 R=16 W=4 fp16"
    r = per_call(case, "fusekit.add_lora", lambda: fusekit.add_lora(ly, lx, lwb, lidx, lwa))
    rec.compare(r, yard, max_us=10, target="< 10 us")
    add_lora_, why = _fusekit_torch("add_lora_")
    if add_lora_ is not None:
        with torch.no_grad():
            r = per_call(case, "fusekit.torch.add_lora_ (torch op)",
                         lambda: add_lora_(ly, lx, lwb, lidx, lwa))
        rec.compare(r, yard, max_us=10, target="< 10 us")
        lt = vllm_add_lora
        r2 = per_call(case, "vLLM torch bgmv (gather+einsum)",
                      lambda: lt(ly, lx, lwa, lwb, lidx, 1.0), max(inner // 10, 20))
        rec.compare(r, r2)
    else:
        rec.skip(sec, case, "fusekit.torch.add_lora_", why)

    # Optimizer steps on tiny parameters (whole Python step: info, no target).
    n_opt = max(inner // 10, 20)
    SparseAdam, why = _fusekit_torch("SparseAdam")
    case = "SparseAdam.step, 1 row x 8"
    tiny = {}
    for impl, cls in (("torch.optim.SparseAdam", torch.optim.SparseAdam),
                      ("fusekit.torch.SparseAdam", SparseAdam)):
        if cls is None:
            rec.skip(sec, case, impl, why)
            continue
        p = torch.nn.Parameter(torch.zeros(4, 8))
        p.grad = torch.sparse_coo_tensor(torch.tensor([[1]]), torch.ones(1, 8), (4, 8),
                                         check_invariants=False)
        opt = cls([p], lr=1e-3)
        tiny[impl] = per_call(case, impl, opt.step, n_opt)
    rec.compare(tiny.get("fusekit.torch.SparseAdam"), tiny.get("torch.optim.SparseAdam"))

    AdamW8bit, why = _fusekit_torch("AdamW8bit")
    case = "AdamW.step, 1 element"
    tiny = {}
    makers = [("torch.optim.AdamW(fused)", lambda ps: torch.optim.AdamW(ps, fused=True)),
              ("fusekit.torch.AdamW8bit", AdamW8bit)]
    for impl, make in makers:
        if make is None:
            rec.skip(sec, case, impl, why)
            continue
        p = torch.nn.Parameter(torch.zeros(1))
        p.grad = torch.ones(1)
        opt = make([p])
        tiny[impl] = per_call(case, impl, opt.step, n_opt)
    rec.compare(tiny.get("fusekit.torch.AdamW8bit"), tiny.get("torch.optim.AdamW(fused)"))


# ---- OMP_WAIT_POLICY -----------------------------------------------------------------------------
def omp_probe(quick: bool, repeats: int) -> Dict[str, float]:
    """Run in a child process: a fusekit op right after a torch op (torch's OpenMP threads may
    still be spinning), alone, and the torch op alone / right after fusekit. Microseconds."""
    import torch

    H, W, L, B = (512, 32, 2, 32) if quick else (4096, 32, 8, 32)
    n_t = (1 << 18) if quick else (1 << 22)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(B, H, generator=g).half()
    y = torch.randn(B, H, generator=g).half()
    wa = (torch.randn(W, L, 16, H, generator=g) * 0.02).half()
    wb = (torch.randn(W, L, H, 16, generator=g) * 0.02).half()
    idx = torch.randperm(W, generator=g)[:B] % W
    big = torch.randn(n_t, generator=g)
    n_adam = (1 << 16) if quick else (1 << 22)
    av, ag = torch.zeros(n_adam), torch.ones(n_adam)
    am, avv = torch.zeros(n_adam), torch.zeros(n_adam)
    layer = [0]

    def fk_lora():
        fusekit.add_lora(y, x, wb, idx, wa, layer_idx=layer[0], scale=0.5)
        layer[0] = (layer[0] + 1) % L

    def fk_adam():
        fusekit.adam_w(av, ag, am, avv, step=0)

    def torch_op():
        big.mul_(1.0000001)

    iters = 10 if quick else 50
    out = {}
    lora_name = f"fusekit add_lora decode H={H}"
    adam_name = f"fusekit adam_w {n_adam / 2**20:g}M"
    mul_name = f"torch mul_ {n_t / 2**20:g}M"

    def median_of(fn, pre=None, pause=0.0):
        time.sleep(0.3)  # torch's OpenMP threads stop spinning from the last measurement
        ts = []
        for _ in range(max(5, iters // 3) if pause else iters):
            if pre is not None:
                pre()
            elif pause:
                time.sleep(pause)  # let every thread go idle (torch's sleep after spinning)
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts) * 1e6

    for _ in range(3):
        fk_lora(), fk_adam(), torch_op()
    for rep in range(repeats):
        for name, fn in ((lora_name, fk_lora), (adam_name, fk_adam)):
            out.setdefault(f"{name}: back to back", []).append(median_of(fn))
            out.setdefault(f"{name}: after a torch op", []).append(median_of(fn, pre=torch_op))
            out.setdefault(f"{name}: after 20 ms idle", []).append(
                median_of(fn, pause=0.02))
        out.setdefault(f"{mul_name}: back to back", []).append(median_of(torch_op))
        out.setdefault(f"{mul_name}: after fusekit add_lora", []).append(
            median_of(torch_op, pre=fk_lora))
        out.setdefault(f"{mul_name}: after 20 ms idle", []).append(
            median_of(torch_op, pause=0.02))
        # A loop of both, as a model alternates them: time per pair.
        t0 = time.perf_counter()
        for _ in range(iters):
            torch_op()
            fk_lora()
        out.setdefault(f"pair: {mul_name} + {lora_name}", []).append(
            (time.perf_counter() - t0) / iters * 1e6)
    # CPU time torch's other threads (OpenMP workers) take in the 100 ms after one torch op: the
    # spinning that takes a core from whatever runs next (from /proc/self/task/*/schedstat).
    for _ in range(3):
        time.sleep(0.2)
        c0 = _other_threads_cpu_s()
        torch_op()
        time.sleep(0.1)
        c1 = _other_threads_cpu_s()
        if c0 >= 0:
            out.setdefault("torch threads' CPU in the 100 ms after one torch op", []).append(
                (c1 - c0) * 1e6)
    return {k: statistics.median(v) for k, v in out.items()}


def _other_threads_cpu_s() -> float:
    """CPU seconds run so far by this process's threads other than the main one (-1: unknown)."""
    total = 0
    try:
        for tid in os.listdir("/proc/self/task"):
            if int(tid) != os.getpid():
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
    except OSError:
        return -1.0
    return total / 1e9


def bench_omp(rec: Recorder, cfg) -> None:
    rounds = 1 if cfg.quick else 2
    print(f"[omp] OMP_WAIT_POLICY: probe in child processes, unset and passive alternating "
          f"(ABBA), {rounds} round(s)", flush=True)
    samples: Dict[str, Dict[str, List[float]]] = {"unset": {}, "passive": {}}
    for rnd in range(rounds):
        for policy in (("unset", "passive") if rnd % 2 == 0 else ("passive", "unset")):
            env = dict(os.environ)
            env.pop("OMP_WAIT_POLICY", None)
            if policy != "unset":
                env["OMP_WAIT_POLICY"] = policy
            cmd = [sys.executable, "-m", "fusekit.bench", "--omp-probe", "--repeats",
                   str(min(cfg.repeats, 2))] + (["--quick"] if cfg.quick else [])
            try:
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
                line = [ln for ln in p.stdout.splitlines() if ln.startswith("OMP_PROBE ")]
                if not line:
                    raise RuntimeError((p.stderr or p.stdout)[-500:])
                for k, v in json.loads(line[-1][len("OMP_PROBE "):]).items():
                    samples[policy].setdefault(k, []).append(v)
            except Exception as e:  # noqa: BLE001
                rec.skip("omp", "OMP_WAIT_POLICY", policy, f"{type(e).__name__}: {e}")
    runs = {pol: {k: statistics.median(v) for k, v in d.items()} for pol, d in samples.items()
            if d}
    rec.omp = {"us_median": runs, "samples": samples, "load_1min_after": os.getloadavg()[0]}
    if len(runs) == 2:
        print(f"  {'probe (us per call, medians)':<48} {'unset':>10} {'passive':>10} "
              f"{'unset/passive':>14}")
        for k in runs["unset"]:
            a, b = runs["unset"][k], runs["passive"].get(k, float("nan"))
            print(f"  {k:<48} {a:>10.0f} {b:>10.0f} {a / b:>14.2f}")


# ---- report --------------------------------------------------------------------------------------
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
    def short(c):
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
        tgt = {">= 10x": 10, "> 1x": 1, ">= 3x": 3}.get(c.target.split(" (")[0])
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


# ---- main ----------------------------------------------------------------------------------------
@dataclass
class Config:
    quick: bool = False
    repeats: int = 7
    only: tuple = SECTIONS
    offload_sizes: tuple = (64, 512)  # millions (2^20) of parameters


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


def _run(args, argv, torch) -> Dict[str, Any]:
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
    fns = {"lazy_adam": bench_lazy_adam, "adam8bit": bench_adam8bit, "offload": bench_offload,
           "lora": bench_lora,
           "overhead": bench_overhead, "omp": bench_omp}
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
        path = args.plot or _default_plot_path()
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


def _replay(args) -> Dict[str, Any]:
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
        path = args.plot or _default_plot_path()
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


if __name__ == "__main__":
    main()
