"""fusekit.torch's multi-LoRA: the custom ops torch.ops.fusekit.add_lora / add_lora_, their
Python faces, torch.compile tracing, autograd, and MultiLoRALinear.

Every expected value comes from a float64 reference written here with torch.einsum on the same
(already rounded) inputs, never from fusekit. Inputs come from generators seeded with SEED (plus a
per-case offset); the functional op's output buffer is poisoned with NaN (through its allocator
hook) so that an element the operator did not write shows.

Tolerance (check_close): the operator accumulates every sum in float32 and rounds once, to the
output dtype, at the end. So each element is within
  - one ulp of the output dtype at the reference's magnitude (round-to-nearest is half an ulp of
    the result's binade, which is at most one ulp of the reference's when the float32 error below
    carries the value across a power of two), plus
  - n * 2^-24 * sum_abs, n = H1 + R + 3: the worst-case float32 error of a dot product of H1
    terms, then one of R terms, the scale product and the add to y, in any summation order
    (|error| <= gamma_n * sum of |terms|),
    sum_abs = |y| + |scale| * sum_r (sum_k |x_k A_rk|) |B_or|.
The bound is worst-case, so it cannot flake; test_tolerance_is_not_vacuous shows it rejects a
float32 result rounded through a 16-bit intermediate, and the 16-bit dtypes' CANN-style rounding
of the intermediate t (or a second rounding of scale * z).
"""

import math

import numpy as np
import pytest
import torch

import fusekit
import fusekit.torch as ft
from fusekit.torch import _lora

SEED = 20261201
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def gen(k=0):
    return torch.Generator().manual_seed(SEED + k)


def bits(t):
    """The raw bits of t (so that -0.0 vs 0.0 and NaN payloads count)."""
    t = t.contiguous()
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def assert_bitwise(a, b, what=""):
    assert a.shape == b.shape and a.dtype == b.dtype, what
    assert torch.equal(bits(a), bits(b)), what


@pytest.fixture
def poisoned_out(monkeypatch):
    """The functional op's output comes from _lora._alloc_out: fill it with NaN first."""
    def alloc(y):
        return torch.full(y.shape, float("nan"), dtype=y.dtype)
    monkeypatch.setattr(_lora, "_alloc_out", alloc)


def make(k, b, h1, h2, h3, r, w, l, dtype, with_a=True):
    g = gen(k)
    x = torch.randn(b, h1 if with_a else r, generator=g).to(dtype)
    y = torch.randn(b, h3, generator=g).to(dtype)
    wa = (torch.randn(w, l, r, h1, generator=g) / math.sqrt(h1)).to(dtype) if with_a else None
    wb = (torch.randn(w, l, h2, r, generator=g) / math.sqrt(r)).to(dtype)
    return y, x, wb, wa


def reference(y, x, wb, idx, wa, layer, scale, off):
    """float64: out = y, rows with 0 <= idx < W get out[i, off:off+H2] += scale * (x A^T) B^T;
    also sum_abs, the per-element sum of |terms| (for the float32 error term)."""
    w, h2 = wb.shape[0], wb.shape[2]
    idx = idx.long()
    valid = (idx >= 0) & (idx < w)
    ic = torch.where(valid, idx, torch.zeros_like(idx))
    bsel = wb.double()[:, layer][ic]  # [B, H2, R]
    x64 = x.double()
    if wa is None:
        t, tabs = x64, x64.abs()
    else:
        asel = wa.double()[:, layer][ic]  # [B, R, H1]
        t = torch.einsum("bi,bri->br", x64, asel)
        tabs = torch.einsum("bi,bri->br", x64.abs(), asel.abs())
    z = torch.einsum("br,bor->bo", t, bsel)
    zabs = torch.einsum("br,bor->bo", tabs, bsel.abs())
    out, sum_abs = y.double().clone(), y.double().abs()
    out[valid, off:off + h2] += scale * z[valid]
    sum_abs[valid, off:off + h2] += abs(scale) * zabs[valid]
    return out, sum_abs


def violations(got, ref, sum_abs, n_terms):
    fi = torch.finfo(got.dtype)
    mag = ref.abs().clamp_min(fi.smallest_normal)
    ulp = torch.exp2(torch.floor(torch.log2(mag))) * fi.eps
    tol = ulp + n_terms * 2.0 ** -24 * sum_abs
    return ~((got.double() - ref).abs() <= tol)  # NaN counts as a violation


def check_close(got, ref, sum_abs, n_terms):
    bad = violations(got, ref, sum_abs, n_terms)
    if bad.any():
        i = bad.nonzero()[0].tolist()
        pytest.fail(f"{int(bad.sum())} of {bad.numel()} elements outside the bound; first at {i}: "
                    f"got {got[tuple(i)].item()}, want {ref[tuple(i)].item()}")


def untouched_mask(shape, idx, w, off, h2):
    """True where the update does not land: rows without an adapter, columns outside the slice."""
    m = torch.ones(shape, dtype=torch.bool)
    rows = (idx.long() >= 0) & (idx.long() < w)
    m[rows.nonzero().flatten()[:, None], torch.arange(off, off + h2)[None, :]] = False
    return m


def indices_for(k, b, w):
    if b in (8, 9):  # one adapter for 8 rows: a group of 8 takes the prefill (GEMM) path
        idx = torch.full((b,), 1, dtype=torch.int64)
        if b == 9:
            idx[4] = -1
        return idx
    idx = torch.randint(-1, w + 1, (b,), generator=gen(1000 + k))  # -1 .. W (W: no adapter too)
    idx[0] = 0  # at least one row with an adapter
    return idx


# ---- the ops against float64 --------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_a", [True, False], ids=["A", "noA"])
@pytest.mark.parametrize("b", [1, 7, 8, 9, 64])
@pytest.mark.parametrize("r", [1, 8, 16])
def test_add_lora_against_float64(dtype, with_a, b, r, poisoned_out):
    k = b * 100 + r * 3 + int(with_a)
    w, l, layer, h1, h2, off = 3, 2, 1, 37, 23, 5
    h3 = h2 + 9  # the update goes to columns 5..27 of 32
    y, x, wb, wa = make(k, b, h1, h2, h3, r, w, l, dtype, with_a)
    idx = indices_for(k, b, w)
    if b > 1 and k % 2:
        idx = idx.to(torch.int32)
    y0 = y.clone()
    want, sum_abs = reference(y, x, wb, idx, wa, layer, 0.5, off)
    keep = untouched_mask(y.shape, idx, w, off, h2)

    out = ft.add_lora(y, x, wb, idx, wa, layer_idx=layer, scale=0.5, y_offset=off,
                      y_slice_size=h2 if k % 3 == 0 else None)
    assert out.dtype == dtype and out.shape == y.shape and out.data_ptr() != y.data_ptr()
    assert_bitwise(y, y0, "the functional op modified y")
    check_close(out, want, sum_abs, (h1 if with_a else 0) + r + 3)
    assert_bitwise(out[keep], y0[keep], "outside the update out must be y's bits")

    yy = y.clone()
    ptr = yy.data_ptr()
    ret = ft.add_lora_(yy, x, wb, idx, wa, layer, 0.5, off, h2)
    assert ret is yy and yy.data_ptr() == ptr
    check_close(yy, want, sum_abs, (h1 if with_a else 0) + r + 3)
    assert_bitwise(yy[keep], y0[keep], "add_lora_ wrote outside the update")
    # in place and into a new tensor the arithmetic is the same, element by element
    assert_bitwise(yy, out)


def test_tolerance_is_not_vacuous():
    # The bound of check_close rejects what a less careful kernel would produce.
    for dtype in DTYPES:
        b, h1, h2, r, w = 64, 37, 23, 16, 3
        y, x, wb, wa = make(7, b, h1, h2, h2, r, w, 2, dtype)
        idx = torch.randint(-1, w + 1, (b,), generator=gen(7))
        want, sum_abs = reference(y, x, wb, idx, wa, 1, 0.5, 0)
        n = h1 + r + 3
        assert not violations(want.to(dtype), want, sum_abs, n).any()  # the exact result, rounded
        low = torch.bfloat16 if dtype == torch.float32 else dtype
        # t = x A^T rounded to a 16-bit type (CANN's way), the rest exact
        valid = (idx >= 0) & (idx < w)
        ic = torch.where(valid, idx, torch.zeros_like(idx))
        t = torch.einsum("bi,bri->br", x.double(), wa.double()[:, 1][ic]).to(low).double()
        z = torch.einsum("br,bor->bo", t, wb.double()[:, 1][ic])
        bad = y.double().clone()
        bad[valid] += 0.5 * z[valid]
        assert violations(bad.to(dtype), want, sum_abs, n).sum() > 10, dtype
        if dtype != torch.float32:  # scale * z rounded to the dtype, then added: two roundings
            twice = y.double() + (want - y.double()).to(dtype).double()
            assert violations(twice.to(dtype), want, sum_abs, n).sum() > 10, dtype


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_rows_without_adapter(dtype, poisoned_out):
    y, x, wb, wa = make(3, 9, 16, 12, 12, 4, 2, 1, dtype)
    for idx in (torch.full((9,), -1), torch.full((9,), 2), torch.tensor([-1, 2] * 4 + [-1])):
        y0 = y.clone()
        out = ft.add_lora(y, x, wb, idx, wa)
        assert_bitwise(out, y0)  # every element written (no NaN poison left), all y's bits
        assert_bitwise(ft.add_lora_(y, x, wb, idx, wa), y0)


def test_layer_selects_the_stacked_layer():
    l = 3
    y, x, wb, wa = make(4, 7, 20, 14, 14, 8, 2, l, torch.float32)
    idx = torch.tensor([0, 1, 1, -1, 0, 1, 0])
    outs = []
    for layer in range(l):
        want, sum_abs = reference(y, x, wb, idx, wa, layer, 1.0, 0)
        outs.append(ft.add_lora(y, x, wb, idx, wa, layer_idx=layer))
        check_close(outs[-1], want, sum_abs, 20 + 8 + 3)
    assert not torch.equal(outs[1], outs[2])  # the layers differ, so the test can tell them apart


def test_slice_of_wider_y_only_the_slice_changes():
    # y is the V part of a fused QKV output: a column slice (row stride 40 > width 12) written
    # in place, without a copy; the other 28 columns of each row keep their bits.
    g = gen(5)
    qkv = torch.randn(9, 40, generator=g).half()
    qkv0 = qkv.clone()
    y = qkv[:, 20:32]
    x = torch.randn(9, 24, generator=g).half()
    wa = torch.randn(4, 1, 8, 24, generator=g).half() / 5
    wb = torch.randn(4, 1, 6, 8, generator=g).half() / 3
    idx = torch.tensor([3, 0, -1, 1, 4, 2, 3, 3, 0])
    want, sum_abs = reference(qkv0[:, 20:32], x, wb, idx, wa, 0, 1.0, 4)
    ft.add_lora_(y, x, wb, idx, wa, y_offset=4, y_slice_size=6)
    check_close(qkv[:, 20:32], want, sum_abs, 24 + 8 + 3)
    outside = torch.ones(40, dtype=torch.bool)
    outside[24:30] = False
    assert_bitwise(qkv[:, outside], qkv0[:, outside])
    # the functional op on the same view: a new contiguous tensor, qkv unchanged
    qkv1 = qkv.clone()
    out = ft.add_lora(y, x, wb, idx, wa, y_offset=4, y_slice_size=6)
    assert out.is_contiguous() and out.shape == (9, 12)
    assert_bitwise(qkv, qkv1)


def test_non_contiguous_innermost_dims_are_copied():
    y, x, wb, wa = make(6, 8, 18, 10, 10, 4, 3, 2, torch.bfloat16)
    idx = torch.tensor([0, 1, 2, -1, 2, 1, 0, 3])
    want, sum_abs = reference(y, x, wb, idx, wa, 1, 0.75, 0)
    xt = x.t().contiguous().t()                       # stride (1, 8)
    wat = wa.transpose(2, 3).contiguous().transpose(2, 3)
    wbt = wb.transpose(2, 3).contiguous().transpose(2, 3)
    yt = y.t().contiguous().t()
    assert xt.stride(-1) != 1 and yt.stride(-1) != 1 and wbt.stride(-1) != 1
    out = ft.add_lora(yt, xt, wbt, idx, wat, layer_idx=1, scale=0.75)
    check_close(out, want, sum_abs, 18 + 4 + 3)
    ret = ft.add_lora_(yt, xt, wbt, idx, wat, layer_idx=1, scale=0.75)
    assert ret is yt and yt.stride(-1) != 1  # y itself updated, through a copy
    assert_bitwise(yt, out)


def test_vllm_stacked_layout_as_is():
    # vLLM's layers hold lora_a_stacked [max_loras, 1, max_rank, in] and lora_b_stacked
    # [max_loras, 1, out, max_rank], int64 token_lora_indices with -1, and call
    #   add_lora(y, x, lora_a_stacked, lora_b_stacked, indices, 0, 1.0)         (punica)
    #   add_lora_slice(y, x, a, b, indices, 0, 1.0, y_offset, y_slice_size)     (merged QKV)
    #   bgmv(y, x, w_t_all [W, L, H2, H1], indices, layer_idx, scale)
    # Here: add_lora_(y, x, lora_b_stacked, indices, lora_a_stacked, ...), the same tensors.
    g = gen(8)
    max_loras, rank, hin, q, kv = 4, 8, 32, 16, 8
    tokens = 11
    x = torch.randn(tokens, hin, generator=g)
    a_stacked = [torch.zeros(max_loras, 1, rank, hin) for _ in range(3)]
    b_stacked = [torch.zeros(max_loras, 1, n, rank) for n in (q, kv, kv)]
    for slot in range(3):  # slot 3 stays empty (zeros), as in vLLM before an adapter is loaded
        for s in range(3):
            r = rank if slot != 1 else 4  # a rank-4 adapter in a rank-8 slot: zero-padded
            a_stacked[s][slot, 0, :r] = torch.randn(r, hin, generator=g) / 6
            b_stacked[s][slot, 0, :, :r] = torch.randn(b_stacked[s].shape[2], r, generator=g)
    indices = torch.tensor([0, 0, 1, -1, 2, 2, 2, 3, -1, 1, 0])  # int64, as vLLM's
    y = torch.randn(tokens, q + 2 * kv, generator=g)
    want = y.double().clone()
    sum_abs = y.double().abs()
    off = 0
    for s, n in enumerate((q, kv, kv)):  # vLLM's torch reference: bgmv_shrink then expand_slice
        sel = indices.clamp_min(0)
        t = torch.einsum("bi,boi->bo", x.double(), a_stacked[s][sel, 0].double())
        zz = torch.einsum("bi,boi->bo", t, b_stacked[s][sel, 0].double())
        want[indices >= 0, off:off + n] += zz[indices >= 0]
        _, sa = reference(y, x, b_stacked[s], indices, a_stacked[s], 0, 1.0, off)
        sum_abs[:, off:off + n] = sa[:, off:off + n]
        off += n
    yy = y.clone()
    off = 0
    for s, n in enumerate((q, kv, kv)):
        ft.add_lora_(yy, x, b_stacked[s], indices, a_stacked[s], 0, 1.0, off, n)
        off += n
    check_close(yy, want, sum_abs, hin + rank + 3)
    assert torch.equal(yy[indices == -1], y[indices == -1])
    assert torch.equal(yy[indices == 3], y[indices == 3])  # an empty slot adds exact zeros
    # bgmv: one matrix per adapter and layer, [W, L, H2, H1]: weight_b with R = H1, no weight_a
    w_t_all = torch.randn(3, 2, q, hin, generator=g) / 6
    idx = torch.tensor([2, -1, 0, 1, 1, 0, 2, -1, 0, 0, 1])
    yb = torch.zeros(tokens, q)
    ft.add_lora_(yb, x, w_t_all, idx, None, 1, 0.5)
    bw, sum_b = reference(torch.zeros(tokens, q), x, w_t_all, idx, None, 1, 0.5, 0)
    check_close(yb, bw, sum_b, hin + 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_int64_indices_read_as_they_are_bitwise_the_int32_result(dtype):
    """int64 indices (torch's and vLLM's type) go to the operator as they are, strided or not: the
    same bits as the int32 indices; any negative value means no adapter."""
    y, x, wb, wa = make(31, 37, 24, 16, 20, 8, 4, 2, dtype)
    g = gen(32)
    idx32 = torch.randint(-1, 5, (37,), generator=g, dtype=torch.int32)  # 4 == W: no adapter too
    want = ft.add_lora(y, x, wb, idx32, wa, 1, 0.5, 2)
    idx64 = idx32.to(torch.int64)
    idx64[idx64 == -1] = -(2 ** 62)
    assert torch.equal(ft.add_lora(y, x, wb, idx64, wa, 1, 0.5, 2), want)
    wide = torch.full((37, 3), 99, dtype=torch.int64)
    wide[:, 1] = idx64
    assert not wide[:, 1].is_contiguous()
    assert torch.equal(ft.add_lora(y, x, wb, wide[:, 1], wa, 1, 0.5, 2), want)
    yy = y.clone()
    ft.add_lora_(yy, x, wb, wide[:, 1], wa, 1, 0.5, 2)
    assert torch.equal(yy, want)


def test_empty_batch_is_a_no_op():
    y, x, wb, wa = make(9, 1, 8, 6, 6, 2, 2, 1, torch.float32)
    e_y, e_x, e_i = y[:0], x[:0], torch.zeros(0, dtype=torch.int64)
    assert ft.add_lora(e_y, e_x, wb, e_i, wa).shape == (0, 6)
    assert ft.add_lora_(e_y, e_x, wb, e_i, wa) is e_y


# ---- refusals -----------------------------------------------------------------------------------
def test_refusals_raise_with_the_library_message_and_modify_nothing():
    y, x, wb, wa = make(10, 5, 16, 12, 12, 4, 3, 2, torch.float32)
    idx = torch.tensor([0, 1, -1, 2, 1])
    y0 = y.clone()
    cases = [
        (dict(indices=torch.tensor([0, 1, -1, 2, 4])),
         r"indices\[4\] = 4 but weight_b has 3 adapters .*nothing was written", 561002),
        (dict(x=x.half()), r"x has dtype float16 but y has float32", 161002),
        (dict(wb=wb.bfloat16()), r"weight_b has dtype bfloat16 but y has float32", 161002),
        (dict(x=x[:4]), r"x has 4 rows but y has 5", 561002),
        (dict(wa=wa[:, :, :, :15]), r"weight_a has H1 = 15 but x has 16 columns", 561002),
        (dict(layer_idx=2), r"layer_idx = 2 is outside \[0, 2\)", 561002),
        (dict(y_slice_size=5), r"y_slice_size = 5 must be -1 or H2 = 12", 561002),
        (dict(y_offset=1), r"y_offset = 1 with H2 = 12 does not fit y's 12 columns", 561002),
        (dict(indices=idx.float()), r"indices has dtype float32", 161002),
        (dict(indices=torch.tensor([0, 1, -1, 2, 2 ** 40])),  # int64, read as it is (2^40 is
         r"indices\[4\] = 1099511627776 but weight_b has 3 adapters", 561002),  # 0 in int32)
        (dict(indices=torch.tensor([0, 1, -1, 2, 2 ** 32 + 1])),
         r"indices\[4\] = 4294967297 but weight_b has 3 adapters", 561002),
    ]
    for change, pattern, code in cases:
        args = dict(y=y, x=x, wb=wb, indices=idx, wa=wa, layer_idx=0, y_offset=0,
                    y_slice_size=None)
        args.update(change)
        for fn in (ft.add_lora, ft.add_lora_):
            with pytest.raises(fusekit.Error, match=pattern) as e:
                fn(args["y"], args["x"], args["wb"], args["indices"], args["wa"],
                   layer_idx=args["layer_idx"], y_offset=args["y_offset"],
                   y_slice_size=args["y_slice_size"])
            assert e.value.code == code, (change, str(e.value))
            assert isinstance(e.value, ValueError)
            assert_bitwise(y, y0, f"{change} modified y")


def test_in_place_on_its_own_input_is_refused_the_functional_op_is_not():
    # add_lora_(h, h, ...) would read x while writing it: the library refuses the overlap.
    h, _, wb, wa = make(20, 6, 16, 16, 16, 4, 2, 1, torch.float32)
    idx = torch.tensor([0, 1, -1, 0, 1, 1])
    h0 = h.clone()
    with pytest.raises(fusekit.Error, match=r"out overlaps x in memory") as e:
        ft.add_lora_(h, h, wb, idx, wa)
    assert e.value.code == 161002
    assert_bitwise(h, h0)
    want, sum_abs = reference(h, h, wb, idx, wa, 0, 1.0, 0)
    check_close(ft.add_lora(h, h, wb, idx, wa), want, sum_abs, 16 + 4 + 3)
    assert_bitwise(h, h0)


def test_fake_impl_traces_meta_tensors():
    m = torch.device("meta")
    y = torch.empty(6, 20, dtype=torch.bfloat16, device=m)
    x = torch.empty(6, 9, dtype=torch.bfloat16, device=m)
    wb = torch.empty(3, 2, 12, 4, dtype=torch.bfloat16, device=m)
    wa = torch.empty(3, 2, 4, 9, dtype=torch.bfloat16, device=m)
    idx = torch.empty(6, dtype=torch.int64, device=m)
    out = ft.add_lora(y, x, wb, idx, wa, layer_idx=1, y_offset=8)
    assert out.device == m and out.shape == (6, 20) and out.dtype == torch.bfloat16
    assert out.is_contiguous()
    assert ft.add_lora_(y, x, wb, idx, wa) is y


def test_opcheck_schema_fake_and_autograd_registration():
    # torch's own checks of a custom op: the schema declares exactly the mutations the kernel
    # makes (y for add_lora_, nothing for add_lora), the fake returns what the kernel returns
    # (shape, dtype, strides), autograd is registered, and AOT dispatch traces both.
    g = gen(19)
    y = torch.randn(7, 20, generator=g)
    x = torch.randn(7, 9, generator=g)
    wb = torch.randn(3, 2, 12, 4, generator=g)
    wa = torch.randn(3, 2, 4, 9, generator=g)
    idx = torch.tensor([0, 1, 2, -1, 3, 1, 0])
    sets = [(y, x, wb, idx, wa, 1, 0.5, 4, 12),
            (y, torch.randn(7, 4, generator=g), wb, idx.int(), None, 0, 1.0, 0, -1)]
    grads = (y.clone().requires_grad_(), x.clone().requires_grad_(), wb.clone().requires_grad_(),
             idx, wa.clone().requires_grad_(), 1, 0.5, 4, -1)
    for args in sets + [grads]:
        torch.library.opcheck(torch.ops.fusekit.add_lora.default, args)
    for args in sets:
        torch.library.opcheck(torch.ops.fusekit.add_lora_.default, (args[0].clone(),) + args[1:])
    assert "Tensor(a0!) y" in str(torch.ops.fusekit.add_lora_.default._schema)
    assert "!" not in str(torch.ops.fusekit.add_lora.default._schema)


# ---- autograd -----------------------------------------------------------------------------------
@pytest.mark.parametrize("with_a", [True, False], ids=["A", "noA"])
def test_functional_op_gradients_against_float64(with_a):
    y, x, wb, wa = make(11, 9, 13, 7, 12, 4, 3, 2, torch.float32, with_a)
    idx = torch.tensor([0, 2, -1, 1, 3, 2, 2, 0, 1])
    leaves = [t.clone().requires_grad_() for t in (y, x, wb)] + \
        ([wa.clone().requires_grad_()] if with_a else [])
    out = ft.add_lora(leaves[0], leaves[1], leaves[2], idx, leaves[3] if with_a else None,
                      layer_idx=1, scale=0.5, y_offset=3)
    go = torch.randn(out.shape, generator=gen(12))
    got = torch.autograd.grad(out, leaves, go)
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    ref_out, _ = reference(ref_leaves[0], ref_leaves[1], ref_leaves[2], idx,
                           ref_leaves[3] if with_a else None, 1, 0.5, 3)
    want = torch.autograd.grad(ref_out, ref_leaves, go.double())
    for name, g, w in zip(("y", "x", "weight_b", "weight_a"), got, want):
        assert g.dtype == torch.float32
        assert torch.allclose(g.double(), w, rtol=1e-5, atol=1e-5), name
    # the in-place face, with x requiring grad, routes through the functional op: x gets its grad
    xr = x.clone().requires_grad_()
    yy = torch.zeros_like(y)
    ft.add_lora_(yy, xr, wb, idx, wa, 1, 0.5, 3)
    gx = torch.autograd.grad(yy, xr, go)[0]
    assert torch.allclose(gx.double(), want[1], rtol=1e-5, atol=1e-5)


# ---- torch.compile ------------------------------------------------------------------------------
class _Tiny(torch.nn.Module):
    """A linear layer with adapters (MultiLoRALinear: add_lora_ on its output), then the
    functional op on that output (both custom ops in one graph)."""

    def __init__(self):
        super().__init__()
        g = gen(13)
        self.lora = ft.MultiLoRALinear(torch.nn.Linear(24, 20), num_adapters=3, rank=4, scale=0.5)
        for s in range(3):
            self.lora.set_adapter(s, torch.randn(4, 24, generator=g),
                                  torch.randn(20, 4, generator=g))
        self.register_buffer("wa", torch.randn(2, 2, 8, 20, generator=g) / 4)
        self.register_buffer("wb", torch.randn(2, 2, 10, 8, generator=g) / 3)

    def forward(self, x, idx):
        h = self.lora(x, idx)
        h = torch.relu(h)
        out = ft.add_lora(h, h, self.wb, idx % 2, self.wa, layer_idx=1, scale=0.25, y_offset=5,
                          y_slice_size=10)
        return out * 2.0


def test_torch_compile_fullgraph_matches_eager_without_graph_breaks():
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    mod = _Tiny()
    x = torch.randn(9, 24, generator=gen(14))
    idx = torch.tensor([0, 1, 2, -1, 0, 1, 2, -1, 0])
    with torch.no_grad():
        eager = mod(x, idx)
        explained = torch._dynamo.explain(mod)(x, idx)
        assert explained.graph_break_count == 0 and explained.graph_count == 1
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(mod, fullgraph=True, backend="inductor")
        got = compiled(x, idx)
        assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
        assert counters["stats"]["unique_graphs"] == 1
    # the ops are fusekit's in both runs; relu, the linear and the doubling are exact or the same
    assert torch.allclose(got, eager, rtol=1e-6, atol=1e-6), (got - eager).abs().max()
    torch._dynamo.reset()


# ---- MultiLoRALinear ----------------------------------------------------------------------------
def _module_reference(m, x, idx):
    """base(x) + scale * (x A^T) B^T per row, in float64 from the module's own tensors."""
    x64 = x.double().reshape(-1, m.in_features)
    y = x64 @ m.base.weight.double().T + m.base.bias.double()
    yabs = x64.abs() @ m.base.weight.double().abs().T + m.base.bias.double().abs()
    lora, sum_abs = reference(y, x64, m.lora_b.detach(), idx.reshape(-1), m.lora_a.detach(), 0,
                              m.scale, 0)
    return lora.reshape(*x.shape[:-1], -1), (sum_abs + yabs).reshape(*x.shape[:-1], -1)


def test_multi_lora_linear_against_float64():
    g = gen(15)
    base = torch.nn.Linear(19, 13)
    m = ft.MultiLoRALinear(base, num_adapters=4, rank=8, scale=0.5)
    assert m.lora_a.shape == (4, 1, 8, 19) and m.lora_b.shape == (4, 1, 13, 8)
    assert {"lora_a", "lora_b"} <= set(m.state_dict())
    assert [n for n, _ in m.named_parameters()] == ["base.weight", "base.bias"]
    a = [torch.randn(r, 19, generator=g) for r in (8, 3, 8)]
    b = [torch.randn(13, r, generator=g) for r in (8, 3, 8)]
    m.set_adapter(0, a[0], b[0])
    m.set_adapter(1, a[1], b[1], scale=2.0)  # rank 3 in a rank-8 slot; alpha/r folded into B
    m.set_adapter(3, a[2], b[2])
    x = torch.randn(2, 5, 19, generator=g)
    idx = torch.tensor([[0, 1, -1, 3, 2], [1, 1, 0, -1, 3]])  # slot 2: empty (zeros)
    with torch.no_grad():
        got = m(x, idx)
    assert got.shape == (2, 5, 13)
    # the reference from the adapters as given (not from the module's buffers)
    x64 = x.double().reshape(-1, 19)
    want = x64 @ base.weight.double().T + base.bias.double()
    scales = {0: 1.0, 1: 2.0, 3: 1.0}
    for row, slot in enumerate(idx.reshape(-1).tolist()):
        if slot in scales:
            k = {0: 0, 1: 1, 3: 2}[slot]
            want[row] += 0.5 * scales[slot] * (x64[row] @ a[k].double().T) @ b[k].double().T
    _, sum_abs = _module_reference(m, x, idx)
    n = 2 * 19 + 8 + 6  # the base GEMM (float32, 19 products + bias) then the LoRA's
    check_close(got.reshape(-1, 13), want, sum_abs.reshape(-1, 13), n)
    with torch.no_grad():
        plain = base(x)
    rows_without = (idx == -1) | (idx == 2)
    assert torch.equal(got[rows_without], plain[rows_without])
    # one index per sequence, broadcast over its tokens
    with torch.no_grad():
        per_seq = m(x, torch.tensor([3, -1]))
        per_tok = m(x, torch.tensor([[3] * 5, [-1] * 5]))
    assert torch.equal(per_seq, per_tok)
    # clearing a slot: its rows get base(x) exactly
    m.clear_adapter(0)
    with torch.no_grad():
        after = m(x, idx)
    assert torch.equal(after[idx == 0], plain[idx == 0])
    assert torch.equal(after[idx == 1], got[idx == 1])


def test_multi_lora_linear_refusals():
    m = ft.MultiLoRALinear(torch.nn.Linear(6, 5), num_adapters=2, rank=2)
    m.set_adapter(0, torch.ones(2, 6), torch.ones(5, 2))
    a0, b0 = m.lora_a.clone(), m.lora_b.clone()
    with pytest.raises(ValueError, match=r"a must be \[r, 6\]"):
        m.set_adapter(0, torch.ones(3, 6), torch.ones(5, 3))  # rank 3 > 2
    with pytest.raises(ValueError, match=r"b .*\[5, r\]"):
        m.set_adapter(1, torch.ones(2, 6), torch.ones(4, 2))
    with pytest.raises(IndexError, match=r"slot 2"):
        m.set_adapter(2, torch.ones(2, 6), torch.ones(5, 2))
    assert torch.equal(m.lora_a, a0) and torch.equal(m.lora_b, b0)
    with pytest.raises(fusekit.Error, match=r"indices\[1\] = 3"), torch.no_grad():
        m(torch.ones(2, 6), torch.tensor([0, 3]))
    with pytest.raises(TypeError):
        ft.MultiLoRALinear(torch.nn.Conv1d(1, 1, 1), 2, 2)


def test_multi_lora_linear_trainable_gradients():
    g = gen(16)
    m = ft.MultiLoRALinear(torch.nn.Linear(10, 7), num_adapters=3, rank=4, scale=0.5,
                           trainable=True)
    with torch.no_grad():
        m.lora_a.copy_(torch.randn(m.lora_a.shape, generator=g))
        m.lora_b.copy_(torch.randn(m.lora_b.shape, generator=g))
    x = torch.randn(6, 10, generator=g, requires_grad=True)
    idx = torch.tensor([0, 1, 2, -1, 1, 0])
    out = m(x, idx)
    go = torch.randn(out.shape, generator=gen(17))
    params = [x, m.base.weight, m.base.bias, m.lora_a, m.lora_b]
    got = torch.autograd.grad(out, params, go)
    p64 = [p.detach().double().requires_grad_() for p in params]
    y = p64[0] @ p64[1].T + p64[2]
    want_out, _ = reference(y, p64[0], p64[4], idx, p64[3], 0, 0.5, 0)
    want = torch.autograd.grad(want_out, p64, go.double(), retain_graph=True)
    for name, a, b in zip(("x", "weight", "bias", "lora_a", "lora_b"), got, want):
        assert torch.allclose(a.double(), b, rtol=1e-5, atol=1e-5), name
    # frozen adapters (buffers) in grad mode: add_lora_ on the base output; the base still gets
    # its gradient (the update's derivative with respect to y is the identity)
    frozen = ft.MultiLoRALinear(m.base, num_adapters=3, rank=4, scale=0.5)
    with torch.no_grad():
        frozen.lora_a.copy_(m.lora_a)
        frozen.lora_b.copy_(m.lora_b)
    out = frozen(x.detach(), idx)
    assert out.requires_grad
    got = torch.autograd.grad(out, [m.base.weight, m.base.bias], go)
    want = torch.autograd.grad(want_out, [p64[1], p64[2]], go.double())
    for name, a, b in zip(("weight", "bias"), got, want):
        assert torch.allclose(a.double(), b, rtol=1e-5, atol=1e-5), name


# ---- the GIL ------------------------------------------------------------------------------------
def test_gil_released_during_a_large_call():
    """Proved by the GIL itself (tests/python/helpers/gil.py): an observer thread holding the GIL
    sees y written while the caller has not come back from add_lora_; the control, a memset that
    holds the GIL, never is. (The probe reads y through NumPy: a torch op would release the GIL.)"""
    from helpers.gil import memset_holding_gil, releases_gil
    b, h, r = 512, 1024, 64
    g = gen(18)
    x = torch.randn(b, h, generator=g)
    wa = torch.randn(1, 1, r, h, generator=g) / 50
    wb = torch.randn(1, 1, h, r, generator=g) / 50
    idx = torch.zeros(b, dtype=torch.int64)
    y0 = torch.randn(b, h, generator=g)

    def lora_round():
        y = y0.clone()
        yn, before = y.numpy(), y0.numpy()
        return (lambda: ft.add_lora_(y, x, wb, idx, wa),
                lambda: bool((yn[:2] != before[:2]).any()
                             or (yn[::64, 0] != before[::64, 0]).any()))

    def held_round():
        buf = np.zeros(b * h, np.float32)
        return memset_holding_gil(buf), lambda: bool(buf[:64].any() or buf[::4096].any())

    ft.add_lora_(y0.clone(), x, wb, idx, wa)  # first call: torch's one-time imports, the workspace
    fusekit.set_num_threads(1)
    try:
        got = releases_gil(lora_round)
    finally:
        fusekit.set_num_threads(0)
    assert got[-1] == "proved", got
    held = releases_gil(held_round, rounds=3)
    assert held == ["late"] * 3, held


def test_eager_fast_path_bumps_the_version_counter():
    # A plain eager add_lora_ skips the torch.library dispatch (about 10 us a call) and must still
    # tell autograd that y changed: a tensor saved for backward and then modified in place is an
    # error at backward time, as with any in-place torch op.
    g = torch.Generator().manual_seed(5)
    y = torch.randn(4, 8, generator=g)
    x = torch.randn(4, 8, generator=g)
    wa = torch.randn(2, 1, 4, 8, generator=g)
    wb = torch.randn(2, 1, 8, 4, generator=g)
    idx = torch.tensor([0, 1, -1, 0])
    v0 = y._version
    ft.add_lora_(y, x, wb, idx, wa)
    assert y._version > v0
    w = torch.randn(8, requires_grad=True)
    yy = y.clone()
    loss = (yy * w).sum()  # saves yy for backward
    ft.add_lora_(yy, x, wb, idx, wa)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
