"""DTensor parameters (FSDP2's ``fully_shard``): the optimizers step the local shard and keep
their state as DTensors of the parameter's mesh and placements, allocated at the local shape, so
that ``torch.distributed.checkpoint`` saves and restores every rank's shard.

The 8-bit state's per-block absmax has no element-wise relation to the parameter (its blocks of 256
lie inside each rank's shard), so it is kept as a DTensor of its own layout: global shape
``[shards, max_blocks]``, one row per shard (zero padded where a shard is shorter), sharded on
dim 0 over every mesh dimension that shards the parameter. Its global shape names the sharding, so
a checkpoint saved under another one is refused (by DCP's size check) instead of being misread.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Tuple

import torch

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # torch depends on typing_extensions

try:  # torch built without distributed support has no DTensor
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Replicate, Shard
except ImportError:  # pragma: no cover
    DTensor = None  # type: ignore[misc,assignment]  # is_dtensor: always False

__all__ = ["is_dtensor", "local", "like_param", "block_layout", "blocks_dtensor"]


def is_dtensor(t: object) -> TypeIs[DTensor]:
    return DTensor is not None and isinstance(t, DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor a kernel reads and writes: a DTensor's local shard (sharing its storage), else
    ``t`` itself."""
    return t.to_local() if is_dtensor(t) else t


def like_param(p: torch.Tensor, local_t: torch.Tensor) -> torch.Tensor:
    """``local_t`` (the parameter's local shape) as a DTensor sharded as ``p`` when ``p`` is one."""
    if not is_dtensor(p):
        return local_t
    return DTensor.from_local(local_t, p.device_mesh, p.placements, run_check=False,
                              shape=p.shape, stride=p.stride())


def _check_placements(name: str, p: DTensor) -> None:
    for pl in p.placements:
        if not isinstance(pl, (Shard, Replicate)):
            raise ValueError(f"{name}: a DTensor parameter with placement {pl} (placements "
                             f"{tuple(p.placements)}) is not supported: parameters are sharded "
                             "(Shard) or replicated (Replicate)")


def block_layout(name: str, p: DTensor, blocks_of: Callable[[int], int]) -> Tuple[int, int]:
    """(shards, max_blocks) of a DTensor parameter: how many shards the placements make, and the
    most blocks (``blocks_of(numel)``) any rank's shard can need (the chunk sizes of
    ``torch.chunk``, which the largest shard bounds)."""
    _check_placements(name, p)
    mesh = p.device_mesh
    shape = list(p.shape)
    shards = 1
    for dim, pl in enumerate(p.placements):
        if isinstance(pl, Shard):
            size = mesh.size(dim)
            shards *= size
            d = pl.dim if pl.dim >= 0 else pl.dim + len(shape)
            shape[d] = -(-shape[d] // size)
    return shards, int(blocks_of(math.prod(shape)))


def blocks_dtensor(p: torch.Tensor, local_t: torch.Tensor, shards: int) -> torch.Tensor:
    """A rank's ``[1, max_blocks]`` row as the ``[shards, max_blocks]`` DTensor (see the module
    docstring); a plain tensor stays as it is."""
    if not is_dtensor(p):
        return local_t
    placements = tuple(Shard(0) if isinstance(pl, Shard) else Replicate() for pl in p.placements)
    return DTensor.from_local(local_t, p.device_mesh, placements, run_check=False,
                              shape=torch.Size((shards, local_t.shape[-1])),
                              stride=(local_t.shape[-1], 1))


def refuse_sharded_table(opt_name: str, label: str, p: torch.Tensor) -> None:
    """The sparse optimizers' parameters are embedding tables stepped by row index: a DTensor
    (FSDP2) table has dense, reduce-scattered gradients, so there is nothing sparse to step."""
    if is_dtensor(p):
        raise ValueError(
            f"{opt_name}: {label} is a DTensor (placements {tuple(p.placements)}): FSDP2 reduces "
            "dense gradients, which SparseAdam does not step; shard the model's dense layers "
            "with fully_shard and keep the embedding table a plain tensor (replicated, or "
            "sharded by rows in your own code), or step it with fusekit.torch.AdamW")
