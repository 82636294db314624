"""The framework-neutral functions of the fusekit package on NumPy arrays (and torch CPU tensors
where torch is installed): results against the NumPy golden references of golden/ (written from
the specs, independent of the C++ kernels), refusals that raise with the library's message and
modify nothing, and the plumbing (threads, GIL, strides, huge pages)."""

import os
import re

import numpy as np
import pytest

import fusekit
from conftest import runnable_implementations
from golden.add_lora import reference as add_lora_reference
from golden.apply_adam_w_quant import create_dynamic_map as golden_dynamic_map
from golden.apply_adam_w_quant import golden_step as awq_golden
from golden.apply_adam_w_quant import powf
from golden.lazy_adam import lazy_adam_golden

SEED = 20261201
POISON = np.float32(-7.77e7)  # no update produces it: a row that should not change keeps it


def rng(k=0):
    return np.random.default_rng(SEED + k)


def sparse_adam_lr(lr, step, beta1=0.9, beta2=0.999):
    """The bias-corrected rate of torch.optim.SparseAdam (t = step + 1), written here in NumPy
    float64: what fusekit.lazy_adam must hand its operator for a raw lr."""
    t = step + 1
    b1, b2 = np.float64(beta1), np.float64(beta2)
    return float(np.float64(lr) * np.sqrt(np.float64(1) - b2 ** t) / (np.float64(1) - b1 ** t))


def lazy_inputs(r, d, n, k=0, dup=True):
    g = rng(k)
    idx = g.integers(0, r, n) if dup else g.permutation(r)[:n]
    return (g.standard_normal((n, d)).astype(np.float32), idx.astype(np.int64),
            g.standard_normal((r, d)).astype(np.float32) * np.float32(0.1),
            g.random((r, d)).astype(np.float32) * np.float32(0.01),
            g.standard_normal((r, d)).astype(np.float32))


# ---- LazyAdam ---------------------------------------------------------------------------------
@pytest.mark.parametrize("d", [1, 7, 8, 16, 17, 32, 64, 65])
@pytest.mark.parametrize("dup", [False, True])
@pytest.mark.parametrize("impl", runnable_implementations(fusekit.implementations("lazy_adam")))
def test_lazy_adam_equals_golden(d, dup, impl):
    grad, idx, m, v, var = lazy_inputs(300, d, 120, k=d, dup=dup)
    idx[::17] = -1  # padding
    want = lazy_adam_golden(grad, idx, m, v, var, sparse_adam_lr(0.01, 3), 0.9, 0.999, 1e-7)
    st = fusekit.lazy_adam(var, grad, idx, m, v, step=3, lr=0.01, beta1=0.9, beta2=0.999,
                           eps=1e-7, implementation=impl)
    for got, exp in zip((m, v, var), want):
        np.testing.assert_array_equal(got, exp)  # bitwise: the spec fixes the float32 order
    keep = idx[idx >= 0]
    assert st.rows_updated == len(np.unique(keep))
    assert st.indices_padding == int(np.sum(idx < 0))


def test_lazy_adam_int32_indices_and_nonfinite_row():
    grad, idx, m, v, var = lazy_inputs(50, 8, 40, k=1)
    grad[3, 2] = np.inf
    want = lazy_adam_golden(grad, idx, m, v, var, sparse_adam_lr(0.02, 0, beta2=0.99), 0.9, 0.99,
                            1e-8)
    st = fusekit.lazy_adam(var, grad, idx.astype(np.int32), m, v, step=0, lr=0.02, beta2=0.99)
    for got, exp in zip((m, v, var), want):
        np.testing.assert_array_equal(got, exp)
    assert st.rows_skipped_nonfinite == 1


def test_lazy_adam_out_of_range_modifies_nothing():
    grad, idx, m, v, var = lazy_inputs(64, 8, 30, k=2)
    idx[11] = 64
    before = [a.copy() for a in (m, v, var)]
    with pytest.raises(fusekit.Error, match=r"indices\[11\] = 64") as e:
        fusekit.lazy_adam(var, grad, idx, m, v, step=0, lr=0.01)
    assert e.value.code == 161002
    for a, b in zip((m, v, var), before):
        np.testing.assert_array_equal(a, b)


def test_lazy_adam_strided_rows():
    # Row strides are free: step a table that is every other row of a larger buffer.
    grad, idx, m, v, var = lazy_inputs(40, 8, 25, k=3)
    big = [np.full((80, 8), POISON, np.float32) for _ in range(3)]
    for b, a in zip(big, (m, v, var)):
        b[::2] = a
    want = lazy_adam_golden(grad, idx, m, v, var, sparse_adam_lr(0.01, 5), 0.9, 0.999, 1e-8)
    fusekit.lazy_adam(big[2][::2], grad, idx, big[0][::2], big[1][::2], step=5, lr=0.01)
    for b, exp in zip(big, want):
        np.testing.assert_array_equal(b[::2], exp)
        assert np.all(b[1::2] == POISON)


def test_lazy_adam_empty():
    grad, idx, m, v, var = lazy_inputs(10, 4, 0, k=4)
    before = var.copy()
    st = fusekit.lazy_adam(var, grad, idx, m, v, step=0, lr=0.01)
    assert st.rows_updated == 0
    np.testing.assert_array_equal(var, before)


# ---- step and lr: the raw rate, bias-corrected inside ------------------------------------------
def sparse_adam_float64(var, grad, idx, m, v, step, lr, b1, b2, eps):
    """torch.optim.SparseAdam's algorithm in float64, the bias correction done here: the gradient
    summed per row, m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t), var -= lr * m_hat /
    (sqrt(v_hat) + eps / sqrt(1 - b2^t)) (torch's eps is added before the rate is corrected)."""
    var, m, v = (a.astype(np.float64) for a in (var, m, v))
    t = step + 1
    g = np.zeros_like(var)
    keep = idx >= 0
    np.add.at(g, idx[keep], grad[keep].astype(np.float64))
    rows = np.unique(idx[keep])
    c1, c2 = 1 - b1 ** t, 1 - b2 ** t
    m[rows] = b1 * m[rows] + (1 - b1) * g[rows]
    v[rows] = b2 * v[rows] + (1 - b2) * g[rows] ** 2
    var[rows] -= lr * (m[rows] / c1) / (np.sqrt(v[rows] / c2) + eps / np.sqrt(c2))
    return var, m, v


@pytest.mark.parametrize("fn", ["lazy_adam", "lazy_adam_quant"])
def test_lazy_functions_take_step_and_the_raw_lr(fn):
    """Five steps with a changing lr (a schedule): each step bitwise the golden module's with the
    rate corrected by this test (sparse_adam_lr), and the float32 trajectory of lazy_adam within
    float32 rounding of SparseAdam's algorithm run in float64."""
    from golden.lazy_adam_quant import lazy_adam_quant_golden
    g = rng(40)
    r, d, n = 30, 12, 20
    var = g.standard_normal((r, d)).astype(np.float32)
    m, v = np.zeros((r, d), np.float32), np.zeros((r, d), np.float32)
    qm, qv = fusekit.create_dynamic_map(True), fusekit.create_dynamic_map(False)
    codes_m, codes_v = np.zeros((r, d), np.uint8), np.zeros((r, d), np.uint8)
    am, av = np.zeros((r, 1), np.float32), np.zeros((r, 1), np.float32)
    ref = (var.astype(np.float64), m.astype(np.float64), v.astype(np.float64))
    b1, b2, eps = 0.8, 0.99, 1e-6
    for step in range(5):
        grad = g.standard_normal((n, d)).astype(np.float32)
        idx = g.integers(-1, r, n).astype(np.int64)
        lr = 0.05 / (step + 1)
        lr_t = sparse_adam_lr(lr, step, b1, b2)
        if fn == "lazy_adam":
            want = lazy_adam_golden(grad, idx, m, v, var, lr_t, b1, b2, eps)
            fusekit.lazy_adam(var, grad, idx, m, v, step=step, lr=lr, beta1=b1, beta2=b2, eps=eps)
            for got, exp in zip((m, v, var), want):
                np.testing.assert_array_equal(got, exp)
            ref = sparse_adam_float64(*ref[:1], grad, idx, *ref[1:], step, lr, b1, b2, eps)
            np.testing.assert_allclose(var, ref[0], rtol=0, atol=2e-6 * (step + 1))
        else:
            want = lazy_adam_quant_golden(grad, idx, codes_m, codes_v, var, qm, qv, am, av, lr_t,
                                          b1, b2, eps, "float32", "float32")
            fusekit.lazy_adam_quant(var, grad, idx, codes_m, codes_v, qm, qv, am, av, step=step,
                                    lr=lr, beta1=b1, beta2=b2, eps=eps)
            for got, exp in zip((codes_m, codes_v, var, am, av), want[:5]):
                np.testing.assert_array_equal(got, exp)


def test_lazy_adam_equals_torch_sparse_adam():
    """The peer: torch.optim.SparseAdam on the same table, three steps; within float32 rounding
    (torch forms (m / denom) * step_size, the operator (m * -lr_t) / denom)."""
    torch = pytest.importorskip("torch")
    g = rng(41)
    r, d, n = 40, 8, 25
    table = g.standard_normal((r, d)).astype(np.float32)
    emb = torch.nn.Embedding(r, d, sparse=True)
    with torch.no_grad():
        emb.weight.copy_(torch.from_numpy(table))
    opt = torch.optim.SparseAdam(emb.parameters(), lr=0.03, betas=(0.85, 0.995), eps=1e-6)
    var, m, v = table.copy(), np.zeros((r, d), np.float32), np.zeros((r, d), np.float32)
    for step in range(3):
        idx = g.integers(0, r, n).astype(np.int64)
        go = g.standard_normal((n, d)).astype(np.float32)
        opt.zero_grad()
        emb(torch.from_numpy(idx)).backward(torch.from_numpy(go))
        opt.step()
        fusekit.lazy_adam(var, go, idx, m, v, step=step, lr=0.03, beta1=0.85, beta2=0.995,
                          eps=1e-6)
    np.testing.assert_allclose(var, emb.weight.detach().numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("step", [-1, 2**62, 1.5, "3", True, None])
def test_step_refused_before_anything_is_written(step):
    grad, idx, m, v, var = lazy_inputs(10, 4, 3)
    before = [a.copy() for a in (m, v, var)]
    with pytest.raises(fusekit.Error, match=r"fusekit.lazy_adam: step") as e:
        fusekit.lazy_adam(var, grad, idx, m, v, step=step)
    assert e.value.code == 161002
    with pytest.raises(fusekit.Error, match=r"fusekit.adam_w: step"):
        fusekit.adam_w(var.ravel(), var.ravel().copy(), m.ravel(), v.ravel(), step=step)
    for a, b in zip((m, v, var), before):
        np.testing.assert_array_equal(a, b)


def test_step_is_required_and_keyword_only():
    grad, idx, m, v, var = lazy_inputs(10, 4, 3)
    with pytest.raises(TypeError):
        fusekit.lazy_adam(var, grad, idx, m, v)
    with pytest.raises(TypeError):
        fusekit.lazy_adam(var, grad, idx, m, v, 0)
    x = np.zeros(4, np.float32)
    with pytest.raises(TypeError):
        fusekit.adam_w(x, x.copy(), x.copy(), x.copy(), 0)


def test_bias_corrected_lr_is_sparse_adams():
    for step, lr, b1, b2 in [(0, 1e-3, 0.9, 0.999), (9, 0.05, 0.8, 0.99), (10**6, 1.0, 0.5, 0.5)]:
        assert fusekit.bias_corrected_lr(lr, step, b1, b2) == sparse_adam_lr(lr, step, b1, b2)
    assert np.isnan(fusekit.bias_corrected_lr(1e-3, 0, 1.0, 0.999))  # refused later by name


# ---- a refused call names the Python argument, not the aclnn one --------------------------------
ACLNN_NAMES = ("inputM", "inputV", "inputVar", "gradient", "varRef", "mRef", "vRef", "qmapM",
               "qmapV", "absmaxM", "absmaxV", "absmaxMRef", "absmaxVRef", "epsilon", "weightDecay",
               "gnormScale", "blockSize", "weightB", "weightAOptional", "layerIdx", "yOffset",
               "ySliceSize")


def assert_names(e, name):
    msg = str(e.value)
    assert re.search(rf"\b{name}\b", msg), msg
    for aclnn in ACLNN_NAMES:
        assert not re.search(rf"\b{aclnn}\b", msg), (aclnn, msg)


def lazy_bad(which):
    """lazy_adam's arguments with one of them bad in a way the C++ checks (not the binding's
    array import) refuse."""
    grad, idx, m, v, var = lazy_inputs(10, 4, 3)
    bad = dict(var=var, grad=grad, indices=idx, m=m, v=v)
    bad[which] = {
        "m": np.zeros((10, 5), np.float32),        # shape: "m [10, 5], v [10, 4] and var ..."
        "v": np.zeros((4, 10), np.float32).T,      # strides: "v must have a contiguous last ..."
        "var": var.astype(np.float16),             # dtype: "var has dtype float16"
        "grad": grad[None],                        # rank: "grad must be 2-D"
        "indices": idx.astype(np.float32),         # dtype: "indices has dtype float32"
    }[which]
    return bad


@pytest.mark.parametrize("which", ["m", "v", "var", "grad", "indices"])
def test_lazy_adam_refusal_names_the_python_argument(which):
    a = lazy_bad(which)
    before = {k: x.copy() for k, x in a.items()}
    with pytest.raises(fusekit.Error, match=rf"^LazyAdam: .*\b{which}\b") as e:
        fusekit.lazy_adam(a["var"], a["grad"], a["indices"], a["m"], a["v"], step=0)
    assert_names(e, which)
    for k, x in a.items():
        np.testing.assert_array_equal(x, before[k])


def quant_inputs(n=512):
    g = rng(43)
    qm, qv = fusekit.create_dynamic_map(True), fusekit.create_dynamic_map(False)
    nb = fusekit.quant_blocks(n)
    return dict(var=g.standard_normal(n).astype(np.float32),
                grad=g.standard_normal(n).astype(np.float32), m=np.zeros(n, np.uint8),
                v=np.zeros(n, np.uint8), qmap_m=qm, qmap_v=qv, absmax_m=np.zeros(nb, np.float32),
                absmax_v=np.zeros(nb, np.float32))


@pytest.mark.parametrize("which, bad, kw", [
    ("m", lambda a: a["m"].astype(np.float32), {}),
    ("v", lambda a: a["v"][:-1], {}),
    ("var", lambda a: np.zeros((2, 256, 1, 1, 1, 1, 1, 1), np.float32)[:, :, 0, 0, 0, 0, 0, :1],
     None),
    ("absmax_m", lambda a: a["absmax_m"][:1], {}),
    ("absmax_v", lambda a: a["absmax_v"].astype(np.float16), {}),
    ("qmap_v", lambda a: a["qmap_v"][:255], {}),
    ("weight_decay", None, dict(weight_decay=float("inf"))),
    ("gnorm_scale", None, dict(gnorm_scale=float("nan"))),
    ("block_size", None, dict(block_size=128)),
])
def test_apply_adam_w_quant_refusal_names_the_python_argument(which, bad, kw):
    a = quant_inputs()
    if bad is not None:
        a[which] = bad(a)
    if kw is None:  # var of another shape than grad and m: "grad has shape [512] but var ..."
        kw = {}
    before = {k: x.copy() for k, x in a.items()}
    with pytest.raises(fusekit.Error, match=r"^ApplyAdamWQuant: ") as e:
        fusekit.apply_adam_w_quant(*a.values(), step=0, **kw)
    assert_names(e, which)
    for k, x in a.items():
        np.testing.assert_array_equal(x, before[k])


def test_attribute_refusals_name_the_python_keyword():
    grad, idx, m, v, var = lazy_inputs(10, 4, 3)
    with pytest.raises(fusekit.Error, match=r"LazyAdam: eps = 0") as e:
        fusekit.lazy_adam(var, grad, idx, m, v, step=0, eps=0.0)
    assert_names(e, "eps")
    x = np.zeros(8, np.float32)
    with pytest.raises(fusekit.Error, match=r"AdamW: weight_decay = inf") as e:
        fusekit.adam_w(x, x.copy(), x.copy(), x.copy(), step=0, weight_decay=float("inf"))
    assert_names(e, "weight_decay")
    a = quant_inputs(300)
    a.update(var=a["var"].reshape(30, 10), grad=a["grad"].reshape(30, 10),
             m=a["m"].reshape(30, 10), v=a["v"].reshape(30, 10),
             absmax_m=np.zeros((30, 1), np.float32), absmax_v=np.zeros((30, 2), np.float32))
    idx = np.arange(30, dtype=np.int64)
    with pytest.raises(fusekit.Error, match=r"LazyAdamQuant: absmax_v must be float32") as e:
        fusekit.lazy_adam_quant(a["var"], a["grad"], idx, a["m"], a["v"], a["qmap_m"],
                                a["qmap_v"], a["absmax_m"], a["absmax_v"], step=0)
    assert_names(e, "absmax_v")


def test_add_lora_refusals_name_the_python_argument():
    g = rng(44)
    y = g.standard_normal((4, 16)).astype(np.float32)
    x = g.standard_normal((4, 16)).astype(np.float32)
    wa = g.standard_normal((2, 1, 4, 16)).astype(np.float32)
    wb = g.standard_normal((2, 1, 16, 4)).astype(np.float32)
    idx = np.zeros(4, np.int64)
    with pytest.raises(fusekit.Error, match=r"AddLora: layer_idx = 3") as e:
        fusekit.add_lora(y, x, wb, idx, wa, layer_idx=3)
    assert_names(e, "layer_idx")
    with pytest.raises(fusekit.Error, match=r"AddLora: weight_a .* and weight_b") as e:
        fusekit.add_lora(y, x, wb, idx, wa[:1])
    assert_names(e, "weight_a")


# ---- refusals common to every function ----------------------------------------------------------
def test_wrong_dtype_names_argument_and_dtype():
    grad, idx, m, v, var = lazy_inputs(10, 4, 3)
    with pytest.raises(fusekit.Error, match=r"grad has dtype float64"):
        fusekit.lazy_adam(var, grad.astype(np.float64), idx, m, v, step=0)


def test_read_only_output_refused():
    grad, idx, m, v, var = lazy_inputs(10, 4, 3)
    var.flags.writeable = False
    with pytest.raises(fusekit.Error, match=r"var is read-only"):
        fusekit.lazy_adam(var, grad, idx, m, v, step=0)


def test_not_an_array_refused():
    _, idx, m, v, var = lazy_inputs(10, 4, 3)
    with pytest.raises(fusekit.Error, match=r"grad must be an array.*got list"):
        fusekit.lazy_adam(var, [[1.0] * 4] * 3, idx, m, v, step=0)


def test_shape_mismatch_names_shapes():
    grad, idx, m, v, var = lazy_inputs(10, 4, 3)
    before = var.copy()
    with pytest.raises(fusekit.Error, match=r"\[10, 4\]|\[10, 5\]"):
        fusekit.lazy_adam(np.zeros((10, 5), np.float32), grad, idx, m, v, step=0)
    np.testing.assert_array_equal(var, before)


def test_error_is_value_error_with_code():
    assert issubclass(fusekit.Error, ValueError)
    assert issubclass(fusekit.NoImplementationError, fusekit.Error)
    assert issubclass(fusekit.NoImplementationError, NotImplementedError)


def test_unknown_implementation():
    grad, idx, m, v, var = lazy_inputs(10, 4, 3)
    with pytest.raises(fusekit.Error, match=r"no implementation is named \"cpu_nope\""):
        fusekit.lazy_adam(var, grad, idx, m, v, step=0, implementation="cpu_nope")


# ---- AdamW ------------------------------------------------------------------------------------
def adam_w_oracle(var, grad, m, v, step, lr, b1, b2, wd, eps):
    """docs/adam_w.md in float32, written here: var += (m*step_size)/(sqrt(v)+eps*c2s), decay
    after. (Inputs are finite and moderate: the non-finite guard is not exercised.)"""
    f = np.float32
    b1, b2, lr, wd, eps = f(b1), f(b2), f(lr), f(wd), f(eps)
    t = f(step + 1)
    c1 = f(1) - powf(b1, t)  # the C library's powf, as the spec says (see golden)
    c2s = np.sqrt(f(1) - powf(b2, t), dtype=f)
    step_size = f(f(-lr * c2s) / c1)
    g = grad.astype(f)
    m2 = m * b1 + g * (f(1) - b1)
    v2 = v * b2 + (g * g) * (f(1) - b2)
    w = var.astype(f) + (m2 * step_size) / (np.sqrt(v2) + f(eps * c2s))
    if wd > 0:
        w = w * f(f(1) - lr * wd)
    return w, m2, v2


@pytest.mark.parametrize("n", [1, 15, 16, 17, 255, 1000])
@pytest.mark.parametrize("impl", runnable_implementations(fusekit.implementations("adam_w")))
def test_adam_w_float32_equals_oracle(n, impl):  # steps 4: where NumPy's power and powf differ
    g = rng(n)
    var = g.standard_normal(n).astype(np.float32)
    grad = g.standard_normal(n).astype(np.float32)
    m = g.standard_normal(n).astype(np.float32) * np.float32(0.1)
    v = g.random(n).astype(np.float32) * np.float32(0.01)
    want = adam_w_oracle(var, grad, m, v, 4, 1e-3, 0.9, 0.999, 0.01, 1e-8)
    st = fusekit.adam_w(var, grad, m, v, step=4, lr=1e-3, weight_decay=0.01, implementation=impl)
    for got, exp in zip((var, m, v), want):
        np.testing.assert_allclose(got, exp, rtol=2e-7, atol=0)  # SIMD sqrt/div are exact; 1 ulp
    assert st.elements_skipped_nonfinite == 0


def test_adam_w_float16_var():
    g = rng(5)
    var = g.standard_normal(300).astype(np.float16)
    grad = g.standard_normal(300).astype(np.float16)
    m = np.zeros(300, np.float32)
    v = np.zeros(300, np.float32)
    w, _, _ = adam_w_oracle(var, grad, m.copy(), v.copy(), 0, 1e-2, 0.9, 0.999, 0.0, 1e-8)
    fusekit.adam_w(var, grad, m, v, step=0, lr=1e-2)
    np.testing.assert_array_equal(var, w.astype(np.float16))  # rounded to nearest even once


# ---- ApplyAdamWQuant --------------------------------------------------------------------------
def test_dynamic_maps_equal_golden():
    for signed in (True, False):
        np.testing.assert_array_equal(fusekit.create_dynamic_map(signed),
                                      golden_dynamic_map(signed))


@pytest.mark.parametrize("n", [1, 255, 256, 257, 1000, 4096])
@pytest.mark.parametrize("step", [0, 3, 9, 1000])
@pytest.mark.parametrize("impl", runnable_implementations(fusekit.implementations("apply_adam_w_quant")))
def test_apply_adam_w_quant_equals_golden(n, step, impl):
    g = rng(n + 7)
    qm, qv = fusekit.create_dynamic_map(True), fusekit.create_dynamic_map(False)
    nb = fusekit.quant_blocks(n)
    var = g.standard_normal(n).astype(np.float32)
    grad = g.standard_normal(n).astype(np.float32) * np.float32(0.1)
    m = g.integers(0, 256, n).astype(np.uint8)
    v = g.integers(0, 256, n).astype(np.uint8)
    am = g.random(nb).astype(np.float32) * np.float32(0.05)
    av = g.random(nb).astype(np.float32) * np.float32(0.001)
    want = awq_golden(var.copy(), grad, m.copy(), v.copy(), qm, qv, am.copy(), av.copy(), step,
                      1e-3, 0.9, 0.999, 0.01, 1e-8, 1.0, "float32")
    st = fusekit.apply_adam_w_quant(var, grad, m, v, qm, qv, am, av, step=step, lr=1e-3,
                                    weight_decay=0.01, implementation=impl)
    for got, exp in zip((var, m, v, am, av), want[:5]):
        np.testing.assert_array_equal(got, exp)
    assert st.blocks_updated == nb and st.blocks_skipped_nonfinite == want[5] == 0


def test_apply_adam_w_quant_unsorted_map_modifies_nothing():
    n = 512
    qm, qv = fusekit.create_dynamic_map(True), fusekit.create_dynamic_map(False)
    qm[[10, 11]] = qm[[11, 10]]
    var = np.ones(n, np.float32)
    grad = np.ones(n, np.float32)
    m = np.full(n, 128, np.uint8)
    v = np.zeros(n, np.uint8)
    am, av = np.ones(2, np.float32), np.ones(2, np.float32)
    before = [a.copy() for a in (var, m, v, am, av)]
    with pytest.raises(fusekit.Error, match=r"qmap_m\[11\] = .* is less than qmap_m\[10\]"):
        fusekit.apply_adam_w_quant(var, grad, m, v, qm, qv, am, av, step=0)
    for a, b in zip((var, m, v, am, av), before):
        np.testing.assert_array_equal(a, b)


# ---- AddLora ----------------------------------------------------------------------------------
@pytest.mark.parametrize("b", [1, 7, 8, 9, 40])
@pytest.mark.parametrize("with_a", [True, False])
def test_add_lora_float32_against_float64(b, with_a):
    g = rng(b)
    W, L, R, H1, H2 = 3, 2, 8, 24, 20
    x = g.standard_normal((b, H1 if with_a else R)).astype(np.float32)
    y = g.standard_normal((b, H2 + 6)).astype(np.float32)
    wa = g.standard_normal((W, L, R, H1)).astype(np.float32) if with_a else None
    wb = g.standard_normal((W, L, H2, R)).astype(np.float32)
    idx = g.integers(-1, W, b).astype(np.int64)
    want, sum_abs = add_lora_reference(x, y, wa, wb, idx, 1, 0.5, 3)
    out = np.full_like(y, POISON)
    st = fusekit.add_lora(y, x, wb, idx, wa, out=out, layer_idx=1, scale=0.5, y_offset=3)
    # float32 accumulation: error bounded by a few ulps of the sum of |terms|
    assert np.all(np.abs(out - want) <= 1e-5 * sum_abs + 1e-30)
    assert st.rows_with_adapter == int(np.sum(idx >= 0))


def test_add_lora_in_place_and_bad_index():
    g = rng(11)
    W, L, R, H = 2, 1, 4, 16
    x = g.standard_normal((5, H)).astype(np.float16)
    y = g.standard_normal((5, H)).astype(np.float16)
    wa = g.standard_normal((W, L, R, H)).astype(np.float16)
    wb = g.standard_normal((W, L, H, R)).astype(np.float16)
    idx = np.array([0, 1, -1, 0, 3], np.int32)
    before = y.copy()
    with pytest.raises(fusekit.Error, match=r"indices\[4\] = 3") as e:
        fusekit.add_lora(y, x, wb, idx, wa)
    assert e.value.code == 561002
    np.testing.assert_array_equal(y, before)
    idx[4] = 1
    want, _ = add_lora_reference(x, y, wa, wb, idx, 0, 1.0, 0)
    fusekit.add_lora(y, x, wb, idx, wa)  # out defaults to y: in place
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=2e-3, atol=2e-2)
    assert np.array_equal(y[2], before[2])  # the row without an adapter is untouched


# ---- threads, GIL, memory ---------------------------------------------------------------------
def test_thread_count_set_and_bitwise_equal():
    grad, idx, m, v, var = lazy_inputs(4000, 32, 3000, k=9)
    results = []
    try:
        for t in (1, 2, 3):
            fusekit.set_num_threads(t)
            assert fusekit.get_num_threads() == t
            mm, vv, ww = m.copy(), v.copy(), var.copy()
            fusekit.lazy_adam(ww, grad, idx, mm, vv, step=0, lr=0.01)
            results.append(ww)
    finally:
        fusekit.set_num_threads(0)
    for r in results[1:]:
        assert r.tobytes() == results[0].tobytes()


def test_gil_released_during_a_step():
    """Proved by the GIL itself (tests/python/helpers/gil.py): an observer thread holding the GIL
    sees var written while the caller has not come back from fusekit.adam_w. The control, a
    memset that holds the GIL, is never proved."""
    from helpers.gil import memset_holding_gil, releases_gil
    n = 1 << 22
    g = rng(12)
    grad = g.standard_normal(n).astype(np.float32)

    def fusekit_round():
        var = np.zeros(n, np.float32)
        m, v = np.zeros(n, np.float32), np.zeros(n, np.float32)
        return (lambda: fusekit.adam_w(var, grad, m, v, step=0, lr=1e-3),
                lambda: bool(var[:64].any() or var[::65536].any()))

    def held_round():
        buf = np.zeros(n, np.float32)
        return memset_holding_gil(buf), lambda: bool(buf[:64].any() or buf[::65536].any())

    fusekit.set_num_threads(1)
    try:
        got = releases_gil(fusekit_round)
    finally:
        fusekit.set_num_threads(0)
    assert got[-1] == "proved", got
    held = releases_gil(held_round, rounds=3)
    assert held == ["late"] * 3, held


def mappings(lo, hi):
    """The /proc/self/smaps entries overlapping [lo, hi): (start, end, {field: value})."""
    out, cur = [], None
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            a, b = (int(x, 16) for x in head.split("-"))
            cur = (a, b, {}) if a < hi and lo < b else None
            if cur:
                out.append(cur)
        elif cur is not None:
            key, _, value = line.partition(":")
            cur[2][key] = value.strip()
    return out


def test_empty_host_is_aligned_and_hugepage_advised():
    """What fusekit controls: the block is aligned to a huge page and advised for huge pages
    (MADV_HUGEPAGE, the "hg" flag of every mapping it spans). Not asserted: smaps' THPeligible,
    which the kernel computes from more than that flag (the system-wide and per-size modes in
    /sys/kernel/mm/transparent_hugepage, a process-wide prctl(PR_SET_THP_DISABLE), whether the
    mapping still spans a whole aligned huge page), nor whether huge pages back it at a given
    moment (free contiguous memory)."""
    n = 8 << 20
    a = fusekit.empty_host(n)
    assert a.nbytes == n and a.ctypes.data % (2 << 20) == 0
    a[:] = 1  # first touch
    got = fusekit.huge_page_backed_bytes(a)
    assert got == -1 or 0 <= got <= a.nbytes
    maps = mappings(a.ctypes.data, a.ctypes.data + n)
    assert maps and maps[0][0] <= a.ctypes.data and maps[-1][1] >= a.ctypes.data + n
    if os.path.isdir("/sys/kernel/mm/transparent_hugepage"):  # a kernel with THP: madvise works
        for start, end, fields in maps:
            assert "hg" in fields["VmFlags"].split(), (hex(start), hex(end), fields["VmFlags"])
    small = fusekit.empty_host(100, hugepages=False)
    assert small.nbytes == 100 and small.ctypes.data % 64 == 0


def test_advise_hugepages_in_place_keeps_address_and_values():
    """fusekit.torch.advise_hugepages on a torch tensor: the whole 2 MiB pages inside its memory
    (computed here from its address) are advised ("hg" in every mapping over them), and neither its
    address nor a value changes (collapsing into huge pages, where the kernel does it, is in
    place)."""
    torch = pytest.importorskip("torch")
    ft = pytest.importorskip("fusekit.torch")
    t = torch.arange(3 << 20, dtype=torch.float32)  # 12 MiB from torch's allocator
    before, ptr = t.clone(), t.data_ptr()
    nbytes = t.untyped_storage().nbytes()
    huge = 2 << 20
    first = (ptr + huge - 1) // huge * huge
    last = (ptr + nbytes) // huge * huge
    got = ft.advise_hugepages(t)
    assert t.data_ptr() == ptr and torch.equal(t, before)
    if not os.path.isdir("/sys/kernel/mm/transparent_hugepage"):
        return
    assert got == last - first > 0
    for start, end, fields in mappings(first, last):
        assert "hg" in fields["VmFlags"].split(), (hex(start), hex(end), fields["VmFlags"])
    assert ft.advise_hugepages(torch.zeros(10)) == 0  # under 2 MiB: nothing to advise


# ---- torch tensors through the array functions --------------------------------------------------
def test_torch_tensors_no_copy():
    torch = pytest.importorskip("torch")
    grad, idx, m, v, var = lazy_inputs(100, 16, 60, k=13)
    want = lazy_adam_golden(grad, idx, m, v, var, sparse_adam_lr(0.01, 2), 0.9, 0.999, 1e-8)
    tm, tv, tw = (torch.from_numpy(a.copy()) for a in (m, v, var))
    tw.requires_grad_(True)
    ptr = tw.data_ptr()
    fusekit.lazy_adam(tw, torch.from_numpy(grad), torch.from_numpy(idx), tm, tv, step=2, lr=0.01)
    assert tw.data_ptr() == ptr
    for got, exp in zip((tm, tv, tw.detach()), want):
        np.testing.assert_array_equal(got.numpy(), exp)


def test_torch_refusals_name_argument():
    torch = pytest.importorskip("torch")
    m = torch.zeros(10, 4)
    v = torch.zeros(10, 4)
    w = torch.zeros(10, 4)
    i = torch.zeros(3, dtype=torch.int64)
    g = torch.ones(3, 4)
    with pytest.raises(fusekit.Error, match=r"grad is on meta; fusekit runs on CPU"):
        fusekit.lazy_adam(w, g.to("meta"), i, m, v, step=0)
    with pytest.raises(fusekit.Error, match=r"grad has layout torch.sparse_coo"):
        fusekit.lazy_adam(w, g.to_sparse(), i, m, v, step=0)
    with pytest.raises(fusekit.Error, match=r"indices has dtype torch.int16"):
        fusekit.lazy_adam(w, g, i.to(torch.int16), m, v, step=0)
    assert torch.count_nonzero(w) == 0


def test_torch_bfloat16_add_lora():
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(SEED)
    W, L, R, H = 2, 1, 4, 32
    x = torch.randn(6, H, generator=gen).bfloat16()
    y = torch.randn(6, H, generator=gen).bfloat16()
    wa = torch.randn(W, L, R, H, generator=gen).bfloat16()
    wb = torch.randn(W, L, H, R, generator=gen).bfloat16()
    idx = torch.tensor([0, 1, -1, 1, 0, -1])
    want, sum_abs = add_lora_reference(x.float().numpy(), y.float().numpy(), wa.float().numpy(),
                                       wb.float().numpy(), idx.numpy(), 0, 1.0, 0)
    out = torch.empty_like(y)
    fusekit.add_lora(y, x, wb, idx, wa, out=out)
    # one rounding to bfloat16 (8 bits of mantissa) of a float32-accumulated value
    assert np.all(np.abs(out.float().numpy() - want) <= 2.0 ** -8 * np.abs(want) + 1e-5 * sum_abs)


def test_omp_num_threads_is_the_default():
    import os
    import subprocess
    import sys
    code = "import fusekit; print(fusekit.get_num_threads())"
    for n in ("1", "3"):
        out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, OMP_NUM_THREADS=n),
                             capture_output=True, text=True, check=True).stdout
        assert out.strip() == n


def test_version_is_the_projects():
    import pathlib
    import re
    cmake = (pathlib.Path(__file__).resolve().parents[2] / "CMakeLists.txt").read_text()
    assert fusekit.__version__ == re.search(r"project\(fusekit VERSION ([0-9.]+)", cmake).group(1)


# ---- LazyAdamQuant ----------------------------------------------------------------------------
@pytest.mark.parametrize("d", [1, 8, 255, 256, 257, 512])
@pytest.mark.parametrize("impl", runnable_implementations(fusekit.implementations("lazy_adam_quant")))
def test_lazy_adam_quant_equals_golden(d, impl):
    from golden.lazy_adam_quant import lazy_adam_quant_golden
    g = rng(100 + d)
    r, n = 60, 40
    blocks = fusekit.quant_blocks(d)
    qm, qv = fusekit.create_dynamic_map(True), fusekit.create_dynamic_map(False)
    grad = g.standard_normal((n, d)).astype(np.float32)
    idx = g.integers(-1, r, n).astype(np.int64)  # duplicates and padding
    m = g.integers(0, 256, (r, d)).astype(np.uint8)
    v = g.integers(0, 256, (r, d)).astype(np.uint8)
    var = g.standard_normal((r, d)).astype(np.float32)
    am = g.random((r, blocks)).astype(np.float32) * np.float32(0.1)
    av = g.random((r, blocks)).astype(np.float32) * np.float32(0.01)
    want = lazy_adam_quant_golden(grad, idx, m, v, var, qm, qv, am, av, sparse_adam_lr(0.01, 7),
                                  0.9, 0.999, 1e-8, "float32", "float32")
    st = fusekit.lazy_adam_quant(var, grad, idx, m, v, qm, qv, am, av, step=7, lr=0.01,
                                 implementation=impl)
    for got, exp in zip((m, v, var, am, av), want[:5]):
        np.testing.assert_array_equal(got, exp)  # untouched rows included: bitwise unchanged
    assert st.rows_updated == len(np.unique(idx[idx >= 0])) and st.rows_skipped_nonfinite == 0


def test_core_package_does_not_import_torch():
    import subprocess
    import sys
    code = "import sys, fusekit; fusekit.create_dynamic_map(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---- plans: made once, run many times -------------------------------------------------------
def test_adam_w_plan_reused_with_new_arrays_and_a_schedule_equals_fresh_calls():
    """One AdamWPlan, five runs on new arrays (new addresses) with a new step and lr each time (a
    learning-rate schedule needs no new plan); each equals the NumPy oracle and a fresh call."""
    n = 1000
    g = rng(91)
    plan = None
    for k in range(5):
        var = g.standard_normal(n).astype(np.float32)
        grad = g.standard_normal(n).astype(np.float32)
        m = g.standard_normal(n).astype(np.float32) * np.float32(0.1)
        v = g.random(n).astype(np.float32) * np.float32(0.01)
        lr = 1e-3 * (k + 1)
        want = adam_w_oracle(var, grad, m, v, 3 * k, lr, 0.9, 0.999, 0.01, 1e-8)
        fresh = [a.copy() for a in (var, grad, m, v)]
        if plan is None:
            plan = fusekit.AdamWPlan((var, grad, m, v), dict(weight_decay=0.01))
            assert plan.implementation in fusekit.implementations("adam_w")
        plan.run((var, grad, m, v), step=3 * k, lr=lr)
        fusekit.adam_w(*fresh, step=3 * k, lr=lr, weight_decay=0.01)
        for got, exp, fr in zip((var, m, v), want, (fresh[0], fresh[2], fresh[3])):
            np.testing.assert_allclose(got, exp, rtol=2e-7, atol=0)
            np.testing.assert_array_equal(got, fr)


def test_lazy_adam_plan_refuses_another_layout_and_modifies_nothing():
    g = rng(92)
    idx = np.array([3, 1, 3, 0], np.int64)
    grad = g.standard_normal((4, 20)).astype(np.float32)
    m, v, var = (g.random((6, 20)).astype(np.float32) for _ in range(3))
    plan = fusekit.LazyAdamPlan((grad, idx, m, v, var), dict(beta1=0.8))
    wide = g.random((6, 21)).astype(np.float32)
    before = [a.copy() for a in (m, v, var, wide)]
    with pytest.raises(fusekit.Error, match=r"\bvar\b") as e:
        plan.run((grad, idx, m, v, wide), lr=0.01)  # another shape than planned
    assert "inputVar" not in str(e.value)
    with pytest.raises(fusekit.Error, match="lr = nan"):
        plan.run((grad, idx, m, v, var), lr=float("nan"))
    for a, b in zip((m, v, var, wide), before):
        np.testing.assert_array_equal(a, b)
    want_m, want_v, want_var = lazy_adam_golden(grad, idx, m.copy(), v.copy(), var.copy(), 0.01,
                                                0.8, 0.999, 1e-7)[:3]
    st = plan.run((grad, idx, m, v, var), lr=0.01)
    assert st.rows_updated == 3
    np.testing.assert_array_equal(var, want_var)


def test_plan_arguments_refused_by_name():
    x = np.zeros(4, np.float32)
    with pytest.raises(fusekit.Error, match=r"tensors must be a sequence of 4 \(var, grad, m, v\)"):
        fusekit.AdamWPlan((x, x, x), {})
    with pytest.raises(fusekit.Error, match="unknown attribute.*takes beta1, beta2"):
        fusekit.AdamWPlan((x, x.copy(), x.copy(), x.copy()), dict(betas=0.9))
    with pytest.raises(fusekit.Error, match="no implementation is named \"cpu_nonesuch\""):
        fusekit.AdamWPlan((x, x.copy(), x.copy(), x.copy()), {}, implementation="cpu_nonesuch")
