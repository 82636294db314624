"""torch.optim.AdamW and torch.optim.Adam, stepped by fusekit's AdamW operator.

Drop-ins for the CPU step of offloaded training (FSDP2 with ``CPUOffloadPolicy``, DeepSpeed's
client optimizer, a model on the CPU): the constructor, the semantics and the state of torch's
(``step``, ``exp_avg``, ``exp_avg_sq``), so that a state_dict moves between torch's optimizer and
this one in both directions. The decoupled weight decay is applied as torch applies it, to the
parameter before the Adam update (``p *= 1 - lr * wd``: the operator's ``decay_before_update``).
Differences, all written down in docs/torch_adamw.md:

- ``exp_avg`` and ``exp_avg_sq`` are float32 for every parameter dtype (torch keeps them in the
  parameter's dtype: bfloat16 moments lose the update of small gradients);
- the arithmetic is the operator's, in float32 (docs/adam_w.md): within a few float32 ulps of
  torch's per step, not bitwise; an element whose step would produce a non-finite value is left
  unchanged and counted (``last_stats``) where torch writes NaN;
- ``amsgrad``, ``capturable`` and ``differentiable`` are refused; ``foreach`` and ``fused`` are
  accepted and change nothing (there is one implementation).

A DTensor parameter (FSDP2's ``fully_shard``) is stepped through its local shard, and its state
is kept as DTensors with the parameter's mesh and placements, allocated at the local shape, so
that ``torch.distributed.checkpoint`` saves and restores every rank's shard. The optimizer never
replaces a parameter's storage (FSDP keeps references to it).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Tuple

import torch

import fusekit

from ._base import (LR, Betas, FusekitOptimizer, Hyper, StepStats, check_dense_param, checked_moment,
                    dense_work, run_closure, step_value)
from ._dtensor import like_param
from ._dtensor import local as _local
from ._memory import HUGE_PAGE_BYTES, zeros_hugepage

__all__ = ["AdamW", "Adam"]

_MOMENTS = ("exp_avg", "exp_avg_sq")
_REFUSED = {
    "amsgrad": "fusekit's AdamW operator keeps no max-of-v state",
    "capturable": "CUDA graphs: fusekit steps CPU tensors",
    "differentiable": "the step runs outside autograd",
}


class _AdamBase(FusekitOptimizer):
    _TORCH_NAME = "Adam"  # torch.optim.AdamW is an Adam: its messages say "Adam"
    _DECOUPLED = True  # AdamW: p *= 1 - lr * wd first; Adam: g += wd * p (torch's L2 term)

    def __init__(self, params: Any, lr: LR, betas: Betas, eps: float, weight_decay: float,
                 amsgrad: bool, maximize: bool, foreach: Optional[bool], capturable: bool,
                 differentiable: bool, fused: Optional[bool], hugepages: bool,
                 extra: Optional[Dict[str, Any]] = None) -> None:
        prefix = self._prefix()
        for key, value in (("amsgrad", amsgrad), ("capturable", capturable),
                           ("differentiable", differentiable)):
            if value:
                raise ValueError(f"{prefix}: {key}=True is not supported ({_REFUSED[key]})")
        # torch.optim.Adam's refusals of tensor hyperparameters on its foreach path, with its
        # messages (fusekit has one implementation, but a drop-in refuses what torch refuses).
        if isinstance(lr, torch.Tensor) and foreach:
            raise ValueError(f"{prefix}: lr as a Tensor is not supported for capturable=False "
                             "and foreach=True")
        if isinstance(betas, (tuple, list)) and len(betas) == 2 and foreach and all(
                isinstance(b, torch.Tensor) for b in betas):
            raise ValueError(f"{prefix}: betas[0] as a Tensor is not supported for "
                             "capturable=False and foreach=True")
        defaults = dict(lr=lr, betas=tuple(betas) if isinstance(betas, list) else betas, eps=eps,
                        weight_decay=weight_decay, amsgrad=False, maximize=bool(maximize),
                        foreach=foreach, capturable=False, differentiable=False, fused=fused)
        defaults.update(extra or {})
        super().__init__(params, defaults, hugepages=hugepages)

    # ---- checks ---------------------------------------------------------------------------------
    def _check_group(self, gi: int, group: Dict[str, Any]) -> Hyper:
        for key in _REFUSED:
            if group.get(key):
                raise ValueError(f"{self._prefix()}: {key}=True (param group {gi}) is not "
                                 f"supported ({_REFUSED[key]})")
        return super()._check_group(gi, group)

    def _check_param(self, gi: int, pi: int, group: Dict[str, Any], p: torch.Tensor) -> None:
        check_dense_param(self._prefix(), self._label(gi, pi, p), p)

    # ---- state ----------------------------------------------------------------------------------
    def _zeros(self, shape: Tuple[int, ...]) -> torch.Tensor:
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

    def _split_loaded_state(self, p: torch.Tensor, v: Dict[str, Any],
                            fail: Callable[[str], Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        # torch.optim.AdamW's / Adam's state or ours: step and the two moments, copied into
        # float32 tensors of the optimizer's own (torch would cast them to the parameter's dtype).
        if not any(key in v for key in _MOMENTS):
            return {}, v
        ours: Dict[str, Any] = {key: checked_moment(fail, p, key, v.pop(key, None))
                                for key in _MOMENTS}
        if "step" not in v:
            fail("'step' is missing")
        ours["step"] = torch.tensor(float(step_value(self._prefix(), fail, v.pop("step"))),
                                    dtype=torch.float32)
        return ours, v

    def _own_state(self, p: torch.Tensor, s: Dict[str, Any]) -> Dict[str, Any]:
        out: Dict[str, Any] = {"step": s["step"]}
        for key in _MOMENTS:
            new = self._new_moment(p)
            _local(new).copy_(_local(s[key]).detach().reshape(_local(new).shape))
            out[key] = new
        return out

    # ---- step -----------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One step of every parameter that has a gradient. Every group's hyperparameters and every
        gradient are checked first: a refusal raises before anything is modified."""
        loss = run_closure(closure)
        work = dense_work(self, self._TORCH_NAME)
        stats = []
        for w in work:
            state = self.state[w.param]
            if len(state) == 0:
                self._init_state(w.param)
            # AdamW always (torch.optim.AdamW forces it too); Adam as its group says.
            decoupled = self._DECOUPLED or bool(w.options.get("decoupled_weight_decay", False))
            n = self._step_one(w.param, state, w.hyper, bool(w.options.get("maximize", False)),
                               decoupled)
            stats.append(StepStats(w.group, w.index, n, 0))
        self.last_stats = stats
        return loss

    def _step_one(self, p: torch.Tensor, state: Dict[str, Any], hp: Hyper, maximize: bool,
                  decoupled: bool) -> int:
        assert p.grad is not None  # dense_work gives the parameters that have one
        var, g = _local(p), _local(p.grad)
        m, v = _local(state["exp_avg"]), _local(state["exp_avg_sq"])
        if g.dtype != var.dtype:
            g = g.to(var.dtype)  # the operator takes var and grad of one dtype
        if maximize:
            g = -g
        wd = hp.weight_decay
        if not decoupled and wd != 0.0:
            g = g.add(var, alpha=wd)  # torch.optim.Adam's L2 term, in the parameter's dtype
            wd = 0.0
        step = int(float(state["step"]))
        flat = var if var.is_contiguous() else var.contiguous()
        grad = g if g.is_contiguous() else g.contiguous()
        # decay_before_update: torch's order, p *= 1 - lr * wd before the Adam update.
        attrs = dict(beta1=hp.beta1, beta2=hp.beta2, eps=hp.eps, weight_decay=wd,
                     decay_before_update=1)
        st = self._plans.run(id(p), fusekit.AdamWPlan,
                             (flat.view(-1), grad.view(-1), m.view(-1), v.view(-1)), attrs,
                             tuple(attrs.values()), step, hp.lr)
        if flat is not var:
            var.copy_(flat)
        state["step"] = torch.tensor(float(step + 1), dtype=torch.float32)
        return int(st.elements_skipped_nonfinite)


class AdamW(_AdamBase):
    """``torch.optim.AdamW`` (decoupled weight decay, applied before the update as torch applies
    it), stepped by fusekit's AdamW operator; float32 moments for float32, bfloat16 and float16
    parameters. ``hugepages``: moments of 2 MiB or more on huge-page memory (the optimizer's own
    allocations; parameters are never moved). After each step, ``last_stats`` holds one
    :class:`~fusekit.torch.StepStats` per parameter stepped."""

    _DECOUPLED = True

    def __init__(self, params: Any, lr: LR = 1e-3, betas: Betas = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, foreach: Optional[bool] = None,
                 capturable: bool = False, differentiable: bool = False,
                 fused: Optional[bool] = None, hugepages: bool = True) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize, foreach,
                         capturable, differentiable, fused, hugepages,
                         extra={"decoupled_weight_decay": True})  # as torch's AdamW groups say


class Adam(_AdamBase):
    """``torch.optim.Adam``: weight decay as torch's L2 term (the gradient plus ``weight_decay *
    param``), or decoupled with ``decoupled_weight_decay=True`` (then it is :class:`AdamW`)."""

    _DECOUPLED = False

    def __init__(self, params: Any, lr: LR = 1e-3, betas: Betas = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *,
                 foreach: Optional[bool] = None, maximize: bool = False,
                 capturable: bool = False, differentiable: bool = False,
                 fused: Optional[bool] = None, decoupled_weight_decay: bool = False,
                 hugepages: bool = True) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize, foreach,
                         capturable, differentiable, fused, hugepages,
                         extra={"decoupled_weight_decay": bool(decoupled_weight_decay)})
