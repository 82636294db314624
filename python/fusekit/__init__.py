"""fusekit: fused operators for training and serving on CPUs.

Array-level functions, framework-neutral: every array argument is any object that speaks DLPack
or the buffer protocol (NumPy arrays, torch CPU tensors), used in place without a copy. Outputs
are written in place; each function returns the stats the C++ API returns. A refused call raises
:class:`fusekit.Error` (a ``ValueError``) with the library's message, and modifies nothing.

- :func:`lazy_adam`: one Adam step on the rows of a table that a batch touched.
- :func:`lazy_adam_quant`: the same step with 8-bit block-wise m and v (fusekit's own operator).
- :func:`embedding_bag_lazy_adam`: an embedding bag's backward fused with that step: the rows of
  the bags' lookups updated from the gradient of the pooled output (no per-lookup gradient).
- :func:`adam_w`: one AdamW step on float32 moments.
- :func:`apply_adam_w_quant`: one AdamW step on 8-bit block-wise quantized moments.
- :func:`add_lora`: multi-adapter LoRA: ``y[i] += scale * x[i] @ A[idx[i]].T @ B[idx[i]].T``.
- :func:`create_dynamic_map`: the 256-entry dynamic quantization map of the 8-bit moments.

The optimizer functions speak one language: the parameter first, then its gradient (and, for
the sparse ones, the indices of its rows), then the state; the rest by keyword: ``step`` (the
steps taken before this one, from 0: t = step + 1; required), ``lr`` (the raw learning rate,
bias-corrected inside for every function), ``beta1``, ``beta2``, ``eps``. A refused call's
message names the Python arguments (``m``, ``weight_decay``), not the aclnn ones.

Each function plans and runs once. To step the same arrays (or arrays of the same layouts) many
times, plan once and run many times: ``plan = fusekit.AdamWPlan((var, grad, m, v),
dict(weight_decay=0.01))``, then ``plan.run((var, grad, m, v), step=k, lr=1e-3)`` per step (the
tensors in the order of the operator's C++ Tensors struct: the functions' order for AdamW and
ApplyAdamWQuant, gradient first for the lazy ones, ``(grad, indices, m, v, var, ...)``, and
AddLora's ``out`` last; the attributes by keyword name; ``step`` and ``lr`` per run).
``plan.implementation`` names what runs. The plans take the operator's own per-run scalars:
``LazyAdamPlan.run`` and ``LazyAdamQuantPlan.run`` take the bias-corrected rate (give them
``bias_corrected_lr(lr, step, beta1, beta2)``), the AdamW plans ``step`` and the raw ``lr``.

PyTorch optimizers and ops are in :mod:`fusekit.torch` (imported on demand; this package needs
only NumPy). Threads: :func:`set_num_threads`, else ``OMP_NUM_THREADS``, else the CPUs this
process may run on; results are bitwise identical for every thread count.
"""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING, Any, Optional, Tuple

if TYPE_CHECKING:
    import numpy as np

#: An array argument: anything that speaks DLPack or the buffer protocol (NumPy arrays, torch CPU
#: tensors).
Array = Any

from . import _fusekit
from ._fusekit import (  # noqa: F401  (re-exported)
    AddLoraPlan,
    AddLoraStats,
    AdamWPlan,
    AdamWStats,
    ApplyAdamWQuantPlan,
    ApplyAdamWQuantStats,
    EmbeddingBagLazyAdamPlan,
    EmbeddingBagLazyAdamQuantPlan,
    EmbeddingBagLazyAdamStats,
    Error,
    LazyAdamPlan,
    LazyAdamQuantPlan,
    LazyAdamQuantStats,
    LazyAdamStats,
    NoImplementationError,
)

__version__: str = _fusekit.__version__

__all__ = [
    "__version__",
    "Error",
    "NoImplementationError",
    "lazy_adam",
    "lazy_adam_quant",
    "embedding_bag_lazy_adam",
    "embedding_bag_lazy_adam_quant",
    "bias_corrected_lr",
    "adam_w",
    "apply_adam_w_quant",
    "add_lora",
    "LazyAdamPlan",
    "LazyAdamQuantPlan",
    "AdamWPlan",
    "ApplyAdamWQuantPlan",
    "AddLoraPlan",
    "EmbeddingBagLazyAdamPlan",
    "EmbeddingBagLazyAdamQuantPlan",
    "create_dynamic_map",
    "quant_blocks",
    "implementations",
    "set_num_threads",
    "get_num_threads",
    "empty_host",
    "huge_page_backed_bytes",
    "BLOCK_SIZE",
    "STATE_FORMATS",
    "SPARSE_STATE_FORMATS",
    "POOLING_MODES",
]

#: Elements per absmax block of the 8-bit moments (the only size the operator takes).
BLOCK_SIZE = 256

#: The 8-bit optimizers' state formats (docs/fp8_state.md): "dynamic_map", codes into the 256-entry
#: maps (bitsandbytes' format, the default); "fp8", m as E4M3 and sqrt(v) as UE4M4 with one scale
#: per block (no maps: pass ``None`` for ``qmap_m`` and ``qmap_v``); "fp8_ue3m5", the same with
#: sqrt(v) as UE3M5 (half UE4M4's rounding error, a range of 2^12 instead of 2^19: for dense
#: layers; :func:`apply_adam_w_quant` only).
STATE_FORMATS = ("dynamic_map", "fp8", "fp8_ue3m5")

#: The formats of the row-wise (lazy) 8-bit optimizers, whose rows are embedding rows: no
#: "fp8_ue3m5" (an embedding table's moments span more decades than UE3M5 holds).
SPARSE_STATE_FORMATS = ("dynamic_map", "fp8")


def _state_attrs(fn: str, state_format: str, guard_lost_v: bool,
                 formats: Tuple[str, ...] = SPARSE_STATE_FORMATS) -> dict:
    """The binding's attributes for a state format (one of ``formats``) and the lost-v guard, or
    a refusal naming the argument."""
    if state_format not in formats:
        raise _refuse(f"{fn}: state_format = {state_format!r} must be one of {formats}")
    return dict(state_format=STATE_FORMATS.index(state_format), guard_lost_v=int(bool(guard_lost_v)))


def _maps(state_format: str, qmap_m: Optional[Array], qmap_v: Optional[Array]) -> tuple:
    """The maps to hand the operator: as given, or empty ones for the fp8 formats' None."""
    if state_format != "dynamic_map":
        import numpy as np
        empty = np.empty(0, np.float32)
        return (empty if qmap_m is None else qmap_m, empty if qmap_v is None else qmap_v)
    return qmap_m, qmap_v


def _refuse(message: str) -> Error:
    """A fusekit.Error raised by the wrapper itself, with the invalid-argument code."""
    e = Error(message)
    e.code = 161002  # ACLNN_ERR_PARAM_INVALID, as the C++ checks give it
    return e


def _step(fn: str, step: int) -> int:
    """``step`` as an int in [0, 2^62), else refused before anything is written."""
    if type(step) is int and 0 <= step < 2**62:  # the usual case, first
        return step
    try:
        s = operator.index(step)
    except TypeError:
        raise _refuse(f"{fn}: step must be an integer (the steps taken before this one, from 0), "
                      f"got {type(step).__name__}") from None
    if isinstance(step, bool) or not 0 <= s < 2**62:
        raise _refuse(f"{fn}: step = {step!r} must be in [0, 2^62) (it counts from 0: "
                      "t = step + 1); nothing was modified")
    return s


def bias_corrected_lr(lr: float, step: int, beta1: float = 0.9, beta2: float = 0.999) -> float:
    """The bias-corrected rate the LazyAdam operators take: ``lr * sqrt(1 - beta2**t) /
    (1 - beta1**t)`` with ``t = step + 1``, in Python float (float64); the operator rounds it to
    float32. This is torch.optim.SparseAdam's step size, computed with the same arithmetic as
    :class:`fusekit.torch.SparseAdam` (``bias_correction1 = 1 - beta1 ** t``,
    ``bias_correction2 = 1 - beta2 ** t``, ``lr * math.sqrt(bias_correction2) /
    bias_correction1``). NaN where that is not a number (a beta outside [0, 1), which the operator
    then refuses by name)."""
    t = int(step) + 1
    try:
        bias_correction1 = 1 - float(beta1) ** t
        bias_correction2 = 1 - float(beta2) ** t
        return float(lr) * math.sqrt(bias_correction2) / bias_correction1
    except (ValueError, ZeroDivisionError, OverflowError):
        return math.nan


def lazy_adam(var: Array, grad: Array, indices: Array, m: Array, v: Array, *, step: int, lr: float = 1e-3, beta1: float = 0.9,
              beta2: float = 0.999, eps: float = 1e-8, num_threads: int = 0,
              implementation: Optional[str] = None) -> LazyAdamStats:
    """One LazyAdam step (torch.optim.SparseAdam's), in place on the rows of ``var``, ``m`` and
    ``v`` (float32 [R, D]) that ``indices`` names.

    ``grad`` float32 [N, D]: the gradient rows; ``indices`` int32 or int64 [N] (negative: padding;
    >= R: refused before anything is written; duplicates summed in order of occurrence). ``step``
    counts from 0 (t = step + 1); ``lr`` is the raw learning rate: the wrapper passes the operator
    the bias-corrected rate ``lr_t = lr * sqrt(1 - beta2**t) / (1 - beta1**t)`` (computed in
    float64 by :func:`bias_corrected_lr`, rounded to float32). Per touched row, in float32:
    ``m = m*beta1 + g*(1-beta1)``, ``v = |v*beta2 + g*g*(1-beta2)|``,
    ``var += (m * -lr_t) / (sqrt(v) + eps)``. A row whose summed gradient is not finite is left
    unchanged and counted. Returns :class:`LazyAdamStats`.
    """
    fn = "fusekit.lazy_adam"
    lr_t = bias_corrected_lr(lr, _step(fn, step), beta1, beta2)
    return _fusekit.lazy_adam((grad, indices, m, v, var),
                              dict(beta1=beta1, beta2=beta2, eps=eps), int(num_threads),
                              implementation, 0, lr_t)


def lazy_adam_quant(var: Array, grad: Array, indices: Array, m: Array, v: Array, qmap_m: Optional[Array], qmap_v: Optional[Array], absmax_m: Array, absmax_v: Array, *, step: int,
                    lr: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999,
                    eps: float = 1e-8, state_format: str = "dynamic_map",
                    guard_lost_v: bool = False, num_threads: int = 0,
                    implementation: Optional[str] = None) -> LazyAdamQuantStats:
    """One LazyAdam step with 8-bit moments, in place on the touched rows of ``var`` (float32,
    float16 or bfloat16 [R, D]), ``m``, ``v`` (uint8 codes [R, D]), ``absmax_m`` and
    ``absmax_v`` (float32 [R, ceil(D / 256)]).

    ``grad`` [N, D] in var's dtype or float32; ``indices`` as for :func:`lazy_adam`;
    ``qmap_m``/``qmap_v``: :func:`create_dynamic_map` (signed / unsigned). ``step`` and ``lr``
    as for :func:`lazy_adam` (the raw rate; the operator gets the bias-corrected one). Per touched
    row: dequantize, LazyAdam's float32 update, requantize with ApplyAdamWQuant's nearest-code
    rule. See docs/lazy_adam_quant.md. ``state_format="fp8"``: m as E4M3 and sqrt(v) as UE4M4,
    ``absmax_m``/``absmax_v`` hold the blocks' scales, the maps are None (docs/fp8_state.md);
    ``guard_lost_v``: the lost-v guard in the dynamic-map format (always on in fp8). Returns
    :class:`LazyAdamQuantStats`.
    """
    fn = "fusekit.lazy_adam_quant"
    attrs = _state_attrs(fn, state_format, guard_lost_v)
    qmap_m, qmap_v = _maps(state_format, qmap_m, qmap_v)
    lr_t = bias_corrected_lr(lr, _step(fn, step), beta1, beta2)
    return _fusekit.lazy_adam_quant(
        (grad, indices, m, v, var, qmap_m, qmap_v, absmax_m, absmax_v),
        dict(beta1=beta1, beta2=beta2, eps=eps, **attrs), int(num_threads), implementation, 0,
        lr_t)


#: The pooling modes of :func:`embedding_bag_lazy_adam` (``mode``), in the binding's numbering.
POOLING_MODES = ("sum", "mean")


def _pooling(fn: str, mode: str) -> int:
    if mode not in POOLING_MODES:
        raise _refuse(f"{fn}: mode = {mode!r} must be one of {POOLING_MODES}")
    return POOLING_MODES.index(mode)


def embedding_bag_lazy_adam(var: Array, grad_output: Array, indices: Array, offsets: Array,
                            m: Array, v: Array, *, per_sample_weights: Optional[Array] = None,
                            mode: str = "sum", step: int, lr: float = 1e-3, beta1: float = 0.9,
                            beta2: float = 0.999, eps: float = 1e-8, num_threads: int = 0,
                            implementation: Optional[str] = None) -> EmbeddingBagLazyAdamStats:
    """An embedding bag's backward fused with one LazyAdam step, in place on the rows of ``var``,
    ``m`` and ``v`` (float32 [R, D]) that the bags look up; no gradient of the table and no
    per-lookup gradient is made.

    ``grad_output`` float32 [B, D]: the gradient of the pooled output; ``indices`` int32 or int64
    [L]; ``offsets`` int32 or int64 [B + 1] (TorchRec's form: bag b is ``indices[offsets[b] :
    offsets[b + 1]]``, ``offsets[0] = 0``, ``offsets[B] = L``); ``per_sample_weights`` float32 [L]
    or None; ``mode`` the forward's pooling, "sum" or "mean". Row r's gradient is the sum, in order
    of occurrence, of ``grad_output[b_i] * c_i`` over its lookups i, ``c_i = s_b * w_i`` (``s_b``
    = 1, or ``1 / len(bag b)`` in float32 for mean; ``w_i`` the weight, or 1); then LazyAdam's
    step with the bias-corrected rate (``step``, ``lr`` as for :func:`lazy_adam`). An id < 0 or
    >= R and offsets that do not describe the bags are refused before anything is written. B and
    L may change from call to call: :class:`EmbeddingBagLazyAdamPlan` is made for the table and
    runs any batch. See docs/embedding_bag_lazy_adam.md. Returns
    :class:`EmbeddingBagLazyAdamStats`.
    """
    fn = "fusekit.embedding_bag_lazy_adam"
    attrs = dict(beta1=beta1, beta2=beta2, eps=eps, mode=_pooling(fn, mode))
    lr_t = bias_corrected_lr(lr, _step(fn, step), beta1, beta2)
    return _fusekit.embedding_bag_lazy_adam(
        (grad_output, indices, offsets, per_sample_weights, m, v, var), attrs, int(num_threads),
        implementation, 0, lr_t)


def embedding_bag_lazy_adam_quant(var: Array, grad_output: Array, indices: Array, offsets: Array,
                                  m: Array, v: Array, qmap_m: Optional[Array],
                                  qmap_v: Optional[Array], absmax_m: Array, absmax_v: Array, *,
                                  per_sample_weights: Optional[Array] = None, mode: str = "sum",
                                  step: int, lr: float = 1e-3, beta1: float = 0.9,
                                  beta2: float = 0.999, eps: float = 1e-8,
                                  state_format: str = "dynamic_map", guard_lost_v: bool = False,
                                  num_threads: int = 0,
                                  implementation: Optional[str] = None) -> EmbeddingBagLazyAdamStats:
    """The 8-bit twin of :func:`embedding_bag_lazy_adam`: an embedding bag's backward fused with one
    :func:`lazy_adam_quant` step, in place on the rows of ``var`` (float32, float16 or bfloat16
    [R, D]), ``m``, ``v`` (uint8 codes [R, D]), ``absmax_m`` and ``absmax_v`` (float32
    [R, ceil(D / 256)]) that the bags look up.

    The batch (``grad_output``, ``indices``, ``offsets``, ``per_sample_weights``, ``mode``) as for
    :func:`embedding_bag_lazy_adam`; the state, the maps, ``state_format`` and ``guard_lost_v`` as
    for :func:`lazy_adam_quant` (``state_format="fp8"``: the maps are None). Row r's gradient is
    :func:`embedding_bag_lazy_adam`'s, then LazyAdamQuant's row step with the bias-corrected rate.
    See docs/embedding_bag_lazy_adam_quant.md. Returns :class:`EmbeddingBagLazyAdamStats`.
    """
    fn = "fusekit.embedding_bag_lazy_adam_quant"
    attrs = dict(beta1=beta1, beta2=beta2, eps=eps, mode=_pooling(fn, mode),
                 **_state_attrs(fn, state_format, guard_lost_v))
    qmap_m, qmap_v = _maps(state_format, qmap_m, qmap_v)
    lr_t = bias_corrected_lr(lr, _step(fn, step), beta1, beta2)
    return _fusekit.embedding_bag_lazy_adam_quant(
        (grad_output, indices, offsets, per_sample_weights, m, v, var, qmap_m, qmap_v, absmax_m,
         absmax_v), attrs, int(num_threads), implementation, 0, lr_t)


def adam_w(var: Array, grad: Array, m: Array, v: Array, *, step: int, lr: float = 1e-3, beta1: float = 0.9,
           beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0,
           gnorm_scale: float = 1.0, num_threads: int = 0,
           implementation: Optional[str] = None) -> AdamWStats:
    """One AdamW step on float32 moments, in place on ``var``, ``m`` and ``v``.

    ``var`` and ``grad``: float32, float16 or bfloat16, the same shape; ``m``, ``v``: float32 of
    that shape. ``step`` counts from 0 (t = step + 1); ``lr`` is the raw learning rate (the
    operator applies the bias correction). The arithmetic is ApplyAdamWQuant's:
    ``var += (m * -lr*c2s/c1) / (sqrt(v) + eps*c2s)``, then ``var *= 1 - lr*weight_decay``
    (decay after the step). Elements whose result would not be finite are left unchanged and
    counted. Returns :class:`AdamWStats`.
    """
    return _fusekit.adam_w((var, grad, m, v),
                           dict(beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps,
                                gnorm_scale=gnorm_scale), int(num_threads), implementation,
                           _step("fusekit.adam_w", step), float(lr))


def apply_adam_w_quant(var: Array, grad: Array, m: Array, v: Array, qmap_m: Optional[Array], qmap_v: Optional[Array], absmax_m: Array, absmax_v: Array, *, step: int,
                       lr: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999,
                       eps: float = 1e-8, weight_decay: float = 0.0, gnorm_scale: float = 1.0,
                       block_size: int = BLOCK_SIZE, state_format: str = "dynamic_map",
                       guard_lost_v: bool = False, num_threads: int = 0,
                       implementation: Optional[str] = None) -> ApplyAdamWQuantStats:
    """One AdamW step on 8-bit block-wise moments, in place.

    ``var``, ``grad``: float32, float16 or bfloat16, n elements; ``m``, ``v``: uint8 codes of
    var's shape; ``qmap_m``, ``qmap_v``: float32 [256] (:func:`create_dynamic_map`); ``absmax_m``,
    ``absmax_v``: float32 [ceil(n / 256)]. ``step`` counts from 0; ``lr`` is the raw learning rate,
    as for :func:`adam_w`. See docs/apply_adam_w_quant.md. ``state_format="fp8"``: m as E4M3 and
    sqrt(v) as UE4M4, ``absmax_m``/``absmax_v`` hold the blocks' scales, the maps are None
    (docs/fp8_state.md); ``"fp8_ue3m5"``: the same with sqrt(v) as UE3M5; ``guard_lost_v``: the
    lost-v guard in the dynamic-map format (always on in the fp8 formats). Returns
    :class:`ApplyAdamWQuantStats`.
    """
    fn = "fusekit.apply_adam_w_quant"
    attrs = _state_attrs(fn, state_format, guard_lost_v, STATE_FORMATS)
    qmap_m, qmap_v = _maps(state_format, qmap_m, qmap_v)
    return _fusekit.apply_adam_w_quant(
        (var, grad, m, v, qmap_m, qmap_v, absmax_m, absmax_v),
        dict(beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps,
             gnorm_scale=gnorm_scale, block_size=block_size, **attrs), int(num_threads),
        implementation, _step(fn, step), float(lr))


def add_lora(y: Array, x: Array, weight_b: Array, indices: Array,
             weight_a: Optional[Array] = None, *, out: Optional[Array] = None, layer_idx: int = 0,
             scale: float = 1.0, y_offset: int = 0, y_slice_size: Optional[int] = None,
             num_threads: int = 0, implementation: Optional[str] = None) -> AddLoraStats:
    """Multi-adapter LoRA, written to ``out`` (default: ``y`` itself, in place).

    ``y`` [B, H3]; ``x`` [B, H1]; ``weight_b`` [W, L, H2, R]; ``weight_a`` [W, L, R, H1] or None
    (then x is already ``x @ A.T``, [B, R]); ``indices`` int32 or int64 [B], -1 (or W) for "no
    adapter". Row i gets ``y[i, y_offset:y_offset+H2] += scale * (x[i] @ A.T) @ B.T`` with its
    adapter's A and B at ``layer_idx``, accumulated in float32. float16, bfloat16 or float32.
    Returns :class:`AddLoraStats`.
    """
    return _fusekit.add_lora((y, x, weight_b, indices, weight_a, y if out is None else out),
                             dict(layer_idx=layer_idx, scale=scale, y_offset=y_offset,
                                  y_slice_size=-1 if y_slice_size is None else y_slice_size),
                             int(num_threads), implementation, 0, 0.0)


def create_dynamic_map(signed: bool = True, max_exponent_bits: int = 7) -> "np.ndarray":
    """The 256-entry dynamic quantization map (bitsandbytes' ``create_dynamic_map``) as a NumPy
    float32 array: signed for m, unsigned (``signed=False``) for v."""
    return _fusekit.create_dynamic_map(bool(signed), int(max_exponent_bits))


def quant_blocks(numel: int, block_size: int = BLOCK_SIZE) -> int:
    """The number of absmax entries a tensor of ``numel`` elements needs."""
    return (int(numel) + block_size - 1) // block_size


def implementations(op: str) -> list:
    """The implementations of an operator built here, in the order a call tries them."""
    return _fusekit.implementations(op)


def set_num_threads(n: int) -> None:
    """Threads for every later call (n <= 0: back to OMP_NUM_THREADS, else the CPUs allowed)."""
    _fusekit.set_num_threads(int(n))


def get_num_threads() -> int:
    """The thread count a call made now would use."""
    return _fusekit.get_num_threads()


def empty_host(nbytes: int, hugepages: bool = True) -> "np.ndarray":
    """A NumPy uint8 array of ``nbytes`` on fusekit's host memory: 2 MiB-aligned and advised for
    transparent huge pages when ``hugepages`` and ``nbytes >= 2 MiB``; freed with its last view.
    (Tables stepped at random rows run about twice as fast on huge pages.)"""
    return _fusekit.empty_host(int(nbytes), bool(hugepages))


def huge_page_backed_bytes(array: Array) -> int:
    """How many bytes of ``array``'s memory the kernel backs with huge pages now (-1: unknown)."""
    if hasattr(array, "data_ptr"):
        address, nbytes = array.data_ptr(), array.numel() * array.element_size()
    else:
        address, nbytes = array.__array_interface__["data"][0], array.nbytes
    return _fusekit.huge_page_backed_bytes(int(address), int(nbytes))
