"""``torch.optim.SparseAdam`` on fusekit's LazyAdam operator.

:class:`SparseAdam` (alias :class:`LazyAdam`) takes the constructor, the param groups, the state
layout (``step``, ``exp_avg``, ``exp_avg_sq``) and the state dicts of ``torch.optim.SparseAdam``,
and steps each parameter with one call of :func:`fusekit.lazy_adam` on the sparse gradient as
autograd made it (duplicate indices and all: the operator sums them), without ``coalesce()`` and
without the dense masks torch builds. See docs/torch_sparse_adam.md for what differs.
"""

from __future__ import annotations

import math
from typing import Any, List, NamedTuple, Optional

import numpy as np
import torch
from torch.optim import Optimizer

import fusekit

from ._dtensor import refuse_sharded_table
from ._memory import advise_hugepages, empty_hugepage, zeros_hugepage
from ._plans import PlanCache

__all__ = ["SparseAdam", "LazyAdam", "SparseAdamStats"]

_INVALID_ARGUMENT = 161002  # the aclnn code fusekit.Error carries for an invalid argument
_DENSE_MESSAGE = "SparseAdam does not support dense gradients, please consider Adam instead"


class SparseAdamStats(NamedTuple):
    """What one parameter's step did (one entry of :attr:`SparseAdam.last_stats`)."""

    group: int  # index of the param group
    index: int  # position of the parameter in group["params"]
    rows_updated: int  # distinct rows written
    rows_skipped_nonfinite: int  # distinct rows left unchanged: their summed gradient had NaN/Inf
    indices_padding: int  # negative indices, ignored


def _error(message: str) -> "fusekit.Error":
    e = fusekit.Error(message)
    e.code = _INVALID_ARGUMENT
    return e


def _as_scalar(lr) -> float:
    if isinstance(lr, torch.Tensor):
        return float(lr.item())
    return float(lr)


def _rows(t: torch.Tensor, rows: int, cols: int) -> Optional[torch.Tensor]:
    """``t`` viewed as [rows, cols] with a contiguous last dimension, or None (no such view)."""
    try:
        v = t.view(rows, cols)
    except RuntimeError:
        return None
    if cols > 1 and rows > 0 and v.stride(1) != 1:
        return None
    return v


class _Work(NamedTuple):
    """One parameter's step, prepared and checked before anything is written."""

    group: int
    index: int
    param: torch.nn.Parameter
    indices: Optional[torch.Tensor]  # int64 [N] (None: empty gradient)
    values: Optional[torch.Tensor]  # float32 [N, D]
    rows: int
    cols: int


class SparseAdam(Optimizer):
    r"""``torch.optim.SparseAdam`` on fusekit's fused LazyAdam (CPU, float32).

    Args:
        params: the parameters (or param groups, or named parameters), as for any optimizer.
            Dense float32 CPU tensors whose gradients are sparse COO: ``nn.Embedding(sparse=True)``,
            ``nn.EmbeddingBag(sparse=True)``.
        lr (float or 1-element Tensor): learning rate (default 1e-3); read from the group at every
            step, so learning-rate schedulers work.
        betas (tuple[float, float]): (beta1, beta2), default (0.9, 0.999).
        eps (float): added to ``sqrt(v)`` (default 1e-8).
        maximize (bool): maximize the objective (default False).
        hugepages (bool, keyword only): back each parameter of at least 2 MiB with huge pages the
            first time it is stepped, in place (``fusekit.torch.advise_hugepages``: its storage
            never moves), and allocate the moments on huge pages (default True).

    The update per row is ``torch.optim.SparseAdam``'s, with the bias correction folded into the
    rate as torch does (``lr * sqrt(1 - beta2**t) / (1 - beta1**t)``, in Python double); the
    float32 arithmetic is the operator's: ``m = m*b1 + g*(1-b1)``, ``v = v*b2 + g*g*(1-b2)``,
    ``p += (m * -lr_t) / (sqrt(v) + eps)``, with beta1, beta2 converted to float32 before
    ``1 - beta``. A row whose summed gradient holds NaN or Inf is left unchanged (torch would write
    NaN into it) and counted in :attr:`last_stats`.

    Attributes:
        last_stats (list[SparseAdamStats]): one entry per parameter that had a gradient in the last
            :meth:`step`, in the order of the groups.
    """

    def __init__(self, params, lr: Any = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 maximize: bool = False, *, hugepages: bool = True) -> None:
        # torch.optim.SparseAdam's checks and messages, in its order.
        if isinstance(lr, torch.Tensor) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        if not 0.0 < lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 < eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")

        self._hugepages = bool(hugepages)
        self._homed = set()  # ids of the parameters already moved (or looked at) for huge pages
        self.last_stats: List[SparseAdamStats] = []
        self._initialized = False
        defaults = {"lr": lr, "betas": betas, "eps": eps, "maximize": maximize}
        super().__init__(params, defaults)
        self._plans = PlanCache()  # each parameter's plan, remade when its row count changes

        sparse_params = []
        complex_params = []
        for index, param_group in enumerate(self.param_groups):
            for d_index, d_param in enumerate(param_group["params"]):
                if d_param.is_sparse:
                    sparse_params.append([index, d_index])
                if d_param.is_complex():
                    complex_params.append([index, d_index])
        if sparse_params:
            raise ValueError(
                f"Sparse params at indices {sparse_params}: SparseAdam requires dense parameter "
                "tensors")
        if complex_params:
            raise ValueError(
                f"Complex params at indices {complex_params}: SparseAdam does not support complex "
                "parameters")
        # What fusekit adds: float32 CPU parameters, betas and eps that survive float32.
        for gi, group in enumerate(self.param_groups):
            self._check_group(gi, group)
            for pi, p in enumerate(group["params"]):
                self._check_param(gi, pi, group, p)
        self._initialized = True

    # ---- checks ---------------------------------------------------------------------------------
    @staticmethod
    def _name(gi: int, pi: int, group, p) -> str:
        names = group.get("param_names")
        label = f"'{names[pi]}' " if names is not None and pi < len(names) else ""
        return f"param {label}(group {gi}, index {pi}, shape {list(p.shape)})"

    def _check_param(self, gi: int, pi: int, group, p: torch.Tensor) -> None:
        refuse_sharded_table("fusekit.torch.SparseAdam", self._name(gi, pi, group, p), p)
        if p.dtype != torch.float32:
            raise TypeError(
                f"fusekit.torch.SparseAdam: {self._name(gi, pi, group, p)} has dtype {p.dtype}; "
                "fusekit's LazyAdam steps float32 parameters only (convert the parameter with "
                ".float(), or use torch.optim.SparseAdam for it)")
        if p.device.type != "cpu":
            raise ValueError(
                f"fusekit.torch.SparseAdam: {self._name(gi, pi, group, p)} is on {p.device}; "
                "fusekit runs on CPU tensors (use torch.optim.SparseAdam on that device)")

    @staticmethod
    def _check_group(gi: int, group) -> None:
        for k, b in enumerate(_as_scalar(b) for b in group["betas"]):
            if not 0.0 <= float(np.float32(b)) < 1.0:
                raise ValueError(
                    f"fusekit.torch.SparseAdam: group {gi}: beta parameter at index {k} = {b!r} "
                    f"is {float(np.float32(b))!r} in float32, where fusekit's LazyAdam computes; "
                    "it must stay below 1.0 (1.0 would freeze the moment)")
        eps32 = float(np.float32(_as_scalar(group["eps"])))
        if not (math.isfinite(eps32) and eps32 > 0.0):
            raise ValueError(
                f"fusekit.torch.SparseAdam: group {gi}: eps = {group['eps']!r} is {eps32!r} in "
                "float32, where fusekit's LazyAdam computes; it must be finite and > 0")

    def add_param_group(self, param_group) -> None:
        super().add_param_group(param_group)
        if getattr(self, "_initialized", False):
            gi = len(self.param_groups) - 1
            group = self.param_groups[gi]
            try:
                for pi, p in enumerate(group["params"]):
                    if p.is_sparse or p.is_complex():
                        raise ValueError(
                            f"fusekit.torch.SparseAdam: {self._name(gi, pi, group, p)}: "
                            "SparseAdam requires dense, real parameter tensors")
                    self._check_param(gi, pi, group, p)
                self._check_group(gi, group)
            except Exception:
                self.param_groups.pop()  # leave the optimizer as it was
                raise

    # ---- pickling: keep the constructor's hugepages flag ----------------------------------------
    def __getstate__(self):
        state = super().__getstate__()
        state["_hugepages"] = self._hugepages
        return state

    def __setstate__(self, state) -> None:
        state = dict(state)
        hugepages = state.pop("_hugepages", getattr(self, "_hugepages", True))
        super().__setstate__(state)
        self._hugepages = hugepages
        if not hasattr(self, "_homed"):
            self._homed = set()
        if not hasattr(self, "last_stats"):
            self.last_stats = []
        self._initialized = True

    # ---- state ----------------------------------------------------------------------------------
    def _new_moment(self, p: torch.Tensor) -> torch.Tensor:
        if self._hugepages:
            return zeros_hugepage(p.shape, torch.float32)
        return torch.zeros(p.shape, dtype=torch.float32)

    def _rehome(self, t: torch.Tensor) -> torch.Tensor:
        if self._hugepages:
            out = empty_hugepage(t.shape, t.dtype)
        else:
            out = torch.empty(t.shape, dtype=t.dtype)
        out.copy_(t)
        return out

    def load_state_dict(self, state_dict) -> None:
        """The base class's load (torch.optim.SparseAdam's state dicts load too), then the moments
        copied onto fresh contiguous memory (huge pages when ``hugepages``), so that the loaded
        dict is never aliased by the state this optimizer writes in place."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state.get(p)
                if not st:
                    continue
                for key in ("exp_avg", "exp_avg_sq"):
                    t = st.get(key)
                    if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                        st[key] = self._rehome(t)

    # ---- the step -------------------------------------------------------------------------------
    def _prepare(self, gi: int, pi: int, group, p: torch.Tensor) -> _Work:
        grad = p.grad
        if not grad.is_sparse:
            raise RuntimeError(_DENSE_MESSAGE)
        self._check_param(gi, pi, group, p)
        if grad.dtype != torch.float32:
            raise TypeError(f"fusekit.torch.SparseAdam: the gradient of "
                            f"{self._name(gi, pi, group, p)} has dtype {grad.dtype}; float32 only")
        if tuple(grad.shape) != tuple(p.shape):
            raise ValueError(f"fusekit.torch.SparseAdam: the gradient of "
                             f"{self._name(gi, pi, group, p)} has shape {list(grad.shape)}")
        k = grad.sparse_dim()
        shape = tuple(p.shape)
        rows, cols = math.prod(shape[:k]), math.prod(shape[k:])
        values = grad._values()
        n = values.shape[0]
        if values.numel() == 0:  # torch skips an empty gradient (no values) without a look
            return _Work(gi, pi, p, None, None, rows, cols)
        idx = grad._indices()
        if k == 1:
            indices = idx[0]  # a view: duplicates and order as autograd left them
        elif k == 0:
            indices = torch.zeros(n, dtype=torch.int64)
        else:  # a hand-built gradient indexing several leading dimensions: row-major row number
            bad = (idx >= torch.tensor(shape[:k], dtype=idx.dtype).unsqueeze(1)).any(dim=1)
            if bool(bad.any()):
                dim = int(bad.nonzero()[0, 0])
                raise _error(f"fusekit.torch.SparseAdam: the gradient of "
                             f"{self._name(gi, pi, group, p)} has an index >= {shape[dim]} in "
                             f"sparse dimension {dim}; nothing was modified")
            mult = torch.tensor([math.prod(shape[j + 1:k]) for j in range(k)], dtype=torch.int64)
            indices = (idx * mult.unsqueeze(1)).sum(dim=0)
            indices[(idx < 0).any(dim=0)] = -1  # a negative component: padding, as in 1-D
        values = values.reshape(n, cols)
        if cols > 1 and values.stride(1) != 1:
            values = values.contiguous()
        return _Work(gi, pi, p, indices, values, rows, cols)

    @torch.no_grad()
    def step(self, closure=None):
        """One optimization step (one fusekit LazyAdam call per parameter with a gradient).

        Everything that can be refused is checked for every parameter before any is written: a
        refused step raises and modifies no parameter and no state.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        # Phase one: check and prepare every parameter; nothing is written.
        plans = []
        for gi, group in enumerate(self.param_groups):
            self._check_group(gi, group)
            beta1, beta2 = (_as_scalar(b) for b in group["betas"])
            lr = _as_scalar(group["lr"])
            if not math.isfinite(lr):
                raise ValueError(f"{self._OPT_NAME}: group {gi}: lr = {lr!r} is not finite")
            work = [self._prepare(gi, pi, group, p)
                    for pi, p in enumerate(group["params"]) if p.grad is not None]
            for w in work:
                self._check_state(w)
            if work:
                plans.append((gi, group, lr, beta1, beta2, work))
        todo = [w for plan in plans for w in plan[5] if w.indices is not None]
        if self._needs_index_precheck(todo):
            # The operator checks the indices before it writes, but a later parameter's refusal
            # would come after earlier parameters were stepped, and a first step creates state
            # (and moves the parameter) before the call: then check them all first (one max per
            # parameter: 0.1 ms for 564k indices, under 1% of such a step). A single parameter
            # stepped again relies on the operator's own check.
            for w in todo:
                top = int(w.indices.numpy().max())  # NumPy: no thread pool to wake
                if top >= w.rows:
                    g = self.param_groups[w.group]
                    raise _error(f"{self._OPT_NAME}: the gradient of "
                                 f"{self._name(w.group, w.index, g, w.param)} names row {top} but "
                                 f"the table has {w.rows} rows; nothing was modified")

        # Phase two: step.
        stats: List[SparseAdamStats] = []
        for gi, group, lr, beta1, beta2, work in plans:
            maximize = group.get("maximize", False)
            eps = _as_scalar(group["eps"])
            for w in work:
                p = w.param
                if self._hugepages and id(p) not in self._homed:
                    advise_hugepages(p.data)  # in place: the storage never moves
                    self._homed.add(id(p))
                state = self.state[p]
                if len(state) == 0:
                    self._init_state(p, state)
                step = int(state["step"]) + 1
                if w.indices is None:  # empty gradient: the step counts, nothing moves (torch)
                    state["step"] = step
                    stats.append(SparseAdamStats(gi, w.index, 0, 0, 0))
                    continue
                bias_correction1 = 1 - beta1 ** step
                bias_correction2 = 1 - beta2 ** step
                step_size = lr * math.sqrt(bias_correction2) / bias_correction1
                values = -w.values if maximize else w.values
                st = self._step_param(w, state, values, step_size, beta1, beta2, eps)
                state["step"] = step
                stats.append(SparseAdamStats(gi, w.index, st.rows_updated,
                                             st.rows_skipped_nonfinite, st.indices_padding))
        self.last_stats = stats
        return loss

    # ---- what a subclass with another state (SparseAdam8bit) replaces ------------------------------
    _OPT_NAME = "fusekit.torch.SparseAdam"  # in the messages of step()

    def _check_state(self, w: _Work) -> None:
        """Phase one: refuse a bad existing state before any parameter is written (the float32
        state is checked where it is used, in _run)."""

    def _needs_index_precheck(self, todo: List[_Work]) -> bool:
        return len(todo) > 1 or any(not self.state.get(w.param) for w in todo)

    def _init_state(self, p: torch.Tensor, state) -> None:
        state["step"] = 0
        state["exp_avg"] = self._new_moment(p)
        state["exp_avg_sq"] = self._new_moment(p)

    def _step_param(self, w: _Work, state, values, step_size, beta1, beta2, eps):
        return self._run(w, state, values, step_size, beta1, beta2, eps)

    def _run(self, w: _Work, state, values, step_size, beta1, beta2, eps):
        tensors = [w.param.data, state["exp_avg"], state["exp_avg_sq"]]
        for t in tensors[1:]:
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(w.param.shape) \
                    or t.dtype != torch.float32 or t.device.type != "cpu":
                name = self._name(w.group, w.index, self.param_groups[w.group], w.param)
                raise ValueError(f"fusekit.torch.SparseAdam: the state of {name} is not float32 "
                                 "CPU tensors of the parameter's shape")
        views, back = [], []
        for t in tensors:
            v = _rows(t, w.rows, w.cols)
            if v is None:  # no [R, D] view (e.g. a transposed parameter): step a copy
                v = t.contiguous().view(w.rows, w.cols)
                back.append((t, v))
            views.append(v)
        var, m, v = views
        attrs = dict(beta1=beta1, beta2=beta2, epsilon=eps)
        st = self._plans.run(id(w.param), fusekit.LazyAdamPlan, (values, w.indices, m, v, var),
                             attrs, (beta1, beta2, eps, values.shape[0], w.indices.dtype), 0,
                             step_size)
        for t, c in back:
            t.copy_(c.view(t.shape))
        return st


LazyAdam = SparseAdam
