"""``torch.optim.SparseAdam`` with 8-bit state, on fusekit's LazyAdamQuant operator.

:class:`SparseAdam8bit` takes :class:`fusekit.torch.SparseAdam`'s constructor (and so
``torch.optim.SparseAdam``'s), its checks, bias correction, sparse-gradient handling (no
``coalesce()``), huge pages and ``last_stats``, and keeps the moments of each table of at least
``min_8bit_size`` elements as 8-bit codes with one float32 absmax per row and block of 256 columns,
stepped by :func:`fusekit.lazy_adam_quant`: ``2 D + 8 ceil(D / 256)`` bytes of state per row
instead of ``8 D``. Smaller tables keep float32 moments and are stepped by
:func:`fusekit.lazy_adam`, exactly as :class:`fusekit.torch.SparseAdam` steps them.

State per parameter:

- 8-bit, ``state_format="dynamic_map"`` (the default; bitsandbytes' names, as
  :class:`fusekit.torch.AdamW8bit`): ``step`` (int), ``state1`` / ``state2`` (m / v: uint8 codes,
  the parameter's shape), ``absmax1`` / ``absmax2`` (float32 ``[R, ceil(D / 256)]``, R the
  parameter's first dimension and D the product of the others), ``qmap1`` / ``qmap2`` (float32
  [256], the signed and unsigned dynamic maps, one tensor shared by every parameter);
- 8-bit, ``state_format="fp8"`` (docs/fp8_state.md): ``step``, ``state1`` (m as E4M3 codes),
  ``state2`` (sqrt(v) as UE4M4 codes), ``scale1`` / ``scale2`` (float32 ``[R, ceil(D / 256)]``,
  the blocks' scales); no maps;
- float32 (tables under ``min_8bit_size``): :class:`~fusekit.torch.SparseAdam`'s and torch's
  ``step``, ``exp_avg``, ``exp_avg_sq``.

See docs/torch_sparse_adam8bit.md.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Tuple

import numpy as np
import torch

import fusekit

from ._base import LR, Betas, Hyper, QuantStateOptimizer, state_format_of, step_value
from ._sparse_adam import _DENSE_MESSAGE, SparseAdam, _rows, _Work

__all__ = ["SparseAdam8bit"]

BLOCK_SIZE = fusekit.BLOCK_SIZE
_DTYPES_8BIT = (torch.float32, torch.bfloat16, torch.float16)
_KEYS_8BIT = ("state1", "state2", "absmax1", "absmax2", "qmap1", "qmap2")
_KEYS_FP8 = ("state1", "state2", "scale1", "scale2")


def _layout(p: torch.Tensor) -> Tuple[int, int, int]:
    """(rows, cols, blocks) of a parameter's 8-bit state: rows = the first dimension, cols = the
    product of the others, blocks = ceil(cols / 256) absmax entries per row."""
    rows = int(p.shape[0])
    cols = math.prod(p.shape[1:])
    return rows, cols, (cols + BLOCK_SIZE - 1) // BLOCK_SIZE


class SparseAdam8bit(QuantStateOptimizer, SparseAdam):
    r"""``torch.optim.SparseAdam`` with 8-bit block-wise moments, on fusekit's LazyAdamQuant.

    Args:
        params, lr, betas, eps, maximize: as :class:`fusekit.torch.SparseAdam` (and
            ``torch.optim.SparseAdam``): the same checks and messages.
        min_8bit_size (int, keyword only): a parameter of at least this many elements (and at
            least one dimension) keeps 8-bit state; a smaller one float32 state (default 4096, as
            bitsandbytes).
        hugepages (bool, keyword only): as :class:`fusekit.torch.SparseAdam`: a parameter of at
            least 2 MiB given huge pages in place at its first step (its storage never moves), the
            state allocated on huge-page memory (default True).
        state_format (str, keyword only): ``"dynamic_map"`` (default: codes into the dynamic
            maps, bitsandbytes' format) or ``"fp8"`` (m as E4M3, sqrt(v) as UE4M4, one scale per
            row block; docs/fp8_state.md). A hyperparameter of every group.
        guard_lost_v (bool, keyword only): the lost-v guard in the dynamic-map format (default
            True: a v that decodes to 0 while m does not is read as m^2, never m / eps); always on
            in fp8 (False refused there).

    Parameters: dense CPU tensors with sparse COO gradients (``nn.Embedding(sparse=True)``,
    ``nn.EmbeddingBag(sparse=True)``), coalesced or not. 8-bit tables may be float32, bfloat16 or
    float16, their gradients the table's dtype or float32; float32-state tables are float32
    (:class:`~fusekit.torch.SparseAdam`'s rule). The 8-bit step on the rows a gradient names, per
    row: dequantize m and v, ``m = m*b1 + g(1-b1)``, ``v = |v*b2 + g²(1-b2)|``,
    ``p += (m * -lr_t) / (sqrt(v) + eps)`` in float32, requantize (docs/lazy_adam_quant.md), with
    ``lr_t = lr * sqrt(1 - beta2**t) / (1 - beta1**t)`` in Python double (SparseAdam's bias
    correction). A row whose new m, v or parameter would not be finite is left unchanged, codes
    and absmax included, and counted in :attr:`last_stats`.

    Attributes:
        last_stats (list[SparseAdamStats]): as :class:`~fusekit.torch.SparseAdam`.
        min_8bit_size (int): the constructor's threshold.
    """

    _STATE_FORMATS = fusekit.SPARSE_STATE_FORMATS  # no fp8_ue3m5 (docs/fp8_state.md)

    _OPTIONS = ("hugepages", "min_8bit_size")

    def __init__(self, params: Any, lr: LR = 1e-3, betas: Betas = (0.9, 0.999), eps: float = 1e-8,
                 maximize: bool = False, *, min_8bit_size: int = 4096, hugepages: bool = True,
                 state_format: str = "dynamic_map", guard_lost_v: bool = True) -> None:
        self.min_8bit_size = self._check_min_8bit_size(min_8bit_size)
        self._init_maps()
        self._set_state_options(state_format, guard_lost_v)
        super().__init__(params, lr=lr, betas=betas, eps=eps, maximize=maximize,
                         hugepages=hugepages)

    # ---- which path -----------------------------------------------------------------------------
    def _is_8bit(self, p: torch.Tensor) -> bool:
        """8-bit state: what the parameter's state holds, or, before its first step, its size."""
        st = self.state.get(p)
        if st:
            return "state1" in st
        return p.dim() >= 1 and p.numel() >= self.min_8bit_size

    # ---- checks ---------------------------------------------------------------------------------
    def _check_dtype(self, label: str, p: torch.Tensor) -> None:
        if self._is_8bit(p):
            if p.dtype not in _DTYPES_8BIT:
                raise TypeError(f"{self._prefix()}: {label} has dtype {p.dtype}; its 8-bit state "
                                "steps float32, bfloat16 and float16 parameters")
        elif p.dtype != torch.float32:
            raise TypeError(
                f"{self._prefix()}: {label} has dtype {p.dtype} and {p.numel()} elements, under "
                f"min_8bit_size = {self.min_8bit_size}: it keeps float32 state, stepped by "
                "fusekit's LazyAdam, which takes float32 parameters only (lower min_8bit_size to "
                f"{p.numel()} for 8-bit state, or convert the parameter with .float())")

    def _check_state(self, w: _Work) -> None:
        """The state of a parameter that has one: its tensors' dtypes and shapes (checked in phase
        one, so that a bad one refuses the step before any parameter is written)."""
        st = self.state.get(w.param)
        if not st:
            return
        p = w.param
        label = self._label(w.group, w.index, p)
        self._check_state_format(label, self.param_groups[w.group], st)
        if "state1" not in st:
            if "exp_avg" not in st or "exp_avg_sq" not in st:
                raise ValueError(f"{self._prefix()}: the state of {label} has neither 8-bit state "
                                 "(state1, state2, absmax1, absmax2) nor float32 state (exp_avg, "
                                 f"exp_avg_sq): keys {sorted(st)}")
            self._check_float_state(w, st)
            return
        rows, cols, blocks = _layout(p)
        want = {"state1": (torch.uint8, tuple(p.shape)), "state2": (torch.uint8, tuple(p.shape))}
        if state_format_of(st) == "fp8":
            want.update(scale1=(torch.float32, (rows, blocks)),
                        scale2=(torch.float32, (rows, blocks)))
        else:
            want.update(absmax1=(torch.float32, (rows, blocks)),
                        absmax2=(torch.float32, (rows, blocks)),
                        qmap1=(torch.float32, (256,)), qmap2=(torch.float32, (256,)))
        for key, (dtype, shape) in want.items():
            t = st.get(key)
            if not isinstance(t, torch.Tensor) or t.dtype != dtype or tuple(t.shape) != shape \
                    or t.device.type != "cpu" or t.layout != torch.strided:
                got = (f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor)
                       else type(t).__name__)
                raise ValueError(f"{self._prefix()}: the 8-bit state of {label}: {key} must be a "
                                 f"CPU {dtype} tensor {list(shape)}, got {got}")

    # ---- state ----------------------------------------------------------------------------------
    def _packed_8bit(self, p: torch.Tensor, fp8: bool) -> Dict[str, torch.Tensor]:
        # The 8-bit state of one parameter, packed by row: m's codes and v's codes of a row side by
        # side in one [R, 2, D] table, and their absmax (fp8: scales) in one [R, 2, B] table;
        # state1/state2 and absmax1/absmax2 (scale1/scale2) are views of the two tables (of the
        # parameter's shape and [R, B]). A step then touches one cache line of codes and one of
        # absmax per row (D <= 32) instead of two each: docs/lazy_adam_quant.md#performance.
        # Zero-filled: every moment is 0 (in both formats).
        rows, cols, blocks = _layout(p)
        codes = self._zeros((rows, 2, cols), torch.uint8)
        per_block = self._zeros((rows, 2, blocks), torch.float32)
        k1, k2 = ("scale1", "scale2") if fp8 else ("absmax1", "absmax2")
        return {"state1": codes[:, 0, :].view(p.shape), "state2": codes[:, 1, :].view(p.shape),
                k1: per_block[:, 0, :], k2: per_block[:, 1, :]}

    def _init_8bit(self, p: torch.Tensor, state: Dict[str, Any], fp8: bool) -> None:
        state["step"] = 0
        state.update(self._packed_8bit(p, fp8))
        if not fp8:
            state["qmap1"] = self._qmap_m
            state["qmap2"] = self._qmap_v

    def state_bytes(self) -> int:
        """Bytes of optimizer state this optimizer holds now (codes, absmax and float32 moments;
        the shared maps counted once)."""
        total, seen = 0, set()
        for st in self.state.values():
            for t in st.values():
                if isinstance(t, torch.Tensor) and id(t) not in seen:
                    seen.add(id(t))
                    total += t.numel() * t.element_size()
        return total

    # load_state_dict (the base's) takes a state from state_dict() (after torch.save / torch.load
    # too), or a float32 one from fusekit.torch.SparseAdam or torch.optim.SparseAdam (those
    # parameters then go on with float32 state). The 8-bit tensors are checked, then copied bit for
    # bit onto this optimizer's own memory, packed by row.
    def _split_loaded_state(self, p: torch.Tensor, v: Dict[str, Any],
                            fail: Callable[[str], Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        if "state1" not in v:
            if p.dtype != torch.float32:
                fail("it is not 8-bit (no 'state1'); float32 state steps float32 parameters only")
            return super()._split_loaded_state(p, v, fail)
        if p.dim() < 1 or p.dtype not in _DTYPES_8BIT:
            fail(f"8-bit state needs a float32, bfloat16 or float16 parameter of at least one "
                 f"dimension, got {p.dtype} of {p.dim()} dimensions")
        fmt = state_format_of(v) or "dynamic_map"
        if fmt == "fp8" and any(k in v for k in ("absmax1", "absmax2", "qmap1", "qmap2")):
            fail("it holds both the fp8 format's scale1/scale2 and the dynamic map's absmax/qmap "
                 "keys: one format or the other")
        self._check_loaded_format(p, fmt, fail)
        keys = _KEYS_FP8 if fmt == "fp8" else _KEYS_8BIT
        for key in ("step",) + keys:
            if key not in v:
                fail(f"'{key}' is missing")
        rows, _, blocks = _layout(p)
        out: Dict[str, Any] = {"step": step_value(self._prefix(), fail, v["step"])}
        for key, dtype, n in (("state1", torch.uint8, p.numel()),
                              ("state2", torch.uint8, p.numel()),
                              ("absmax1", torch.float32, rows * blocks),
                              ("absmax2", torch.float32, rows * blocks),
                              ("scale1", torch.float32, rows * blocks),
                              ("scale2", torch.float32, rows * blocks),
                              ("qmap1", torch.float32, 256), ("qmap2", torch.float32, 256)):
            if key not in keys:
                continue
            t = v[key]
            if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.numel() != n \
                    or t.layout != torch.strided:
                got = (f"{t.dtype} of {t.numel()} elements" if isinstance(t, torch.Tensor)
                       else type(t).__name__)
                fail(f"{key} must be {dtype} of {n} elements, got {got}")
            out[key] = t
        for key in ("qmap1", "qmap2") if fmt == "dynamic_map" else ():
            a = out[key].detach().cpu().reshape(-1).numpy()
            if not np.all(np.isfinite(a)) or np.any(a[1:] < a[:-1]):
                fail(f"{key} must hold 256 finite floats in ascending order")
        return out, {kk: vv for kk, vv in v.items()
                     if kk not in _KEYS_8BIT + _KEYS_FP8 + ("step",)}

    def _own_state(self, p: torch.Tensor, s: Dict[str, Any]) -> Dict[str, Any]:
        if "state1" not in s:
            return super()._own_state(p, s)
        out: Dict[str, Any] = {"step": s["step"]}
        fp8 = "scale1" in s
        for key, dst in self._packed_8bit(p, fp8).items():  # whatever layout the saved one had
            out[key] = dst.copy_(s[key].detach().cpu().reshape(dst.shape))
        if not fp8:
            for key in ("qmap1", "qmap2"):
                out[key] = self._shared_map(s[key])
        return out

    # ---- the step -------------------------------------------------------------------------------
    def _prepare(self, gi: int, pi: int, group: Dict[str, Any], p: torch.Tensor) -> _Work:
        if not self._is_8bit(p):
            return super()._prepare(gi, pi, group, p)  # SparseAdam's, float32
        grad = p.grad
        assert grad is not None  # step() prepares the parameters that have one
        if not grad.is_sparse:
            raise RuntimeError(f"{self._prefix()}: {_DENSE_MESSAGE}")
        self._check_param(gi, pi, group, p)
        label = self._label(gi, pi, p)
        if grad.dtype not in (p.dtype, torch.float32):
            raise TypeError(f"{self._prefix()}: the gradient of {label} has dtype {grad.dtype}; "
                            f"the 8-bit step takes the parameter's dtype ({p.dtype}) or float32")
        if tuple(grad.shape) != tuple(p.shape):
            raise ValueError(f"{self._prefix()}: the gradient of {label} has shape "
                             f"{list(grad.shape)}")
        if grad.sparse_dim() != 1:
            raise ValueError(f"{self._prefix()}: the gradient of {label} has sparse_dim "
                             f"{grad.sparse_dim()}; the 8-bit state is kept per row of the first "
                             "dimension, so the gradient must index rows (sparse_dim 1, as "
                             "nn.Embedding and nn.EmbeddingBag make it); nothing was modified")
        rows, cols, _ = _layout(p)
        values = grad._values()
        n = values.shape[0]
        if values.numel() == 0:
            return _Work(gi, pi, p, None, None, rows, cols)
        values = values.reshape(n, cols)
        if cols > 1 and values.stride(1) != 1:
            values = values.contiguous()
        return _Work(gi, pi, p, grad._indices()[0], values, rows, cols)

    def _init_state(self, p: torch.Tensor, state: Dict[str, Any]) -> None:
        if self._is_8bit(p):  # before the state exists: by size; kept after
            self._init_8bit(p, state, self._group_format_of(p) == "fp8")
        else:
            super()._init_state(p, state)

    def _step_param(self, w: _Work, state: Dict[str, Any], values: torch.Tensor,
                    step_size: float, hp: Hyper) -> Any:
        if "state1" in state:
            return self._run_8bit(w, state, values, step_size, hp)
        return self._run(w, state, values, step_size, hp)

    def _run_8bit(self, w: _Work, state: Dict[str, Any], values: torch.Tensor, step_size: float,
                  hp: Hyper) -> Any:
        rows, cols, blocks = _layout(w.param)
        shapes = [(rows, cols)] * 3 + [(rows, blocks)] * 2
        fp8 = "scale1" in state
        k1, k2 = ("scale1", "scale2") if fp8 else ("absmax1", "absmax2")
        tensors = [w.param.data, state["state1"], state["state2"], state[k1], state[k2]]
        views, back = [], []
        for t, (r, c) in zip(tensors, shapes):
            v = _rows(t, r, c)
            if v is None:  # no [R, D] view (a transposed parameter): step a copy, copy it back
                v = t.contiguous().view(r, c)
                back.append((t, v))
            views.append(v)
        var, m, v, am, av = views
        assert w.indices is not None
        # The plans' integer attributes (fusekit.STATE_FORMATS): 0 the dynamic maps, 1 fp8 (whose
        # guard is always on).
        guard = fp8 or bool(self.param_groups[w.group]["guard_lost_v"])
        attrs: Dict[str, Any] = dict(beta1=hp.beta1, beta2=hp.beta2, eps=hp.eps,
                                     state_format=1 if fp8 else 0, guard_lost_v=int(guard))
        qmap1, qmap2 = (self._no_map, self._no_map) if fp8 else (state["qmap1"], state["qmap2"])
        st = self._plans.run(id(w.param), fusekit.LazyAdamQuantPlan,
                             (values, w.indices, m, v, var, qmap1, qmap2, am, av),
                             attrs, (hp.beta1, hp.beta2, hp.eps, fp8, guard, values.shape[0],
                                     w.indices.dtype), 0, step_size)
        for t, c in back:
            t.copy_(c.view(t.shape))
        return st
