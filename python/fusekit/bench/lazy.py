"""The lazy_adam section: one SparseAdam step on an nn.Embedding-like table (2,000,000 x 32
float32, a sparse gradient over 564,096 unique random rows): torch.optim.SparseAdam against
fusekit.torch.SparseAdam and SparseAdam8bit, the raw fusekit.lazy_adam on 4 KiB and huge pages,
and torch's fused dense Adam."""
from __future__ import annotations

from typing import Any, Callable, Dict, List

import fusekit

from .machine import _fusekit_torch
from .results import Config, Recorder
from .timing import Impl, _free, run_case


def bench_lazy_adam(rec: Recorder, cfg: Config) -> None:
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

    def gbps(t: float) -> Dict[str, Any]:
        return {"GB/s": moved_bytes / t / 1e9}

    def sparse_grad() -> Any:  # as nn.Embedding(sparse=True) makes it: uncoalesced, batch order
        return torch.sparse_coo_tensor(idx.unsqueeze(0), values, (R, D), check_invariants=False)

    def raw_step(var: Any, m: Any, v: Any) -> Callable[[], Any]:
        return lambda: fusekit.lazy_adam(var, values, idx, m, v, step=0, lr=1e-3)

    def page_metrics(frac: float) -> Callable[[float], Dict[str, Any]]:
        return lambda t: {**gbps(t), "huge pages": f"{frac:.0%}"}

    impls: List[Impl] = []
    keep: List[Any] = []
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
                          metrics=lambda t: {"state B/row": f"{opt8.state_bytes() / R:.1f}"}))
    else:
        rec.skip(sec, case, "fusekit.torch.SparseAdam8bit", why8)
    # The raw operator on torch's tensors (4 KiB pages unless THP is "always") and on huge pages.
    for label, alloc in (("4 KiB pages", torch.zeros), ("huge pages", zeros_hugepage)):
        var, m, v = alloc((R, D)), alloc((R, D)), alloc((R, D))
        var.copy_(init)
        keep.append((var, m, v))
        frac = ft.hugepage_backed_fraction(var)
        impls.append(Impl(f"fusekit.lazy_adam ({label})", raw_step(var, m, v),
                          metrics=page_metrics(frac)))
    # torch's fused dense Adam over the whole table, with a dense gradient.
    p = torch.nn.Parameter(init.clone())
    p.grad = torch.zeros(R, D)
    p.grad.index_copy_(0, idx, values)
    try:
        dense = torch.optim.Adam([p], lr=1e-3, fused=True)
        keep.append((p, dense))
        impls.append(Impl("torch.optim.Adam(fused) dense", dense.step,
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
