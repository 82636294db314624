"""fusekit.torch's 8-bit optimizers with the FP8 state format and the lost-v guard (issue #33).

- ``AdamW8bit`` / ``Adam8bit`` / ``SparseAdam8bit`` with ``state_format="fp8"`` bit for bit
  against golden/fp8_state.py (NumPy, written from docs/fp8_state.md, not from the C++) over
  several steps: float32, bfloat16 and float16 parameters, sizes that are not multiples of 256,
  a transposed parameter, duplicate sparse indices;
- the state keys (``state1``, ``state2``, ``scale1``, ``scale2``, no maps), state_dict through
  ``torch.save`` / ``torch.load(weights_only=True)`` resuming bit for bit, ``copy.deepcopy`` and
  pickle, a DTensor parameter on a one-rank mesh;
- the refusals: the two hyperparameters' rule, a group switched to the other format, a state_dict
  of the other format (both ways, and bitsandbytes' layout);
- the lost-v guard of the dynamic-map format, on by default: bit for bit the golden's guarded step,
  and ``guard_lost_v=False`` bit for bit its unguarded one;
- the hazard of issue #33 item 2 as a user meets it: the largest single-step move of any element
  for torch's float32 optimizer, fusekit's dynamic map with and without the guard, fusekit's fp8
  and bitsandbytes' 8-bit Adam on CPU (test_hazard_*).
"""

import copy
import functools
import io
import math
import pickle
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import fusekit
import fusekit.torch as ft
from golden import fp8_state as fp8
from golden.apply_adam_w_quant import create_dynamic_map, golden_step

SEED = 20261233
F32 = np.float32
DNAME = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
HP = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8)


def rng(k=0):
    return np.random.default_rng(SEED + k)


def storage(t):
    """A flat NumPy copy of a tensor's values in logical order, as the goldens store them
    (bfloat16 as uint16)."""
    t = t.detach().contiguous().reshape(-1)
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16).copy()
    return t.numpy().copy()


def bits(a):
    """Bit patterns (unsigned ints) of a tensor or an array, flat, in logical order."""
    if isinstance(a, torch.Tensor):
        a = storage(a)
    a = np.ascontiguousarray(a).reshape(-1)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.itemsize])


def assert_bits(got, want, what):
    g, w = bits(got).astype(np.int64), bits(want).astype(np.int64)
    assert g.shape == w.shape, (what, g.shape, w.shape)
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, f"{what}: {bad.size} of {g.size} differ, first at {bad[:5]}"


def tensor(a, dtype, shape=None):
    t = torch.from_numpy(np.asarray(a, F32).copy()).to(dtype)
    return t.reshape(shape) if shape is not None else t


def spread_grad(g, n):
    """Gradients over many decades (some subnormal in the formats, a few exact zeros)."""
    x = g.normal(0, 1, n) * 10.0 ** g.uniform(-7, 0, n)
    x[g.random(n) < 0.02] = 0
    return x


def state_bits(opt, params):
    out = []
    for p in params:
        st = opt.state[p]
        out.append({k: (v if isinstance(v, int) else (v.dtype, tuple(v.shape), bits(v).tobytes()))
                    for k, v in st.items()})
    return out


# ---- dense: AdamW8bit / Adam8bit against golden/fp8_state.py ------------------------------------
# sqrt(v)'s code and v's scale key by state format (the golden's v_format; the state's key).
V_FORMAT = {"fp8": ("ue4m4", "scale2"), "fp8_ue3m5": ("ue3m5", "scale2_ue3m5")}


class DenseGolden:
    """One parameter's expected var, codes and scales, stepped by golden/fp8_state.py."""

    def __init__(self, p, fmt="fp8"):
        self.v_format, self.v_key = V_FORMAT[fmt]
        n = p.numel()
        nb = fusekit.quant_blocks(n)
        self.dtype = DNAME[p.dtype]
        self.var = storage(p)
        self.mc, self.vc = np.zeros(n, np.uint8), np.zeros(n, np.uint8)
        self.sm, self.sv = np.zeros(nb, F32), np.zeros(nb, F32)
        self.step = 0

    def advance(self, grad, lr, betas, eps, wd):
        (self.var, self.mc, self.vc, self.sm, self.sv, self.skipped) = fp8.apply_adam_w_quant_fp8(
            self.var, storage(grad), self.mc, self.vc, self.sm, self.sv, self.step, lr, betas[0],
            betas[1], wd, eps, 1.0, dtype=self.dtype, grad_dtype=self.dtype,
            v_format=self.v_format)
        self.step += 1

    def check(self, p, st, what):
        assert st["step"] == self.step, what
        assert set(st) == {"step", "state1", "state2", "scale1", self.v_key}, (what, sorted(st))
        assert st["state1"].dtype == st["state2"].dtype == torch.uint8
        assert st["scale1"].dtype == st[self.v_key].dtype == torch.float32
        assert_bits(p, self.var, f"{what} var")
        assert_bits(st["state1"], self.mc, f"{what} m codes (E4M3)")
        assert_bits(st["state2"], self.vc, f"{what} sqrt(v) codes ({self.v_format})")
        assert_bits(st["scale1"], self.sm, f"{what} scale1")
        assert_bits(st[self.v_key], self.sv, f"{what} {self.v_key}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=lambda d: DNAME[d])
@pytest.mark.parametrize("cls", [ft.AdamW8bit, ft.Adam8bit], ids=lambda c: c.__name__)
@pytest.mark.parametrize("fmt", ["fp8", "fp8_ue3m5"])
def test_dense_fp8_steps_equal_the_golden(cls, dtype, fmt):
    g = rng(1)
    # 300: one full block and a partial one (min_8bit_size 1); 4097, 5000: not multiples of 256;
    # a transposed [70, 80] weight: the operator's gathering path, blocks in logical order.
    shapes = [(300,), (4097,), (5000,), (80, 70)]
    params = [nn.Parameter(tensor(g.uniform(-1, 1, math.prod(s)), dtype, s)) for s in shapes]
    params[3] = nn.Parameter(params[3].detach().t())
    assert not params[3].is_contiguous()
    wd = 0.05 if cls is ft.AdamW8bit else 0.0
    opt = cls(params, **HP, weight_decay=wd, min_8bit_size=1, state_format=fmt)
    assert opt.defaults["state_format"] == fmt and opt.param_groups[0]["state_format"] == fmt
    goldens = [DenseGolden(p, fmt) for p in params]
    for k in range(5):
        for p, gold in zip(params, goldens):
            gr = tensor(spread_grad(g, p.numel()), dtype, p.shape)
            p.grad = gr
            gold.grad = gr.clone()
        opt.step()
        for i, (p, gold) in enumerate(zip(params, goldens)):
            gold.advance(gold.grad, HP["lr"], HP["betas"], HP["eps"], wd)
            gold.check(p, opt.state[p], f"step {k} param {i} {list(p.shape)}")
            assert gold.skipped == 0
    assert not params[3].is_contiguous()
    assert [s.blocks_skipped_nonfinite for s in opt.last_stats] == [0, 0, 0, 0]


def test_dense_fp8_small_tensors_keep_float32_state_and_nonfinite_blocks_are_skipped():
    big, small = nn.Parameter(torch.zeros(1000)), nn.Parameter(torch.zeros(50))
    opt = ft.AdamW8bit([big, small], min_8bit_size=1000, state_format="fp8")
    gold = DenseGolden(big)
    g = rng(2)
    gr = tensor(g.normal(0, 0.05, 1000), torch.float32)
    gr[300] = float("nan")  # block 1
    big.grad, small.grad = gr.clone(), torch.ones(50)
    opt.step()
    gold.advance(gr, 1e-3, (0.9, 0.999), 1e-8, 1e-2)
    assert gold.skipped == 1
    gold.check(big, opt.state[big], "nan block")
    assert opt.last_stats == [ft.StepStats(0, 0, 0, 1), ft.StepStats(0, 1, 0, 0)]
    assert opt.state[small]["state1"].dtype == torch.float32 and "scale1" not in opt.state[small]


# ---- sparse: SparseAdam8bit against golden/fp8_state.py -----------------------------------------
def sparse_grad(g, rows, dim, n, dtype):
    idx = torch.from_numpy(g.integers(0, rows, n)).long()
    idx[1] = idx[0]  # a duplicate: summed by the operator in order of occurrence
    vals = tensor(spread_grad(g, n * dim), dtype, (n, dim))
    return torch.sparse_coo_tensor(idx.unsqueeze(0), vals, (rows, dim))


def lazy_golden(p, grad, st, lr, betas, eps):
    """The expected (var, m codes, v codes, scale1, scale2) after SparseAdam8bit's next step, from
    the state it holds now (zeros before the first step)."""
    R, D = p.shape
    nb = fusekit.quant_blocks(D)
    if st:
        mc, vc = storage(st["state1"]).reshape(R, D), storage(st["state2"]).reshape(R, D)
        sm, sv = storage(st["scale1"]).reshape(R, nb), storage(st["scale2"]).reshape(R, nb)
        step = st["step"]
    else:
        mc, vc = np.zeros((R, D), np.uint8), np.zeros((R, D), np.uint8)
        sm, sv = np.zeros((R, nb), F32), np.zeros((R, nb), F32)
        step = 0
    t = step + 1
    lr_t = lr * math.sqrt(1 - betas[1] ** t) / (1 - betas[0] ** t)  # SparseAdam's, in double
    idx = grad._indices()[0].numpy()
    vals = storage(grad._values()).reshape(len(idx), D)
    out = fp8.lazy_adam_quant_fp8(storage(p).reshape(R, D), vals, idx, mc, vc, sm, sv, lr_t,
                                  betas[0], betas[1], eps, dtype=DNAME[p.dtype],
                                  grad_dtype=DNAME[grad.dtype])
    return out, t


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: DNAME[d])
@pytest.mark.parametrize("dim", [1, 7, 255, 256, 257, 300])
def test_sparse_fp8_steps_equal_the_golden(dim, dtype):
    g = rng(3 + dim)
    rows = max(8, 4200 // dim + 1)  # at least 4096 elements: 8-bit state by default
    p = nn.Parameter(tensor(g.uniform(-1, 1, rows * dim), dtype, (rows, dim)))
    opt = ft.SparseAdam8bit([p], **HP, state_format="fp8")
    for k in range(5):
        p.grad = sparse_grad(g, rows, dim, rows // 2, dtype)
        st = opt.state.get(p)
        (var, mc, vc, sm, sv, skipped), t = lazy_golden(p, p.grad, st, HP["lr"], HP["betas"],
                                                         HP["eps"])
        opt.step()
        st = opt.state[p]
        what = f"dim {dim} step {k}"
        assert st["step"] == t and skipped == 0
        assert set(st) == {"step", "state1", "state2", "scale1", "scale2"}, sorted(st)
        assert tuple(st["scale1"].shape) == (rows, fusekit.quant_blocks(dim))
        assert_bits(p, var, f"{what} var")
        assert_bits(st["state1"], mc, f"{what} m codes")
        assert_bits(st["state2"], vc, f"{what} v codes")
        assert_bits(st["scale1"], sm, f"{what} scale1")
        assert_bits(st["scale2"], sv, f"{what} scale2")
        assert opt.last_stats[0].rows_skipped_nonfinite == 0


def test_sparse_fp8_packed_by_row():
    p = nn.Parameter(torch.zeros(64, 100))
    opt = ft.SparseAdam8bit([p], state_format="fp8", hugepages=False)
    p.grad = sparse_grad(rng(4), 64, 100, 10, torch.float32)
    opt.step()
    st = opt.state[p]
    # one [R, 2, D] table of codes and one [R, 2, B] of scales, as the dynamic map's state
    assert st["state1"].stride() == (200, 1) and st["state2"].stride() == (200, 1)
    assert st["state2"].data_ptr() == st["state1"].data_ptr() + 100
    assert st["scale1"].stride() == (2, 1)
    assert st["scale2"].data_ptr() == st["scale1"].data_ptr() + 4
    assert opt.state_bytes() == 64 * (2 * 100 + 8)


# ---- state_dict, copy, pickle ----------------------------------------------------------------
def dense_run(opt, params, g, steps):
    for _ in range(steps):
        grads = [tensor(g.normal(0, 0.05, p.numel()), p.dtype, p.shape) for p in params]
        for p, gr in zip(params, grads):
            p.grad = gr.clone()
        opt.step()
        yield grads


@pytest.mark.parametrize("fmt", ["fp8", "fp8_ue3m5"])
def test_dense_fp8_state_dict_round_trip_resumes_bit_for_bit(fmt):
    g = rng(5)
    dtypes, sizes = [torch.float32, torch.bfloat16, torch.float32], [5000, 4352, 100]
    params = [nn.Parameter(tensor(g.uniform(-1, 1, n), d)) for n, d in zip(sizes, dtypes)]
    opt = ft.AdamW8bit([{"params": params[:2]}, {"params": params[2:], "lr": 5e-3}], **HP,
                       state_format=fmt)
    list(dense_run(opt, params, g, 3))
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    assert [grp["state_format"] for grp in loaded["param_groups"]] == [fmt, fmt]
    assert set(loaded["state"][0]) == {"step", "state1", "state2", "scale1", V_FORMAT[fmt][1]}
    params2 = [nn.Parameter(p.detach().clone()) for p in params]
    opt2 = ft.AdamW8bit([{"params": params2[:2]}, {"params": params2[2:]}], lr=1.0,
                        state_format=fmt)
    opt2.load_state_dict(loaded)
    assert state_bits(opt2, params2) == state_bits(opt, params)
    assert opt2.param_groups[1]["lr"] == 5e-3
    for grads in dense_run(opt, params, g, 3):
        for p2, gr in zip(params2, grads):
            p2.grad = gr.clone()
        opt2.step()
    for p, p2 in zip(params, params2):
        assert_bits(p2, storage(p), "resumed")
    assert state_bits(opt2, params2) == state_bits(opt, params)


def test_sparse_fp8_state_dict_round_trip_resumes_bit_for_bit():
    g = rng(6)
    p = nn.Parameter(tensor(g.uniform(-1, 1, 300 * 20), torch.bfloat16, (300, 20)))
    opt = ft.SparseAdam8bit([p], state_format="fp8")
    for _ in range(3):
        p.grad = sparse_grad(g, 300, 20, 50, torch.bfloat16)
        opt.step()
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    q = nn.Parameter(p.detach().clone())
    opt2 = ft.SparseAdam8bit([q], state_format="fp8")
    opt2.load_state_dict(torch.load(buf, weights_only=True))
    assert state_bits(opt2, [q]) == state_bits(opt, [p])
    assert opt2.state[q]["state2"].data_ptr() == opt2.state[q]["state1"].data_ptr() + 20  # packed
    for _ in range(3):
        gr = sparse_grad(g, 300, 20, 50, torch.bfloat16)
        p.grad, q.grad = gr, gr.clone()
        opt.step()
        opt2.step()
    assert state_bits(opt2, [q]) == state_bits(opt, [p])
    assert_bits(q, storage(p), "resumed")


def _pickled(opt):
    return pickle.loads(pickle.dumps(opt))


@pytest.mark.parametrize("copier", [copy.deepcopy, _pickled], ids=["deepcopy", "pickle"])
@pytest.mark.parametrize("cls", [ft.AdamW8bit, ft.SparseAdam8bit], ids=lambda c: c.__name__)
def test_fp8_copy_steps_exactly_as_the_original(cls, copier):
    g = rng(7)
    sparse = cls is ft.SparseAdam8bit
    params = [nn.Parameter(tensor(g.uniform(-1, 1, 4800), torch.float32, (240, 20))),
              nn.Parameter(tensor(g.uniform(-1, 1, 60), torch.float32, (6, 10)))]
    opt = cls(params, lr=1e-2, hugepages=False, state_format="fp8")

    def run(o, ps, k):  # the same gradients for both, from the step number
        gg = rng(100 + k)
        for p in ps:
            if sparse:
                p.grad = sparse_grad(gg, p.shape[0], p.shape[1], 7, torch.float32)
            else:
                p.grad = tensor(gg.normal(0, 0.05, p.numel()), torch.float32, p.shape)
        o.step()

    for k in range(2):
        run(opt, params, k)
    clone = copier(opt)
    assert type(clone) is cls
    assert clone.defaults["state_format"] == "fp8" and clone.defaults["guard_lost_v"] is True
    assert all(grp["state_format"] == "fp8" for grp in clone.param_groups)
    cparams = [p for grp in clone.param_groups for p in grp["params"]]
    for k in range(2, 5):
        run(opt, params, k)
        run(clone, cparams, k)
    assert state_bits(clone, cparams) == state_bits(opt, params)
    for p, c in zip(params, cparams):
        assert_bits(c, storage(p), "copy")
    assert "scale1" in opt.state[params[0]] and "qmap1" not in opt.state[params[0]]


# ---- the rule of the two hyperparameters, and the refusals ---------------------------------------
ALL8 = [ft.AdamW8bit, ft.Adam8bit, ft.SparseAdam8bit]


@pytest.mark.parametrize("cls", ALL8, ids=lambda c: c.__name__)
@pytest.mark.parametrize("kw, msg", [
    ({"state_format": "fp4"}, r"Invalid state_format value: 'fp4'; it must be 'dynamic_map' .* "
                              r"or 'fp8'"),
    ({"state_format": None}, r"Invalid state_format value: None"),
    ({"state_format": "FP8"}, r"Invalid state_format value: 'FP8'"),
    ({"guard_lost_v": "yes"}, r"Invalid guard_lost_v value: 'yes'; it must be True or False"),
    ({"guard_lost_v": 1}, r"Invalid guard_lost_v value: 1"),
    ({"state_format": "fp8", "guard_lost_v": False},
     r"guard_lost_v=False is not available with state_format='fp8'"),
    ({"state_format": "fp8_ue3m5", "guard_lost_v": False},
     r"guard_lost_v=False is not available with state_format='fp8_ue3m5'"),
])
def test_constructor_refusals(cls, kw, msg):
    if cls is ft.SparseAdam8bit and kw.get("state_format") == "fp8_ue3m5":
        msg = r"Invalid state_format value: 'fp8_ue3m5'"
    with pytest.raises(ValueError, match=f"^fusekit.torch.{cls.__name__}: {msg}"):
        cls([nn.Parameter(torch.zeros(10, 10))], **kw)


def test_fp8_ue3m5_is_for_the_dense_optimizers():
    """UE3M5's v is ApplyAdamWQuant's (dense layers): the row-wise faces and operator refuse it,
    naming what they take and why."""
    with pytest.raises(ValueError, match=r"SparseAdam8bit: Invalid state_format value: "
                                         r"'fp8_ue3m5'; it must be 'dynamic_map' .* or 'fp8' .*"
                                         r"'fp8_ue3m5' is for dense layers"):
        ft.SparseAdam8bit([nn.Parameter(torch.zeros(10, 10))], state_format="fp8_ue3m5")
    with pytest.raises(ValueError, match=r"Invalid state_format value: 'fp8_ue3m5'"):
        ft.FusedEmbeddingBag(10, 4, state="8bit", state_format="fp8_ue3m5")
    assert "fp8_ue3m5" in fusekit.STATE_FORMATS
    assert "fp8_ue3m5" not in fusekit.SPARSE_STATE_FORMATS
    var = np.zeros((4, 8), np.float32)
    m = np.zeros((4, 8), np.uint8)
    with pytest.raises(fusekit.Error, match=r"state_format = 'fp8_ue3m5' must be one of "
                                            r"\('dynamic_map', 'fp8'\)"):
        fusekit.lazy_adam_quant(var, np.ones((1, 8), np.float32), np.array([1], np.int32), m,
                                m.copy(), None, None, np.zeros((4, 1), np.float32),
                                np.zeros((4, 1), np.float32), step=0, state_format="fp8_ue3m5")


@pytest.mark.parametrize("cls", ALL8, ids=lambda c: c.__name__)
def test_defaults_and_groups(cls):
    a, b = nn.Parameter(torch.zeros(64, 64)), nn.Parameter(torch.zeros(64, 64))
    opt = cls([a])
    assert opt.defaults["state_format"] == "dynamic_map" and opt.defaults["guard_lost_v"] is True
    opt.add_param_group({"params": [b], "state_format": "fp8"})
    assert [grp["state_format"] for grp in opt.param_groups] == ["dynamic_map", "fp8"]
    with pytest.raises(ValueError, match=r"Invalid state_format value: 'e5m2' \(param group 2\)"):
        opt.add_param_group({"params": [nn.Parameter(torch.zeros(4))], "state_format": "e5m2"})
    assert len(opt.param_groups) == 2
    # each group's state in its own format
    if cls is ft.SparseAdam8bit:
        for p in (a, b):
            p.grad = torch.sparse_coo_tensor(torch.tensor([[1, 5]]), torch.ones(2, 64), (64, 64))
    else:
        a.grad, b.grad = torch.ones(64, 64), torch.ones(64, 64)
    opt.step()
    assert "qmap1" in opt.state[a] and "absmax1" in opt.state[a] and "scale1" not in opt.state[a]
    assert "scale1" in opt.state[b] and "qmap1" not in opt.state[b]


@pytest.mark.parametrize("cls", ALL8, ids=lambda c: c.__name__)
def test_a_group_switched_to_the_other_format_is_refused_and_nothing_changes(cls):
    p, q = nn.Parameter(torch.zeros(64, 64)), nn.Parameter(torch.zeros(64, 64))
    opt = cls([{"params": [p]}, {"params": [q], "state_format": "fp8"}])

    def grads():
        for t in (p, q):
            if cls is ft.SparseAdam8bit:
                t.grad = torch.sparse_coo_tensor(torch.tensor([[1, 5]]), torch.ones(2, 64),
                                                 (64, 64))
            else:
                t.grad = torch.ones(64, 64)

    grads()
    opt.step()
    before = state_bits(opt, [p, q]), storage(p), storage(q)
    opt.param_groups[1]["state_format"] = "dynamic_map"
    grads()
    with pytest.raises(ValueError, match=r"holds fp8 state but its group's state_format is now "
                                         r"'dynamic_map'.*nothing was modified"):
        opt.step()
    assert state_bits(opt, [p, q]) == before[0]
    assert_bits(p, before[1], "p")
    assert_bits(q, before[2], "q")
    opt.param_groups[1]["state_format"] = "fp8"
    opt.param_groups[1]["guard_lost_v"] = False  # the rule at every step
    with pytest.raises(ValueError, match=r"guard_lost_v=False \(param group 1\) is not available"):
        opt.step()


def test_a_group_switched_between_the_fp8_formats_is_refused_and_nothing_changes():
    """The two fp8 formats have the same codes' size and the same m: a state of one read as the
    other would decode v wrongly; its keys say which (scale2 or scale2_ue3m5)."""
    p = nn.Parameter(torch.zeros(64, 64))
    opt = ft.AdamW8bit([p], state_format="fp8")
    p.grad = torch.ones(64, 64)
    opt.step()
    before = state_bits(opt, [p]), storage(p)
    for now, was in (("fp8_ue3m5", "fp8"),):
        opt.param_groups[0]["state_format"] = now
        with pytest.raises(ValueError, match=rf"holds {was} state but its group's state_format is "
                                             rf"now '{now}'.*nothing was modified"):
            opt.step()
    assert state_bits(opt, [p]) == before[0]
    assert_bits(p, before[1], "p")
    q = nn.Parameter(torch.zeros(64, 64))
    opt = ft.AdamW8bit([q], state_format="fp8_ue3m5")
    q.grad = torch.ones(64, 64)
    opt.step()
    assert set(opt.state[q]) == {"step", "state1", "state2", "scale1", "scale2_ue3m5"}
    opt.param_groups[0]["state_format"] = "fp8"
    with pytest.raises(ValueError, match=r"holds fp8_ue3m5 state but its group's state_format is "
                                         r"now 'fp8'"):
        opt.step()


def _trained(cls, fmt, k=8):
    p = nn.Parameter(tensor(rng(k).uniform(-1, 1, 4800), torch.float32, (240, 20)))
    opt = cls([p], state_format=fmt)
    if cls is ft.SparseAdam8bit:
        p.grad = sparse_grad(rng(k + 1), 240, 20, 30, torch.float32)
    else:
        p.grad = tensor(rng(k + 1).normal(0, 0.05, 4800), torch.float32, (240, 20))
    opt.step()
    return p, opt


@pytest.mark.parametrize("cls", ALL8, ids=lambda c: c.__name__)
@pytest.mark.parametrize("saved, into", [("dynamic_map", "fp8"), ("fp8", "dynamic_map"),
                                         ("fp8", "fp8_ue3m5"), ("fp8_ue3m5", "fp8"),
                                         ("fp8_ue3m5", "dynamic_map")])
def test_a_state_dict_of_the_other_format_is_refused(cls, saved, into):
    if cls is ft.SparseAdam8bit and "fp8_ue3m5" in (saved, into):
        pytest.skip("SparseAdam8bit has no fp8_ue3m5 (test_fp8_ue3m5_is_for_the_dense_optimizers)")
    p, opt = _trained(cls, saved)
    sd = opt.state_dict()
    q, target = _trained(cls, into, k=20)
    before = state_bits(target, [q])
    with pytest.raises(ValueError, match=rf"param group 0 was saved with state_format "
                                         rf"'{saved}', this optimizer's is '{into}'; construct "
                                         rf"the optimizer with state_format='{saved}'.*nothing "
                                         "was loaded"):
        target.load_state_dict(sd)
    assert state_bits(target, [q]) == before and target.param_groups[0]["state_format"] == into
    # Without the groups' key (bitsandbytes' state_dict, or fusekit's before the formats): the
    # state's own keys say its format.
    sd2 = copy.deepcopy(sd)
    for grp in sd2["param_groups"]:
        del grp["state_format"], grp["guard_lost_v"]
    with pytest.raises(ValueError, match=rf"it holds {saved} state \(.*\) but this optimizer's "
                                         rf"state_format for its group is '{into}'; construct "
                                         rf"the optimizer with state_format='{saved}'.*nothing "
                                         "was loaded"):
        target.load_state_dict(sd2)
    assert state_bits(target, [q]) == before


@pytest.mark.parametrize("fmt", ["dynamic_map", "fp8"])
def test_a_state_dict_without_the_group_keys_keeps_the_optimizers(fmt):
    p, opt = _trained(ft.AdamW8bit, fmt)
    sd = copy.deepcopy(opt.state_dict())
    for grp in sd["param_groups"]:
        del grp["state_format"], grp["guard_lost_v"]
    q = nn.Parameter(p.detach().clone())
    opt2 = ft.AdamW8bit([q], state_format=fmt, guard_lost_v=True)
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["state_format"] == fmt
    assert opt2.param_groups[0]["guard_lost_v"] is True
    assert state_bits(opt2, [q]) == state_bits(opt, [p])


def test_a_mixed_state_is_refused():
    p, opt = _trained(ft.AdamW8bit, "fp8")
    sd = copy.deepcopy(opt.state_dict())
    sd["state"][0]["absmax1"] = sd["state"][0]["scale1"].clone()
    q, target = _trained(ft.AdamW8bit, "fp8", k=30)
    with pytest.raises(ValueError, match="both the fp8 format's scale1/scale2 and the dynamic "
                                         "map's absmax/qmap keys"):
        target.load_state_dict(sd)
    sd = copy.deepcopy(opt.state_dict())
    sd["state"][0]["scale2"] = sd["state"][0]["scale2"][:-1]
    with pytest.raises(ValueError, match=r"scale2 must be float32 \[19\]"):
        target.load_state_dict(sd)


# ---- the lost-v guard of the dynamic-map format ------------------------------------------------
def lost_v_grads(g, n, steps):
    """Gradients that leave v coded to 0 while m is not: per block of 256 one large gradient,
    the others 1e-4 of it, and every other block without gradient on two steps of three."""
    out = []
    for t in range(steps):
        x = 1e-4 * g.uniform(0.5, 1.5, n) * g.choice([-1.0, 1.0], n)
        nb = fusekit.quant_blocks(n)
        big = np.minimum(np.arange(nb) * 256 + g.integers(0, 256, nb), n - 1)
        x[big] = g.uniform(0.5, 1.5, nb)
        if t % 3:
            for b in range(0, nb, 2):
                x[b * 256:(b + 1) * 256] = 0
        out.append(x.astype(F32))
    return out


@pytest.mark.parametrize("guard", [True, False])
def test_dynamic_map_guard_is_the_goldens(guard):
    """AdamW8bit's dynamic-map step with guard_lost_v (the default True) is golden_step with
    guard_lost_v=True bit for bit; with guard_lost_v=False golden_step's unguarded (bitsandbytes')
    arithmetic. The gradients make the guard matter: the two runs must differ."""
    n = 6000
    g = rng(9)
    p0 = g.uniform(-1, 1, n).astype(F32)
    p = nn.Parameter(tensor(p0, torch.float32))
    opt = ft.AdamW8bit([p], lr=1e-3) if guard else ft.AdamW8bit([p], lr=1e-3, guard_lost_v=False)
    assert opt.param_groups[0]["guard_lost_v"] is guard
    qm, qv = create_dynamic_map(True), create_dynamic_map(False)
    nb = fusekit.quant_blocks(n)
    var, m, v = p0.copy(), np.zeros(n, np.uint8), np.zeros(n, np.uint8)  # a fresh state
    am, av = np.zeros(nb, F32), np.zeros(nb, F32)
    lost_reads = 0
    other = p0.copy()  # the other setting of the guard, to show it matters
    om, ov, oam, oav = m.copy(), v.copy(), am.copy(), av.copy()
    for k, gr in enumerate(lost_v_grads(g, n, 12)):
        col = np.arange(n) // 256
        lost_reads += int(np.sum((qv[v] * av[col] == 0) & (qm[m] * am[col] != 0)))
        p.grad = tensor(gr, torch.float32)
        opt.step()
        args = (k, 1e-3, 0.9, 0.999, 1e-2, 1e-8, 1.0, "float32")
        var, m, v, am, av, _ = golden_step(var, gr, m, v, qm, qv, am, av, *args,
                                           guard_lost_v=guard)
        other, om, ov, oam, oav, _ = golden_step(other, gr, om, ov, qm, qv, oam, oav, *args,
                                                 guard_lost_v=not guard)
        st = opt.state[p]
        assert_bits(p, var, f"step {k} var")
        assert_bits(st["state1"], m, f"step {k} m")
        assert_bits(st["state2"], v, f"step {k} v")
        assert_bits(st["absmax1"], am, f"step {k} absmax1")
        assert_bits(st["absmax2"], av, f"step {k} absmax2")
    assert lost_reads > 100  # the case reads lost v's: the guard was exercised
    assert not np.array_equal(bits(var), bits(other))


@pytest.mark.parametrize("guard", [True, False])
def test_sparse_dynamic_map_guard_is_the_goldens(guard):
    from golden.lazy_adam_quant import lazy_adam_quant_golden
    R, D = 40, 256
    g = rng(10)
    p = nn.Parameter(tensor(g.uniform(-1, 1, R * D), torch.float32, (R, D)))
    opt = ft.SparseAdam8bit([p], lr=1e-3, guard_lost_v=guard)
    qm, qv = create_dynamic_map(True), create_dynamic_map(False)
    var = storage(p).reshape(R, D)
    m, v = np.zeros((R, D), np.uint8), np.zeros((R, D), np.uint8)  # a fresh state
    am, av = np.zeros((R, 1), F32), np.zeros((R, 1), F32)
    grads = lost_v_grads(g, R * D, 9)
    lost_reads = 0
    for k, gr in enumerate(grads):
        gr = gr.reshape(R, D)
        rows = np.flatnonzero(np.any(gr != 0, axis=1))
        lost_reads += int(np.sum(((qv[v] * av == 0) & (qm[m] * am != 0))[rows]))
        idx = torch.from_numpy(rows).long()
        p.grad = torch.sparse_coo_tensor(idx.unsqueeze(0), torch.from_numpy(gr[rows]), (R, D))
        opt.step()
        t = k + 1
        lr_t = 1e-3 * math.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
        m, v, var, am, av, _ = lazy_adam_quant_golden(
            gr[rows], rows, m, v, var, qm, qv, am, av, lr_t, 0.9, 0.999, 1e-8, "float32",
            "float32", guard_lost_v=guard)
        st = opt.state[p]
        assert_bits(p, var, f"step {k} var")
        assert_bits(st["state1"], m, f"step {k} m")
        assert_bits(st["state2"], v, f"step {k} v")
    assert lost_reads > 50


# ---- DTensor (FSDP2) ----------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["fp8", "fp8_ue3m5"])
def test_dtensor_fp8_steps_as_the_plain_tensor(one_rank_group, fmt):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (1,))
    n = 4097
    full = tensor(rng(11).uniform(-1, 1, n), torch.bfloat16)
    p = nn.Parameter(distribute_tensor(full.clone(), mesh, [Shard(0)]))
    q = nn.Parameter(full.clone())
    o, t = (ft.AdamW8bit([x], **HP, state_format=fmt) for x in (p, q))
    g = rng(12)
    for _ in range(3):
        gr = tensor(g.normal(0, 0.05, n), torch.bfloat16)
        p.grad = distribute_tensor(gr.clone(), mesh, [Shard(0)])
        q.grad = gr
        o.step()
        t.step()
    assert_bits(p.to_local(), storage(q), "var")
    s, r = o.state[p], t.state[q]
    for key in ("state1", "state2"):
        assert isinstance(s[key], DTensor) and s[key].placements == p.placements
        assert_bits(s[key].to_local(), storage(r[key]), key)
    scales = ("scale1", V_FORMAT[fmt][1])
    for key in scales:
        assert isinstance(s[key], DTensor) and tuple(s[key].shape) == (1, fusekit.quant_blocks(n))
        assert_bits(s[key].to_local(), storage(r[key]), key)
    p2 = nn.Parameter(distribute_tensor(full.clone(), mesh, [Shard(0)]))
    o2 = ft.AdamW8bit([p2], **HP, state_format=fmt)
    o2.load_state_dict(o.state_dict())
    for key in ("state1", "state2") + scales:
        assert_bits(o2.state[p2][key].to_local(), storage(s[key].to_local()), key)


# ---- the hazard: issue #33 item 2, as a user meets it -------------------------------------------
LR = 1e-3
BLOCKS, STEPS = 64, 60


@functools.lru_cache(maxsize=None)
def hazard_grads(case, seed=33):
    """[STEPS, BLOCKS * 256] float32: per step and block of 256 one gradient of 1e3 * U(0.5, 1.5)
    beside 255 of 1e3 / ratio * U(0.5, 1.5) (case = the ratio), or one-hot rows (case "onehot":
    one gradient per block, its magnitude log-uniform over 1e-6..1e3, the rest exactly 0); random
    signs and positions every step; blocks 0-31 without gradient on two steps of three
    (tools/fp8_v_format_study.py's hazard case)."""
    g = np.random.default_rng(seed)
    n = BLOCKS * 256
    out = np.empty((STEPS, n), F32)
    quiet = np.arange(BLOCKS) < BLOCKS // 2
    for t in range(STEPS):
        if case == "onehot":
            x = np.zeros((BLOCKS, 256))
            mag = 10.0 ** g.uniform(-6, 3, BLOCKS)
        else:
            x = (1e3 / case) * g.uniform(0.5, 1.5, (BLOCKS, 256))
            mag = 1e3 * g.uniform(0.5, 1.5, BLOCKS)
        x[np.arange(BLOCKS), g.integers(0, 256, BLOCKS)] = mag
        x *= g.choice([-1.0, 1.0], (BLOCKS, 256))
        if t % 3 != 0:
            x[quiet] = 0
        out[t] = x.ravel()
    return out


# 1e9: the issue's base case (1e-6 beside 1e3); 3e5: where the study saw fp8's largest guarded move
CASES = [1e9, 1e3, 1e4, 1e5, 3e5, 1e6, 1e7, "onehot"]


def largest_move(make_opt, grads, sparse=False):
    """The largest |change| of any element in any one step (float64), over the run."""
    n = grads.shape[1]
    p = nn.Parameter(torch.zeros(BLOCKS, n // BLOCKS) if sparse else torch.zeros(n))
    opt = make_opt([p])
    worst = 0.0
    for gr in grads:
        before = p.detach().double().clone()
        x = torch.from_numpy(gr)
        if sparse:
            rows = torch.from_numpy(np.flatnonzero(np.any(gr.reshape(BLOCKS, -1) != 0, axis=1)))
            p.grad = torch.sparse_coo_tensor(rows.unsqueeze(0), x.view(BLOCKS, -1)[rows],
                                             p.shape)
        else:
            p.grad = x.clone()
        opt.step()
        worst = max(worst, float((p.detach().double() - before).abs().max()))
    return worst


def _bnb():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import bitsandbytes
        return bitsandbytes
    except ImportError:
        return None


DENSE_VARIANTS = {
    "torch.optim.Adam (float32)": lambda ps: torch.optim.Adam(ps, lr=LR),
    "fusekit Adam8bit, dynamic map, guard (default)": lambda ps: ft.Adam8bit(ps, lr=LR),
    "fusekit Adam8bit, fp8": lambda ps: ft.Adam8bit(ps, lr=LR, state_format="fp8"),
    "fusekit Adam8bit, dynamic map, guard_lost_v=False": lambda ps: ft.Adam8bit(
        ps, lr=LR, guard_lost_v=False),
    # UE3M5's 2^12 range loses v in most of these blocks: the guard takes it.
    "fusekit Adam8bit, fp8_ue3m5": lambda ps: ft.Adam8bit(ps, lr=LR, state_format="fp8_ue3m5"),
}
SPARSE_VARIANTS = {
    "torch.optim.SparseAdam (float32)": lambda ps: torch.optim.SparseAdam(ps, lr=LR),
    "fusekit SparseAdam8bit, dynamic map, guard (default)": lambda ps: ft.SparseAdam8bit(
        ps, lr=LR),
    "fusekit SparseAdam8bit, fp8": lambda ps: ft.SparseAdam8bit(ps, lr=LR, state_format="fp8"),
    "fusekit SparseAdam8bit, dynamic map, guard_lost_v=False": lambda ps: ft.SparseAdam8bit(
        ps, lr=LR, guard_lost_v=False),
}
# The guarded 8-bit steps may exceed float32's by what rounding v down near its format's floor
# gives (never m / eps): tools/fp8_v_format_study.py measured at most 3.1 lr over its scenarios.
# The bound asserted, with room: 5 lr (docs/fp8_state.md, "The lost-v guard").
GUARDED_BOUND = 5 * LR


def hazard_table(variants, sparse):
    table = {}
    for name, make in variants.items():
        table[name] = [largest_move(make, hazard_grads(c), sparse) for c in CASES]
    return table


def print_table(title, table):
    head = " | ".join(f"{c:.0e}" if c != "onehot" else "one-hot" for c in CASES)
    print(f"\n{title}: largest single-step move, lr {LR} (ratio: big / small gradient)")
    print(f"| variant | {head} |")
    for name, row in table.items():
        print(f"| {name} | " + " | ".join(f"{x:.1e}" for x in row) + " |")


def test_hazard_dense():
    """64 blocks of 256, one large gradient beside tiny ones in each block, half the blocks
    without gradient on two steps of three, lr 1e-3, 60 steps (issue #33 item 2), over gradient
    ratios 1e3..1e7, the issue's 1e9 and one-hot rows."""
    variants = dict(DENSE_VARIANTS)
    bnb = _bnb()
    if bnb is not None:
        variants["bitsandbytes Adam8bit (CPU)"] = lambda ps: bnb.optim.Adam8bit(ps, lr=LR)
    table = hazard_table(variants, sparse=False)
    print_table("Adam8bit", table)
    rows = list(table.values())
    fp32, guarded, fp8_, unguarded, ue3m5 = rows[:5]
    assert max(fp32) <= 1.05 * LR  # float32 Adam: about lr (measured 1.016 lr)
    assert max(guarded) <= GUARDED_BOUND, guarded
    assert max(fp8_) <= GUARDED_BOUND, fp8_
    assert max(ue3m5) <= GUARDED_BOUND, ue3m5
    # Without the guard the dynamic map jumps by m / eps (the test can fail): far more than lr
    # where the study saw it (ratios 1e3..1e6, one-hot rows).
    for case in (1e3, 1e4, 1e5, 1e6, "onehot"):
        assert unguarded[CASES.index(case)] > 100 * LR, (case, unguarded)


def test_hazard_sparse_one_hot_rows():
    """SparseAdam8bit on a [64, 256] table (one block per row), the rows of the hazard case named
    by the sparse gradient when they have one (a quiet row is not named: lazy Adam leaves it
    alone). The m / eps jump needs a named row with an exact zero beside a lost v: the one-hot
    rows; in the ratio cases every element of a named row has a gradient, and the unguarded
    format overshoots by v read too small, not lost."""
    table = hazard_table(SPARSE_VARIANTS, sparse=True)
    print_table("SparseAdam8bit", table)
    fp32, guarded, fp8_, unguarded = table.values()
    # torch's lazy float32 step itself goes past lr here (measured 1.4 lr): a row stepped only
    # every third step has moments that the global bias correction over-corrects.
    assert max(fp32) <= 1.5 * LR
    assert max(guarded) <= GUARDED_BOUND, guarded
    assert max(fp8_) <= GUARDED_BOUND, fp8_
    assert unguarded[CASES.index("onehot")] > 100 * LR, unguarded
    assert max(unguarded[1:-1]) > GUARDED_BOUND, unguarded
