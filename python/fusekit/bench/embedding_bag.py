"""The embedding_bag section: one training step of an embedding-bag table (issue 32's table,
1,000,000 x 32 float32; a batch of 8192 bags), forward + backward + optimizer, on two batches:
bags of 1-4 ids (~20.5k lookups) and multi-hot bags of 40-60 ids (~410k lookups), sum pooling.
fusekit.torch.FusedEmbeddingBag (the optimizer in the backward: fusekit's EmbeddingBagLazyAdam,
no per-lookup gradient) against what a PyTorch user writes without it: nn.EmbeddingBag(sparse=True)
and a sparse Adam (fusekit.torch.SparseAdam, torch.optim.SparseAdam), the same batch and the same
gradient of the output. And the 8-bit state (FusedEmbeddingBag(state="8bit"): fusekit's
EmbeddingBagLazyAdamQuant, in both state formats) against the float32 FusedEmbeddingBag, issue 32's
target: 8-bit within 1.2x of the float32 fused step."""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

from .machine import _fusekit_torch
from .results import Config, Recorder
from .timing import Impl, _free, run_case


def bench_embedding_bag(rec: Recorder, cfg: Config) -> None:
    import torch

    R, D, B = (20_000, 32, 256) if cfg.quick else (1_000_000, 32, 8192)
    sec = "embedding_bag"
    for lo, hi in ((1, 4), (40, 60)):
        g = torch.Generator().manual_seed(lo)
        lens = torch.randint(lo, hi + 1, (B,), generator=g)
        offsets = torch.zeros(B + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(lens, 0)
        L = int(offsets[-1])
        ids = torch.randint(0, R, (L,), generator=g)
        grad_out = torch.randn(B, D, generator=g)
        init = torch.randn(R, D, generator=g) * 0.1
        rows = int(torch.unique(ids).numel())
        case = f"EmbeddingBag step {R:,}x{D}, {B} bags of {lo}-{hi} ({L:,} ids)"
        print(f"[embedding_bag] {case}, {rows:,} distinct rows", flush=True)
        # What the step must move: m, v and the table of each distinct row, read and written.
        moved = rows * D * 4 * 6

        def gbps(t: float) -> Dict[str, Any]:
            return {"GB/s (table rows)": moved / t / 1e9}

        impls: List[Impl] = []
        keep: List[Any] = []
        FusedEmbeddingBag, why = _fusekit_torch("FusedEmbeddingBag")
        if FusedEmbeddingBag is not None:
            fused = FusedEmbeddingBag(R, D, mode="sum", include_last_offset=True, lr=1e-3,
                                      _weight=init.clone())
            keep.append(fused)

            def fused_step(m: Any = fused) -> None:
                with torch.enable_grad():
                    m(ids, offsets).backward(grad_out)
            impls.append(Impl("fusekit.torch.FusedEmbeddingBag", fused_step, metrics=gbps))
            for fmt in _FORMATS:
                q = FusedEmbeddingBag(R, D, mode="sum", include_last_offset=True, lr=1e-3,
                                      _weight=init.clone(), state="8bit", state_format=fmt)
                keep.append(q)

                def q_step(m: Any = q) -> None:
                    with torch.enable_grad():
                        m(ids, offsets).backward(grad_out)
                impls.append(Impl(_eight_bit(fmt), q_step, metrics=gbps))
        else:
            rec.skip(sec, case, "fusekit.torch.FusedEmbeddingBag", why)

        def sparse_route(opt_cls: Any) -> Tuple[Any, Any]:
            emb = torch.nn.EmbeddingBag(R, D, mode="sum", sparse=True, include_last_offset=True,
                                        _weight=init.clone())
            opt = opt_cls(emb.parameters(), lr=1e-3)

            def step() -> None:
                with torch.enable_grad():
                    opt.zero_grad(set_to_none=True)
                    emb(ids, offsets).backward(grad_out)
                    opt.step()
            return (emb, opt), step

        SparseAdam, why_s = _fusekit_torch("SparseAdam")
        if SparseAdam is not None:
            k, step = sparse_route(SparseAdam)
            keep.append(k)
            impls.append(Impl("nn.EmbeddingBag(sparse) + fusekit.torch.SparseAdam", step,
                              metrics=gbps))
        else:
            rec.skip(sec, case, "nn.EmbeddingBag(sparse) + fusekit.torch.SparseAdam", why_s)
        k, step = sparse_route(torch.optim.SparseAdam)
        keep.append(k)
        impls.append(Impl("nn.EmbeddingBag(sparse) + torch.optim.SparseAdam", step, metrics=gbps))
        res = run_case(rec, sec, case, impls, cfg.repeats)
        del keep, impls
        _free()
        fk = res.get("fusekit.torch.FusedEmbeddingBag")
        rec.compare(fk, res.get("nn.EmbeddingBag(sparse) + fusekit.torch.SparseAdam"),
                    min_speedup=2.0 if lo >= 40 else None,
                    target=">= 2x (#32, multi-hot)" if lo >= 40 else "")
        rec.compare(fk, res.get("nn.EmbeddingBag(sparse) + torch.optim.SparseAdam"))
        for fmt in _FORMATS:
            # 8-bit / float32 <= 1.2: the float32 step as the peer, >= 1 / 1.2 of the speed.
            rec.compare(res.get(_eight_bit(fmt)), fk, min_speedup=1 / 1.2,
                        target="8-bit within 1.2x (#32)")


#: The 8-bit state formats the section times (docs/fp8_state.md).
_FORMATS = ("dynamic_map", "fp8")


def _eight_bit(fmt: str) -> str:
    return f"fusekit.torch.FusedEmbeddingBag(state='8bit', {fmt})"
