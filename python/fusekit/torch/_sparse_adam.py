"""``torch.optim.SparseAdam`` on fusekit's LazyAdam operator.

:class:`SparseAdam` (alias :class:`LazyAdam`) takes the constructor, the param groups, the state
layout (``step``, ``exp_avg``, ``exp_avg_sq``) and the state dicts of ``torch.optim.SparseAdam``,
and steps each parameter with one call of :func:`fusekit.lazy_adam` on the sparse gradient as
autograd made it (duplicate indices and all: the operator sums them), without ``coalesce()`` and
without the dense masks torch builds. See docs/torch_sparse_adam.md for what differs.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import torch

import fusekit

from ._base import LR, Betas, FusekitOptimizer, Hyper, run_closure, step_value
from ._dtensor import refuse_sharded_table
from ._memory import advise_hugepages, empty_hugepage, zeros_hugepage

__all__ = ["SparseAdam", "LazyAdam", "SparseAdamStats"]

_INVALID_ARGUMENT = 161002  # the aclnn code fusekit.Error carries for an invalid argument
_DENSE_MESSAGE = "SparseAdam does not support dense gradients, please consider Adam instead"
_MOMENTS = ("exp_avg", "exp_avg_sq")


class SparseAdamStats(NamedTuple):
    """What one parameter's step did (one entry of :attr:`SparseAdam.last_stats`)."""

    group: int  # index of the param group
    index: int  # type: ignore[assignment]  # position in group["params"] (shadows tuple.index)
    rows_updated: int  # distinct rows written
    rows_skipped_nonfinite: int  # distinct rows left unchanged: their summed gradient had NaN/Inf
    indices_padding: int  # negative indices, ignored


def _error(message: str) -> "fusekit.Error":
    e = fusekit.Error(message)
    e.code = _INVALID_ARGUMENT
    return e


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
    index: int  # type: ignore[assignment]  # position in group["params"]
    param: torch.Tensor
    indices: Optional[torch.Tensor]  # int64 [N] (None: empty gradient)
    values: Optional[torch.Tensor]  # float32 [N, D]
    rows: int
    cols: int


class SparseAdam(FusekitOptimizer):
    r"""``torch.optim.SparseAdam`` on fusekit's fused LazyAdam (CPU, float32).

    Args:
        params: the parameters (or param groups, or named parameters), as for any optimizer.
            Dense float32 CPU tensors whose gradients are sparse COO: ``nn.Embedding(sparse=True)``,
            ``nn.EmbeddingBag(sparse=True)``.
        lr (float or 1-element Tensor): learning rate (default 1e-3); read from the group at every
            step, so learning-rate schedulers and a tensor changed in place work.
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
    NaN into it) and counted in :attr:`last_stats`. The hyperparameter rules are those of every
    fusekit.torch optimizer (``lr`` >= 0 where torch's SparseAdam wants > 0; ``eps`` >= 2^-114 in
    float32 where torch's wants > 0): docs/python.md.

    Attributes:
        last_stats (list[SparseAdamStats]): one entry per parameter that had a gradient in the last
            :meth:`step`, in the order of the groups.
    """

    def __init__(self, params: Any, lr: LR = 1e-3, betas: Betas = (0.9, 0.999), eps: float = 1e-8,
                 maximize: bool = False, *, hugepages: bool = True) -> None:
        defaults = {"lr": lr, "betas": betas, "eps": eps, "maximize": maximize}
        super().__init__(params, defaults, hugepages=hugepages)

    # ---- checks ---------------------------------------------------------------------------------
    def _check_param(self, gi: int, pi: int, group: Dict[str, Any], p: torch.Tensor) -> None:
        label = self._label(gi, pi, p)
        # torch.optim.SparseAdam's refusals, with its messages.
        if p.is_sparse:
            raise ValueError(f"{self._prefix()}: Sparse params at indices [[{gi}, {pi}]]: "
                             f"SparseAdam requires dense parameter tensors ({label})")
        if p.is_complex():
            raise ValueError(f"{self._prefix()}: Complex params at indices [[{gi}, {pi}]]: "
                             f"SparseAdam does not support complex parameters ({label})")
        refuse_sharded_table(self._prefix(), label, p)
        if p.device.type != "cpu":
            raise ValueError(f"{self._prefix()}: {label} is on {p.device}; fusekit runs on CPU "
                             "tensors (use torch.optim.SparseAdam on that device)")
        self._check_dtype(label, p)

    def _check_dtype(self, label: str, p: torch.Tensor) -> None:
        if p.dtype != torch.float32:
            raise TypeError(
                f"{self._prefix()}: {label} has dtype {p.dtype}; fusekit's LazyAdam steps float32 "
                "parameters only (convert the parameter with .float(), or use "
                "torch.optim.SparseAdam for it)")

    # ---- state ----------------------------------------------------------------------------------
    def _zeros(self, shape: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if self.hugepages:
            return zeros_hugepage(tuple(shape), dtype)
        return torch.zeros(tuple(shape), dtype=dtype)

    def _new_moment(self, p: torch.Tensor) -> torch.Tensor:
        return self._zeros(tuple(p.shape), torch.float32)

    def _split_loaded_state(self, p: torch.Tensor, v: Dict[str, Any],
                            fail: Callable[[str], Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        # torch.optim.SparseAdam's state or ours: step and the float32 moments, copied onto fresh
        # memory of the optimizer's own (huge pages when hugepages), so that the loaded dict is
        # never aliased by the state this optimizer writes in place.
        if not any(key in v for key in _MOMENTS):
            return {}, v
        if p.dtype != torch.float32:
            fail("float32 state (exp_avg, exp_avg_sq) steps float32 parameters only")
        ours: Dict[str, Any] = {}
        for key in _MOMENTS:
            t = v.pop(key, None)
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 \
                    or tuple(t.shape) != tuple(p.shape) or t.layout != torch.strided:
                got = (f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor)
                       else type(t).__name__)
                fail(f"'{key}' must be a dense float32 tensor of the parameter's shape, got {got}")
            ours[key] = t
        if "step" not in v:
            fail("'step' is missing")
        ours["step"] = step_value(self._prefix(), fail, v.pop("step"))
        return ours, v

    def _own_state(self, p: torch.Tensor, s: Dict[str, Any]) -> Dict[str, Any]:
        out: Dict[str, Any] = {"step": s["step"]}
        for key in _MOMENTS:
            out[key] = self._new_moment(p).copy_(s[key].detach().cpu().reshape(p.shape))
        return out

    # ---- the step -------------------------------------------------------------------------------
    def _prepare(self, gi: int, pi: int, group: Dict[str, Any], p: torch.Tensor) -> _Work:
        grad = p.grad
        assert grad is not None  # step() prepares the parameters that have one
        if not grad.is_sparse:
            raise RuntimeError(f"{self._prefix()}: {_DENSE_MESSAGE}")
        self._check_param(gi, pi, group, p)
        label = self._label(gi, pi, p)
        if grad.dtype != torch.float32:
            raise TypeError(f"{self._prefix()}: the gradient of {label} has dtype {grad.dtype}; "
                            "float32 only")
        if tuple(grad.shape) != tuple(p.shape):
            raise ValueError(f"{self._prefix()}: the gradient of {label} has shape "
                             f"{list(grad.shape)}")
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
                raise _error(f"{self._prefix()}: the gradient of {label} has an index >= "
                             f"{shape[dim]} in sparse dimension {dim}; nothing was modified")
            mult = torch.tensor([math.prod(shape[j + 1:k]) for j in range(k)], dtype=torch.int64)
            indices = (idx * mult.unsqueeze(1)).sum(dim=0)
            indices[(idx < 0).any(dim=0)] = -1  # a negative component: padding, as in 1-D
        values = values.reshape(n, cols)
        if cols > 1 and values.stride(1) != 1:
            values = values.contiguous()
        return _Work(gi, pi, p, indices, values, rows, cols)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One optimization step (one fusekit LazyAdam call per parameter with a gradient).

        Everything that can be refused is checked for every parameter before any is written: a
        refused step raises and modifies no parameter and no state.
        """
        loss = run_closure(closure)

        # Phase one: check and prepare every parameter; nothing is written.
        plans = []
        for gi, group in enumerate(self.param_groups):
            work = [self._prepare(gi, pi, group, p)
                    for pi, p in enumerate(group["params"]) if p.grad is not None]
            if not work:
                continue
            hyper = self._check_group(gi, group)
            for w in work:
                self._check_state(w)
            plans.append((gi, group, hyper, work))
        todo = [w for plan in plans for w in plan[3] if w.indices is not None]
        if self._needs_index_precheck(todo):
            # The operator checks the indices before it writes, but a later parameter's refusal
            # would come after earlier parameters were stepped, and a first step creates state
            # (and moves the parameter) before the call: then check them all first (one max per
            # parameter: 0.1 ms for 564k indices, under 1% of such a step). A single parameter
            # stepped again relies on the operator's own check.
            for w in todo:
                assert w.indices is not None
                top = int(w.indices.numpy().max())  # NumPy: no thread pool to wake
                if top >= w.rows:
                    raise _error(f"{self._prefix()}: the gradient of "
                                 f"{self._label(w.group, w.index, w.param)} names row {top} but "
                                 f"the table has {w.rows} rows; nothing was modified")

        # Phase two: step.
        stats: List[SparseAdamStats] = []
        for gi, group, hp, work in plans:
            maximize = group.get("maximize", False)
            for w in work:
                p = w.param
                if self.hugepages and id(p) not in self._advised:
                    advise_hugepages(p.data)  # in place: the storage never moves
                    self._advised.add(id(p))
                state = self.state[p]
                if len(state) == 0:
                    self._init_state(p, state)
                step = int(state["step"]) + 1
                if w.indices is None:  # empty gradient: the step counts, nothing moves (torch)
                    state["step"] = step
                    stats.append(SparseAdamStats(gi, w.index, 0, 0, 0))
                    continue
                bias_correction1 = 1 - hp.beta1 ** step
                bias_correction2 = 1 - hp.beta2 ** step
                step_size = hp.lr * math.sqrt(bias_correction2) / bias_correction1
                assert w.values is not None
                values = -w.values if maximize else w.values
                st = self._step_param(w, state, values, step_size, hp)
                state["step"] = step
                stats.append(SparseAdamStats(gi, w.index, st.rows_updated,
                                             st.rows_skipped_nonfinite, st.indices_padding))
        self.last_stats = stats
        return loss

    # ---- what a subclass with another state (SparseAdam8bit) replaces ------------------------------
    def _check_state(self, w: _Work) -> None:
        """Phase one: refuse a bad existing state before any parameter is written."""
        st = self.state.get(w.param)
        if st:
            self._check_float_state(w, st)

    def _check_float_state(self, w: _Work, st: Dict[str, Any]) -> None:
        p = w.param
        for key in _MOMENTS:
            t = st.get(key)
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 \
                    or tuple(t.shape) != tuple(p.shape) or t.device.type != "cpu" \
                    or t.layout != torch.strided:
                raise ValueError(f"{self._prefix()}: the state of "
                                 f"{self._label(w.group, w.index, p)}: {key} must be a float32 "
                                 "CPU tensor of the parameter's shape")

    def _needs_index_precheck(self, todo: List[_Work]) -> bool:
        return len(todo) > 1 or any(not self.state.get(w.param) for w in todo) or any(
            self.hugepages and id(w.param) not in self._advised for w in todo)

    def _init_state(self, p: torch.Tensor, state: Dict[str, Any]) -> None:
        state["step"] = 0
        state["exp_avg"] = self._new_moment(p)
        state["exp_avg_sq"] = self._new_moment(p)

    def _step_param(self, w: _Work, state: Dict[str, Any], values: torch.Tensor,
                    step_size: float, hp: Hyper) -> Any:
        return self._run(w, state, values, step_size, hp)

    def _run(self, w: _Work, state: Dict[str, Any], values: torch.Tensor, step_size: float,
             hp: Hyper) -> Any:
        tensors = [w.param.data, state["exp_avg"], state["exp_avg_sq"]]
        views, back = [], []
        for t in tensors:
            v = _rows(t, w.rows, w.cols)
            if v is None:  # no [R, D] view (e.g. a transposed parameter): step a copy
                v = t.contiguous().view(w.rows, w.cols)
                back.append((t, v))
            views.append(v)
        var, m, v = views
        assert w.indices is not None
        attrs = dict(beta1=hp.beta1, beta2=hp.beta2, eps=hp.eps)
        st = self._plans.run(id(w.param), fusekit.LazyAdamPlan, (values, w.indices, m, v, var),
                             attrs, (hp.beta1, hp.beta2, hp.eps, values.shape[0],
                                     w.indices.dtype), 0, step_size)
        for t, c in back:
            t.copy_(c.view(t.shape))
        return st


LazyAdam = SparseAdam
