"""The adam8bit section: one AdamW step on 64M float32 parameters: torch.optim.AdamW (foreach,
fused), bitsandbytes' and torchao's AdamW8bit on the CPU, fusekit.torch.AdamW8bit and the raw
fusekit.apply_adam_w_quant."""
from __future__ import annotations

from typing import Any, Callable, Dict, List

import fusekit

from .machine import _fusekit_torch, state_bytes
from .results import Config, Recorder
from .timing import Impl, _free, run_case


def bench_adam8bit(rec: Recorder, cfg: Config) -> None:
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
    hp: Dict[str, Any] = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    impls: List[Impl] = []
    opts: Dict[str, Any] = {}

    def add_opt(label: str, make: Callable[[List[Any]], Any], bytes_moved: int,
                first_step: bool = True) -> None:
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
        impls.append(Impl(label, opt.step, metrics=lambda t: {
            "GB/s": bytes_moved / t / 1e9, "state B/param": state_bytes(opt) / n_el}))

    add_opt("torch.optim.AdamW(foreach)",
            lambda ps: torch.optim.AdamW(ps, foreach=True, **hp), bytes_32)
    add_opt("torch.optim.AdamW(fused)", lambda ps: torch.optim.AdamW(ps, fused=True, **hp),
            bytes_32)
    peers8: List[str] = []
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

    def raw_step() -> None:
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
