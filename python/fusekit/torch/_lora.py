"""Multi-LoRA for PyTorch: vLLM's ``add_lora`` on fusekit's AddLora, as torch custom ops.

- ``torch.ops.fusekit.add_lora`` (functional: returns a new tensor, ``y`` unchanged) and
  ``torch.ops.fusekit.add_lora_`` (in place on ``y``, ``mutates_args=("y",)``), each with a fake
  implementation, so that ``torch.compile(fullgraph=True)`` traces a module calling them without
  a graph break. The functional op is differentiable (a backward in plain torch ops).
- :func:`add_lora` / :func:`add_lora_`: the Python faces, with vLLM-style arguments
  (``weight_a=None``, ``y_slice_size=None``) turned into the ops' schema.
- :class:`MultiLoRALinear`: an ``nn.Linear`` plus W stacked adapters, one adapter per row.

Semantics (docs/add_lora.md, docs/torch_lora.md): row i with ``0 <= indices[i] < W`` gets
``out[i, y_offset:y_offset+H2] = y[i, ...] + scale * (x[i] @ A[idx, layer].T) @ B[idx, layer].T``
accumulated in float32 and rounded once to y's dtype; -1 (or W) is "no adapter" (the row is y's,
bit for bit); an index > W is refused before anything is written.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Tuple, overload

import torch
from torch import nn

from .. import _fusekit

__all__ = ["add_lora", "add_lora_", "MultiLoRALinear"]


# ---- helpers ------------------------------------------------------------------------------------
@overload
def _inner_contiguous(t: torch.Tensor) -> torch.Tensor: ...


@overload
def _inner_contiguous(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]: ...


def _inner_contiguous(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``t`` itself when its innermost dimension is contiguous (outer strides are free: the
    operator reads a slice of a wider buffer at full speed), else a contiguous copy."""
    if t is None or t.dim() == 0 or t.size(-1) <= 1 or t.stride(-1) == 1:
        return t
    return t.contiguous()


def _alloc_out(y: torch.Tensor) -> torch.Tensor:
    """The functional op's output: contiguous, y's shape and dtype (the fake returns the same).
    Every element is written by the operator (y's bits where no update lands)."""
    return torch.empty(y.shape, dtype=y.dtype, device=y.device)


def _empty_batch(y: torch.Tensor, x: torch.Tensor, indices: torch.Tensor) -> bool:
    # The library refuses zero sizes (as CANN does); a batch of no rows is a no-op here, which is
    # what a module sees at the end of a stream. Any other zero size still goes to the library.
    return y.dim() == 2 and x.dim() == 2 and y.size(0) == 0 and x.size(0) == 0 \
        and indices.numel() == 0


def _run(out: torch.Tensor, y: torch.Tensor, x: torch.Tensor, weight_b: torch.Tensor,
         indices: torch.Tensor, weight_a: Optional[torch.Tensor], layer_idx: int, scale: float,
         y_offset: int, y_slice_size: int) -> None:
    _fusekit.add_lora((y, x, weight_b, indices, weight_a, out),
                      dict(layer_idx=int(layer_idx), scale=float(scale), y_offset=int(y_offset),
                           y_slice_size=int(y_slice_size)), 0, None, 0, 0.0)


# ---- the custom ops ------------------------------------------------------------------------------
def _add_lora_impl(y: torch.Tensor, x: torch.Tensor, weight_b: torch.Tensor,
                   indices: torch.Tensor, weight_a: Optional[torch.Tensor], layer_idx: int,
                   scale: float, y_offset: int, y_slice_size: int) -> torch.Tensor:
    if _empty_batch(y, x, indices):
        return _alloc_out(y)
    y = _inner_contiguous(y)
    out = _alloc_out(y)
    _run(out, y, _inner_contiguous(x), _inner_contiguous(weight_b), indices,
         _inner_contiguous(weight_a), layer_idx, scale, y_offset, y_slice_size)
    return out


@torch.library.custom_op("fusekit::add_lora", mutates_args=())
def _add_lora_op(y: torch.Tensor, x: torch.Tensor, weight_b: torch.Tensor, indices: torch.Tensor,
                 weight_a: Optional[torch.Tensor], layer_idx: int, scale: float, y_offset: int,
                 y_slice_size: int) -> torch.Tensor:
    return _add_lora_impl(y, x, weight_b, indices, weight_a, layer_idx, scale, y_offset,
                          y_slice_size)


@_add_lora_op.register_fake
def _add_lora_fake(y: torch.Tensor, x: torch.Tensor, weight_b: torch.Tensor,
                   indices: torch.Tensor, weight_a: Optional[torch.Tensor], layer_idx: int,
                   scale: float, y_offset: int, y_slice_size: int) -> torch.Tensor:
    return y.new_empty(y.shape)  # contiguous, as _alloc_out


def _add_lora_inplace_impl(y: torch.Tensor, x: torch.Tensor, weight_b: torch.Tensor,
                           indices: torch.Tensor, weight_a: Optional[torch.Tensor],
                           layer_idx: int, scale: float, y_offset: int,
                           y_slice_size: int) -> None:
    if _empty_batch(y, x, indices):
        return
    x, weight_b = _inner_contiguous(x), _inner_contiguous(weight_b)
    weight_a = _inner_contiguous(weight_a)
    if y.dim() == 0 or y.size(-1) <= 1 or y.stride(-1) == 1:
        _run(y, y, x, weight_b, indices, weight_a, layer_idx, scale, y_offset, y_slice_size)
    else:  # the operator writes rows with a contiguous innermost dimension: via a copy
        tmp = y.contiguous()
        _run(tmp, tmp, x, weight_b, indices, weight_a, layer_idx, scale, y_offset, y_slice_size)
        y.copy_(tmp)


@torch.library.custom_op("fusekit::add_lora_", mutates_args=("y",))
def _add_lora_inplace_op(y: torch.Tensor, x: torch.Tensor, weight_b: torch.Tensor,
                         indices: torch.Tensor, weight_a: Optional[torch.Tensor], layer_idx: int,
                         scale: float, y_offset: int, y_slice_size: int) -> None:
    _add_lora_inplace_impl(y, x, weight_b, indices, weight_a, layer_idx, scale, y_offset,
                           y_slice_size)


@_add_lora_inplace_op.register_fake
def _add_lora_inplace_fake(y: torch.Tensor, x: torch.Tensor, weight_b: torch.Tensor,
                           indices: torch.Tensor, weight_a: Optional[torch.Tensor],
                           layer_idx: int, scale: float, y_offset: int,
                           y_slice_size: int) -> None:
    return None


# ---- autograd of the functional op ---------------------------------------------------------------
# out = y + P(scale * z), z[i] = (x[i] A_i^T) B_i^T on the rows with an adapter, P placing the
# H2 columns at y_offset. Written with dense one-hot products over the W adapters (memory
# O(B * W * R), no [B, H2, R] gather), in float32, the gradients cast to each input's dtype.
def _setup_context(ctx: Any, inputs: Tuple[Any, ...], output: torch.Tensor) -> None:
    y, x, weight_b, indices, weight_a, layer_idx, scale, y_offset, y_slice_size = inputs
    ctx.save_for_backward(x, weight_b, indices, weight_a)
    ctx.layer_idx, ctx.scale, ctx.y_offset = int(layer_idx), float(scale), int(y_offset)
    ctx.has_a = weight_a is not None


def _backward(ctx: Any, grad_out: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
    x, weight_b, indices, weight_a = ctx.saved_tensors
    layer, scale, off = ctx.layer_idx, ctx.scale, ctx.y_offset
    w, h2, r = weight_b.shape[0], weight_b.shape[2], weight_b.shape[3]
    rows = x.shape[0]
    need = ctx.needs_input_grad
    grad_y = grad_out if need[0] else None
    g = grad_out[:, off:off + h2].float()                                             # [B, H2]
    onehot = (indices.reshape(-1, 1).long() ==
              torch.arange(w, device=indices.device).reshape(1, -1)).float()          # [B, W]
    bl = weight_b[:, layer].float()                                                   # [W, H2, R]
    xf = x.float()
    if ctx.has_a:
        al = weight_a[:, layer].float()                                               # [W, R, H1]
        t_all = (xf @ al.reshape(w * r, -1).T).reshape(rows, w, r)                    # [B, W, R]
    else:
        al = None
        t_all = xf.reshape(rows, 1, r).expand(rows, w, r)
    t_sel = t_all * onehot.unsqueeze(-1)              # t of each row in its adapter's slot, else 0
    # d/dt: gt[i] = scale * g[i] B_i, in the row's adapter slot.
    gt_all = (g @ bl.permute(1, 0, 2).reshape(h2, w * r)).reshape(rows, w, r)
    gt_sel = scale * gt_all * onehot.unsqueeze(-1)                                    # [B, W, R]
    grad_x = grad_a = grad_b = None
    if need[1]:
        if ctx.has_a:
            grad_x = gt_sel.reshape(rows, w * r) @ al.reshape(w * r, -1)
        else:
            grad_x = gt_sel.sum(1)
        grad_x = grad_x.to(x.dtype)
    if need[2]:
        gb = scale * (g.T @ t_sel.reshape(rows, w * r)).reshape(h2, w, r).permute(1, 0, 2)
        grad_b = torch.zeros_like(weight_b)
        grad_b[:, layer] = gb.to(weight_b.dtype)
    if ctx.has_a and need[4]:
        ga = (gt_sel.reshape(rows, w * r).T @ xf).reshape(w, r, -1)
        grad_a = torch.zeros_like(weight_a)
        grad_a[:, layer] = ga.to(weight_a.dtype)
    return grad_y, grad_x, grad_b, None, grad_a, None, None, None, None


_add_lora_op.register_autograd(_backward, setup_context=_setup_context)


# ---- the Python faces ----------------------------------------------------------------------------
def _schema_args(layer_idx: int, scale: float, y_offset: int,
                 y_slice_size: Optional[int]) -> Tuple[int, float, int, int]:
    return (int(layer_idx), float(scale), int(y_offset),
            -1 if y_slice_size is None else int(y_slice_size))


def add_lora(y: torch.Tensor, x: torch.Tensor, weight_b: torch.Tensor, indices: torch.Tensor,
             weight_a: Optional[torch.Tensor] = None, layer_idx: int = 0, scale: float = 1.0,
             y_offset: int = 0, y_slice_size: Optional[int] = None) -> torch.Tensor:
    """vLLM's multi-LoRA add, functional: a new tensor (contiguous, y's shape and dtype); ``y`` is
    not modified.

    ``y`` [B, H3]; ``x`` [B, H1]; ``weight_b`` [W, L, H2, R]; ``weight_a`` [W, L, R, H1] or None
    (then x is already ``x @ A.T``, [B, R]); ``indices`` int32/int64 [B], -1 (or W) for no
    adapter. Row i gets ``out[i, y_offset:y_offset+H2] = y[i, ...] + scale * (x[i] @ A.T) @ B.T``
    with its adapter's A and B at ``layer_idx``, accumulated in float32. float16, bfloat16 or
    float32 CPU tensors. ``y_slice_size``: None or H2. Differentiable. Refusals raise
    :class:`fusekit.Error` with the library's message.
    """
    args = _schema_args(layer_idx, scale, y_offset, y_slice_size)
    if _eager(y, x, weight_b, indices, weight_a):
        return _add_lora_impl(y, x, weight_b, indices, weight_a, *args)
    return torch.ops.fusekit.add_lora(y, x, weight_b, indices, weight_a, *args)


def _needs_grad(*ts: Optional[torch.Tensor]) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in ts)


_increment_version: Optional[Callable[[torch.Tensor], None]] = getattr(
    torch.autograd.graph, "increment_version", None)


def _eager(*ts: Optional[torch.Tensor]) -> bool:
    """True for a plain eager call: plain CPU tensors (no meta, fake, functional or proxy ones), no
    dispatch mode, no compilation, no gradient wanted. Then the ops' bodies run directly: the
    torch.library dispatch costs about 10 us a call, three times the operator's own overhead on
    a decode step. Anything else goes through torch.ops.fusekit.*."""
    return (_increment_version is not None and not torch.compiler.is_compiling()
            and torch._C._len_torch_dispatch_stack() == 0
            and all(t is None or (type(t) is torch.Tensor and t.is_cpu) for t in ts)
            and not _needs_grad(*ts))


def add_lora_(y: torch.Tensor, x: torch.Tensor, weight_b: torch.Tensor, indices: torch.Tensor,
              weight_a: Optional[torch.Tensor] = None, layer_idx: int = 0, scale: float = 1.0,
              y_offset: int = 0, y_slice_size: Optional[int] = None) -> torch.Tensor:
    """:func:`add_lora` in place on ``y`` (vLLM's ``add_lora`` / ``add_lora_slice`` / ``bgmv``
    semantics); returns ``y``. Only the rows with an adapter, in the slice, are written.

    When autograd must see the update (grad mode on and x or a weight requires grad), it is
    computed by the differentiable functional op and copied into ``y`` (``y.copy_``), so that
    gradients reach x and the weights.
    """
    args = _schema_args(layer_idx, scale, y_offset, y_slice_size)
    if _eager(y, x, weight_b, indices, weight_a):
        _add_lora_inplace_impl(y, x, weight_b, indices, weight_a, *args)
        assert _increment_version is not None  # _eager is False without it
        _increment_version(y)  # what the dispatcher does for a mutated argument
    elif _needs_grad(x, weight_b, weight_a):
        y.copy_(torch.ops.fusekit.add_lora(y, x, weight_b, indices, weight_a, *args))
    else:
        torch.ops.fusekit.add_lora_(y, x, weight_b, indices, weight_a, *args)
    return y


# ---- the module ----------------------------------------------------------------------------------
class MultiLoRALinear(nn.Module):
    """An ``nn.Linear`` serving W LoRA adapters at once: each row of a batch names its adapter.

    ``forward(x, adapter_indices)`` = ``base(x)`` plus, for each row with ``0 <= index < W``,
    ``scale * (x_row @ A[index].T) @ B[index].T`` (one :func:`add_lora_` on the base output);
    -1 is "no adapter". ``x`` is [..., in_features]; ``adapter_indices`` has one entry per row
    (shape ``x.shape[:-1]``, or any shape with that many elements), or one per leading index
    (e.g. [batch] for x [batch, seq, in]: broadcast over the sequence).

    The adapters live in ``lora_a`` [W, 1, R, in_features] and ``lora_b`` [W, 1, out_features, R]
    (vLLM's stacked layout with L = 1; base's dtype and device), zero at first: buffers, saved in
    the state dict, or Parameters with ``trainable=True``. :meth:`set_adapter` loads one (PEFT's
    ``lora_A.weight`` [r, in] and ``lora_B.weight`` [out, r], r <= R, zero-padded to R),
    :meth:`clear_adapter` zeroes one. ``scale`` multiplies every adapter's update; a per-adapter
    factor (PEFT's ``lora_alpha / r``) is folded into B by ``set_adapter(..., scale=...)``.
    """

    def __init__(self, base: nn.Linear, num_adapters: int, rank: int, *, scale: float = 1.0,
                 trainable: bool = False):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"MultiLoRALinear wraps an nn.Linear, got {type(base).__name__}")
        if int(num_adapters) < 1 or int(rank) < 1:
            raise ValueError(f"MultiLoRALinear: num_adapters ({num_adapters}) and rank ({rank}) "
                             "must be positive")
        self.base = base
        self.num_adapters, self.rank, self.scale = int(num_adapters), int(rank), float(scale)
        w = base.weight
        a = torch.zeros(self.num_adapters, 1, self.rank, base.in_features, dtype=w.dtype,
                        device=w.device)
        b = torch.zeros(self.num_adapters, 1, base.out_features, self.rank, dtype=w.dtype,
                        device=w.device)
        if trainable:
            self.lora_a, self.lora_b = nn.Parameter(a), nn.Parameter(b)
        else:
            self.register_buffer("lora_a", a)
            self.register_buffer("lora_b", b)

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def _check_slot(self, slot: int) -> int:
        slot = int(slot)
        if not 0 <= slot < self.num_adapters:
            raise IndexError(
                f"MultiLoRALinear: slot {slot} is not one of 0..{self.num_adapters - 1}")
        return slot

    @torch.no_grad()
    def set_adapter(self, slot: int, a: torch.Tensor, b: torch.Tensor,
                    scale: Optional[float] = None) -> None:
        """Loads an adapter into ``slot``: ``a`` [r, in_features] (PEFT's ``lora_A.weight``),
        ``b`` [out_features, r] (``lora_B.weight``), ``r <= rank`` (zero-padded); ``scale``, if
        given, is folded into B (``b * scale``). Nothing changes if the shapes are wrong."""
        slot = self._check_slot(slot)
        r = a.shape[0] if a.dim() == 2 else -1
        if (a.dim() != 2 or b.dim() != 2 or a.shape[1] != self.in_features
                or b.shape[0] != self.out_features or b.shape[1] != r or not 1 <= r <= self.rank):
            raise ValueError(
                f"MultiLoRALinear.set_adapter: a must be [r, {self.in_features}] and b "
                f"[{self.out_features}, r] with 1 <= r <= {self.rank}; got a {list(a.shape)}, "
                f"b {list(b.shape)}")
        b = b if scale is None else b.double() * float(scale)
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        self.lora_a[slot, 0, :r].copy_(a)
        self.lora_b[slot, 0, :, :r].copy_(b)

    @torch.no_grad()
    def clear_adapter(self, slot: int) -> None:
        """Zeroes ``slot``: rows that name it get base(x) exactly (nothing added but zeros)."""
        slot = self._check_slot(slot)
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()

    def forward(self, x: torch.Tensor, adapter_indices: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        lead = x.shape[:-1]
        idx = adapter_indices
        if idx.shape != lead and idx.numel() != math.prod(lead):
            # one index per leading position (e.g. per sequence): broadcast over the rest
            idx = idx.reshape(tuple(idx.shape) + (1,) * (len(lead) - idx.dim())).expand(lead)
        idx = idx.reshape(-1)
        rows = x.reshape(-1, self.in_features)
        y2 = y.reshape(-1, self.out_features)
        if _needs_grad(rows, self.lora_a, self.lora_b):
            y2 = add_lora(y2, rows, self.lora_b, idx, self.lora_a, 0, self.scale)
        else:
            add_lora_(y2, rows, self.lora_b, idx, self.lora_a, 0, self.scale)
        return y2.reshape(y.shape)

    def extra_repr(self) -> str:
        return f"num_adapters={self.num_adapters}, rank={self.rank}, scale={self.scale}"
