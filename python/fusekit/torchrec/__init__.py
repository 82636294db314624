"""fusekit as TorchRec's CPU embedding optimizer (docs/torchrec.md).

TorchRec's embedding tables train with the optimizer fused into the embedding backward (FBGEMM's
table-batched embedding, TBE). On CPU, FBGEMM's TBE has no Adam (``Optimizer adam is not
supported in CPU mode``). :func:`sharders` returns the sharders to hand
``DistributedModelParallel``: with them, what a TorchRec user writes for GPU,

.. code-block:: python

    apply_optimizer_in_backward(torch.optim.Adam, ebc.parameters(), {"lr": 0.02})
    model = DistributedModelParallel(ebc, device=torch.device("cpu"),
                                     sharders=fusekit.torchrec.sharders())

(or ``fusekit.torchrec.sharders(fused_params={"optimizer": EmbOptimType.ADAM, ...})``), runs
fusekit's fused embedding-bag backward + lazy Adam (EmbeddingBagLazyAdam) on the rows of each
batch, with FBGEMM's TBE Adam arithmetic (one iteration counter per table group, bias correction
``1 - beta**t``, ``eps`` added to ``sqrt(v_hat)``). The tables stay TorchRec's: ShardedTensor
weights in ``model.state_dict()``, ``model.fused_optimizer`` with ``<table>.momentum1`` and
``<table>.exp_avg_sq``, table-wise, row-wise, column-wise, table-row-wise plans (the planner on
CPU offers row-wise with these sharders), ``torch.distributed.checkpoint``.

Known to work with torch 2.14.1, fbgemm-gpu-cpu 1.9.0, torchrec 1.9.2
(requirements/torchrec.txt).
"""

from __future__ import annotations

try:
    import torchrec as _torchrec  # noqa: F401
    import fbgemm_gpu as _fbgemm_gpu  # noqa: F401
except ImportError as e:  # pragma: no cover - the message is what matters
    raise ImportError(
        "fusekit.torchrec needs TorchRec and FBGEMM's CPU build: pip install torchrec==1.9.2 "
        "fbgemm-gpu-cpu==1.9.0 --no-deps (with torch 2.14.1; torchrec's own requirement "
        "'fbgemm-gpu' is the CUDA build, which --no-deps keeps out). The versions known to work "
        f"are in requirements/torchrec.txt and docs/torchrec.md. ({e})") from e

from ._kernel import (  # noqa: E402
    FUSED_PARAM_GUARD_LOST_V,
    FUSED_PARAM_STATE_FORMAT,
    SUPPORTED_OPTIMIZERS,
    FusedAdamTBE,
    FusekitBatchedFusedEmbeddingBag,
)
from ._sharder import (  # noqa: E402
    FusekitEmbeddingBagCollectionSharder,
    FusekitShardedEmbeddingBagCollection,
    sharders,
)

__all__ = [
    "sharders",
    "FusekitEmbeddingBagCollectionSharder",
    "FusekitShardedEmbeddingBagCollection",
    "FusekitBatchedFusedEmbeddingBag",
    "FusedAdamTBE",
    "SUPPORTED_OPTIMIZERS",
    "FUSED_PARAM_STATE_FORMAT",
    "FUSED_PARAM_GUARD_LOST_V",
]
