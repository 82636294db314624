"""torch.optim.AdamW and torch.optim.Adam, stepped by fusekit's AdamW operator.

Drop-ins for the CPU step of offloaded training (FSDP2 with ``CPUOffloadPolicy``, DeepSpeed's
client optimizer, a model on the CPU): the constructor, the semantics and the state of torch's
(``step``, ``exp_avg``, ``exp_avg_sq``), so that a state_dict moves between torch's optimizer and
this one in both directions. Differences, all written down in docs/torch_adamw.md:

- ``exp_avg`` and ``exp_avg_sq`` are float32 for every parameter dtype (torch keeps them in the
  parameter's dtype: bfloat16 moments lose the update of small gradients);
- the arithmetic is the operator's, in float32 (docs/adam_w.md): within a few float32 ulps of
  torch's per step, not bitwise; an element whose step would produce a non-finite value is left
  unchanged and counted (``last_step_skipped``) where torch writes NaN;
- ``amsgrad``, ``capturable`` and ``differentiable`` are refused; ``foreach`` and ``fused`` are
  accepted and change nothing (there is one implementation).

A DTensor parameter (FSDP2's ``fully_shard``) is stepped through its local shard, and its state
is kept as DTensors with the parameter's mesh and placements, allocated at the local shape, so
that ``torch.distributed.checkpoint`` saves and restores every rank's shard. The optimizer never
replaces a parameter's storage (FSDP keeps references to it).
"""

from __future__ import annotations

import math
from itertools import chain
from typing import Any, Dict, Optional

import torch

import fusekit

from ._adam8bit import _check_dense_params, _check_hparams, _dense_work, _run_closure
from ._dtensor import is_dtensor as _is_dtensor
from ._dtensor import like_param
from ._dtensor import local as _local
from ._memory import HUGE_PAGE_BYTES, zeros_hugepage
from ._plans import PlanCache

__all__ = ["AdamW", "Adam"]

_MOMENTS = ("exp_avg", "exp_avg_sq")

class _AdamBase(torch.optim.Optimizer):
    _NAME = "AdamW"
    _DECOUPLED = True  # AdamW: p *= 1 - lr * wd; Adam: g += wd * p (torch.optim.Adam's L2 term)

    def __init__(self, params, lr, betas, eps, weight_decay, amsgrad, maximize, foreach,
                 capturable, differentiable, fused, hugepages):
        name = self._NAME
        if amsgrad:
            raise ValueError(f"{name}: amsgrad=True is not supported: fusekit's AdamW operator "
                             "keeps no max-of-v state")
        if capturable:
            raise ValueError(f"{name}: capturable=True (CUDA graphs) is not supported: fusekit "
                             "steps CPU tensors")
        if differentiable:
            raise ValueError(f"{name}: differentiable=True is not supported: the step runs "
                             "outside autograd")
        if isinstance(lr, torch.Tensor):
            lr = float(lr)
        defaults = dict(lr=lr, betas=tuple(float(b) for b in betas), eps=eps,
                        weight_decay=weight_decay, amsgrad=False, maximize=bool(maximize),
                        foreach=foreach, capturable=False, differentiable=False, fused=fused)
        _check_hparams(name, defaults)
        self.hugepages = bool(hugepages)
        #: After each step(): {param: elements the non-finite guard left unchanged}, and the total.
        self.last_step_skipped: Dict[torch.Tensor, int] = {}
        self.last_step_skipped_elements = 0
        super().__init__(params, defaults)
        self._plans = PlanCache()

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        name = self._NAME
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else params
        if isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections, but "
                            "the ordering of tensors in sets will change between runs. Please use "
                            "a list instead.")
        params = list(params)
        _check_dense_params(name, params)
        merged = dict(self.defaults)
        merged.update({k: v for k, v in param_group.items() if k != "params"})
        _check_hparams(name, merged)
        for key in ("amsgrad", "capturable", "differentiable"):
            if merged.get(key):
                raise ValueError(f"{name}: {key}=True is not supported")
        param_group = dict(param_group)
        param_group["params"] = params
        super().add_param_group(param_group)

    # ---- state ----------------------------------------------------------------------------------
    def _zeros(self, shape) -> torch.Tensor:
        if self.hugepages and math.prod(shape) * 4 >= HUGE_PAGE_BYTES:
            return zeros_hugepage(tuple(shape), torch.float32)  # the optimizer's own memory
        return torch.zeros(tuple(shape), dtype=torch.float32)

    def _new_moment(self, p: torch.Tensor) -> torch.Tensor:
        return like_param(p, self._zeros(tuple(_local(p).shape)))

    def _init_state(self, p: torch.Tensor) -> None:
        state = self.state[p]
        state["step"] = torch.tensor(0.0, dtype=torch.float32)
        for key in _MOMENTS:
            state[key] = self._new_moment(p)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads a state from :meth:`state_dict` or from ``torch.optim.AdamW`` / ``Adam``. The
        moments are copied into float32 tensors of the optimizer's own (torch would cast them to
        the parameter's dtype); a DTensor parameter takes a DTensor state of its placements. Every
        state is checked before anything changes."""
        name = self._NAME
        state_dict = dict(state_dict)
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups) or any(
                len(g["params"]) != len(s["params"])
                for g, s in zip(self.param_groups, saved_groups)):
            raise ValueError(f"{name}.load_state_dict: the state has other parameter groups than "
                             "the optimizer; nothing was loaded")
        id_map = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                          chain.from_iterable(g["params"] for g in self.param_groups)))
        moments: Dict[torch.Tensor, Dict[str, torch.Tensor]] = {}
        rest = {}
        for k, v in state_dict["state"].items():
            if k in id_map and isinstance(v, dict) and any(key in v for key in _MOMENTS):
                p = id_map[k]
                v = dict(v)
                moments[p] = {key: self._checked_moment(p, k, key, v.pop(key, None))
                              for key in _MOMENTS}
            rest[k] = v
        state_dict["state"] = rest
        super().load_state_dict(state_dict)  # step and anything else, as torch loads them
        for p, mom in moments.items():
            for key, t in mom.items():
                new = self._new_moment(p)
                _local(new).copy_(_local(t).detach().reshape(_local(new).shape))
                self.state[p][key] = new

    def _checked_moment(self, p, k, key, t) -> torch.Tensor:
        where = f"{self._NAME}.load_state_dict: state of parameter {k} (shape {tuple(p.shape)})"
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise ValueError(f"{where}: '{key}' must be a floating-point tensor, got "
                             f"{type(t).__name__}; nothing was loaded")
        if t.shape != p.shape:
            raise ValueError(f"{where}: '{key}' has shape {tuple(t.shape)}; nothing was loaded")
        if _is_dtensor(p) != _is_dtensor(t) or (
                _is_dtensor(p) and (t.placements != p.placements
                                    or _local(t).shape != _local(p).shape)):
            raise ValueError(f"{where}: '{key}' is not sharded as the parameter is (load a "
                             "distributed state through torch.distributed.checkpoint); nothing "
                             "was loaded")
        return t

    # ---- step -----------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        """One step of every parameter that has a gradient. Every group's hyperparameters and every
        gradient are checked first: a refusal raises ValueError before anything is modified."""
        loss = _run_closure(closure)
        name = self._NAME

        def check_group(group, where):
            for key in ("amsgrad", "capturable", "differentiable"):
                if group.get(key):
                    raise ValueError(f"{name}: {key}=True ({where}) is not supported")

        work = []
        for p, hp, group in _dense_work(name, self.param_groups, check_group):
            decoupled = bool(group.get("decoupled_weight_decay", self._DECOUPLED))
            work.append((p, hp, bool(group.get("maximize", False)), decoupled))

        skipped: Dict[torch.Tensor, int] = {}
        total = 0
        for p, hp, maximize, decoupled in work:
            state = self.state[p]
            if len(state) == 0:
                self._init_state(p)
            n = self._step_one(p, state, hp, maximize, decoupled)
            if n:
                skipped[p] = n
                total += n
        self.last_step_skipped = skipped
        self.last_step_skipped_elements = total
        return loss

    def _step_one(self, p, state, hp, maximize, decoupled) -> int:
        var, g = _local(p), _local(p.grad)
        m, v = _local(state["exp_avg"]), _local(state["exp_avg_sq"])
        if g.dtype != var.dtype:
            g = g.to(var.dtype)  # the operator takes var and grad of one dtype
        if maximize:
            g = -g
        wd = hp["weight_decay"]
        if not decoupled and wd != 0.0:
            g = g.add(var, alpha=wd)  # torch.optim.Adam's L2 term, in the parameter's dtype
            wd = 0.0
        step = int(float(state["step"]))
        flat = var if var.is_contiguous() else var.contiguous()
        grad = g if g.is_contiguous() else g.contiguous()
        attrs = dict(beta1=hp["beta1"], beta2=hp["beta2"], eps=hp["eps"], weight_decay=wd)
        st = self._plans.run(id(p), fusekit.AdamWPlan,
                             (flat.view(-1), grad.view(-1), m.view(-1), v.view(-1)), attrs,
                             tuple(attrs.values()), step, hp["lr"])
        if flat is not var:
            var.copy_(flat)
        state["step"] = torch.tensor(float(step + 1), dtype=torch.float32)
        return st.elements_skipped_nonfinite


class AdamW(_AdamBase):
    """``torch.optim.AdamW`` (decoupled weight decay), stepped by fusekit's AdamW operator; float32
    moments for float32, bfloat16 and float16 parameters. ``hugepages``: moments of 2 MiB or more
    on huge-page memory (the optimizer's own allocations; parameters are never moved)."""

    _NAME = "AdamW"
    _DECOUPLED = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 foreach: Optional[bool] = None, capturable: bool = False,
                 differentiable: bool = False, fused: Optional[bool] = None,
                 hugepages: bool = True):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize, foreach,
                         capturable, differentiable, fused, hugepages)


class Adam(_AdamBase):
    """``torch.optim.Adam``: weight decay as torch's L2 term (the gradient plus ``weight_decay *
    param``), or decoupled with ``decoupled_weight_decay=True`` (then it is :class:`AdamW`)."""

    _NAME = "Adam"
    _DECOUPLED = False

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, *,
                 foreach: Optional[bool] = None, maximize: bool = False,
                 capturable: bool = False, differentiable: bool = False,
                 fused: Optional[bool] = None, decoupled_weight_decay: bool = False,
                 hugepages: bool = True):
        self._DECOUPLED = bool(decoupled_weight_decay)
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize, foreach,
                         capturable, differentiable, fused, hugepages)
        self.defaults["decoupled_weight_decay"] = self._DECOUPLED
        for group in self.param_groups:
            group.setdefault("decoupled_weight_decay", self._DECOUPLED)
