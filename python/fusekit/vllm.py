"""fusekit as vLLM's multi-LoRA kernel on CPU: a vLLM general plugin.

The fusekit wheel declares the entry point ``vllm.general_plugins: fusekit =
fusekit.vllm:register``; vLLM calls :func:`register` in each of its processes (main, engine core,
workers). On a vLLM version whose CPU punica wrapper it knows (:data:`KNOWN_VERSIONS`), it makes
``PunicaWrapperCPU``'s LoRA methods run fusekit's AddLora, in place:

- ``add_lora_linear``: every slice of every LoRA linear layer (qkv, gate_up, ...): shrink and
  expand fused, accumulated in float32, rounded once into ``y``;
- ``add_lora_logits``: the LoRA of the logits processor (the sampler's indices);
- ``add_lora_embedding`` (``add_inputs=True``): the embedding's B.

A token index of -1 (no adapter) adds nothing, also when every ``max_loras`` slot is occupied
(vLLM's torch ops index the stacked weights with it and add the last slot's adapter). Anything the
operator does not take (dtypes other than float32, float16 and bfloat16, mixed dtypes, tensors
off the CPU, ``add_inputs=False``) goes to vLLM's own method unchanged; ``add_shrink`` and
``add_expand`` (float32 buffers against model-dtype inputs) stay vLLM's.

``FUSEKIT_VLLM=0`` in the environment leaves vLLM untouched. On an unknown version, or a wrapper
whose methods are not the expected ones, :func:`register` warns and changes nothing.

Threads: the LoRA calls run on ``FUSEKIT_VLLM_THREADS`` fusekit threads (default 1; 0 means
fusekit's own default, :func:`fusekit.get_num_threads`). vLLM's CPU worker binds its OpenMP
threads to every core it uses and they spin between ops, so fusekit's helper threads would share
those cores with them: in the engine one thread measured faster than two on a 2-vCPU machine
(docs/vllm.md; on a machine with many cores, measure a larger value).
See docs/vllm.md.
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple

if TYPE_CHECKING:  # imported when vLLM calls the patched methods, not with this module
    import torch
    from torch import Tensor

__all__ = ["register", "unregister", "KNOWN_VERSIONS", "is_patched"]

#: vLLM versions whose ``PunicaWrapperCPU`` this plugin was written and tested against.
KNOWN_VERSIONS = ("0.32.0",)

# A child of vLLM's logger: vLLM's handler and format print its lines in every vLLM process.
_log = logging.getLogger("vllm.fusekit")
_ORIGINAL: Dict[str, Callable[..., Any]] = {}  # method name -> vLLM's function, once patched

# The parameters each patched method must have (names and order), as vLLM 0.32 defines them.
_EXPECTED = {
    "add_lora_linear": ["self", "y", "x", "lora_a_stacked", "lora_b_stacked", "scale",
                        "output_slices", "buffer", "kwargs"],
    "add_lora_logits": ["self", "y", "x", "lora_a_stacked", "lora_b_stacked", "scale", "buffer",
                        "kwargs"],
    "add_lora_embedding": ["self", "y", "x", "lora_b_stacked", "add_inputs", "kwargs"],
}


def is_patched() -> bool:
    """True once :func:`register` has patched vLLM's CPU punica wrapper in this process."""
    return bool(_ORIGINAL)


def unregister() -> None:
    """Gives vLLM its own methods back (for comparing both in one process)."""
    if not _ORIGINAL:
        return
    from vllm.lora.punica_wrapper import punica_cpu
    for name, fn in _ORIGINAL.items():
        setattr(punica_cpu.PunicaWrapperCPU, name, fn)
    _ORIGINAL.clear()


def _base_version(v: str) -> str:
    return v.split("+", 1)[0]


def register() -> None:
    """vLLM's plugin entry point (idempotent). Patches ``PunicaWrapperCPU`` as the module
    docstring says, or warns and leaves vLLM as it is."""
    if os.environ.get("FUSEKIT_VLLM", "1").strip() == "0":
        return
    if _ORIGINAL:
        return
    try:
        import vllm
        from vllm.lora.punica_wrapper import punica_cpu
    except Exception as e:  # noqa: BLE001  (a vLLM without LoRA support, or a broken one)
        _log.warning("fusekit: vLLM's CPU punica wrapper does not import (%s: %s); vLLM is left "
                     "as it is", type(e).__name__, e)
        return
    version = getattr(vllm, "__version__", "unknown")
    if _base_version(version) not in KNOWN_VERSIONS:
        _log.warning("fusekit: vLLM %s is not a version whose PunicaWrapperCPU fusekit knows "
                     "(%s); vLLM is left as it is", version, ", ".join(KNOWN_VERSIONS))
        return
    cls = punica_cpu.PunicaWrapperCPU
    for name, params in _EXPECTED.items():
        got = list(inspect.signature(getattr(cls, name, None) or (lambda: None)).parameters)
        if got != params:
            _log.warning("fusekit: vLLM %s's PunicaWrapperCPU.%s has parameters %s, not %s; vLLM "
                         "is left as it is", version, name, got, params)
            return
    import fusekit

    for name, fn in (("add_lora_linear", _add_lora_linear),
                     ("add_lora_logits", _add_lora_logits),
                     ("add_lora_embedding", _add_lora_embedding)):
        _ORIGINAL[name] = getattr(cls, name)
        fn.__doc__ = _ORIGINAL[name].__doc__
        setattr(cls, name, fn)
    _log.info("fusekit %s: vLLM %s's PunicaWrapperCPU runs LoRA on fusekit's AddLora "
              "(add_lora_linear, add_lora_logits, add_lora_embedding; FUSEKIT_VLLM=0 turns this "
              "off)", fusekit.__version__, version)


_DTYPES: Optional[Tuple[torch.dtype, ...]] = None  # the torch dtypes AddLora steps, once torch is in
_APPLY: Optional[Callable[..., None]] = None


def _threads() -> int:
    """FUSEKIT_VLLM_THREADS (default 1; 0: fusekit's default thread count)."""
    v = os.environ.get("FUSEKIT_VLLM_THREADS", "1").strip()
    try:
        return max(0, int(v))
    except ValueError:
        _log.warning("fusekit: FUSEKIT_VLLM_THREADS=%r is not a number; using 1", v)
        return 1


def _op() -> Callable[..., None]:
    """The function the patched methods call, made once (they run per layer and step):
    ``apply(y, x, b, indices, a, scale, y_offset, n)`` adds the LoRA update in place on the 2-D
    ``y``. A plain eager call with inner-contiguous tensors (vLLM's) goes to the operator's binding
    directly, on FUSEKIT_VLLM_THREADS threads; anything else (tracing, compilation, a strided
    innermost dimension) through :func:`fusekit.torch.add_lora_`."""
    global _APPLY
    if _APPLY is not None:
        return _APPLY
    from fusekit import _fusekit
    from fusekit.torch import add_lora_
    from fusekit.torch._lora import _eager, _increment_version

    threads = _threads()
    run = _fusekit.add_lora

    def apply(y: Tensor, x: Tensor, b: Tensor, idx: Tensor, a: Optional[Tensor], scale: float,
              y_offset: int, n: int) -> None:
        if _eager(y, x, b, idx, a) and all(t is None or t.stride(-1) == 1 for t in (y, x, b, a)):
            run((y, x, b, idx, a, y),
                {"layer_idx": 0, "scale": scale, "y_offset": y_offset, "y_slice_size": n},
                threads, None, 0, 0.0)
            assert _increment_version is not None  # _eager is False without it
            _increment_version(y)  # what the dispatcher does for a mutated argument
        else:
            add_lora_(y, x, b, idx, a, 0, scale, y_offset, n)

    _APPLY = apply
    return apply


def _fits(*tensors: Tensor) -> bool:
    """Whether AddLora takes these tensors: one float dtype it steps, all on the CPU."""
    global _DTYPES
    import torch
    if _DTYPES is None:
        _DTYPES = (torch.float32, torch.float16, torch.bfloat16)
    dt = tensors[0].dtype
    return dt in _DTYPES and all(t.dtype == dt and t.device.type == "cpu" for t in tensors)


# vLLM's methods, patched: self is vLLM's PunicaWrapperCPU, the tensors torch's.
def _add_lora_linear(self: Any, y: Tensor, x: Tensor, lora_a_stacked: Tuple[Tensor, ...],
                     lora_b_stacked: Tuple[Tensor, ...], scale: float,
                     output_slices: Tuple[int, ...], *, buffer: Any = None,
                     **kwargs: Any) -> None:
    if not _fits(y, x, *lora_a_stacked, *lora_b_stacked):
        return _ORIGINAL["add_lora_linear"](self, y, x, lora_a_stacked, lora_b_stacked, scale,
                                            output_slices, buffer=buffer, **kwargs)
    apply = _op()
    y2 = y.view(-1, y.shape[-1])
    x2 = x.view(-1, x.shape[-1])
    idx = self.token_lora_indices[: x2.shape[0]]
    offset = 0
    scale = float(scale)
    for a, b, n in zip(lora_a_stacked, lora_b_stacked, output_slices):
        apply(y2, x2, b, idx, a, scale, offset, n)
        offset += n


def _add_lora_logits(self: Any, y: Tensor, x: Tensor, lora_a_stacked: Tensor,
                     lora_b_stacked: Tensor, scale: float, *, buffer: Any = None,
                     **kwargs: Any) -> None:
    if not _fits(y, x, lora_a_stacked, lora_b_stacked):
        return _ORIGINAL["add_lora_logits"](self, y, x, lora_a_stacked, lora_b_stacked, scale,
                                            buffer=buffer, **kwargs)
    apply = _op()
    y2 = y.view(-1, y.shape[-1])
    x2 = x.view(-1, x.shape[-1])
    # The adapter and the model may pad the vocabulary differently: the common columns, as vLLM.
    common = min(lora_b_stacked.shape[-2], y2.shape[-1])
    apply(y2, x2, lora_b_stacked[:, :, :common], self.sampler_indices[: x2.shape[0]],
          lora_a_stacked, float(scale), 0, common)


def _add_lora_embedding(self: Any, y: Tensor, x: Tensor, lora_b_stacked: Tensor,
                        add_inputs: bool = True, **kwargs: Any) -> None:
    if not add_inputs or not _fits(y, x, lora_b_stacked):
        return _ORIGINAL["add_lora_embedding"](self, y, x, lora_b_stacked, add_inputs, **kwargs)
    apply = _op()
    y2 = y.view(-1, y.shape[-1])
    x2 = x.view(-1, x.shape[-1])
    apply(y2, x2, lora_b_stacked, self.token_lora_indices[: x2.shape[0]], None, 1.0, 0,
          lora_b_stacked.shape[-2])
