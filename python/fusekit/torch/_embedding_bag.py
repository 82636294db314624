"""``FusedEmbeddingBag``: an ``nn.EmbeddingBag`` whose optimizer runs in its backward.

The forward pools with torch (``F.embedding_bag``); the backward does not make a gradient of the
weight: it runs fusekit's EmbeddingBagLazyAdam on the weight and the module's Adam state, the
rows of the batch updated from the gradient of the pooled output (no per-lookup gradient, no
sparse gradient, no optimizer object). The arithmetic is ``torch.optim.SparseAdam``'s on a sparse
gradient from ``nn.EmbeddingBag(sparse=True)`` (docs/embedding_bag_lazy_adam.md): per row the
summed gradient g, ``m = m*beta1 + g*(1-beta1)``, ``v = |v*beta2 + g*g*(1-beta2)|``,
``w += (m * -lr_t) / (sqrt(v) + eps)`` with ``lr_t = lr * sqrt(1 - beta2**t) / (1 - beta1**t)``.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

import fusekit

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
    """``nn.EmbeddingBag`` with Adam in its backward (fusekit's EmbeddingBagLazyAdam).

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
    """

    # The buffers (registered in __init__), typed for the checkers.
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    step: torch.Tensor

    def __init__(self, num_embeddings: int, embedding_dim: int, mode: str = "sum",
                 lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 include_last_offset: bool = False, _weight: Optional[torch.Tensor] = None,
                 padding_idx: Optional[int] = None, max_norm: Optional[float] = None,
                 scale_grad_by_freq: bool = False, num_threads: int = 0,
                 hugepages: bool = True) -> None:
        super().__init__()
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
        self.register_buffer("exp_avg", empty(shape).zero_())
        self.register_buffer("exp_avg_sq", empty(shape).zero_())
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))
        self._plans = PlanCache()
        #: The stats of the last step (fusekit.EmbeddingBagLazyAdamStats), or None.
        self.last_stats: Optional[fusekit.EmbeddingBagLazyAdamStats] = None

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}, lr={self.lr}, "
                f"betas={self.betas}, eps={self.eps}")

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
        """One Adam step on the rows of the batch: fusekit's EmbeddingBagLazyAdam."""
        grad_output = grad_output.detach()
        if grad_output.dtype != torch.float32:
            grad_output = grad_output.float()
        if grad_output.stride(-1) != 1:
            grad_output = grad_output.contiguous()
        step = int(self.step)
        beta1, beta2 = self.betas
        lr_t = fusekit.bias_corrected_lr(self.lr, step, beta1, beta2)
        psw = None if per_sample_weights is None else per_sample_weights.detach().float()
        tensors = (grad_output, indices, offsets, psw, self.exp_avg, self.exp_avg_sq,
                   self.weight.data)
        attrs = dict(beta1=beta1, beta2=beta2, eps=self.eps,
                     mode=fusekit.POOLING_MODES.index(self.mode))
        key = (beta1, beta2, self.eps, self.mode, indices.dtype, offsets.dtype, psw is None)
        self.last_stats = self._plans.run(id(self), _Plan(self.num_threads), tensors, attrs, key,
                                          0, lr_t)
        self.step.add_(1)

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> "FusedEmbeddingBag":
        # .to(), .float(), ...: the plans were made for the old tensors' layouts.
        self._plans.clear()
        return super()._apply(fn, *args, **kwargs)


class _Plan:
    """``fusekit.EmbeddingBagLazyAdamPlan`` with the module's thread count, for PlanCache (which
    calls ``plan_type(tensors, attrs)``); the class is its cache slot's identity."""

    def __init__(self, num_threads: int) -> None:
        self.num_threads = num_threads

    def __hash__(self) -> int:
        return hash((_Plan, self.num_threads))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Plan) and other.num_threads == self.num_threads

    def __call__(self, tensors: Any, attrs: Any) -> Any:
        return fusekit.EmbeddingBagLazyAdamPlan(tensors, attrs, self.num_threads)
