"""The torchrec section (run it in the TorchRec environment, requirements/torchrec.txt; skipped
elsewhere): one training step (forward, backward, optimizer) of a TorchRec EmbeddingBagCollection
under DistributedModelParallel on the CPU (one process, gloo), issue 32's case: one 1,000,000 x 32
table, a batch of 8192 bags of 1-4 ids (~20.5k lookups) and a multi-hot batch of 40-60 ids.
fusekit's lazy Adam through fusekit.torchrec's sharders (apply_optimizer_in_backward with
torch.optim.Adam, as on GPU) against FBGEMM's CPU TBE with EXACT_ROWWISE_ADAGRAD (the fused
optimizer TorchRec has on the CPU) and the DENSE compute kernel with torch.optim.Adam (Adam on
the whole table every step). And the 8-bit state (fusekit.torch.SparseAdam8bit in backward on a
CPU-built EBC: fusekit's EmbeddingBagLazyAdamQuant, in both state formats) against fusekit's
float32 route, issue 32's target: 8-bit within 1.2x of the float32 fused step."""
from __future__ import annotations

import importlib
import os
from typing import Any, Callable, List, Optional, Tuple

from .results import Config, Recorder
from .timing import Impl, _free, run_case

_ROUTES = ("fusekit.torchrec lazy Adam", "TBE EXACT_ROWWISE_ADAGRAD", "DENSE kernel + torch Adam",
           "fusekit.torchrec lazy Adam 8-bit (dynamic_map)",
           "fusekit.torchrec lazy Adam 8-bit (fp8)")
#: The 8-bit routes: the route's name -> its state format.
_EIGHT_BIT = {_ROUTES[3]: "dynamic_map", _ROUTES[4]: "fp8"}


def _ensure_process_group() -> None:
    import torch.distributed as dist
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29400 + os.getpid() % 500))
        dist.init_process_group("gloo", rank=0, world_size=1)


def _route(name: str, R: int, D: int, init: Any, lr: float) -> Tuple[Any, Optional[Any]]:
    """The DMP-wrapped EBC of one table and, on the dense route, its optimizer."""
    import torch
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
    from torchrec.distributed.types import ShardingEnv, ShardingPlan
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(
        name="t0", embedding_dim=D, num_embeddings=R, feature_names=["f0"])],
        device=torch.device("cpu"))
    with torch.no_grad():
        ebc.embedding_bags["t0"].weight.copy_(init)
    plan = None
    if name == _ROUTES[0]:
        fk_torchrec = importlib.import_module("fusekit.torchrec")
        apply_optimizer_in_backward(torch.optim.Adam, ebc.parameters(), {"lr": lr})
        sharders: List[Any] = list(fk_torchrec.sharders())
    elif name in _EIGHT_BIT:
        fk_torchrec = importlib.import_module("fusekit.torchrec")
        fk_torch = importlib.import_module("fusekit.torch")
        apply_optimizer_in_backward(fk_torch.SparseAdam8bit, ebc.parameters(),
                                    {"lr": lr, "state_format": _EIGHT_BIT[name]})
        sharders = list(fk_torchrec.sharders())
    elif name == _ROUTES[1]:
        sharders = [EmbeddingBagCollectionSharder(fused_params={
            "optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": lr})]
    else:
        sharder = EmbeddingBagCollectionSharder()
        sharders = [sharder]
        plan = ShardingPlan({"": construct_module_sharding_plan(
            ebc, {"t0": table_wise(rank=0, compute_kernel="dense")}, sharder=sharder,
            local_size=1, world_size=1, device_type="cpu")})
    dmp = DistributedModelParallel(ebc, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                   device=torch.device("cpu"), sharders=sharders, plan=plan)
    opt = None
    if name == _ROUTES[2]:
        opt = torch.optim.Adam([p for p in dmp.parameters() if p.requires_grad], lr=lr)
    return dmp, opt


def bench_torchrec(rec: Recorder, cfg: Config) -> None:
    sec = "torchrec"
    try:
        import torch
        import torchrec  # noqa: F401
        from torchrec import KeyedJaggedTensor
    except ImportError as e:
        rec.skip(sec, "EBC step", "all", f"torchrec not importable ({e}): run this section in "
                 "the environment of requirements/torchrec.txt")
        return
    _ensure_process_group()
    R, D, B = (20_000, 32, 256) if cfg.quick else (1_000_000, 32, 8192)
    for lo, hi in ((1, 4), (40, 60)):
        g = torch.Generator().manual_seed(lo)
        lens = torch.randint(lo, hi + 1, (B,), generator=g)
        ids = torch.randint(0, R, (int(lens.sum()),), generator=g)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=["f0"], values=ids, lengths=lens)
        grad_out = torch.randn(B, D, generator=g)
        init = torch.randn(R, D, generator=g) * 0.1
        case = f"TorchRec EBC step {R:,}x{D}, {B} bags of {lo}-{hi} ({ids.numel():,} ids)"
        print(f"[torchrec] {case}", flush=True)
        impls: List[Impl] = []
        keep: List[Any] = []
        for name in _ROUTES:
            try:
                with torch.enable_grad():  # the bench runs its sections under no_grad
                    dmp, opt = _route(name, R, D, init, 1e-3)
            except Exception as e:  # noqa: BLE001 (a route that cannot be built is reported)
                rec.skip(sec, case, name, f"{type(e).__name__}: {e}")
                continue
            keep.append((dmp, opt))
            impls.append(Impl(name, _step_fn(dmp, opt, kjt, grad_out, torch)))
        res = run_case(rec, sec, case, impls, cfg.repeats)
        del keep, impls
        _free()
        fk = res.get(_ROUTES[0])
        rec.compare(fk, res.get(_ROUTES[1]), min_speedup=1 / 1.25 if lo == 1 else None,
                    target="within 1.25x (#32)" if lo == 1 else "")
        rec.compare(fk, res.get(_ROUTES[2]), min_speedup=10.0 if lo == 1 else None,
                    target=">= 10x (#32)" if lo == 1 else "")
        for name in _EIGHT_BIT:
            # 8-bit / float32 <= 1.2: the float32 route as the peer, >= 1 / 1.2 of its speed.
            rec.compare(res.get(name), fk, min_speedup=1 / 1.2, target="8-bit within 1.2x (#32)")


def _step_fn(dmp: Any, opt: Any, kjt: Any, grad_out: Any, torch: Any) -> Callable[[], None]:
    def step() -> None:
        with torch.enable_grad():
            if opt is not None:
                opt.zero_grad(set_to_none=True)
            out = dmp(kjt)
            if hasattr(out, "wait"):
                out = out.wait()
            out.values().backward(grad_out)
            if opt is not None:
                opt.step()
    return step
