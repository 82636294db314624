"""fusekit for TensorFlow: LazyAdam as TensorFlow ops and as Keras optimizers (docs/tensorflow.md).

- :func:`op_library_path`: the op library for ``tf.load_op_library``. It registers Rec SDK's
  (mx_rec's) op ``LazyAdam`` with its exact signature and a real CPU kernel (fusekit's LazyAdam,
  in place on TF1 ref variables, registered with a priority above mx_rec's CPU stub), and
  ``FusekitResourceSparseApplyLazyAdam`` for resource variables (TensorFlow's locking conventions
  for sparse applies).
- :func:`load`: the loaded library (once per process); :func:`lazy_adam` and
  :func:`resource_sparse_apply_lazy_adam` call its ops.
- :class:`LazyAdam`: a Keras 3 optimizer that updates only the rows of an ``IndexedSlices``
  gradient (and is ``keras.optimizers.Adam`` on dense gradients).
- :mod:`fusekit.tensorflow.legacy`: ``LazyAdam`` for tf_keras' legacy optimizers.
- :class:`LazyAdam8bit`: :class:`LazyAdam` with 8-bit moments for its tables (fusekit's
  LazyAdamQuant, ``FusekitResourceSparseApplyLazyAdamQuant``,
  :func:`resource_sparse_apply_lazy_adam_quant`): ``2 dim + 8 ceil(dim / 256)`` bytes of state per
  table row instead of ``8 dim``, in either state format (``state_format="dynamic_map"`` or
  ``"fp8"``, docs/fp8_state.md).

The op library is built with the package when the build's Python imports TensorFlow
(``-DFUSEKIT_TENSORFLOW=ON``, or ``AUTO`` as ``pip install --no-build-isolation .`` asks), and
works only with the TensorFlow minor version it was built against.
"""

from __future__ import annotations

import os
import types
from typing import Any, Optional, Tuple

_HERE = os.path.dirname(os.path.abspath(__file__))
_LIBRARY = os.path.join(_HERE, "_fusekit_tf_ops.so")

if not os.path.exists(_LIBRARY):
    raise ImportError(
        "fusekit.tensorflow: the op library _fusekit_tf_ops.so was not built with this copy of "
        f"fusekit ({_HERE}). Build it with TensorFlow importable by the build's Python: "
        "cmake -DFUSEKIT_PYTHON=ON -DFUSEKIT_TENSORFLOW=ON -DPython_EXECUTABLE=<python with "
        "tensorflow> (then PYTHONPATH=<build>/python), or pip install --no-build-isolation . in "
        "that environment. See docs/tensorflow.md.")

import tensorflow as tf  # noqa: E402

from fusekit import SPARSE_STATE_FORMATS as _STATE_FORMATS  # noqa: E402  (the 8-bit op's formats)

from ._built_with import TENSORFLOW_VERSION  # noqa: E402


def _minor(version: str) -> Tuple[str, ...]:
    return tuple(version.split(".")[:2])


if _minor(tf.__version__) != _minor(TENSORFLOW_VERSION):
    raise ImportError(
        f"fusekit.tensorflow: the op library was built against TensorFlow {TENSORFLOW_VERSION}, "
        f"this process imports TensorFlow {tf.__version__}: an op library works only with the "
        "minor version it was built with. Rebuild fusekit with this TensorFlow "
        "(docs/tensorflow.md).")

_ops: Optional[types.ModuleType] = None


def op_library_path() -> str:
    """The path of the op library, for ``tf.load_op_library`` (mx_rec's ``LazyAdam``,
    ``FusekitResourceSparseApplyLazyAdam`` and ``FusekitResourceSparseApplyLazyAdamQuant``)."""
    return _LIBRARY


def load() -> types.ModuleType:
    """The op library, loaded once per process (``tf.load_op_library(op_library_path())``): a
    module whose functions are the ops, ``lazy_adam``,
    ``fusekit_resource_sparse_apply_lazy_adam`` and
    ``fusekit_resource_sparse_apply_lazy_adam_quant``."""
    global _ops
    if _ops is None:
        _ops = tf.load_op_library(_LIBRARY)
    return _ops


# The tensors and variables are TensorFlow's (tf.Tensor, tf.Variable, TF1 ref variables): Any to
# type checkers without TensorFlow's annotations.
def lazy_adam(gradient: Any, indices: Any, input_m: Any, input_v: Any, input_var: Any, lr: Any,
              beta1: float, beta2: float, epsilon: float,
              name: Optional[str] = None) -> Tuple[Any, Any, Any]:
    """mx_rec's ``LazyAdam`` op: one LazyAdam step, in place on ``input_m``, ``input_v`` and
    ``input_var`` (float32 [rows, dim]; TF1 ref variables in graph mode, as mx_rec passes them);
    ``gradient`` float32 [N, dim], ``indices`` int32 [N, 1] or [N]; ``lr`` the bias-corrected
    step ``lr * sqrt(1 - beta2^t) / (1 - beta1^t)``. Returns the updated (m, v, var)."""
    ops = load()
    if not hasattr(ops, "lazy_adam"):
        raise RuntimeError(
            "fusekit.tensorflow.lazy_adam: the op LazyAdam was registered by another library "
            "loaded before fusekit's (mx_rec's): call that library's lazy_adam wrapper; "
            "fusekit's kernel is the one that runs (registered with a higher priority)")
    return ops.lazy_adam(gradient, indices, input_m, input_v, input_var, lr, beta1=beta1,
                         beta2=beta2, epsilon=epsilon, name=name)


def resource_sparse_apply_lazy_adam(var: Any, m: Any, v: Any, lr: Any, grad: Any, indices: Any,
                                    beta1: float = 0.9, beta2: float = 0.999,
                                    epsilon: float = 1e-7, use_locking: bool = False,
                                    copy_on_read: bool = True, hugepages: bool = True,
                                    name: Optional[str] = None) -> Any:
    """One LazyAdam step on resource variables ``var``, ``m``, ``v`` (float32 [rows, dim]), the
    rows of ``indices`` (int32 or int64 [N]; duplicates summed, negative ones skipped) with
    ``grad`` [N, dim]; ``lr`` the bias-corrected step. ``use_locking``: hold the variables'
    locks exclusively. ``copy_on_read`` (TensorFlow's convention for sparse applies): switch the
    variables to copy-on-read mode; ``False`` keeps their mode and copies a variable only when a
    live read shares its buffer (what a table read whole every step needs). ``hugepages``:
    advise each table of at least 2 MiB onto huge pages once, where it is (nothing moves; a step
    at random rows is faster on them). Returns the op."""
    handles = [x.handle if hasattr(x, "handle") else x for x in (var, m, v)]
    return load().fusekit_resource_sparse_apply_lazy_adam(
        *handles, lr, grad, indices, beta1=beta1, beta2=beta2, epsilon=epsilon,
        use_locking=use_locking, copy_on_read=copy_on_read, huge_pages=hugepages, name=name)


def resource_sparse_apply_lazy_adam_quant(var: Any, codes: Any, absmax: Any, qmap_m: Any,
                                          qmap_v: Any, lr: Any, grad: Any, indices: Any,
                                          beta1: float = 0.9, beta2: float = 0.999,
                                          epsilon: float = 1e-7, hugepages: bool = True,
                                          state_format: str = "dynamic_map",
                                          guard_lost_v: bool = False,
                                          name: Optional[str] = None) -> Any:
    """One 8-bit LazyAdam step (fusekit's LazyAdamQuant) on resource variables: ``var`` float32
    [rows, dim] and its state, packed by row: ``codes`` uint8 [rows, 2, dim] (m's codes, then
    v's) and ``absmax`` float32 [rows, 2, ceil(dim / 256)] (m's, then v's); the rows of
    ``indices`` (int32 or int64 [N]; duplicates summed, negative ones skipped) with ``grad``
    [N, dim]; ``lr`` the bias-corrected step. Zero codes with a zero absmax are zero moments (a
    fresh state). The variables are locked exclusively, and a variable whose buffer a live read
    shares is copied first. ``hugepages``: as :func:`resource_sparse_apply_lazy_adam`.

    ``state_format`` (docs/fp8_state.md): ``"dynamic_map"`` (the default), codes into ``qmap_m``
    and ``qmap_v`` (float32 [256], :func:`fusekit.create_dynamic_map` signed and unsigned);
    ``"fp8"``, m's codes E4M3 and v's codes UE4M4 of sqrt(v), ``absmax`` holding the blocks'
    scales, no maps (pass ``None``, or empty tensors). ``guard_lost_v``: the lost-v guard (where
    the old v decodes to 0 and the old m does not, v is taken as m * m) in the dynamic-map
    format, off by default as fusekit's C++ face has it; always on in fp8. Returns the op."""
    if state_format not in _STATE_FORMATS:
        raise ValueError("fusekit.tensorflow.resource_sparse_apply_lazy_adam_quant: state_format "
                         f"must be one of {_STATE_FORMATS}, got {state_format!r}")
    if state_format == "fp8":
        empty = tf.zeros([0], tf.float32)
        qmap_m = empty if qmap_m is None else qmap_m
        qmap_v = empty if qmap_v is None else qmap_v
    elif qmap_m is None or qmap_v is None:
        raise ValueError("fusekit.tensorflow.resource_sparse_apply_lazy_adam_quant: the "
                         "dynamic_map state format needs qmap_m and qmap_v (float32 [256])")
    handles = [x.handle if hasattr(x, "handle") else x for x in (var, codes, absmax)]
    return load().fusekit_resource_sparse_apply_lazy_adam_quant(
        *handles, qmap_m, qmap_v, lr, grad, indices, beta1=beta1, beta2=beta2, epsilon=epsilon,
        huge_pages=hugepages, state_format=state_format, guard_lost_v=bool(guard_lost_v),
        name=name)


# The Keras 3 optimizer, registered with Keras on import (so that keras.models.load_model finds
# "fusekit>LazyAdam" once fusekit.tensorflow is imported). Keras comes with TensorFlow 2.16+.
from ._keras import LazyAdam, LazyAdam8bit  # noqa: E402


__all__ = ["op_library_path", "load", "lazy_adam", "resource_sparse_apply_lazy_adam",
           "resource_sparse_apply_lazy_adam_quant", "LazyAdam", "LazyAdam8bit"]
