"""fusekit for PyTorch: drop-in optimizers and the multi-LoRA op, on CPU tensors.

- :class:`SparseAdam` (alias :class:`LazyAdam`): ``torch.optim.SparseAdam`` on fusekit's LazyAdam.
- :class:`SparseAdam8bit`: the same with 8-bit block-wise m and v (fusekit's LazyAdamQuant): the
  optimizer state of an embedding table in a third of the memory.
- :class:`AdamW8bit`, :class:`Adam8bit`: bitsandbytes' 8-bit block-wise optimizers on
  fusekit's ApplyAdamWQuant (and its float32 AdamW for small tensors).
- :class:`FusedEmbeddingBag`: ``nn.EmbeddingBag`` with Adam in its backward (fusekit's
  EmbeddingBagLazyAdam: the rows of the batch updated from the gradient of the pooled output);
  ``state="8bit"``: SparseAdam8bit's state, stepped by EmbeddingBagLazyAdamQuant.
- :func:`add_lora`, :func:`add_lora_`: vLLM's multi-LoRA add (``torch.ops.fusekit.add_lora``, a
  custom op that ``torch.compile`` traces without a graph break); :class:`MultiLoRALinear`.
- Huge pages for tables and states: :func:`empty_hugepage`, :func:`to_hugepages`.

Importing this module imports torch; ``import fusekit`` alone does not.

The optimizers load with their submodules when a name is first used (the module ``__getattr__``
below): they import ``torch.distributed.tensor`` (for FSDP2's DTensor parameters), which takes
0.52-0.65 s after torch's own 1.4 s on this project's 2-vCPU machine (``python -X importtime``),
against 16 ms for this module with the LoRA ops and the memory helpers, which load eagerly.
Type checkers read the optimizers from the imports under ``TYPE_CHECKING``, which never run.
"""

import importlib
from typing import TYPE_CHECKING, Any, List

import torch  # noqa: F401  (this module is the torch face: torch must be importable)

if TYPE_CHECKING:  # what __getattr__ returns, for type checkers (never imported at run time)
    from ._adam8bit import Adam8bit, AdamW8bit
    from ._adamw import Adam, AdamW
    from ._base import StepStats
    from ._embedding_bag import FusedEmbeddingBag
    from ._sparse_adam import LazyAdam, SparseAdam, SparseAdamStats
    from ._sparse_adam8bit import SparseAdam8bit

# Each name is defined in one submodule, loaded when first used.
_WHERE = {
    "SparseAdam": "_sparse_adam",
    "LazyAdam": "_sparse_adam",
    "SparseAdamStats": "_sparse_adam",
    "SparseAdam8bit": "_sparse_adam8bit",
    "StepStats": "_base",
    "AdamW": "_adamw",
    "Adam": "_adamw",
    "AdamW8bit": "_adam8bit",
    "Adam8bit": "_adam8bit",
    "FusedEmbeddingBag": "_embedding_bag",
}


# The custom ops (torch.ops.fusekit.add_lora, add_lora_) are registered when _lora loads: load it
# now, so that a graph or program that names them finds them after `import fusekit.torch`.
from . import _lora  # noqa: E402,F401
from ._lora import MultiLoRALinear, add_lora, add_lora_  # noqa: E402
from ._memory import (  # noqa: E402
    advise_hugepages,
    empty_hugepage,
    hugepage_backed_fraction,
    to_hugepages,
    zeros_hugepage,
)


if not TYPE_CHECKING:  # hidden from type checkers: to them a name not imported above is an error

    def __getattr__(name: str) -> Any:
        if name in _WHERE:
            value = getattr(importlib.import_module("." + _WHERE[name], __name__), name)
            globals()[name] = value
            return value
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_WHERE))


__all__ = [
    "SparseAdam",
    "LazyAdam",
    "SparseAdamStats",
    "SparseAdam8bit",
    "StepStats",
    "AdamW",
    "Adam",
    "AdamW8bit",
    "Adam8bit",
    "FusedEmbeddingBag",
    "add_lora",
    "add_lora_",
    "MultiLoRALinear",
    "empty_hugepage",
    "zeros_hugepage",
    "to_hugepages",
    "advise_hugepages",
    "hugepage_backed_fraction",
]
