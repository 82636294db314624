"""Huge-page backing for the tables and optimizer states fusekit steps.

torch allocates tensors on ordinary 4 KiB pages (unless ``transparent_hugepage`` is ``always``),
and an operator that reads rows at random then misses the TLB on almost every row: LazyAdam at
the seed shape takes about twice as long. fusekit's optimizers therefore

- allocate the state they own (moments, codes, absmax) with :func:`empty_hugepage`: memory from
  fusekit's host allocator, 2 MiB-aligned and advised with ``MADV_HUGEPAGE`` before it is touched;
- advise a parameter's memory where it is, once, when the optimizer first sees it, with
  :func:`advise_hugepages` (``MADV_HUGEPAGE``, then ``MADV_COLLAPSE``: the kernel replaces the
  small pages under the tensor by huge ones in place). The storage is never replaced: FSDP,
  DeepSpeed and pinned host copies keep references to a parameter's memory, and an optimizer that
  moved it (``param.data = copy``) would step a copy nobody reads.

:func:`to_hugepages` (a copy on huge-page memory) stays for a user who owns the tensor and knows
that nothing else holds its memory.

What a user gets under each ``/sys/kernel/mm/transparent_hugepage/enabled`` mode is in
docs/python.md ("Memory pages").
"""

from __future__ import annotations

import math
from typing import List, Tuple, Union

import torch

from .. import _fusekit

HUGE_PAGE_BYTES = _fusekit.HUGE_PAGE_BYTES


Shape = Union[int, Tuple[int, ...], List[int]]  # a torch.Size is a tuple


def empty_hugepage(shape: Shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor on fusekit's host memory: 2 MiB-aligned and advised
    for huge pages when it is at least 2 MiB (else 64-byte aligned). The memory is freed when the
    last tensor viewing it goes."""
    dims = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = math.prod(dims) * itemsize
    if nbytes == 0:
        return torch.empty(dims, dtype=dtype)
    raw = _fusekit.empty_host(nbytes, True)  # a NumPy uint8 array that owns the memory
    flat = torch.from_numpy(raw)  # shares the memory and keeps `raw` alive
    return flat.view(dtype).view(dims)


def zeros_hugepage(shape: Shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """:func:`empty_hugepage`, zero-filled (the first touch: this is when the pages are taken)."""
    t = empty_hugepage(shape, dtype)
    t.zero_()
    return t


def is_hugepage_candidate(t: torch.Tensor) -> bool:
    """True for a CPU tensor of at least 2 MiB whose memory does not start on a 2 MiB boundary
    (fusekit's own allocations of that size always do)."""
    if t.device.type != "cpu" or t.layout != torch.strided:
        return False
    nbytes = t.untyped_storage().nbytes()
    return nbytes >= HUGE_PAGE_BYTES and t.untyped_storage().data_ptr() % HUGE_PAGE_BYTES != 0


def to_hugepages(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` on huge-page memory (same shape, dtype and strides when contiguous), or
    ``t`` itself when it is smaller than 2 MiB or already there. Use it once, as
    ``param.data = to_hugepages(param.data)``."""
    if not is_hugepage_candidate(t):
        return t
    out = empty_hugepage(t.shape, t.dtype)
    out.copy_(t)
    return out


def advise_hugepages(t: torch.Tensor) -> int:
    """Asks the kernel to back the whole 2 MiB pages of ``t``'s memory with huge pages where it is
    (``fusekit.memory``'s ``advise_huge_pages_in_place``: ``MADV_HUGEPAGE``, then
    ``MADV_COLLAPSE`` on Linux 6.1+, which copies the pages into huge ones without changing their
    addresses). Nothing moves: safe for a parameter that other code holds. Returns the bytes
    advised (0 for a tensor under 2 MiB, not on the CPU, or where madvise is refused)."""
    if t.device.type != "cpu" or t.layout != torch.strided or t.numel() == 0:
        return 0
    storage = t.untyped_storage()
    if storage.nbytes() < HUGE_PAGE_BYTES:
        return 0
    return int(_fusekit.advise_huge_pages_in_place(storage.data_ptr(), storage.nbytes()))


def hugepage_backed_fraction(t: torch.Tensor) -> float:
    """The fraction of ``t``'s bytes that the kernel backs with huge pages now (from
    /proc/self/smaps; -1.0 when that cannot be read)."""
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return 0.0
    got = _fusekit.huge_page_backed_bytes(t.data_ptr(), nbytes)
    return -1.0 if got < 0 else got / nbytes
