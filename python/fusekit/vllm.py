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
See docs/vllm.md.
"""

from __future__ import annotations

import inspect
import logging
import os

__all__ = ["register", "unregister", "KNOWN_VERSIONS", "is_patched"]

#: vLLM versions whose ``PunicaWrapperCPU`` this plugin was written and tested against.
KNOWN_VERSIONS = ("0.32.0",)

# A child of vLLM's logger: vLLM's handler and format print its lines in every vLLM process.
_log = logging.getLogger("vllm.fusekit")
_ORIGINAL = {}  # method name -> vLLM's function, once patched

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


_DTYPES = None
_ADD_LORA_ = None


def _op():
    """fusekit.torch.add_lora_, imported once (these methods run per layer and step)."""
    global _ADD_LORA_
    if _ADD_LORA_ is None:
        from fusekit.torch import add_lora_
        _ADD_LORA_ = add_lora_
    return _ADD_LORA_


def _fits(*tensors) -> bool:
    """Whether AddLora takes these tensors: one float dtype it steps, all on the CPU."""
    global _DTYPES
    import torch
    if _DTYPES is None:
        _DTYPES = (torch.float32, torch.float16, torch.bfloat16)
    dt = tensors[0].dtype
    return dt in _DTYPES and all(t.dtype == dt and t.device.type == "cpu" for t in tensors)


def _add_lora_linear(self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, *,
                     buffer=None, **kwargs):
    if not _fits(y, x, *lora_a_stacked, *lora_b_stacked):
        return _ORIGINAL["add_lora_linear"](self, y, x, lora_a_stacked, lora_b_stacked, scale,
                                            output_slices, buffer=buffer, **kwargs)
    add_lora_ = _op()
    y2 = y.view(-1, y.shape[-1])
    x2 = x.view(-1, x.shape[-1])
    idx = self.token_lora_indices[: x2.shape[0]]
    offset = 0
    for a, b, n in zip(lora_a_stacked, lora_b_stacked, output_slices):
        add_lora_(y2, x2, b, idx, a, 0, float(scale), offset, n)
        offset += n


def _add_lora_logits(self, y, x, lora_a_stacked, lora_b_stacked, scale, *, buffer=None,
                     **kwargs):
    if not _fits(y, x, lora_a_stacked, lora_b_stacked):
        return _ORIGINAL["add_lora_logits"](self, y, x, lora_a_stacked, lora_b_stacked, scale,
                                            buffer=buffer, **kwargs)
    add_lora_ = _op()
    y2 = y.view(-1, y.shape[-1])
    x2 = x.view(-1, x.shape[-1])
    # The adapter and the model may pad the vocabulary differently: the common columns, as vLLM.
    common = min(lora_b_stacked.shape[-2], y2.shape[-1])
    add_lora_(y2, x2, lora_b_stacked[:, :, :common], self.sampler_indices[: x2.shape[0]],
              lora_a_stacked, 0, float(scale), 0, common)


def _add_lora_embedding(self, y, x, lora_b_stacked, add_inputs=True, **kwargs):
    if not add_inputs or not _fits(y, x, lora_b_stacked):
        return _ORIGINAL["add_lora_embedding"](self, y, x, lora_b_stacked, add_inputs, **kwargs)
    add_lora_ = _op()
    y2 = y.view(-1, y.shape[-1])
    x2 = x.view(-1, x.shape[-1])
    add_lora_(y2, x2, lora_b_stacked, self.token_lora_indices[: x2.shape[0]], None, 0, 1.0, 0,
              lora_b_stacked.shape[-2])
