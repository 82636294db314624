"""The embedding kernel: a table group's TBE look-alike (:class:`FusedAdamTBE`) and the TorchRec
kernel module that holds it (:class:`FusekitBatchedFusedEmbeddingBag`), in the place where
TorchRec's FUSED compute kernel puts ``BatchedFusedEmbeddingBag`` around FBGEMM's
``SplitTableBatchedEmbeddingBagsCodegen``.

The forward pools with torch (``F.embedding_bag`` per feature); the backward runs fusekit's
EmbeddingBagLazyAdam per table on the gradient of the pooled output (with 8-bit state its twin,
EmbeddingBagLazyAdamQuant): the rows of the batch get their summed gradient and an Adam step, no
per-lookup gradient and no table gradient is made.
The arithmetic is FBGEMM's TBE Adam (``split_embedding_codegen``'s ``adam``): per table group one
iteration counter ``t`` (incremented once per backward), per touched row

    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    w = w - lr * (m / (1 - beta1**t)) / (sqrt(v / (1 - beta2**t)) + eps)

which fusekit's operator computes as ``w += (m * -lr_t) / (sqrt(v) + eps_t)`` with
``lr_t = lr * sqrt(1 - beta2**t) / (1 - beta1**t)`` and ``eps_t = eps * sqrt(1 - beta2**t)``
(the same quantity, rearranged; within float32 rounding of it).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
from torchrec.distributed.batched_embedding_kernel import (
    BaseBatchedEmbeddingBag,
    EmbeddingFusedOptimizer,
)
from torchrec.distributed.composable.table_batched_embedding_slice import (
    TableBatchedEmbeddingSlice,
)
from torchrec.distributed.embedding_types import GroupedEmbeddingConfig
from torchrec.distributed.types import ShardingEnv, ShardingType
from torchrec.modules.embedding_configs import DataType
from torchrec.optim.fused import EmptyFusedOptimizer, FusedOptimizer, FusedOptimizerModule
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

import fusekit

_PREFIX = "fusekit.torchrec"

#: fused_params keys of fusekit's own: the table's Adam state in 8 bits (LazyAdamQuant,
#: docs/lazy_adam_quant.md) in this state format ("dynamic_map" or "fp8"; None: float32), and
#: the lost-v guard of the dynamic-map format (default True, as fusekit.torch.SparseAdam8bit).
FUSED_PARAM_STATE_FORMAT = "fusekit_state_format"
FUSED_PARAM_GUARD_LOST_V = "fusekit_guard_lost_v"

#: The optimizers fusekit's kernel runs (FBGEMM's ``EmbOptimType`` names).
SUPPORTED_OPTIMIZERS: Tuple[str, ...] = ("ADAM",)

# fused_params keys that do not change the arithmetic of this kernel (TorchRec and FBGEMM add
# them for their own kernels: caches, placement, precision of a cache this kernel does not have).
_IGNORED_KEYS = frozenset({
    "cache_precision", "cache_algorithm", "cache_load_factor", "cache_reserved_memory",
    "prefetch_pipeline", "enable_raw_embedding_streaming", "output_dtype", "stochastic_rounding",
    "bounds_check_mode", "enforce_hbm", "uvm_host_mapped", "foreach", "capturable",
    "differentiable", "fused", "momentum_dtype", "embedding_table_index_type",
    "embedding_table_offset_type",
})


def _optimizer_name(optimizer: Any) -> str:
    name = getattr(optimizer, "name", None)
    return str(name if name is not None else optimizer).upper()


def adam_hyperparameters(fused_params: Dict[str, Any], tables: Sequence[str]
                         ) -> Dict[str, Any]:
    """The Adam settings of a table group from TorchRec's fused_params (what
    ``apply_optimizer_in_backward(torch.optim.Adam, ..., kwargs)`` or the sharder's
    ``fused_params`` put there), FBGEMM's defaults for the rest; refuses what the kernel does not
    run, naming what it does."""
    where = f"{_PREFIX}: tables {list(tables)}"
    optimizer = fused_params.get("optimizer")
    if optimizer is None:
        raise ValueError(
            f"{where} have no optimizer: fusekit's kernel runs Adam in the backward. Use "
            "apply_optimizer_in_backward(torch.optim.Adam, ebc.parameters(), {'lr': ...}) or "
            "fusekit.torchrec.sharders(fused_params={'optimizer': EmbOptimType.ADAM, ...})")
    if _optimizer_name(optimizer) not in SUPPORTED_OPTIMIZERS:
        raise ValueError(
            f"{where}: optimizer {_optimizer_name(optimizer)} is not supported by fusekit's "
            f"embedding kernel; supported: {', '.join('EmbOptimType.' + s for s in SUPPORTED_OPTIMIZERS)}"
            " (torch.optim.Adam or torchrec.optim.Adam in apply_optimizer_in_backward). For "
            "SGD, Adagrad, rowwise Adagrad on CPU use TorchRec's own sharders (FBGEMM's CPU TBE).")
    out: Dict[str, Any] = {"learning_rate": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}
    for key, value in fused_params.items():
        if key == "optimizer" or key in _IGNORED_KEYS:
            continue
        if key == FUSED_PARAM_STATE_FORMAT:
            if value is not None and value not in fusekit.SPARSE_STATE_FORMATS:
                raise ValueError(f"{where}: {key} = {value!r} must be None (float32 state) or "
                                 f"one of {fusekit.SPARSE_STATE_FORMATS} (8-bit state)")
            out["state_format"] = value
            continue
        if key == FUSED_PARAM_GUARD_LOST_V:
            out["guard_lost_v"] = bool(value)
            continue
        if key in ("learning_rate", "lr"):
            out["learning_rate"] = float(value)
        elif key in ("eps", "beta1", "beta2"):
            out[key] = float(value)
        elif key == "betas":
            out["beta1"], out["beta2"] = float(value[0]), float(value[1])
        elif key == "weight_decay":
            if float(value) != 0.0:
                raise ValueError(f"{where}: weight_decay = {value}: fusekit's kernel runs Adam "
                                 "without weight decay (weight_decay must be 0)")
        elif key in ("amsgrad", "maximize", "decoupled_weight_decay"):
            if value:
                raise ValueError(f"{where}: {key}=True is not supported by fusekit's kernel")
        elif key == "weight_decay_mode":
            if _optimizer_name(value) not in ("NONE", "0"):
                raise ValueError(f"{where}: weight_decay_mode {value} is not supported")
        else:
            raise ValueError(
                f"{where}: fused_params key {key!r} is not supported by fusekit's kernel (it "
                "takes optimizer, learning_rate/lr, eps, beta1, beta2, betas, weight_decay=0, "
                f"{FUSED_PARAM_STATE_FORMAT}, {FUSED_PARAM_GUARD_LOST_V})")
    return out


class _TBEFunction(torch.autograd.Function):
    """forward: the pooled lookups of every feature; backward: the fused Adam step per table."""

    @staticmethod
    def forward(ctx: Any, placeholder: torch.Tensor, indices: torch.Tensor,
                offsets: torch.Tensor, per_sample_weights: Optional[torch.Tensor],
                tbe: "FusedAdamTBE") -> torch.Tensor:
        ctx.tbe = tbe
        ctx.save_for_backward(indices, offsets, per_sample_weights)
        return tbe._pool(indices, offsets, per_sample_weights)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        indices, offsets, per_sample_weights = ctx.saved_tensors
        tbe: FusedAdamTBE = ctx.tbe
        grad_weights = None
        if ctx.needs_input_grad[3]:
            grad_weights = tbe._grad_per_sample_weights(grad_output, indices, offsets)
        tbe._step(grad_output, indices, offsets, per_sample_weights)
        return None, None, None, grad_weights, None


class FusedAdamTBE(nn.Module):
    """A table group as FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen`` presents it to
    TorchRec, with Adam fused into the backward by fusekit.

    The tables' weights are one flat float32 buffer (``weights_host``, table after table, rows
    ``[rows, dim]`` row-major, as FBGEMM lays them out), the moments two more
    (``momentum1_host``, ``momentum2_host``), on huge pages unless ``hugepages=False``.
    ``forward(indices, offsets, per_sample_weights=None)`` takes TBE's batch: ``offsets``
    ``[F * B + 1]`` over the features (``feature_table_map`` gives each feature's table), and
    returns ``[B, sum of the features' dims]``. What TorchRec calls on a TBE is here:
    ``split_embedding_weights``, ``split_optimizer_states``, ``get_optimizer_state``
    (``exp_avg``, ``exp_avg_sq``), ``get_learning_rate``/``set_learning_rate``,
    ``set_optimizer_step``, ``update_hyper_parameters``, ``flush``, ``reset_cache_states``.
    """

    iter: torch.Tensor

    def __init__(self, rows: Sequence[int], dims: Sequence[int], feature_table_map: Sequence[int],
                 pooling: str, table_names: Sequence[str], learning_rate: float = 0.01,
                 beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                 num_threads: int = 0, hugepages: bool = True,
                 state_format: Optional[str] = None, guard_lost_v: bool = True) -> None:
        super().__init__()
        if pooling not in fusekit.POOLING_MODES:
            raise ValueError(f"{_PREFIX}: pooling {pooling!r} must be one of "
                             f"{fusekit.POOLING_MODES}")
        self.rows = [int(r) for r in rows]
        self.dims = [int(d) for d in dims]
        self.table_names = list(table_names)
        self.feature_table_map = [int(t) for t in feature_table_map]
        self.pooling = pooling
        self.learning_rate = float(learning_rate)
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)
        self.num_threads = int(num_threads)
        self.weights_offsets: List[int] = []
        total = 0
        for r, d in zip(self.rows, self.dims):
            self.weights_offsets.append(total)
            total += r * d
        def empty(n: int, dtype: torch.dtype) -> torch.Tensor:
            if hugepages:
                from fusekit.torch import empty_hugepage
                return empty_hugepage((n,), dtype)
            return torch.empty(n, dtype=dtype)
        alloc = lambda: empty(total, torch.float32)  # noqa: E731
        # Plain attributes, not buffers: TorchRec's kernel presents them as ShardedTensors.
        self.weights_host = alloc()
        self.state_format = state_format
        self.guard_lost_v = bool(guard_lost_v)
        if state_format is None:
            self.momentum1_host = alloc().zero_()
            self.momentum2_host = alloc().zero_()
        else:
            # 8-bit state (LazyAdamQuant): m and v as uint8 codes, one absmax (fp8: scale) per
            # row and moment: a table up to 256 wide is one quantization block per row, so the
            # per-row value is a row-wise state TorchRec shards like rowwise Adagrad's.
            for name, d in zip(self.table_names, self.dims):
                if d > fusekit.BLOCK_SIZE:
                    raise ValueError(
                        f"{_PREFIX}: table {name!r} is {d} wide: the 8-bit state takes tables up "
                        f"to {fusekit.BLOCK_SIZE} wide (one quantization block per row; a "
                        "column-wise plan splits a wider table)")
            # On huge pages as the float32 state (the step reads rows at random).
            self.momentum1_host = empty(total, torch.uint8).zero_()
            self.momentum2_host = empty(total, torch.uint8).zero_()
            self.absmax1_host = empty(sum(self.rows), torch.float32).zero_()
            self.absmax2_host = empty(sum(self.rows), torch.float32).zero_()
            self._row_offsets = [sum(self.rows[:t]) for t in range(len(self.rows))]
            if state_format == "dynamic_map":
                self._qmaps = (fusekit.create_dynamic_map(True), fusekit.create_dynamic_map(False))
        self.register_buffer("iter", torch.zeros(1, dtype=torch.int64), persistent=False)
        self._placeholder = torch.zeros(0, requires_grad=True)
        self.feature_dims = [self.dims[t] for t in self.feature_table_map]
        #: The stats of the last step per table (fusekit.EmbeddingBagLazyAdamStats).
        self.last_stats: List[Any] = []
        self._lr_source: Optional[Any] = None

    def _view(self, flat: torch.Tensor, t: int) -> torch.Tensor:
        o, r, d = self.weights_offsets[t], self.rows[t], self.dims[t]
        return flat[o:o + r * d].view(r, d)

    # What TorchRec calls on a TBE.
    def split_embedding_weights(self) -> List[torch.Tensor]:
        return [self._view(self.weights_host, t) for t in range(len(self.rows))]

    def _absmax(self, flat: torch.Tensor, t: int) -> torch.Tensor:
        o = self._row_offsets[t]
        return flat[o:o + self.rows[t]]

    def split_optimizer_states(self) -> List[List[torch.Tensor]]:
        """Per table: m, v (float32 [rows, dim]; 8-bit: uint8 codes, then the absmax (fp8: the
        scale) of m and of v, float32 [rows])."""
        out = []
        for t in range(len(self.rows)):
            states = [self._view(self.momentum1_host, t), self._view(self.momentum2_host, t)]
            if self.state_format is not None:
                states += [self._absmax(self.absmax1_host, t), self._absmax(self.absmax2_host, t)]
            out.append(states)
        return out

    def get_optimizer_state(self) -> List[Dict[str, torch.Tensor]]:
        keys = ["exp_avg", "exp_avg_sq"]
        if self.state_format == "dynamic_map":
            keys += ["exp_avg_absmax", "exp_avg_sq_absmax"]
        elif self.state_format == "fp8":
            keys += ["exp_avg_scale", "exp_avg_sq_scale"]
        return [dict(zip(keys, states)) for states in self.split_optimizer_states()]

    def state_bytes(self) -> int:
        """Bytes of Adam state this group holds (moments and, 8-bit, the per-row absmax)."""
        return sum(x.numel() * x.element_size() for states in self.split_optimizer_states()
                   for x in states)

    def get_learning_rate(self) -> float:
        if self._lr_source is not None:
            return float(self._lr_source.param_groups[0]["lr"])
        return self.learning_rate

    def set_learning_rate(self, lr: float) -> None:
        self.learning_rate = float(lr)
        if self._lr_source is not None:
            self._lr_source.param_groups[0]["lr"] = float(lr)

    def attach_optimizer(self, optimizer: Any) -> None:
        """The learning rate is read from ``optimizer.param_groups[0]["lr"]`` at every step
        (TorchRec's fused optimizer of this kernel): an LR scheduler on ``model.fused_optimizer``
        takes effect at the next backward, with or without a call to its ``step()``."""
        self._lr_source = optimizer

    def set_optimizer_step(self, step: int) -> None:
        """The steps taken: the next backward is step ``step + 1`` (FBGEMM's ``iter``)."""
        self.iter.fill_(int(step))

    def get_optimizer_step(self) -> int:
        return int(self.iter.item())

    def update_hyper_parameters(self, params_dict: Dict[str, float]) -> None:
        for name, value in params_dict.items():
            if name == "lr":
                self.set_learning_rate(value)
            elif name in ("eps", "beta1", "beta2"):
                setattr(self, name, float(value))
            elif name == "weight_decay" and float(value) == 0.0:
                pass
            else:
                raise NotImplementedError(f"{_PREFIX}: setting hyper-parameter {name} is not "
                                          "supported (lr, eps, beta1, beta2 are)")

    def flush(self) -> None:
        pass

    def reset_cache_states(self) -> None:
        pass

    # The batch.
    def _features(self, indices: torch.Tensor, offsets: torch.Tensor
                  ) -> Iterator[Tuple[int, int, torch.Tensor, torch.Tensor, int, int]]:
        """Per feature: (feature, table, its ids, its [B + 1] offsets from 0, first lookup, end)."""
        n = len(self.feature_table_map)
        if n == 0:
            return
        total_bags = offsets.numel() - 1
        if total_bags < 0 or total_bags % n:
            raise ValueError(f"{_PREFIX}: offsets has {offsets.numel()} entries; a batch of "
                             f"{n} features needs F * B + 1")
        b = total_bags // n
        bounds = offsets[::b].tolist() if b else [int(offsets[0])] * (n + 1)
        for f, t in enumerate(self.feature_table_map):
            start, end = int(bounds[f]), int(bounds[f + 1])
            seg = offsets[f * b:(f + 1) * b + 1]
            yield f, t, indices[start:end], seg - start, start, end

    def _check_ids(self, indices: torch.Tensor, offsets: torch.Tensor) -> None:
        for f, t, ids, _, _, _ in self._features(indices, offsets):
            if ids.numel() == 0:
                continue
            lo, hi = (int(x) for x in torch.aminmax(ids))
            if lo < 0 or hi >= self.rows[t]:
                bad = lo if lo < 0 else hi
                pos = int(torch.nonzero((ids < 0) | (ids >= self.rows[t]))[0])
                raise IndexError(
                    f"{_PREFIX}: table {self.table_names[t]!r} (feature {f} of this group): id "
                    f"{bad} at lookup {pos} is out of range [0, {self.rows[t]}) (the rows this "
                    "shard holds); nothing was modified")

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor,
                per_sample_weights: Optional[torch.Tensor] = None, **kwargs: Any) -> torch.Tensor:
        if kwargs:
            raise NotImplementedError(f"{_PREFIX}: TBE forward arguments {sorted(kwargs)} are "
                                      "not supported (variable batch per feature, ...)")
        self._check_ids(indices, offsets)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.float()
        if not (torch.is_grad_enabled() and self.training):
            return self._pool(indices, offsets, per_sample_weights)
        out: torch.Tensor = _TBEFunction.apply(self._placeholder, indices, offsets,
                                               per_sample_weights, self)
        return out

    def _pool(self, indices: torch.Tensor, offsets: torch.Tensor,
              per_sample_weights: Optional[torch.Tensor]) -> torch.Tensor:
        n = len(self.feature_table_map)
        b = (offsets.numel() - 1) // n if n else 0
        weights = self.split_embedding_weights()
        outs = []
        for f, t, ids, off, start, end in self._features(indices, offsets):
            w = None if per_sample_weights is None else per_sample_weights[start:end]
            if self.pooling == "mean" and w is not None:
                # TBE's weighted mean (torch's embedding_bag takes weights with sum only).
                y = F.embedding_bag(ids, weights[t], off, mode="sum", per_sample_weights=w,
                                    include_last_offset=True)
                lengths = (off[1:] - off[:-1]).clamp(min=1).to(torch.float32)
                y = y / lengths[:, None]
            else:
                y = F.embedding_bag(ids, weights[t], off, mode=self.pooling,
                                    per_sample_weights=w, include_last_offset=True)
            outs.append(y)
        if not outs:
            return torch.empty(b, 0, dtype=torch.float32)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)

    def _grad_per_sample_weights(self, grad_output: torch.Tensor, indices: torch.Tensor,
                                 offsets: torch.Tensor) -> torch.Tensor:
        """d out / d w_i = table[ids_i] (sum; / len for mean): from the rows before the step."""
        grad = torch.zeros(indices.numel(), dtype=torch.float32)
        weights = self.split_embedding_weights()
        col = 0
        for f, t, ids, off, start, end in self._features(indices, offsets):
            d = self.dims[t]
            lengths = off[1:] - off[:-1]
            bag_of = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
            g = grad_output[:, col:col + d].float()
            vals = (g[bag_of] * weights[t][ids]).sum(1)
            if self.pooling == "mean":
                vals = vals / lengths.clamp(min=1).to(torch.float32)[bag_of]
            grad[start:end] = vals
            col += d
        return grad

    def _step(self, grad_output: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
              per_sample_weights: Optional[torch.Tensor]) -> None:
        """One Adam step per table of the group on the rows of the batch (FBGEMM's iteration
        counter: t = iter + 1, then iter = t)."""
        grad_output = grad_output.detach()
        if grad_output.dtype != torch.float32:
            grad_output = grad_output.float()
        if grad_output.stride(-1) != 1:
            grad_output = grad_output.contiguous()
        lr = self.get_learning_rate()
        t = int(self.iter.item()) + 1
        self.iter.fill_(t)
        beta1, beta2 = self.beta1, self.beta2
        eps_t = self.eps * math.sqrt(1.0 - beta2 ** t)
        psw = None if per_sample_weights is None else per_sample_weights.detach().float()
        # Per table, the features that look it up (TBE shares a table between features).
        per_table: Dict[int, List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                        Optional[torch.Tensor]]]] = {}
        col = 0
        for f, tab, ids, off, start, end in self._features(indices, offsets):
            d = self.dims[tab]
            g = grad_output[:, col:col + d]
            w = None if psw is None else psw[start:end]
            per_table.setdefault(tab, []).append((g, ids, off, w))
            col += d
        m_all = self.split_optimizer_states()
        var_all = self.split_embedding_weights()
        stats = []
        for tab, parts in per_table.items():
            if len(parts) == 1:
                g, ids, off, w = parts[0]
            else:
                g = torch.cat([p[0] for p in parts])
                ids = torch.cat([p[1] for p in parts])
                shifted, base = [parts[0][2]], int(parts[0][2][-1])
                for p in parts[1:]:
                    shifted.append(p[2][1:] + base)
                    base += int(p[2][-1])
                off = torch.cat(shifted)
                w = None if psw is None else torch.cat([p[3] for p in parts])  # type: ignore
            if self.state_format is not None:
                stats.append(self._step_8bit(tab, var_all[tab], m_all[tab], g, ids, off, w, t,
                                             lr, eps_t))
                continue
            m, v = m_all[tab][0], m_all[tab][1]
            stats.append(fusekit.embedding_bag_lazy_adam(
                var_all[tab], g, ids, off, m, v, per_sample_weights=w, mode=self.pooling,
                step=t - 1, lr=lr, beta1=beta1, beta2=beta2, eps=eps_t,
                num_threads=self.num_threads))
        self.last_stats = stats

    def _step_8bit(self, tab: int, var: torch.Tensor, states: List[torch.Tensor],
                   g: torch.Tensor, ids: torch.Tensor, off: torch.Tensor,
                   w: Optional[torch.Tensor], t: int, lr: float, eps_t: float) -> Any:
        """The 8-bit step, fused: one call of fusekit's EmbeddingBagLazyAdamQuant on the
        gradient of the pooled output (no per-lookup gradient), as the float32 step calls
        EmbeddingBagLazyAdam. The table's per-row absmax (fp8: scale) is the operator's
        ``[rows, ceil(dim / 256)]`` block scales: one block per row (tables up to 256 wide)."""
        m, v, a1, a2 = states
        qm, qv = self._qmaps if self.state_format == "dynamic_map" else (None, None)
        return fusekit.embedding_bag_lazy_adam_quant(
            var, g, ids, off, m, v, qm, qv, a1.view(-1, 1), a2.view(-1, 1),
            per_sample_weights=w, mode=self.pooling, step=t - 1, lr=lr, beta1=self.beta1,
            beta2=self.beta2, eps=eps_t, state_format=str(self.state_format),
            guard_lost_v=self.guard_lost_v, num_threads=self.num_threads)


class FusekitBatchedFusedEmbeddingBag(BaseBatchedEmbeddingBag, FusedOptimizerModule):
    """TorchRec's FUSED compute kernel for a table group, on fusekit: what
    ``BatchedFusedEmbeddingBag`` is around FBGEMM's TBE, around :class:`FusedAdamTBE`. Its
    fused optimizer is TorchRec's own ``EmbeddingFusedOptimizer`` (the state names
    ``<table>.momentum1``, ``<table>.exp_avg_sq``, ShardedTensor or DTensor shards)."""

    def __init__(self, config: GroupedEmbeddingConfig, pg: Optional[Any] = None,
                 device: Optional[torch.device] = None,
                 sharding_type: Optional[ShardingType] = None,
                 env: Optional[ShardingEnv] = None,
                 options: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(config, pg, device, sharding_type)
        names = [t.name for t in config.embedding_tables]
        if device is not None and device.type != "cpu":
            raise ValueError(f"{_PREFIX}: tables {names}: device {device} (fusekit's kernel runs "
                             "on CPU; on GPU use TorchRec's own sharders)")
        if config.data_type != DataType.FP32:
            raise ValueError(f"{_PREFIX}: tables {names}: data type {config.data_type} "
                             "(fusekit's kernel trains float32 tables)")
        if self._pooling == PoolingMode.SUM:
            pooling = "sum"
        elif self._pooling == PoolingMode.MEAN:
            pooling = "mean"
        else:
            raise ValueError(f"{_PREFIX}: tables {names}: pooling {self._pooling} is not "
                             "supported (sum, mean)")
        hyper = adam_hyperparameters(dict(config.fused_params or {}), names)
        options = dict(options or {})
        self._emb_module = FusedAdamTBE(
            self._local_rows, self._local_cols, self._feature_table_map, pooling, names,
            num_threads=int(options.get("num_threads", 0)),
            hugepages=bool(options.get("hugepages", True)), **hyper)
        self._optim = EmbeddingFusedOptimizer(config, self._emb_module, pg)
        self._emb_module.attach_optimizer(self._optim)
        self.init_parameters()

    @property
    def _param_per_table(self) -> Dict[str, TableBatchedEmbeddingSlice]:
        """Per table name, its weight as one slice of the flat buffer (a table column-wise sharded
        into several shards on this rank: the shards together), each with a per-table fused
        optimizer that shares this kernel's state, step and learning rate (TorchRec's
        composability API, as for FBGEMM's kernel)."""
        tbe = self._emb_module
        out: Dict[str, TableBatchedEmbeddingSlice] = {}
        counts = dict(self.table_name_to_count)
        weights = tbe.split_embedding_weights()
        states = tbe.get_optimizer_state()
        for t, table in enumerate(self._config.embedding_tables):
            if table.name not in counts:
                continue
            count = counts.pop(table.name)
            start = tbe.weights_offsets[t]
            weight = TableBatchedEmbeddingSlice(
                data=tbe.weights_host, start_offset=start,
                end_offset=start + count * tbe.rows[t] * tbe.dims[t], num_embeddings=-1,
                embedding_dim=tbe.dims[t])
            weight._in_backward_optimizers = [EmbeddingFusedOptimizer(
                config=self._config, emb_module=tbe, pg=self._pg,
                create_for_table=table.name, param_weight_for_table=weight,
                embedding_weights_by_table=weights, all_optimizer_states=states)]
            out[table.name] = weight
        return out

    @_param_per_table.setter
    def _param_per_table(self, v: Dict[str, TableBatchedEmbeddingSlice]) -> None:
        self.__dict__["_param_per_table_unused"] = v

    @property
    def emb_module(self) -> FusedAdamTBE:
        return self._emb_module

    @property
    def fused_optimizer(self) -> FusedOptimizer:
        return self._optim

    def forward(self, features: KeyedJaggedTensor, vbe_output: Optional[torch.Tensor] = None,
                vbe_output_offsets: Optional[torch.Tensor] = None) -> torch.Tensor:
        if features.variable_stride_per_key():
            raise NotImplementedError(f"{_PREFIX}: a variable batch size per feature (VBE) is "
                                      "not supported")
        out: torch.Tensor = super().forward(features)
        return out

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[Tuple[str, torch.Tensor]]:
        # Fused parameters are not buffers (TorchRec's convention for fused kernels).
        yield from ()

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[Tuple[str, nn.Parameter]]:
        for name, tensor in self.named_split_embedding_weights(prefix, recurse,
                                                               remove_duplicate):
            param = nn.Parameter(tensor)
            param._in_backward_optimizers = [EmptyFusedOptimizer()]  # type: ignore[attr-defined]
            yield name, param

    def flush(self) -> None:
        pass

    def purge(self) -> None:
        pass
