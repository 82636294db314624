"""The sharders: TorchRec's EmbeddingBagCollection sharder whose sharded module builds fusekit's
kernel (:class:`~fusekit.torchrec.FusekitBatchedFusedEmbeddingBag`) for the FUSED compute kernel.

No TorchRec code is patched. :class:`FusekitShardedEmbeddingBagCollection` is TorchRec's
``ShardedEmbeddingBagCollection`` with one method overridden, ``_create_lookups``: for each
sharding (table-wise, column-wise, table-column-wise, row-wise, table-row-wise) it builds the
lookup that sharding's ``create_lookup`` builds (``GroupedPooledEmbeddingsLookup`` with the
sharding's grouped configs, process group, device and, for the row-wise kinds, the sharding type
that makes a mean table pool as a sum, TorchRec dividing after the reduction), as a subclass
whose ``_create_embedding_kernel`` makes fusekit's kernel for FUSED tables. Everything else
(input and output distribution, state_dict with ShardedTensor/DTensor weights, the fused
optimizer, checkpoints) is TorchRec's.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from torchrec.distributed.embedding_lookup import GroupedPooledEmbeddingsLookup
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import (
    EmbeddingBagCollectionSharder,
    ShardedEmbeddingBagCollection,
)
from torchrec.distributed.sharding.cw_sharding import CwPooledEmbeddingSharding
from torchrec.distributed.sharding.dp_sharding import DpPooledEmbeddingSharding
from torchrec.distributed.sharding.rw_sharding import RwPooledEmbeddingSharding
from torchrec.distributed.sharding.tw_sharding import TwPooledEmbeddingSharding
from torchrec.distributed.sharding.twrw_sharding import TwRwPooledEmbeddingSharding
from torchrec.distributed.types import ParameterSharding, ShardingEnv, ShardingType
from torchrec.modules.embedding_configs import PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from fbgemm_gpu.split_embedding_configs import EmbOptimType

from ._kernel import (
    FUSED_PARAM_GUARD_LOST_V,
    FUSED_PARAM_STATE_FORMAT,
    FusekitBatchedFusedEmbeddingBag,
)

_PREFIX = "fusekit.torchrec"

#: The sharding types fusekit's sharders offer on CPU (data-parallel is left out: a replicated
#: table trains with a dense optimizer, not with the fused kernel).
SHARDING_TYPES = (
    ShardingType.TABLE_WISE.value,
    ShardingType.ROW_WISE.value,
    ShardingType.COLUMN_WISE.value,
    ShardingType.TABLE_COLUMN_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
)


class _FusekitPooledLookup(GroupedPooledEmbeddingsLookup):
    """TorchRec's pooled lookup, with fusekit's kernel for the FUSED compute kernel."""

    def __init__(self, *args: Any, fusekit_options: Dict[str, Any], **kwargs: Any) -> None:
        # Set before the base class builds the kernels (nn.Module allows plain attributes here).
        object.__setattr__(self, "_fusekit_options", dict(fusekit_options))
        super().__init__(*args, **kwargs)

    def _create_embedding_kernel(self, config: Any, device: Optional[torch.device],
                                 pg: Optional[Any], sharding_type: Optional[ShardingType],
                                 env: Optional[ShardingEnv]) -> Any:
        if config.compute_kernel == EmbeddingComputeKernel.FUSED:
            return FusekitBatchedFusedEmbeddingBag(config=config, pg=pg, device=device,
                                                   sharding_type=sharding_type, env=env,
                                                   options=self._fusekit_options)
        names = [t.name for t in config.embedding_tables]
        if config.compute_kernel == EmbeddingComputeKernel.DENSE:
            raise ValueError(
                f"{_PREFIX}: the plan gives tables {names} the dense compute kernel (a dense "
                "gradient and a dense optimizer: not fusekit's); give them 'fused' "
                "(construct_module_sharding_plan picks 'dense' for tables without an optimizer "
                "in backward: pass compute_kernel='fused' to table_wise(...), row_wise(...), "
                "..., or use apply_optimizer_in_backward(torch.optim.Adam, ...))")
        raise ValueError(f"{_PREFIX}: tables {names}: compute kernel "
                         f"{config.compute_kernel.value!r} is not supported by fusekit's "
                         "sharders (fused, dense)")


def _lookup_arguments(sharding: Any) -> Dict[str, Any]:
    """What each sharding's own ``create_lookup`` passes its GroupedPooledEmbeddingsLookup."""
    if isinstance(sharding, TwRwPooledEmbeddingSharding):
        configs = sharding._grouped_embedding_configs_per_rank[sharding._rank]
        kind: Optional[ShardingType] = ShardingType.TABLE_ROW_WISE
    elif isinstance(sharding, RwPooledEmbeddingSharding):
        configs, kind = sharding._grouped_embedding_configs, ShardingType.ROW_WISE
    elif isinstance(sharding, (TwPooledEmbeddingSharding, CwPooledEmbeddingSharding)):
        configs, kind = sharding._grouped_embedding_configs, None
    else:
        raise ValueError(f"{_PREFIX}: sharding {type(sharding).__name__} is not supported "
                         f"(supported: {', '.join(SHARDING_TYPES)})")
    return dict(grouped_configs=configs, pg=sharding._pg, device=sharding._device,
                feature_processor=None, sharding_type=kind, env=sharding._env)


def _fusekit_optimizer_kwargs(param: Any) -> Optional[Dict[str, Any]]:
    """The fused_params of a parameter given fusekit.torch.SparseAdam8bit or SparseAdam by
    apply_optimizer_in_backward, or None for any other optimizer (TorchRec's business)."""
    from fusekit.torch import SparseAdam, SparseAdam8bit

    classes = getattr(param, "_optimizer_classes", None)
    if not classes or len(classes) != 1 or not isinstance(classes[0], type):
        return None
    cls = classes[0]
    if not issubclass(cls, (SparseAdam, SparseAdam8bit)):
        return None
    given = dict((getattr(param, "_optimizer_kwargs", None) or [{}])[0])
    betas = given.pop("betas", (0.9, 0.999))
    out: Dict[str, Any] = {"optimizer": EmbOptimType.ADAM, "lr": given.pop("lr", 1e-3),
                           "beta1": float(betas[0]), "beta2": float(betas[1]),
                           "eps": given.pop("eps", 1e-8)}
    if given.pop("maximize", False):
        raise ValueError(f"{_PREFIX}: {cls.__name__}(maximize=True) is not supported")
    if issubclass(cls, SparseAdam8bit):
        out[FUSED_PARAM_STATE_FORMAT] = given.pop("state_format", "dynamic_map")
        out[FUSED_PARAM_GUARD_LOST_V] = bool(given.pop("guard_lost_v", True))
        given.pop("min_8bit_size", None)  # every table is stepped in 8 bits
    given.pop("hugepages", None)  # the sharder's option
    if given:
        raise ValueError(f"{_PREFIX}: {cls.__name__} settings {sorted(given)} are not supported "
                         "in TorchRec (lr, betas, eps, state_format, guard_lost_v are)")
    return out


class FusekitShardedEmbeddingBagCollection(ShardedEmbeddingBagCollection):
    """TorchRec's ShardedEmbeddingBagCollection whose lookups run fusekit's kernel."""

    def __init__(self, *args: Any, fusekit_options: Optional[Dict[str, Any]] = None,
                 **kwargs: Any) -> None:
        object.__setattr__(self, "_fusekit_options", dict(fusekit_options or {}))
        super().__init__(*args, **kwargs)
        self._divide_only_row_wise_mean_features()

    def _divide_only_row_wise_mean_features(self) -> None:
        """TorchRec 1.9.2's mean pooling callback (a row-wise mean table's bags are pooled as sums
        on each shard and divided by their lengths after the reduction) sets the divisor to 1 for
        the row-wise *sum* features only: in a plan that mixes a row-wise mean table with tables
        sharded another way, the features of those other tables (already pooled by their kernel)
        were divided by their bag lengths too, a wrong forward (found by
        tests/integration/test_torchrec.py, with TorchRec's own kernels as well as fusekit's).
        Here every feature that is not a row-wise mean feature gets the divisor 1."""
        rs = self._pooling_type_to_rs_features
        if PoolingType.MEAN.value not in rs:
            return
        row_wise_mean = set(rs[PoolingType.MEAN.value])
        listed = set(rs.get(PoolingType.SUM.value, []))
        for config in self._embedding_bag_configs:
            for feature in config.feature_names:
                if feature not in row_wise_mean and feature not in listed:
                    rs[PoolingType.SUM.value].append(feature)
                    listed.add(feature)

    @classmethod
    def create_grouped_sharding_infos(cls, module: Any, table_name_to_parameter_sharding: Any,
                                      prefix: str, fused_params: Optional[Dict[str, Any]],
                                      suffix: Optional[str] = "weight") -> Any:
        """TorchRec's, with fusekit's own torch optimizers accepted in backward:
        ``apply_optimizer_in_backward(fusekit.torch.SparseAdam8bit, ...)`` (8-bit state) or
        ``fusekit.torch.SparseAdam`` (float32) is read as TBE Adam with the optimizer's lr,
        betas, eps and, for SparseAdam8bit, state_format and guard_lost_v (TorchRec itself
        refuses any class it cannot cast to an EmbOptimType). The parameters' in-backward
        settings are translated for the call and put back after it."""
        saved = []
        try:
            for param in module.parameters():
                kwargs = _fusekit_optimizer_kwargs(param)
                if kwargs is not None:
                    saved.append((param, param._optimizer_kwargs))
                    param._optimizer_kwargs = [kwargs]
            return super().create_grouped_sharding_infos(
                module, table_name_to_parameter_sharding, prefix, fused_params, suffix)
        finally:
            for param, kwargs in saved:
                param._optimizer_kwargs = kwargs

    def _create_lookups(self) -> None:
        for sharding in self._embedding_shardings:
            if isinstance(sharding, DpPooledEmbeddingSharding):
                self._lookups.append(sharding.create_lookup())  # dense, TorchRec's own
                continue
            self._lookups.append(_FusekitPooledLookup(
                fusekit_options=self._fusekit_options, **_lookup_arguments(sharding)))


class FusekitEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """TorchRec's EmbeddingBagCollectionSharder on fusekit's kernel: on CPU it offers the
    table-wise, row-wise, column-wise, table-column-wise and table-row-wise sharding types
    (TorchRec's CPU planner offers no row-wise otherwise) with the FUSED compute kernel, and its
    sharded module runs fusekit's fused backward + Adam.

    ``fused_params``: as TorchRec's sharder takes them (``{"optimizer": EmbOptimType.ADAM,
    "learning_rate": ..., "eps": ..., "beta1": ..., "beta2": ...}``); the optimizer of
    ``apply_optimizer_in_backward`` takes precedence per table, as in TorchRec. ``num_threads``:
    fusekit's threads per step (0: fusekit's default); ``hugepages``: the tables and their state
    on huge-page memory; ``state_format``: every table's Adam state in 8 bits (LazyAdamQuant,
    "dynamic_map" or "fp8"; None: float32; per table: ``apply_optimizer_in_backward(
    fusekit.torch.SparseAdam8bit, ...)``)."""

    def __init__(self, fused_params: Optional[Dict[str, Any]] = None,
                 qcomm_codecs_registry: Optional[Dict[str, Any]] = None,
                 num_threads: int = 0, hugepages: bool = True,
                 state_format: Optional[str] = None) -> None:
        if state_format is not None:
            fused_params = dict(fused_params or {}, **{FUSED_PARAM_STATE_FORMAT: state_format})
        super().__init__(fused_params=fused_params, qcomm_codecs_registry=qcomm_codecs_registry)
        self._fusekit_options = {"num_threads": int(num_threads), "hugepages": bool(hugepages)}

    def shard(self, module: EmbeddingBagCollection, params: Dict[str, ParameterSharding],
              env: ShardingEnv, device: Optional[torch.device] = None,
              module_fqn: Optional[str] = None) -> ShardedEmbeddingBagCollection:
        if device is not None and device.type not in ("cpu", "meta"):
            raise ValueError(f"{_PREFIX}: device {device}: fusekit's sharders shard onto the CPU "
                             "(on GPU use TorchRec's own sharders)")
        return FusekitShardedEmbeddingBagCollection(
            module=module, table_name_to_parameter_sharding=params, env=env,
            fused_params=self.fused_params, device=device,
            qcomm_codecs_registry=self.qcomm_codecs_registry, module_fqn=module_fqn,
            sharded_module_order_overwrite=self._sharded_module_order_overwrite,
            fusekit_options=self._fusekit_options)

    def sharding_types(self, compute_device_type: str) -> List[str]:
        if compute_device_type == "cpu":
            return list(SHARDING_TYPES)
        types: List[str] = super().sharding_types(compute_device_type)
        return types

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
        if compute_device_type == "cpu":
            return [EmbeddingComputeKernel.FUSED.value]
        kernels: List[str] = super().compute_kernels(sharding_type, compute_device_type)
        return kernels

    @property
    def sharded_module_type(self) -> type:
        return FusekitShardedEmbeddingBagCollection


def sharders(fused_params: Optional[Dict[str, Any]] = None, num_threads: int = 0,
             hugepages: bool = True, state_format: Optional[str] = None) -> List[Any]:
    """The sharders to hand ``DistributedModelParallel(module, sharders=...)`` so that its
    EmbeddingBagCollections train on CPU with fusekit's fused backward + Adam: fusekit's
    EmbeddingBagCollection sharder, then TorchRec's default sharders for the other module types.

    ``fused_params``, ``num_threads``, ``hugepages``, ``state_format``: see
    :class:`FusekitEmbeddingBagCollectionSharder`."""
    from torchrec.distributed.sharding_plan import get_default_sharders

    ours = FusekitEmbeddingBagCollectionSharder(fused_params=fused_params,
                                                num_threads=num_threads, hugepages=hugepages,
                                                state_format=state_format)
    out: List[Any] = [ours]
    for s in get_default_sharders():
        if s.module_type is not EmbeddingBagCollection:
            out.append(s)
    return out


__all__ = ["sharders", "FusekitEmbeddingBagCollectionSharder",
           "FusekitShardedEmbeddingBagCollection", "SHARDING_TYPES"]
