"""``FusedEmbeddingBag``: an ``nn.EmbeddingBag`` whose optimizer runs in its backward.

The forward pools with torch (``F.embedding_bag``); the backward does not make a gradient of the
weight: it runs fusekit's EmbeddingBagLazyAdam on the weight and the module's Adam state, the
rows of the batch updated from the gradient of the pooled output (no per-lookup gradient, no
sparse gradient, no optimizer object). The arithmetic is ``torch.optim.SparseAdam``'s on a sparse
gradient from ``nn.EmbeddingBag(sparse=True)`` (docs/embedding_bag_lazy_adam.md): per row the
summed gradient g, ``m = m*beta1 + g*(1-beta1)``, ``v = |v*beta2 + g*g*(1-beta2)|``,
``w += (m * -lr_t) / (sqrt(v) + eps)`` with ``lr_t = lr * sqrt(1 - beta2**t) / (1 - beta1**t)``.

``state="8bit"``: the moments as :class:`fusekit.torch.SparseAdam8bit` keeps them (8-bit codes
with one float32 scale per row and block of 256 columns, in either state format, with the lost-v
guard) and the step fusekit's EmbeddingBagLazyAdamQuant (docs/embedding_bag_lazy_adam_quant.md):
SparseAdam8bit's step on ``nn.EmbeddingBag(sparse=True)``'s gradient, fused.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

import fusekit

from ._base import check_state_options
from ._memory import empty_hugepage
from ._plans import PlanCache

_PREFIX = "fusekit.torch.FusedEmbeddingBag"


class _FusedEmbeddingBagFunction(torch.autograd.Function):
    """forward: F.embedding_bag; backward: the fused step on the module's weight and state."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                per_sample_weights: Optional[torch.Tensor], module: "FusedEmbeddingBag"
                ) -> torch.Tensor:
        out = F.embedding_bag(indices, weight, offsets, mode=module.mode,
                              per_sample_weights=per_sample_weights, include_last_offset=True)
        ctx.module = module
        ctx.save_for_backward(indices, offsets, per_sample_weights)
        return out

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        indices, offsets, per_sample_weights = ctx.saved_tensors
        module: FusedEmbeddingBag = ctx.module
        grad_weights = None
        if ctx.needs_input_grad[3]:
            # d out[b] / d w_i = weight[indices[i]] (sum mode): the rows before this step changes
            # them.
            bag_of = torch.repeat_interleave(
                torch.arange(offsets.numel() - 1), offsets[1:] - offsets[:-1])
            grad_weights = (grad_output[bag_of] * module.weight.detach()[indices]).sum(1)
        module._fused_step(grad_output, indices, offsets, per_sample_weights)
        return None, None, None, grad_weights, None


class FusedEmbeddingBag(nn.Module):
    """``nn.EmbeddingBag`` with Adam in its backward (fusekit's EmbeddingBagLazyAdam, or with
    ``state="8bit"`` EmbeddingBagLazyAdamQuant).

    ``FusedEmbeddingBag(num_embeddings, embedding_dim, mode="sum", lr=1e-3, betas=(0.9, 0.999),
    eps=1e-8)``: ``weight`` [num_embeddings, embedding_dim] float32 (initialized as
    nn.EmbeddingBag's, N(0, 1), or ``_weight``); the Adam state as buffers ``exp_avg``,
    ``exp_avg_sq`` (zeros) and ``step`` (the steps taken), so ``state_dict()`` holds everything a
    resumed run needs. ``forward(input, offsets=None, per_sample_weights=None)`` takes what
    nn.EmbeddingBag takes (a 2-D input of fixed-size bags, or a 1-D input with offsets, [B] or
    with ``include_last_offset=True`` [B + 1]; per_sample_weights with mode "sum", as torch
    allows); each backward through the output is one Adam step on the rows of that batch: the
    weight gets no ``.grad`` (an optimizer over ``model.parameters()`` skips it). ``lr`` may be
    changed between steps (``module.lr = ...``). Not supported: ``padding_idx``, ``max_norm``,
    ``scale_grad_by_freq``, mode "max" (a clear error). Refusals (an id out of range) modify
    nothing. ``hugepages`` (default True): the weight and the state on huge-page memory
    (:func:`fusekit.torch.empty_hugepage`), which the random row access needs to run at speed.

    ``state="8bit"`` (default ``"fp32"``): m and v kept as :class:`fusekit.torch.SparseAdam8bit`
    keeps them, 2 D + 8 ceil(D / 256) bytes per row instead of 8 D, under SparseAdam8bit's names
    and layout: buffers ``state1`` / ``state2`` (uint8 codes [num_embeddings, embedding_dim],
    views of one [R, 2, D] table), ``absmax1`` / ``absmax2`` (float32 [R, ceil(D / 256)], views of
    one [R, 2, B] table) and ``qmap1`` / ``qmap2`` (the dynamic maps) with
    ``state_format="dynamic_map"`` (the default), or ``scale1`` / ``scale2`` with
    ``state_format="fp8"`` (m as E4M3, sqrt(v) as UE4M4: docs/fp8_state.md); ``guard_lost_v``
    as SparseAdam8bit's (default True; always on in fp8). Each backward is then SparseAdam8bit's
    step on the gradient ``nn.EmbeddingBag(sparse=True)`` would make, fused
    (docs/embedding_bag_lazy_adam_quant.md).
    """

    # The buffers (registered in __init__), typed for the checkers: float32 state ...
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    # ... or 8-bit state (SparseAdam8bit's names; absmax1/absmax2 or scale1/scale2 by format)
    state1: torch.Tensor
    state2: torch.Tensor
    step: torch.Tensor

    #: The values of ``state``.
    STATES = ("fp32", "8bit")

    def __init__(self, num_embeddings: int, embedding_dim: int, mode: str = "sum",
                 lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 include_last_offset: bool = False, _weight: Optional[torch.Tensor] = None,
                 padding_idx: Optional[int] = None, max_norm: Optional[float] = None,
                 scale_grad_by_freq: bool = False, num_threads: int = 0,
                 hugepages: bool = True, state: str = "fp32", state_format: str = "dynamic_map",
                 guard_lost_v: bool = True) -> None:
        super().__init__()
        if state not in self.STATES:
            raise ValueError(f"{_PREFIX}: state = {state!r} must be one of {self.STATES}")
        if state == "8bit":
            state_format, guard_lost_v = check_state_options(
                _PREFIX, {"state_format": state_format, "guard_lost_v": guard_lost_v},
                formats=fusekit.SPARSE_STATE_FORMATS)
        if mode not in fusekit.POOLING_MODES:
            raise ValueError(f"{_PREFIX}: mode = {mode!r} must be one of {fusekit.POOLING_MODES} "
                             "(mode 'max' has no gradient an Adam step could take per row)")
        for name, value in (("padding_idx", padding_idx), ("max_norm", max_norm)):
            if value is not None:
                raise NotImplementedError(f"{_PREFIX}: {name} is not supported")
        if scale_grad_by_freq:
            raise NotImplementedError(f"{_PREFIX}: scale_grad_by_freq is not supported")
        if not 0.0 <= lr:
            raise ValueError(f"{_PREFIX}: lr = {lr} must be >= 0")
        self.num_embeddings = int(num_embeddings)
        self.embedding_dim = int(embedding_dim)
        self.mode = mode
        self.lr = float(lr)
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = float(eps)
        self.include_last_offset = bool(include_last_offset)
        self.num_threads = int(num_threads)
        shape = (self.num_embeddings, self.embedding_dim)
        # The table and its state on huge pages (fusekit.torch.empty_hugepage): the step reads
        # rows at random, and on 4 KiB pages misses the TLB on almost every row.
        empty = empty_hugepage if hugepages else (lambda s: torch.empty(s, dtype=torch.float32))
        weight = empty(shape)
        if _weight is None:
            nn.init.normal_(weight)
        else:
            if tuple(_weight.shape) != shape or _weight.dtype != torch.float32:
                raise ValueError(f"{_PREFIX}: _weight must be float32 of shape {shape}, got "
                                 f"{_weight.dtype} {tuple(_weight.shape)}")
            with torch.no_grad():
                weight.copy_(_weight)
        self.weight = nn.Parameter(weight)
        self.state = state
        self.state_format = state_format
        self.guard_lost_v = bool(guard_lost_v)
        if state == "fp32":
            self.register_buffer("exp_avg", empty(shape).zero_())
            self.register_buffer("exp_avg_sq", empty(shape).zero_())
        else:
            self._register_8bit_state(empty)
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))
        self._plans = PlanCache()
        #: The stats of the last step (fusekit.EmbeddingBagLazyAdamStats), or None.
        self.last_stats: Optional[fusekit.EmbeddingBagLazyAdamStats] = None

    def _register_8bit_state(self, empty: Any) -> None:
        """SparseAdam8bit's state of one table, packed by row as it packs it: m's and v's codes of
        a row side by side in one [R, 2, D] table, their scales in one [R, 2, B] table; zeros
        (every moment 0, in both formats)."""
        rows, cols = self.num_embeddings, self.embedding_dim
        blocks = fusekit.quant_blocks(cols)
        codes = empty((rows, 2, cols), torch.uint8).zero_()
        per_block = empty((rows, 2, blocks), torch.float32).zero_()
        k1, k2 = ("scale1", "scale2") if self.state_format == "fp8" else ("absmax1", "absmax2")
        self.register_buffer("state1", codes[:, 0, :])
        self.register_buffer("state2", codes[:, 1, :])
        self.register_buffer(k1, per_block[:, 0, :])
        self.register_buffer(k2, per_block[:, 1, :])
        if self.state_format == "dynamic_map":
            self.register_buffer("qmap1", torch.from_numpy(fusekit.create_dynamic_map(True)))
            self.register_buffer("qmap2", torch.from_numpy(fusekit.create_dynamic_map(False)))

    def state_bytes(self) -> int:
        """Bytes of optimizer state: codes, scales and maps (or float32 m and v), as
        ``SparseAdam8bit.state_bytes()`` counts those of an optimizer over this one table (the step
        counter not counted)."""
        names = (("exp_avg", "exp_avg_sq") if self.state == "fp32" else
                 ("state1", "state2", "scale1", "scale2", "absmax1", "absmax2", "qmap1", "qmap2"))
        return sum(t.numel() * t.element_size() for n, t in self.named_buffers() if n in names)

    def extra_repr(self) -> str:
        text = (f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}, lr={self.lr}, "
                f"betas={self.betas}, eps={self.eps}")
        if self.state == "8bit":
            text += (f", state='8bit', state_format={self.state_format!r}, "
                     f"guard_lost_v={self.guard_lost_v}")
        return text

    def _bags(self, input: torch.Tensor, offsets: Optional[torch.Tensor]
              ) -> Tuple[torch.Tensor, torch.Tensor]:
        """The lookups and the [B + 1] offsets of nn.EmbeddingBag's two input forms."""
        if input.dim() == 2:
            if offsets is not None:
                raise ValueError(f"{_PREFIX}: offsets must be None with a 2-D input")
            bags, n = input.shape
            return input.reshape(-1), torch.arange(bags + 1, dtype=input.dtype) * n
        if input.dim() != 1 or offsets is None or offsets.dim() != 1:
            raise ValueError(f"{_PREFIX}: input must be 2-D, or 1-D with 1-D offsets")
        offsets = offsets.to(input.dtype)
        if not self.include_last_offset:
            offsets = torch.cat([offsets, torch.tensor([input.numel()], dtype=input.dtype)])
        return input, offsets

    def forward(self, input: torch.Tensor, offsets: Optional[torch.Tensor] = None,
                per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        indices, full_offsets = self._bags(input, offsets)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.reshape(-1)
        if not (torch.is_grad_enabled() and self.weight.requires_grad):
            return F.embedding_bag(indices, self.weight, full_offsets, mode=self.mode,
                                   per_sample_weights=per_sample_weights,
                                   include_last_offset=True)
        return _FusedEmbeddingBagFunction.apply(self.weight, indices, full_offsets,
                                                per_sample_weights, self)

    def _fused_step(self, grad_output: torch.Tensor, indices: torch.Tensor,
                    offsets: torch.Tensor, per_sample_weights: Optional[torch.Tensor]) -> None:
        """One Adam step on the rows of the batch: fusekit's EmbeddingBagLazyAdam (or
        EmbeddingBagLazyAdamQuant)."""
        grad_output = grad_output.detach()
        if grad_output.dtype != torch.float32:
            grad_output = grad_output.float()
        if grad_output.stride(-1) != 1:
            grad_output = grad_output.contiguous()
        step = int(self.step)
        beta1, beta2 = self.betas
        lr_t = fusekit.bias_corrected_lr(self.lr, step, beta1, beta2)
        psw = None if per_sample_weights is None else per_sample_weights.detach().float()
        batch = (grad_output, indices, offsets, psw)
        attrs = dict(beta1=beta1, beta2=beta2, eps=self.eps,
                     mode=fusekit.POOLING_MODES.index(self.mode))
        if self.state == "fp32":
            tensors: Tuple[Any, ...] = batch + (self.exp_avg, self.exp_avg_sq, self.weight.data)
            plan_type: Any = fusekit.EmbeddingBagLazyAdamPlan
        else:
            fp8 = self.state_format == "fp8"
            no_map = torch.empty(0, dtype=torch.float32)
            buffers = dict(self.named_buffers())
            tensors = batch + (
                self.state1, self.state2, self.weight.data,
                no_map if fp8 else buffers["qmap1"], no_map if fp8 else buffers["qmap2"],
                buffers["scale1" if fp8 else "absmax1"], buffers["scale2" if fp8 else "absmax2"])
            attrs.update(state_format=fusekit.STATE_FORMATS.index(self.state_format),
                         guard_lost_v=int(self.guard_lost_v))
            plan_type = fusekit.EmbeddingBagLazyAdamQuantPlan
        key = (beta1, beta2, self.eps, self.mode, indices.dtype, offsets.dtype, psw is None)
        self.last_stats = self._plans.run(id(self), _Plan(plan_type, self.num_threads), tensors,
                                          attrs, key, 0, lr_t)
        self.step.add_(1)

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> "FusedEmbeddingBag":
        # .to(), .float(), ...: the plans were made for the old tensors' layouts.
        self._plans.clear()
        return super()._apply(fn, *args, **kwargs)


class _Plan:
    """``fusekit.EmbeddingBagLazyAdamPlan`` (or ``...QuantPlan``) with the module's thread count,
    for PlanCache (which calls ``plan_type(tensors, attrs)``); the class and the thread count are
    its cache slot's identity."""

    def __init__(self, plan_class: Any, num_threads: int) -> None:
        self.plan_class = plan_class
        self.num_threads = num_threads

    def __hash__(self) -> int:
        return hash((_Plan, self.plan_class, self.num_threads))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, _Plan) and other.plan_class is self.plan_class
                and other.num_threads == self.num_threads)

    def __call__(self, tensors: Any, attrs: Any) -> Any:
        return self.plan_class(tensors, attrs, self.num_threads)
