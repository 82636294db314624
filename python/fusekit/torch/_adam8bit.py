"""bitsandbytes' 8-bit block-wise AdamW and Adam as torch optimizers, on fusekit's operators.

A parameter of at least ``min_8bit_size`` elements keeps m and v as uint8 codes with one float32
per block of 256 elements, and is stepped by :func:`fusekit.apply_adam_w_quant`; a smaller one
(and every one with ``optim_bits=32``) keeps float32 m and v and is stepped by
:func:`fusekit.adam_w`. Two formats of the codes (``state_format``, a hyperparameter of every
group, docs/fp8_state.md):

- ``"dynamic_map"`` (the default): bitsandbytes' layout, codes into the dynamic maps. ``step``
  (int, 1 after the first step), ``state1`` / ``state2`` (m / v: uint8 codes or float32, the
  parameter's shape), ``qmap1`` / ``qmap2`` (float32 [256], the maps, one tensor shared by every
  parameter) and ``absmax1`` / ``absmax2`` (float32 [ceil(n / 256)]). The lost-v guard is on
  unless ``guard_lost_v=False`` (the step divides by v as it decodes, as bitsandbytes');
- ``"fp8"``: ``step``, ``state1`` (m as E4M3 codes), ``state2`` (sqrt(v) as UE4M4 codes),
  ``scale1`` / ``scale2`` (float32 [ceil(n / 256)]: the blocks' scales, max / 448 and max / 496);
  no maps;
- ``"fp8_ue3m5"``: as ``"fp8"`` with sqrt(v) as UE3M5 codes (half UE4M4's rounding error, a range
  of 2^12: for dense layers), its scales (max / 31.5) under ``scale2_ue3m5``.

See docs/torch_adam8bit.md for the options accepted and refused and where the arithmetic differs
from ``torch.optim.AdamW`` and from bitsandbytes.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
import torch

import fusekit

from ._base import (SCALE_KEYS, LR, Betas, Hyper, QuantStateOptimizer, StepStats,
                    check_dense_param, dense_work, param_label, run_closure, state_format_of,
                    step_value)
from ._dtensor import block_layout, blocks_dtensor, is_dtensor, like_param, local
from ._memory import HUGE_PAGE_BYTES, advise_hugepages, zeros_hugepage

__all__ = ["AdamW8bit", "Adam8bit"]

BLOCK_SIZE = fusekit.BLOCK_SIZE
_TENSOR_KEYS_8BIT = ("state1", "state2", "qmap1", "qmap2", "absmax1", "absmax2")
_FP8_KEYS = ("scale1", "scale2", "scale2_ue3m5")  # the fp8 formats' per-block scales
_STATE_KEYS = ("step",) + _TENSOR_KEYS_8BIT + _FP8_KEYS
# bitsandbytes' state_dict() nests the quantization tensors under this key (for FSDP).
_BNB_WRAP_KEY = "__bnb_optimizer_quant_state__"


class _Adam8bitBase(QuantStateOptimizer):
    _OPTIONS = ("hugepages", "optim_bits", "min_8bit_size", "is_paged", "args")

    def __init__(self, params: Any, lr: LR, betas: Betas, eps: float, weight_decay: float,
                 amsgrad: bool, optim_bits: int, args: Any, min_8bit_size: int, is_paged: bool,
                 percentile_clipping: int, block_wise: bool, hugepages: bool, state_format: str,
                 guard_lost_v: bool) -> None:
        name = self._prefix()
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
        self.optim_bits = int(optim_bits)
        self.min_8bit_size = self._check_min_8bit_size(min_8bit_size)
        self.is_paged = bool(is_paged)  # no effect on CPU (documented)
        self.args = args
        self._init_maps()
        self._set_state_options(state_format, guard_lost_v)
        defaults = dict(lr=lr, betas=tuple(betas) if isinstance(betas, list) else betas, eps=eps,
                        weight_decay=weight_decay)
        super().__init__(params, defaults, hugepages=hugepages)

    def _check_param(self, gi: int, pi: int, group: Dict[str, Any], p: torch.Tensor) -> None:
        check_dense_param(self._prefix(), self._label(gi, pi, p), p)

    # ---- state ----------------------------------------------------------------------------------
    def _zeros(self, shape: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if self.hugepages and nbytes >= HUGE_PAGE_BYTES:
            return zeros_hugepage(tuple(shape), dtype)
        return torch.zeros(tuple(shape), dtype=dtype)

    def _maybe_advise(self, p: torch.Tensor) -> None:
        """Backs a parameter of at least 2 MiB with huge pages where it is, once
        (:func:`advise_hugepages`): its storage never moves (FSDP and DeepSpeed hold it)."""
        if self.hugepages and id(p) not in self._advised:
            self._advised.add(id(p))
            advise_hugepages(local(p.data))

    def _uses_8bit(self, p: torch.Tensor) -> bool:
        # The parameter's full size, also for a DTensor: every rank decides alike.
        return self.optim_bits == 8 and p.numel() >= self.min_8bit_size

    def _absmax_layout(self, p: torch.Tensor) -> Tuple[Tuple[int, ...], Optional[int]]:
        """The absmax tensors' local shape and, for a DTensor, the number of shards (see
        fusekit.torch._dtensor: one row of blocks per shard)."""
        if is_dtensor(p):
            shards, max_blocks = block_layout(self._prefix(), p, fusekit.quant_blocks)
            return (1, max_blocks), shards
        return (fusekit.quant_blocks(p.numel()),), None

    def _new_state(self, p: torch.Tensor, key: str, dtype: torch.dtype) -> torch.Tensor:
        """A zero state tensor of the optimizer's own, sharded as the parameter is (the per-block
        absmax or scale tensors in their own layout: fusekit.torch._dtensor)."""
        if key.startswith(("absmax", "scale")):
            shape, shards = self._absmax_layout(p)
            return blocks_dtensor(p, self._zeros(shape, torch.float32),
                                  shards if shards is not None else 1)
        return like_param(p, self._zeros(tuple(local(p).shape), dtype))

    def _init_state(self, p: torch.Tensor, group: Dict[str, Any]) -> None:
        self._maybe_advise(p)
        state = self.state[p]
        state["step"] = 0
        if self._uses_8bit(p):
            for key in ("state1", "state2"):
                state[key] = self._new_state(p, key, torch.uint8)
            fmt = group["state_format"]
            if fmt != "dynamic_map":  # an fp8 format: codes 0 and scales 0, every moment 0
                for key in SCALE_KEYS[fmt]:
                    state[key] = self._new_state(p, key, torch.float32)
                return
            state["qmap1"], state["qmap2"] = self._qmap_m, self._qmap_v
            for key in ("absmax1", "absmax2"):
                state[key] = self._new_state(p, key, torch.float32)
        else:
            for key in ("state1", "state2"):
                state[key] = self._new_state(p, key, torch.float32)

    # ---- step -----------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One step of every parameter that has a gradient. Everything is checked first (each
        group's hyperparameters, each gradient's layout, dtype, device and shape): a refusal raises
        before any parameter or state is modified."""
        loss = run_closure(closure)
        work = dense_work(self, type(self).__name__)
        for w in work:  # a state of the other format than its group's: refused before any step
            self._check_state_format(param_label(w.options, w.group, w.index, w.param), w.options,
                                     self.state.get(w.param, {}))
        stats = []
        for w in work:
            p = w.param
            state = self.state[p]
            if len(state) == 0:
                self._init_state(p, w.options)
            assert p.grad is not None  # dense_work gives the parameters that have one
            var, g = local(p), local(p.grad)  # a DTensor's local shard
            if g.dtype != var.dtype:
                # A gradient of another dtype (torch's Tensor.grad_dtype, e.g. float32 gradients of
                # bfloat16 parameters) is rounded to the parameter's dtype: the operators take var
                # and grad of one dtype. One temporary copy.
                g = g.to(var.dtype)
            step = int(state["step"])
            if state["state1"].dtype == torch.uint8:
                stats.append(StepStats(w.group, w.index, 0, self._step_8bit(
                    p, var, g, state, step, w.hyper, bool(w.options["guard_lost_v"]))))
            else:
                stats.append(StepStats(w.group, w.index,
                                       self._step_32bit(p, var, g, state, step, w.hyper), 0))
            state["step"] = step + 1
        self.last_stats = stats
        return loss

    @staticmethod
    def _attrs(hp: Hyper) -> Dict[str, float]:
        # bitsandbytes' order: the decoupled decay after the update (the operators' default).
        return dict(beta1=hp.beta1, beta2=hp.beta2, eps=hp.eps, weight_decay=hp.weight_decay)

    def _step_8bit(self, key: torch.Tensor, p: torch.Tensor, g: torch.Tensor,
                   state: Dict[str, Any], step: int, hp: Hyper, guard_lost_v: bool) -> int:
        """One step of ``p`` (a plain tensor or a DTensor's local shard; ``key`` names the
        parameter's plan) and its 8-bit state, of either format (its keys say which)."""
        m, v = local(state["state1"]), local(state["state2"])
        blocks = fusekit.quant_blocks(p.numel())
        fmt = state_format_of(state) or "dynamic_map"
        fp8 = fmt != "dynamic_map"
        k1, k2 = SCALE_KEYS[fmt]
        absmax1 = local(state[k1]).view(-1)[:blocks]  # a shard's blocks: its row's first
        absmax2 = local(state[k2]).view(-1)[:blocks]
        qmap1, qmap2 = (self._no_map, self._no_map) if fp8 else (state["qmap1"], state["qmap2"])
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
        attrs: Dict[str, Any] = self._attrs(hp)
        # The plans' integer attributes (fusekit.STATE_FORMATS): 0 the dynamic maps, 1 fp8, 2
        # fp8_ue3m5 (the fp8 formats' guard is always on).
        attrs.update(state_format=fusekit.STATE_FORMATS.index(fmt),
                     guard_lost_v=1 if fp8 or guard_lost_v else 0)
        st = self._plans.run(id(key), fusekit.ApplyAdamWQuantPlan,
                             (var, grad, m, v, qmap1, qmap2, absmax1, absmax2),
                             attrs, tuple(attrs.values()), step, hp.lr)
        if copy_back is not None:
            p.copy_(copy_back.view(p.shape))
        return int(st.blocks_skipped_nonfinite)

    def _step_32bit(self, key: torch.Tensor, p: torch.Tensor, g: torch.Tensor,
                    state: Dict[str, Any], step: int, hp: Hyper) -> int:
        var = p if p.is_contiguous() else p.contiguous()  # adam_w takes contiguous tensors
        grad = g if g.is_contiguous() else g.contiguous()
        attrs = self._attrs(hp)
        st = self._plans.run(id(key), fusekit.AdamWPlan,
                             (var.view(-1), grad.view(-1), local(state["state1"]).view(-1),
                              local(state["state2"]).view(-1)), attrs, tuple(attrs.values()),
                             step, hp.lr)
        if var is not p:
            p.copy_(var)
        return int(st.elements_skipped_nonfinite)

    # ---- state_dict -----------------------------------------------------------------------------
    # load_state_dict (the base's) takes a state from state_dict() or from bitsandbytes' 8-bit
    # optimizers, whose quantization tensors may be nested for FSDP: codes, absmax, maps and
    # moments are copied bit for bit into the optimizer's own memory.

    def _split_loaded_state(self, p: torch.Tensor, v: Dict[str, Any],
                            fail: Callable[[str], Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        if isinstance(v.get(_BNB_WRAP_KEY), dict):
            v.update(v.pop(_BNB_WRAP_KEY))
        for key in ("step", "state1", "state2"):
            if key not in v:
                fail(f"'{key}' is missing")
        out: Dict[str, Any] = {"step": step_value(self._prefix(), fail, v["step"])}
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
            fmt = state_format_of(v) or "dynamic_map"
            if fmt != "dynamic_map" and any(k in v for k in ("absmax1", "absmax2", "qmap1",
                                                            "qmap2")):
                fail(f"it holds both the {fmt} format's {'/'.join(SCALE_KEYS[fmt])} and the "
                     "dynamic map's absmax/qmap keys: one format or the other")
            if fmt == "fp8_ue3m5" and "scale2" in v:
                fail("it holds both the fp8 format's scale2 and the fp8_ue3m5 format's "
                     "scale2_ue3m5: one format or the other")
            self._check_loaded_format(p, fmt, fail)
            shape, shards = self._absmax_layout(p)
            want = (shards,) + shape[1:] if shards is not None else shape
            for key in SCALE_KEYS[fmt]:
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
            if fmt == "dynamic_map":
                for key in ("qmap1", "qmap2"):
                    t = v.get(key)
                    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 \
                            or t.numel() != 256:
                        fail(f"{key} must be float32 [256]")
                    a = t.detach().cpu().reshape(-1).numpy()
                    if not np.all(np.isfinite(a)) or np.any(a[1:] < a[:-1]):
                        fail(f"{key} must hold 256 finite floats in ascending order")
                    out[key] = t
        return out, {kk: vv for kk, vv in v.items() if kk not in _STATE_KEYS}

    def _own_state(self, p: torch.Tensor, s: Dict[str, Any]) -> Dict[str, Any]:
        self._maybe_advise(p)
        out: Dict[str, Any] = {"step": s["step"]}
        for key in ("state1", "state2"):
            t = s[key]
            new = self._new_state(p, key, t.dtype)
            local(new).copy_(local(t).detach().reshape(local(new).shape))
            out[key] = new
        if s["state1"].dtype == torch.uint8:
            fmt = state_format_of(s) or "dynamic_map"
            for key in SCALE_KEYS[fmt]:
                new = self._new_state(p, key, torch.float32)
                local(new).copy_(local(s[key]).detach().reshape(local(new).shape))
                out[key] = new
            if fmt == "dynamic_map":
                for key in ("qmap1", "qmap2"):
                    out[key] = self._shared_map(s[key])
        return out


class AdamW8bit(_Adam8bitBase):
    """bitsandbytes' ``AdamW8bit`` on fusekit: 8-bit block-wise m and v for tensors of at least
    ``min_8bit_size`` elements, float32 m and v for smaller ones (or all, ``optim_bits=32``).

    Positional arguments as bitsandbytes 0.50 takes them; ``percentile_clipping`` and
    ``block_wise`` (of older bitsandbytes) are keyword-only and accept only their defaults;
    ``hugepages`` (fusekit's): state of at least 2 MiB on huge-page memory, and a parameter of at
    least 2 MiB advised for huge pages where it is (its storage never moves). ``is_paged`` has no
    effect on CPU. DTensor parameters (FSDP2) are stepped through their local shards, with the
    state sharded alike (docs/offloaded_training.md).

    ``state_format`` (fusekit's; a hyperparameter of every group): ``"dynamic_map"`` (the
    default: bitsandbytes' codes, maps and absmax, its state_dict layout), ``"fp8"`` (m as E4M3,
    sqrt(v) as UE4M4, one float32 scale per block, no maps: ``state1``, ``state2``, ``scale1``,
    ``scale2``; docs/fp8_state.md) or ``"fp8_ue3m5"`` (sqrt(v) as UE3M5: half the rounding error
    of v, a range of 2^12 where UE4M4's is 2^19; v's scales under ``scale2_ue3m5``; for dense
    layers, the closer to float32 on the fine-tuning example). ``guard_lost_v`` (fusekit's,
    default True): the lost-v guard
    of the dynamic-map format, fusekit's deliberate difference from bitsandbytes (a second moment
    that decodes to 0 while the first does not is read as m^2, so that the step cannot become
    m / eps); False: the step divides by v as it decodes, as bitsandbytes'. The FP8 formats always
    have it (False is refused with them).

    After each step, ``last_stats`` holds one :class:`~fusekit.torch.StepStats` per parameter
    stepped: what the non-finite guard left unchanged (blocks of 256 for 8-bit state, elements
    for float32 state).
    """

    def __init__(self, params: Any, lr: LR = 1e-3, betas: Betas = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, optim_bits: int = 8,
                 args: Optional[Any] = None, min_8bit_size: int = 4096, is_paged: bool = False,
                 *, percentile_clipping: int = 100, block_wise: bool = True,
                 hugepages: bool = True, state_format: str = "dynamic_map",
                 guard_lost_v: bool = True) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, optim_bits, args,
                         min_8bit_size, is_paged, percentile_clipping, block_wise, hugepages,
                         state_format, guard_lost_v)


class Adam8bit(_Adam8bitBase):
    """bitsandbytes' ``Adam8bit`` on fusekit: :class:`AdamW8bit` with ``weight_decay=0`` by
    default (``state_format`` and ``guard_lost_v`` as there). A weight decay > 0 is decoupled
    (multiplies the parameter by ``1 - lr * weight_decay``), as bitsandbytes' Adam8bit does, not
    torch.optim.Adam's L2 term."""

    def __init__(self, params: Any, lr: LR = 1e-3, betas: Betas = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, optim_bits: int = 8,
                 args: Optional[Any] = None, min_8bit_size: int = 4096, is_paged: bool = False,
                 *, percentile_clipping: int = 100, block_wise: bool = True,
                 hugepages: bool = True, state_format: str = "dynamic_map",
                 guard_lost_v: bool = True) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, optim_bits, args,
                         min_8bit_size, is_paged, percentile_clipping, block_wise, hugepages,
                         state_format, guard_lost_v)
