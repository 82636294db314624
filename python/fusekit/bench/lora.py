"""The lora section: the multi-LoRA add, prefill (B=4096, H1=H2=4096, R=16, W=4) and decode (B=32,
W=32, 8 layers in turn), float16 and bfloat16: fusekit.torch.add_lora_ against vLLM's torch path
(vllm/lora/ops/torch_ops, written here), the sgmv style (rows grouped by adapter) and a grouped
bmm."""
from __future__ import annotations

from typing import Any, Callable, Dict

import fusekit

from .machine import _fusekit_torch
from .results import Config, Recorder
from .timing import Impl, _free, run_case


def vllm_bgmv_shrink(x: Any, lora_a: Any, out: Any, idx: Any, scale: float) -> None:
    """vLLM's torch ``bgmv_shrink`` (vllm/lora/ops/torch_ops): per-row gathered A, converted to
    the output's dtype (float32: the CPU punica wrapper's buffer), einsum, scaled, stored."""
    import torch
    a = lora_a[idx].to(dtype=out.dtype)
    if a.dim() == 4:
        a = a.squeeze(dim=1)
    t = torch.einsum("bi, boi -> bo", x.to(dtype=out.dtype), a)
    out[:, :t.shape[1]] = scale * t


def vllm_bgmv_expand(t: Any, lora_b: Any, y: Any, idx: Any) -> None:
    """vLLM's torch ``bgmv_expand`` with ``add_inputs=True``: per-row gathered B in y's dtype."""
    import torch
    b = lora_b[idx].to(dtype=y.dtype)
    if b.dim() == 4:
        b = b.squeeze(dim=1)
    u = torch.einsum("bi, boi -> bo", t.to(dtype=y.dtype), b)
    n = min(u.shape[1], y.shape[1])
    y[:, :n] += u[:, :n]


def vllm_add_lora(y: Any, x: Any, lora_a4: Any, lora_b4: Any, idx: Any, scale: float) -> None:
    """vLLM's CPU punica ``add_lora_linear`` on its torch ops (one slice): a float32 [B, R]
    buffer, shrink, expand. (vLLM's sgmv ops repeat the segment indices per token and call these
    same bgmv ops, so prefill runs this too.)"""
    import torch
    buf = torch.zeros((x.size(0), lora_a4.size(-2)), dtype=torch.float32)
    vllm_bgmv_shrink(x, lora_a4, buf, idx, scale)
    vllm_bgmv_expand(buf, lora_b4, y, idx)


class Groups:
    """Rows grouped by adapter, computed once per batch (as vLLM's metadata is)."""

    def __init__(self, idx: Any, w: int) -> None:
        import torch
        self.rows = [torch.nonzero(idx == a).flatten() for a in range(w)]
        counts = [len(r) for r in self.rows]
        self.m = max(counts)
        self.grp = torch.cat([torch.full((c,), a, dtype=torch.long) for a, c in enumerate(counts)])
        self.slot = torch.cat([torch.arange(c) for c in counts])
        self.perm = torch.cat(self.rows)
        self.w = w


def sgmv_matmul(y: Any, x: Any, a: Any, b: Any, groups: Groups, scale: float) -> None:
    """The sgmv style in torch: per adapter, gather its rows, two matmuls, scatter-add."""
    for w, rows in enumerate(groups.rows):
        if len(rows) == 0:
            continue
        u = (x.index_select(0, rows) @ a[w].t()) @ b[w].t()
        y.index_add_(0, rows, u, alpha=scale)


def grouped_bmm(y: Any, x: Any, a: Any, b: Any, groups: Groups, scale: float) -> None:
    """Rows packed per adapter into [W, M, H1] (zero-padded), two bmm, scatter-add back."""
    import torch
    xg = x.new_zeros((groups.w, groups.m, x.shape[1]))
    xg[groups.grp, groups.slot] = x.index_select(0, groups.perm)
    u = torch.bmm(torch.bmm(xg, a.transpose(1, 2)), b.transpose(1, 2))
    y.index_add_(0, groups.perm, u[groups.grp, groups.slot], alpha=scale)


def bench_lora(rec: Recorder, cfg: Config) -> None:
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

            def metrics(t: float) -> Dict[str, Any]:
                m = {"GFLOP/s": flops / t / 1e9}
                if kind == "decode":
                    m["GB/s of weights"] = wbytes / t / 1e9
                return m

            def cycler(f: Callable[[Any, int], Any]) -> Callable[[], None]:  # each layer in turn
                state = [0]

                def call() -> None:
                    l = state[0]
                    state[0] = (l + 1) % L
                    f(y, l)
                return call

            fk: Callable[[Any, int], None]
            if add_lora_ is not None:
                def fk(out: Any, l: int) -> None:
                    add_lora_(out, x, wb, idx, wa, l, scale)
            else:
                def fk(out: Any, l: int) -> None:
                    fusekit.add_lora(out, x, wb, idx, wa, layer_idx=l, scale=scale)
            peers: Dict[str, Callable[[Any, int], None]] = {
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
            checks: Dict[str, bool] = {}
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
