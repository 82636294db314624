"""bitsandbytes' 8-bit block-wise AdamW and Adam as torch optimizers, on fusekit's operators.

A parameter of at least ``min_8bit_size`` elements keeps m and v as uint8 codes into the dynamic
maps (signed for m, unsigned for v) with one float32 absmax per block of 256 elements, and is
stepped by :func:`fusekit.apply_adam_w_quant`; a smaller one (and every one with
``optim_bits=32``) keeps float32 m and v and is stepped by :func:`fusekit.adam_w`. The state
layout is bitsandbytes': ``step`` (int, 1 after the first step), ``state1`` / ``state2`` (m / v:
uint8 codes or float32, the parameter's shape), ``qmap1`` / ``qmap2`` (float32 [256], the maps,
one tensor shared by every parameter) and ``absmax1`` / ``absmax2`` (float32 [ceil(n / 256)]).

See docs/torch_adam8bit.md for the options accepted and refused and where the arithmetic differs
from ``torch.optim.AdamW`` and from bitsandbytes.
"""

from __future__ import annotations

import math
from itertools import chain
from typing import Any, Dict, Optional

import numpy as np
import torch

import fusekit

from ._dtensor import block_layout, blocks_dtensor, is_dtensor, like_param, local
from ._memory import HUGE_PAGE_BYTES, advise_hugepages, zeros_hugepage
from ._plans import PlanCache

__all__ = ["AdamW8bit", "Adam8bit"]

BLOCK_SIZE = fusekit.BLOCK_SIZE
# The operators' lower bound on eps, in float32 (docs/apply_adam_w_quant.md, "eps").
EPS_MIN = float(np.float32(2.0 ** -114))
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_TENSOR_KEYS_8BIT = ("state1", "state2", "qmap1", "qmap2", "absmax1", "absmax2")
_STATE_KEYS = ("step",) + _TENSOR_KEYS_8BIT
# bitsandbytes' state_dict() nests the quantization tensors under this key (for FSDP).
_BNB_WRAP_KEY = "__bnb_optimizer_quant_state__"


def _f32(x) -> float:
    return float(np.float32(float(x)))


class _Adam8bitBase(torch.optim.Optimizer):
    _NAME = "AdamW8bit"

    def __init__(self, params, lr, betas, eps, weight_decay, amsgrad, optim_bits, args,
                 min_8bit_size, is_paged, percentile_clipping, block_wise, hugepages):
        name = self._NAME
        if args is not None:  # bitsandbytes: an args object overrides these constructor arguments
            optim_bits = getattr(args, "optim_bits", optim_bits)
            min_8bit_size = getattr(args, "min_8bit_size", min_8bit_size)
            percentile_clipping = getattr(args, "percentile_clipping", percentile_clipping)
            block_wise = getattr(args, "block_wise", block_wise)
            if getattr(args, "max_unorm", 0.0) not in (0, 0.0, None):
                raise ValueError(f"{name}: args.max_unorm = {args.max_unorm} is not supported "
                                 "(it is a LAMB/LARS option); use 0")
            if getattr(args, "skip_zeros", False):
                raise ValueError(f"{name}: args.skip_zeros = True is not supported")
        if amsgrad:
            raise ValueError(f"{name}: amsgrad=True is not supported (nor by bitsandbytes' "
                             "8-bit optimizers): there is no 8-bit max-of-v state")
        if optim_bits not in (8, 32):
            raise ValueError(f"{name}: optim_bits must be 8 (8-bit moments for tensors of at least "
                             f"min_8bit_size elements) or 32 (float32 moments for all), "
                             f"got {optim_bits!r}")
        if not block_wise:
            raise ValueError(f"{name}: block_wise=False (one absmax per tensor) is not supported: "
                             "fusekit's ApplyAdamWQuant quantizes block-wise, one absmax per 256 "
                             "elements")
        if percentile_clipping != 100:
            raise ValueError(f"{name}: percentile_clipping={percentile_clipping!r} is not "
                             "supported (bitsandbytes 0.50 removed it too); clip gradients with "
                             "torch.nn.utils.clip_grad_norm_ before step()")
        if isinstance(min_8bit_size, bool) or not isinstance(min_8bit_size, (int, np.integer)) \
                or min_8bit_size < 0:
            raise ValueError(f"{name}: min_8bit_size must be an int >= 0, got {min_8bit_size!r}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        _check_hparams(name, defaults)
        self.optim_bits = int(optim_bits)
        self.min_8bit_size = int(min_8bit_size)
        self.is_paged = bool(is_paged)  # no effect on CPU (documented)
        self.hugepages = bool(hugepages)
        self.args = args
        qm = torch.from_numpy(fusekit.create_dynamic_map(True))
        qv = torch.from_numpy(fusekit.create_dynamic_map(False))
        # Maps shared by every 8-bit parameter's state (bytes -> tensor), the optimizer's own first.
        self._maps = {_key(qm): qm, _key(qv): qv}
        self._qmap_m, self._qmap_v = qm, qv
        #: After each step(): {param: count} for the parameters where the guard left something
        #: unchanged (8-bit: blocks of 256; 32-bit: elements), and the two totals.
        self.last_step_skipped: Dict[torch.Tensor, int] = {}
        self.last_step_skipped_blocks = 0
        self.last_step_skipped_elements = 0
        super().__init__(params, defaults)
        self._plans = PlanCache()  # each parameter's plan, made on its first step
        self._advised = set()  # ids of the parameters advised for huge pages

    # ---- groups ---------------------------------------------------------------------------------
    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        name = self._NAME
        params = param_group["params"]
        if isinstance(params, torch.Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections, but "
                            "the ordering of tensors in sets will change between runs. Please use "
                            "a list instead.")
        else:
            params = list(params)
        _check_dense_params(name, params)
        merged = dict(self.defaults)
        merged.update({k: v for k, v in param_group.items() if k != "params"})
        _check_hparams(name, merged)
        param_group = dict(param_group)
        param_group["params"] = params
        super().add_param_group(param_group)

    # ---- state ----------------------------------------------------------------------------------
    def _zeros(self, shape, dtype) -> torch.Tensor:
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if self.hugepages and nbytes >= HUGE_PAGE_BYTES:
            return zeros_hugepage(tuple(shape), dtype)
        return torch.zeros(tuple(shape), dtype=dtype)

    def _maybe_move_param(self, p: torch.Tensor) -> None:
        """Backs a parameter of at least 2 MiB with huge pages where it is, once
        (:func:`advise_hugepages`): its storage never moves (FSDP and DeepSpeed hold it)."""
        if self.hugepages and id(p) not in self._advised:
            self._advised.add(id(p))
            advise_hugepages(local(p.data))

    def _uses_8bit(self, p: torch.Tensor) -> bool:
        # The parameter's full size, also for a DTensor: every rank decides alike.
        return self.optim_bits == 8 and p.numel() >= self.min_8bit_size

    def _absmax_layout(self, p: torch.Tensor):
        """The absmax tensors' local shape and, for a DTensor, the number of shards (see
        fusekit.torch._dtensor: one row of blocks per shard)."""
        if is_dtensor(p):
            shards, max_blocks = block_layout(self._NAME, p, fusekit.quant_blocks)
            return (1, max_blocks), shards
        return (fusekit.quant_blocks(p.numel()),), None

    def _new_state(self, p: torch.Tensor, key: str, dtype) -> torch.Tensor:
        """A zero state tensor of the optimizer's own, sharded as the parameter is."""
        if key.startswith("absmax"):
            shape, shards = self._absmax_layout(p)
            return blocks_dtensor(p, self._zeros(shape, torch.float32), shards)
        return like_param(p, self._zeros(tuple(local(p).shape), dtype))

    def _init_state(self, p: torch.Tensor) -> None:
        self._maybe_move_param(p)
        state = self.state[p]
        state["step"] = 0
        if self._uses_8bit(p):
            for key in ("state1", "state2"):
                state[key] = self._new_state(p, key, torch.uint8)
            state["qmap1"], state["qmap2"] = self._qmap_m, self._qmap_v
            for key in ("absmax1", "absmax2"):
                state[key] = self._new_state(p, key, torch.float32)
        else:
            for key in ("state1", "state2"):
                state[key] = self._new_state(p, key, torch.float32)

    # ---- step -----------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        """One step of every parameter that has a gradient. Everything is checked first (each
        group's hyperparameters, each gradient's layout, dtype, device and shape): a refusal raises
        ValueError before any parameter or state is modified."""
        loss = _run_closure(closure)
        work = [(p, hp) for p, hp, _ in _dense_work(self._NAME, self.param_groups)]

        skipped: Dict[torch.Tensor, int] = {}
        blocks_skipped = elements_skipped = 0
        for p, hp in work:
            state = self.state[p]
            if len(state) == 0:
                self._init_state(p)
            var, g = local(p), local(p.grad)  # a DTensor's local shard
            if g.dtype != var.dtype:
                # A gradient of another dtype (torch's Tensor.grad_dtype, e.g. float32 gradients of
                # bfloat16 parameters) is rounded to the parameter's dtype: the operators take var
                # and grad of one dtype. One temporary copy.
                g = g.to(var.dtype)
            step = int(state["step"])
            if state["state1"].dtype == torch.uint8:
                n = self._step_8bit(p, var, g, state, step, hp)
                blocks_skipped += n
            else:
                n = self._step_32bit(p, var, g, state, step, hp)
                elements_skipped += n
            state["step"] = step + 1
            if n:
                skipped[p] = n
        self.last_step_skipped = skipped
        self.last_step_skipped_blocks = blocks_skipped
        self.last_step_skipped_elements = elements_skipped
        return loss

    def _step_8bit(self, key, p, g, state, step, hp) -> int:
        """One step of ``p`` (a plain tensor or a DTensor's local shard; ``key`` names the
        parameter's plan) and its 8-bit state."""
        m, v = local(state["state1"]), local(state["state2"])
        blocks = fusekit.quant_blocks(p.numel())
        absmax1 = local(state["absmax1"]).view(-1)[:blocks]  # a shard's blocks: its row's first
        absmax2 = local(state["absmax2"]).view(-1)[:blocks]
        if p.is_contiguous() and g.is_contiguous():
            var, grad, m, v = p.view(-1), g.view(-1), m.view(-1), v.view(-1)
            copy_back = None
        elif 1 <= p.dim() <= 8:
            var, grad = p, g  # the operator takes strided views (the gathering path)
            copy_back = None
        else:
            var, grad = p.contiguous().view(-1), g.contiguous().view(-1)
            m, v = m.view(-1), v.view(-1)
            copy_back = var
        attrs = {k: x for k, x in hp.items() if k != "lr"}
        st = self._plans.run(id(key), fusekit.ApplyAdamWQuantPlan,
                             (var, grad, m, v, state["qmap1"], state["qmap2"], absmax1, absmax2),
                             attrs, tuple(attrs.values()), step, hp["lr"])
        if copy_back is not None:
            p.copy_(copy_back.view(p.shape))
        return st.blocks_skipped_nonfinite

    def _step_32bit(self, key, p, g, state, step, hp) -> int:
        var = p if p.is_contiguous() else p.contiguous()  # adam_w takes contiguous tensors
        grad = g if g.is_contiguous() else g.contiguous()
        attrs = {k: x for k, x in hp.items() if k != "lr"}
        st = self._plans.run(id(key), fusekit.AdamWPlan,
                             (var.view(-1), grad.view(-1), local(state["state1"]).view(-1),
                              local(state["state2"]).view(-1)), attrs, tuple(attrs.values()),
                             step, hp["lr"])
        if var is not p:
            p.copy_(var)
        return st.elements_skipped_nonfinite

    # ---- state_dict -----------------------------------------------------------------------------
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads a state from :meth:`state_dict` (or from bitsandbytes' 8-bit optimizers, whose
        quantization tensors may be nested for FSDP). Codes, absmax, maps and moments are copied
        bit for bit into the optimizer's own memory (never cast to the parameter's dtype, as
        ``torch.optim.Optimizer.load_state_dict`` would); everything is checked before anything is
        changed."""
        name = self._NAME
        state_dict = dict(state_dict)
        groups = self.param_groups
        saved_groups = state_dict["param_groups"]
        if len(groups) != len(saved_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(g["params"]) != len(s["params"]) for g, s in zip(groups, saved_groups)):
            raise ValueError("loaded state dict contains a parameter group that doesn't match "
                             "the size of optimizer's group")
        id_map = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                          chain.from_iterable(g["params"] for g in groups)))
        ours: Dict[torch.Tensor, Dict[str, Any]] = {}
        rest_state = {}
        for k, v in state_dict["state"].items():
            if k not in id_map or not isinstance(v, dict):
                rest_state[k] = v
                continue
            v = dict(v)
            if isinstance(v.get(_BNB_WRAP_KEY), dict):
                v.update(v.pop(_BNB_WRAP_KEY))
            p = id_map[k]
            ours[p] = self._checked_state(name, p, k, v)
            rest_state[k] = {kk: vv for kk, vv in v.items() if kk not in _STATE_KEYS}
        # Everything checked: now copy (nothing above wrote to self).
        copies = {p: self._copy_state(p, s) for p, s in ours.items()}
        state_dict["state"] = rest_state
        super().load_state_dict(state_dict)
        for p, s in copies.items():
            self._maybe_move_param(p)
            self.state[p].update(s)

    def _checked_state(self, name, p, k, v) -> Dict[str, Any]:
        def fail(msg):
            raise ValueError(f"{name}.load_state_dict: state of parameter {k} "
                             f"(shape {tuple(p.shape)}): {msg}; nothing was loaded")

        for key in ("step", "state1", "state2"):
            if key not in v:
                fail(f"'{key}' is missing")
        step = v["step"]
        if isinstance(step, torch.Tensor):
            if step.numel() != 1:
                fail(f"step has {step.numel()} elements")
            step = step.item()
        if float(step) != int(step) or not 0 <= int(step) < 2 ** 62:
            fail(f"step = {step!r} must be an integer in [0, 2^62)")
        out = {"step": int(step)}
        n = p.numel()
        s1, s2 = v["state1"], v["state2"]
        for key, t in (("state1", s1), ("state2", s2)):
            if not isinstance(t, torch.Tensor) or t.numel() != n:
                fail(f"{key} must be a tensor of {n} elements, got "
                     f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if s1.dtype != s2.dtype or s1.dtype not in (torch.uint8, torch.float32):
            fail(f"state1 and state2 must both be uint8 (8-bit) or both float32, got {s1.dtype} "
                 f"and {s2.dtype}")
        for key, t in (("state1", s1), ("state2", s2)):
            if is_dtensor(p) != is_dtensor(t) or (is_dtensor(p) and (
                    t.placements != p.placements or local(t).shape != local(p).shape)):
                fail(f"{key} is not sharded as the parameter is (load a distributed state through "
                     "torch.distributed.checkpoint, at the world size and sharding it was saved "
                     "with)")
        out["state1"], out["state2"] = s1, s2
        if s1.dtype == torch.uint8:
            shape, shards = self._absmax_layout(p)
            want = (shards,) + shape[1:] if shards is not None else shape
            for key in ("absmax1", "absmax2"):
                t = v.get(key)
                if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
                    fail(f"{key} must be a float32 tensor, got "
                         f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
                if is_dtensor(p):
                    if not is_dtensor(t) or tuple(t.shape) != want:
                        fail(f"{key} has shape {tuple(t.shape)}, this sharding needs the DTensor "
                             f"{want} (one row of 256-element blocks per shard): 8-bit state "
                             "saved at another world size or sharding cannot be loaded")
                elif t.numel() != shape[0]:
                    fail(f"{key} must be float32 [{shape[0]}], got {tuple(t.shape)}")
                out[key] = t
            for key in ("qmap1", "qmap2"):
                t = v.get(key)
                if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() != 256:
                    fail(f"{key} must be float32 [256]")
                a = t.detach().cpu().reshape(-1).numpy()
                if not np.all(np.isfinite(a)) or np.any(a[1:] < a[:-1]):
                    fail(f"{key} must hold 256 finite floats in ascending order")
                out[key] = t
        return out

    def _copy_state(self, p, s) -> Dict[str, Any]:
        out = {"step": s["step"]}
        for key in ("state1", "state2"):
            t = s[key]
            new = self._new_state(p, key, t.dtype)
            local(new).copy_(local(t).detach().reshape(local(new).shape))
            out[key] = new
        if s["state1"].dtype == torch.uint8:
            for key in ("absmax1", "absmax2"):
                new = self._new_state(p, key, torch.float32)
                local(new).copy_(local(s[key]).detach().reshape(local(new).shape))
                out[key] = new
            for key in ("qmap1", "qmap2"):
                t = s[key].detach().cpu().reshape(-1).contiguous()
                kb = _key(t)
                if kb not in self._maps:  # a map of another bit pattern (bitsandbytes' float32 map)
                    self._maps[kb] = t.clone()
                out[key] = self._maps[kb]
        return out


def _key(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().view(torch.int32).numpy().tobytes()


def _check_dense_params(name, params) -> None:
    """The parameters of a group for a dense optimizer: CPU, strided, a float dtype fusekit steps
    (non-tensors are left to torch's own checks)."""
    for i, p in enumerate(params):
        if not isinstance(p, torch.Tensor):
            continue
        if p.device.type != "cpu":
            raise ValueError(f"{name}: parameter {i} of the group is on {p.device}; fusekit "
                             "steps CPU tensors")
        if p.layout != torch.strided:
            raise ValueError(f"{name}: parameter {i} of the group has layout {p.layout}; "
                             "only dense (strided) parameters are supported")
        if p.dtype not in _DTYPES:
            raise ValueError(f"{name}: parameter {i} of the group has dtype {p.dtype}; "
                             "fusekit steps float32, float16 and bfloat16 parameters")


def _run_closure(closure):
    """torch's closure convention: called with grad enabled, its loss returned by step()."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def _dense_work(name, param_groups, check_group=None):
    """The (parameter, hyperparameters, group) of every parameter with a gradient, everything
    checked before any step: each group's hyperparameters (and ``check_group(group, where)``),
    each gradient (:func:`_check_dense_grad`)."""
    work = []
    for gi, group in enumerate(param_groups):
        hp = None
        for pi, p in enumerate(group["params"]):
            g = p.grad
            if g is None:
                continue
            if hp is None:
                hp = _check_hparams(name, group, where=f"param group {gi}")
                if check_group is not None:
                    check_group(group, f"param group {gi}")
            _check_dense_grad(name, f"parameter {pi} of param group {gi}", p, g)
            work.append((p, hp, group))
    return work


def _check_dense_grad(name, where, p, g) -> None:
    """A dense optimizer's gradient: strided, floating-point, on the CPU, the parameter's shape."""
    if g.is_sparse or g.layout != torch.strided:
        raise ValueError(f"{name}: {where} has a sparse gradient ({g.layout}); {name} steps "
                         "dense gradients (use fusekit.torch.SparseAdam for sparse ones)")
    if not g.is_floating_point():
        raise ValueError(f"{name}: the gradient of {where} has dtype {g.dtype}; a "
                         "floating-point gradient is needed")
    if g.device.type != "cpu":
        raise ValueError(f"{name}: the gradient of {where} is on {g.device}")
    if g.shape != p.shape:
        raise ValueError(f"{name}: the gradient of {where} has shape {tuple(g.shape)}, the "
                         f"parameter {tuple(p.shape)}")
    if is_dtensor(g) != is_dtensor(p) or (is_dtensor(p) and (
            local(g).shape != local(p).shape)):
        raise ValueError(f"{name}: the gradient of {where} is "
                         f"{'a DTensor' if is_dtensor(g) else 'a plain tensor'} of local shape "
                         f"{tuple(local(g).shape)}, the parameter "
                         f"{'a DTensor' if is_dtensor(p) else 'a plain tensor'} of local shape "
                         f"{tuple(local(p).shape)}")


def _check_hparams(name, group, where="") -> Dict[str, float]:
    """The group's hyperparameters checked (as the operators will see them, in float32) and
    returned as the operators' keyword arguments."""
    at = f" ({where})" if where else ""
    lr, betas, eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
    try:
        lr_f = float(lr)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"{name}: lr = {lr!r}{at} is not a number")
    if not (math.isfinite(lr_f) and lr_f >= 0):
        raise ValueError(f"{name}: Invalid learning rate: {lr}{at}; it must be finite and >= 0")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"{name}: betas{at} must be a pair (beta1, beta2), got {betas!r}")
    b = []
    for i, beta in enumerate(betas):
        bf = float(beta)
        if not (0.0 <= bf < 1.0 and 0.0 <= _f32(bf) < 1.0):
            raise ValueError(f"{name}: Invalid beta parameter at index {i}: {beta}{at}; it must be "
                             "in [0, 1) (also after rounding to float32)")
        b.append(bf)
    eps_f = float(eps)
    if not (math.isfinite(eps_f) and _f32(eps_f) >= EPS_MIN):
        raise ValueError(f"{name}: Invalid epsilon value: {eps}{at}; it must be finite and >= "
                         f"4.81482486e-35 (2^-114) in float32, so that eps * sqrt(1 - beta2^t) is "
                         "never 0")
    wd_f = float(wd)
    if not (math.isfinite(wd_f) and wd_f >= 0):
        raise ValueError(f"{name}: Invalid weight_decay value: {wd}{at}; it must be finite and "
                         ">= 0")
    return dict(lr=lr_f, beta1=b[0], beta2=b[1], eps=eps_f, weight_decay=wd_f)


class AdamW8bit(_Adam8bitBase):
    """bitsandbytes' ``AdamW8bit`` on fusekit: 8-bit block-wise m and v for tensors of at least
    ``min_8bit_size`` elements, float32 m and v for smaller ones (or all, ``optim_bits=32``).

    Positional arguments as bitsandbytes 0.50 takes them; ``percentile_clipping`` and
    ``block_wise`` (of older bitsandbytes) are keyword-only and accept only their defaults;
    ``hugepages`` (fusekit's): state of at least 2 MiB on huge-page memory, and a parameter of at
    least 2 MiB advised for huge pages where it is (its storage never moves). ``is_paged`` has no
    effect on CPU. DTensor parameters (FSDP2) are stepped through their local shards, with the
    state sharded alike (docs/offloaded_training.md).
    After each step, ``last_step_skipped`` ({param: count}), ``last_step_skipped_blocks`` and
    ``last_step_skipped_elements`` say what the non-finite guard left unchanged.
    """

    _NAME = "AdamW8bit"

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, optim_bits: int = 8,
                 args: Optional[Any] = None, min_8bit_size: int = 4096, is_paged: bool = False,
                 *, percentile_clipping: int = 100, block_wise: bool = True,
                 hugepages: bool = True):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, optim_bits, args,
                         min_8bit_size, is_paged, percentile_clipping, block_wise, hugepages)


class Adam8bit(_Adam8bitBase):
    """bitsandbytes' ``Adam8bit`` on fusekit: :class:`AdamW8bit` with ``weight_decay=0`` by
    default. A weight decay > 0 is decoupled (multiplies the parameter by ``1 - lr *
    weight_decay``), as bitsandbytes' Adam8bit does, not torch.optim.Adam's L2 term."""

    _NAME = "Adam8bit"

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, optim_bits: int = 8,
                 args: Optional[Any] = None, min_8bit_size: int = 4096, is_paged: bool = False,
                 *, percentile_clipping: int = 100, block_wise: bool = True,
                 hugepages: bool = True):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, optim_bits, args,
                         min_8bit_size, is_paged, percentile_clipping, block_wise, hugepages)
