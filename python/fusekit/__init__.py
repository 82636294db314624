"""fusekit: fused operators for training and serving on CPUs.

Array-level functions, framework-neutral: every array argument is any object that speaks DLPack
or the buffer protocol (NumPy arrays, torch CPU tensors), used in place without a copy. Outputs
are written in place; each function returns the stats the C++ API returns. A refused call raises
:class:`fusekit.Error` (a ``ValueError``) with the library's message, and modifies nothing.

- :func:`lazy_adam`: one Adam step on the rows of a table that a batch touched.
- :func:`lazy_adam_quant`: the same step with 8-bit block-wise m and v (fusekit's own operator).
- :func:`adam_w`: one AdamW step on float32 moments.
- :func:`apply_adam_w_quant`: one AdamW step on 8-bit block-wise quantized moments.
- :func:`add_lora`: multi-adapter LoRA: ``y[i] += scale * x[i] @ A[idx[i]].T @ B[idx[i]].T``.
- :func:`create_dynamic_map`: the 256-entry dynamic quantization map of the 8-bit moments.

Each function plans and runs once. To step the same arrays (or arrays of the same layouts) many
times, plan once and run many times: ``plan = fusekit.AdamWPlan((var, grad, m, v),
dict(weight_decay=0.01))``, then ``plan.run((var, grad, m, v), step=k, lr=1e-3)`` per step (the
tensors in the order the function takes them, AddLora's ``out`` last; the attributes by keyword
name; ``step`` and ``lr`` per run). ``plan.implementation`` names what runs.

PyTorch optimizers and ops are in :mod:`fusekit.torch` (imported on demand; this package needs
only NumPy). Threads: :func:`set_num_threads`, else ``OMP_NUM_THREADS``, else the CPUs this
process may run on; results are bitwise identical for every thread count.
"""

from __future__ import annotations

from typing import Optional

from . import _fusekit
from ._fusekit import (  # noqa: F401  (re-exported)
    AddLoraPlan,
    AddLoraStats,
    AdamWPlan,
    AdamWStats,
    ApplyAdamWQuantPlan,
    ApplyAdamWQuantStats,
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
    "adam_w",
    "apply_adam_w_quant",
    "add_lora",
    "LazyAdamPlan",
    "LazyAdamQuantPlan",
    "AdamWPlan",
    "ApplyAdamWQuantPlan",
    "AddLoraPlan",
    "create_dynamic_map",
    "quant_blocks",
    "implementations",
    "set_num_threads",
    "get_num_threads",
    "empty_host",
    "huge_page_backed_bytes",
    "BLOCK_SIZE",
]

#: Elements per absmax block of the 8-bit moments (the only size the operator takes).
BLOCK_SIZE = 256


def lazy_adam(gradient, indices, m, v, var, lr: float, *, beta1: float = 0.9, beta2: float = 0.999,
              epsilon: float = 1e-7, num_threads: int = 0,
              implementation: Optional[str] = None) -> LazyAdamStats:
    """One LazyAdam step, in place on ``m``, ``v`` and ``var`` (float32 [R, D]).

    ``gradient`` float32 [N, D]; ``indices`` int32 or int64 [N] (negative: padding; >= R: refused
    before anything is written; duplicates summed in order of occurrence). ``lr`` is the
    bias-corrected rate ``lr * sqrt(1 - beta2**t) / (1 - beta1**t)``; the update is
    ``m = m*beta1 + g*(1-beta1)``, ``v = |v*beta2 + g*g*(1-beta2)|``,
    ``var += (m * -lr) / (sqrt(v) + epsilon)`` in float32. A row whose summed gradient is not
    finite is left unchanged and counted. Returns :class:`LazyAdamStats`.
    """
    return _fusekit.lazy_adam((gradient, indices, m, v, var),
                              dict(beta1=beta1, beta2=beta2, epsilon=epsilon), int(num_threads),
                              implementation, 0, float(lr))


def lazy_adam_quant(gradient, indices, m, v, var, qmap_m, qmap_v, absmax_m, absmax_v, lr: float,
                    *, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-7,
                    num_threads: int = 0,
                    implementation: Optional[str] = None) -> LazyAdamQuantStats:
    """One LazyAdam step with 8-bit moments, in place on the touched rows of ``m``, ``v`` (uint8
    codes [R, D]), ``absmax_m``, ``absmax_v`` (float32 [R, ceil(D / 256)]) and ``var`` (float32,
    float16 or bfloat16 [R, D]).

    ``gradient`` [N, D] in var's dtype or float32; ``indices`` as for :func:`lazy_adam`;
    ``qmap_m``/``qmap_v``: :func:`create_dynamic_map` (signed / unsigned). Per touched row:
    dequantize, LazyAdam's float32 update (``lr`` already bias-corrected), requantize with
    ApplyAdamWQuant's nearest-code rule. See docs/lazy_adam_quant.md. Returns
    :class:`LazyAdamQuantStats`.
    """
    return _fusekit.lazy_adam_quant(
        (gradient, indices, m, v, var, qmap_m, qmap_v, absmax_m, absmax_v),
        dict(beta1=beta1, beta2=beta2, epsilon=epsilon), int(num_threads), implementation, 0,
        float(lr))


def adam_w(var, grad, m, v, step: int, *, lr: float = 1e-3, beta1: float = 0.9,
           beta2: float = 0.999, weight_decay: float = 0.0, eps: float = 1e-8,
           gnorm_scale: float = 1.0, num_threads: int = 0,
           implementation: Optional[str] = None) -> AdamWStats:
    """One AdamW step on float32 moments, in place on ``var``, ``m`` and ``v``.

    ``var`` and ``grad``: float32, float16 or bfloat16, the same shape; ``m``, ``v``: float32 of
    that shape. ``step`` counts from 0 (t = step + 1). The arithmetic is ApplyAdamWQuant's:
    ``var += (m * -lr*c2s/c1) / (sqrt(v) + eps*c2s)``, then ``var *= 1 - lr*weight_decay``
    (decay after the step). Elements whose result would not be finite are left unchanged and
    counted. Returns :class:`AdamWStats`.
    """
    return _fusekit.adam_w((var, grad, m, v),
                           dict(beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps,
                                gnorm_scale=gnorm_scale), int(num_threads), implementation,
                           int(step), float(lr))


def apply_adam_w_quant(var, grad, m, v, qmap_m, qmap_v, absmax_m, absmax_v, step: int, *,
                       lr: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999,
                       weight_decay: float = 0.0, eps: float = 1e-8, gnorm_scale: float = 1.0,
                       block_size: int = BLOCK_SIZE, num_threads: int = 0,
                       implementation: Optional[str] = None) -> ApplyAdamWQuantStats:
    """One AdamW step on 8-bit block-wise moments, in place.

    ``var``, ``grad``: float32, float16 or bfloat16, n elements; ``m``, ``v``: uint8 codes of
    var's shape; ``qmap_m``, ``qmap_v``: float32 [256] (:func:`create_dynamic_map`); ``absmax_m``,
    ``absmax_v``: float32 [ceil(n / 256)]. ``step`` counts from 0. See docs/apply_adam_w_quant.md.
    Returns :class:`ApplyAdamWQuantStats`.
    """
    return _fusekit.apply_adam_w_quant(
        (var, grad, m, v, qmap_m, qmap_v, absmax_m, absmax_v),
        dict(beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps,
             gnorm_scale=gnorm_scale, block_size=block_size), int(num_threads), implementation,
        int(step), float(lr))


def add_lora(y, x, weight_b, indices, weight_a=None, *, out=None, layer_idx: int = 0,
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


def create_dynamic_map(signed: bool = True, max_exponent_bits: int = 7):
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


def empty_host(nbytes: int, huge_pages: bool = True):
    """A NumPy uint8 array of ``nbytes`` on fusekit's host memory: 2 MiB-aligned and advised for
    transparent huge pages when ``huge_pages`` and ``nbytes >= 2 MiB``; freed with its last view.
    (Tables stepped at random rows run about twice as fast on huge pages.)"""
    return _fusekit.empty_host(int(nbytes), bool(huge_pages))


def huge_page_backed_bytes(array) -> int:
    """How many bytes of ``array``'s memory the kernel backs with huge pages now (-1: unknown)."""
    if hasattr(array, "data_ptr"):
        address, nbytes = array.data_ptr(), array.numel() * array.element_size()
    else:
        address, nbytes = array.__array_interface__["data"][0], array.nbytes
    return _fusekit.huge_page_backed_bytes(int(address), int(nbytes))
