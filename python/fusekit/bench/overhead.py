"""The overhead section: microseconds per call on 1-element / 1-row problems through the Python API
(the array functions, fusekit.torch.add_lora_, tiny optimizer steps), with torch's x.add_(1) on a
1-element tensor as the yardstick."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

import fusekit

from .lora import vllm_add_lora
from .machine import _fusekit_torch
from .results import Config, Recorder, Result
from .timing import measure


def bench_overhead(rec: Recorder, cfg: Config) -> None:
    import torch

    sec = "overhead"
    reps = 3 if cfg.quick else max(cfg.repeats, 7)
    inner = 50 if cfg.quick else 2000
    print(f"[overhead] tiny problems, {inner} calls x {reps}", flush=True)

    def per_call(case: str, impl: str, fn: Callable[[], Any], n_inner: int = inner) -> Result:
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
    tiny: Dict[str, Result] = {}
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
    makers: List[Tuple[str, Any]] = [
        ("torch.optim.AdamW(fused)", lambda ps: torch.optim.AdamW(ps, fused=True)),
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
