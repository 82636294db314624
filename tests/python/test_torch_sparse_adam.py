"""fusekit.torch.SparseAdam against torch.optim.SparseAdam itself (the oracle: same constructor,
same starts, same batches, many steps), plus what fusekit adds or refuses: float32 only,
non-finite rows left unchanged, out-of-range indices refused with nothing modified, huge pages,
state dicts that interchange with torch's, and results independent of the thread count.

Tolerances. Both optimizers fold the bias correction into the rate in Python double, but the
float32 arithmetic differs in order and in constants:

- torch: ``m += (g - m) * (1 - b1)``, ``v += (g*g - v) * (1 - b2)``, ``p += -lr_t * (m / d)``;
  fusekit: ``m = m*b1 + g*(1 - b1)``, ``v = v*b2 + g*g*(1 - b2)``, ``p += (m * -lr_t) / d``, with
  ``d = sqrt(v) + eps``. Different rounding: a few float32 ulps per step.
- fusekit converts beta to float32 *before* ``1 - beta`` (the operator's spec): with b2 = 0.999,
  ``1 - float32(0.999)`` is 1.29e-5 relatively off 0.001, so v differs from torch's by that
  factor (V_RTOL below, computed from the betas), and the update by half of it.

Each step's update is at most about lr (Adam's normalised step), so after `steps` steps a
parameter can be off by steps * lr * (relative update error): PARAM_ATOL below.
"""

import copy
import io
import pickle

import numpy as np
import pytest
import torch
from torch import nn

import fusekit
import fusekit.torch as ft
from fusekit.torch._memory import HUGE_PAGE_BYTES
from conftest import collapse_expected

SEED = 20261207
B1, B2 = 0.9, 0.999
# v's relative gap from the float32 (1 - beta2), twice for margin, plus float32 rounding noise.
V_RTOL = 2 * abs((1 - float(np.float32(B2))) - (1 - B2)) / (1 - B2) + 1e-5
REL_UPDATE = V_RTOL  # the update's relative gap (half of v's, through sqrt), with margin


def param_atol(steps, lr):
    return steps * lr * REL_UPDATE + 1e-6


def gen(k=0):
    return torch.Generator().manual_seed(SEED + k)


def snapshot(opt, params):
    """Bitwise copies of the params and their states."""
    out = [p.detach().clone() for p in params]
    for p in params:
        st = opt.state.get(p, {})
        out.append(int(st["step"]) if "step" in st else None)
        for key in ("exp_avg", "exp_avg_sq"):
            out.append(st[key].clone() if key in st else None)
    return out


def assert_bitwise_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y), "a tensor changed"
        else:
            assert x == y


def assert_close_to_torch(ours, theirs, params_ours, params_theirs, steps, lr):
    """Params within PARAM_ATOL; moments within float32-rounding of the gradients' scale: the
    params' rounding gaps feed back into every later gradient, so an element of m near 0 can be
    off by a few 1e-6 of the largest m, not of itself."""
    for po, pt in zip(params_ours, params_theirs):
        torch.testing.assert_close(po.detach(), pt.detach(), rtol=1e-5,
                                   atol=param_atol(steps, lr))
        so, st = ours.state[po], theirs.state[pt]
        assert so["step"] == st["step"]
        assert isinstance(so["step"], int)
        m_scale = float(st["exp_avg"].abs().max())
        v_scale = float(st["exp_avg_sq"].abs().max())
        torch.testing.assert_close(so["exp_avg"], st["exp_avg"], rtol=1e-5, atol=1e-5 * m_scale)
        torch.testing.assert_close(so["exp_avg_sq"], st["exp_avg_sq"], rtol=V_RTOL,
                                   atol=1e-5 * v_scale)


class Tower(nn.Module):
    """Embedding(s) and a fixed readout: the loss depends on the table, so each step's gradient
    depends on the earlier steps (a mismatch would grow, not hide)."""

    def __init__(self, rows=60, dim=8, bag=None, padding_idx=None, k=0):
        super().__init__()
        torch.manual_seed(SEED + k)
        if bag is None:
            self.emb = nn.Embedding(rows, dim, sparse=True, padding_idx=padding_idx)
        else:
            self.emb = nn.EmbeddingBag(rows, dim, mode=bag, sparse=True)
        self.register_buffer("w", torch.randn(dim))

    def forward(self, x, offsets=None):
        e = self.emb(x) if offsets is None else self.emb(x, offsets)
        return e @ self.w


def train(model, opt, batches, scheduler=None):
    for x, offsets, y in batches:
        opt.zero_grad()
        out = model(x, offsets)
        loss = ((out - y) ** 2).mean()
        loss.backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()


def make_batches(steps, rows, n, k=0, bags=None, low=0):
    g = gen(100 + k)
    out = []
    for _ in range(steps):
        # Drawn from a narrow range: many repeats per batch (the gradients are uncoalesced).
        x = torch.randint(low, max(low + 1, rows // 3), (n,), generator=g)
        offsets = None
        if bags:
            offsets = torch.sort(torch.randint(0, n, (bags - 1,), generator=g)).values
            offsets = torch.cat([torch.zeros(1, dtype=torch.int64), offsets])
        y = torch.randn(n if bags is None else bags, generator=g)
        out.append((x, offsets, y))
    return out


def pair(model_fn, lr=0.01, **kw):
    ours_m, theirs_m = model_fn(), model_fn()
    for a, b in zip(ours_m.parameters(), theirs_m.parameters()):
        assert torch.equal(a, b)
    # A tensor lr is shared state (schedulers fill_ it): each optimizer gets its own.
    lr2 = lr.clone() if isinstance(lr, torch.Tensor) else lr
    ours = ft.SparseAdam(ours_m.parameters(), lr=lr, **kw)
    theirs = torch.optim.SparseAdam(theirs_m.parameters(), lr=lr2, **kw)
    return ours_m, ours, theirs_m, theirs


# ---- results against torch.optim.SparseAdam -----------------------------------------------------
@pytest.mark.parametrize("padding_idx", [None, 0])
@pytest.mark.parametrize("maximize", [False, True])
def test_embedding_with_duplicates_matches_torch(padding_idx, maximize):
    steps, lr = 20, 0.01
    om, ours, tm, theirs = pair(lambda: Tower(padding_idx=padding_idx), lr=lr, maximize=maximize)
    batches = make_batches(steps, 60, 48)
    x0 = batches[0][0]
    assert len(torch.unique(x0)) < len(x0)  # the batch repeats rows
    if padding_idx is not None:
        assert bool((x0 == padding_idx).any())
    # The first gradient autograd makes is uncoalesced: fusekit gets it as it is.
    om(x0).sum().backward()
    assert not om.emb.weight.grad.is_coalesced()
    om.emb.weight.grad = None
    pad_before = om.emb.weight[0].detach().clone()
    train(om, ours, batches)
    train(tm, theirs, batches)
    assert_close_to_torch(ours, theirs, [om.emb.weight], [tm.emb.weight], steps, lr)
    if padding_idx is not None:
        assert torch.equal(om.emb.weight[0].detach(), pad_before)  # never stepped
    assert ours.last_stats[0].rows_updated > 0
    assert ours.last_stats[0].rows_skipped_nonfinite == 0


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_matches_torch(mode):
    steps, lr = 20, 0.02
    om, ours, tm, theirs = pair(lambda: Tower(bag=mode), lr=lr)
    batches = make_batches(steps, 60, 64, k=1, bags=12)
    train(om, ours, batches)
    train(tm, theirs, batches)
    assert_close_to_torch(ours, theirs, [om.emb.weight], [tm.emb.weight], steps, lr)


def hand_grad(rows, dim, n, k, coalesce=False, low=0, high=None):
    g = gen(200 + k)
    idx = torch.randint(low, rows if high is None else high, (1, n), generator=g)
    vals = torch.randn(n, dim, generator=g)
    t = torch.sparse_coo_tensor(idx, vals, (rows, dim), check_invariants=False)
    return t.coalesce() if coalesce else t


@pytest.mark.parametrize("coalesce", [False, True])
def test_hand_built_gradients_match_torch(coalesce):
    steps, lr, rows, dim = 20, 0.01, 40, 5
    torch.manual_seed(SEED)
    start = torch.randn(rows, dim)
    po, pt = nn.Parameter(start.clone()), nn.Parameter(start.clone())
    ours, theirs = ft.SparseAdam([po], lr=lr), torch.optim.SparseAdam([pt], lr=lr)
    for s in range(steps):
        g = hand_grad(rows, dim, 30, s, coalesce=coalesce)
        assert g.is_coalesced() == coalesce
        po.grad, pt.grad = g, g.clone()
        ours.step()
        theirs.step()
    assert_close_to_torch(ours, theirs, [po], [pt], steps, lr)


def test_param_groups_and_scheduler_match_torch():
    steps = 20

    def model():
        torch.manual_seed(SEED + 3)
        return nn.ModuleList([nn.Embedding(50, 4, sparse=True), nn.Embedding(30, 6, sparse=True)])

    def groups(m):
        return [{"params": [m[0].weight]}, {"params": [m[1].weight], "lr": 0.03}]

    om, tm = model(), model()
    ours = ft.SparseAdam(groups(om), lr=0.01)
    theirs = torch.optim.SparseAdam(groups(tm), lr=0.01)
    s_ours = torch.optim.lr_scheduler.StepLR(ours, step_size=5, gamma=0.5)
    s_theirs = torch.optim.lr_scheduler.StepLR(theirs, step_size=5, gamma=0.5)
    g = gen(4)
    for _ in range(steps):
        a = torch.randint(0, 20, (40,), generator=g)
        b = torch.randint(0, 10, (40,), generator=g)
        y = torch.randn(40, generator=g)
        for m, opt in ((om, ours), (tm, theirs)):
            opt.zero_grad()
            loss = ((m[0](a).sum(1) * m[1](b).sum(1) - y) ** 2).mean()
            loss.backward()
            opt.step()
        s_ours.step()
        s_theirs.step()
    assert ours.param_groups[1]["lr"] == theirs.param_groups[1]["lr"] == 0.03 * 0.5 ** 4
    assert_close_to_torch(ours, theirs, [om[0].weight, om[1].weight],
                          [tm[0].weight, tm[1].weight], steps, 0.03)
    assert [(s.group, s.index) for s in ours.last_stats] == [(0, 0), (1, 0)]


def test_lambda_lr_and_tensor_lr_match_torch():
    steps = 20
    om, ours, tm, theirs = pair(lambda: Tower(k=5), lr=torch.tensor(0.02))
    s_ours = torch.optim.lr_scheduler.LambdaLR(ours, lambda e: 1.0 / (1 + e))
    s_theirs = torch.optim.lr_scheduler.LambdaLR(theirs, lambda e: 1.0 / (1 + e))
    batches = make_batches(steps, 60, 32, k=5)
    train(om, ours, batches, s_ours)
    train(tm, theirs, batches, s_theirs)
    assert_close_to_torch(ours, theirs, [om.emb.weight], [tm.emb.weight], steps, 0.02)


def test_multidimensional_and_transposed_params_match_torch():
    steps, lr = 12, 0.01
    torch.manual_seed(SEED + 6)
    cube = torch.randn(20, 2, 3)
    flat = torch.randn(7, 20)
    # [20, 2, 3] stepped as [20, 6] (sparse dim 1); a transposed [20, 7] (no [R, D] view);
    # a [20, 7] table whose gradient indexes both dimensions (sparse dim 2).
    def params():
        return [nn.Parameter(cube.clone()), nn.Parameter(flat.clone().t()),
                nn.Parameter(flat.t().contiguous())]

    po, pt = params(), params()
    assert not po[1].is_contiguous()
    ours, theirs = ft.SparseAdam(po, lr=lr), torch.optim.SparseAdam(pt, lr=lr)
    g = gen(7)
    for _ in range(steps):
        i1 = torch.randint(0, 20, (1, 15), generator=g)
        g1 = torch.sparse_coo_tensor(i1, torch.randn(15, 2, 3, generator=g), (20, 2, 3),
                                     check_invariants=True)
        i2 = torch.randint(0, 20, (1, 15), generator=g)
        g2 = torch.sparse_coo_tensor(i2, torch.randn(15, 7, generator=g), (20, 7),
                                     check_invariants=True)
        i3 = torch.stack([torch.randint(0, 20, (25,), generator=g),
                          torch.randint(0, 7, (25,), generator=g)])
        g3 = torch.sparse_coo_tensor(i3, torch.randn(25, generator=g), (20, 7),
                                     check_invariants=True)
        for ps in (po, pt):
            ps[0].grad, ps[1].grad, ps[2].grad = g1.clone(), g2.clone(), g3.clone()
        ours.step()
        theirs.step()
    assert_close_to_torch(ours, theirs, po, pt, steps, lr)
    assert po[1].stride() == pt[1].stride()  # the transposed param kept its layout


def test_empty_gradient_counts_the_step_like_torch():
    om, ours, tm, theirs = pair(lambda: Tower(k=8))
    empty = torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.int64), torch.zeros(0, 8),
                                    (60, 8), check_invariants=True)
    before = om.emb.weight.detach().clone()
    for m, opt in ((om, ours), (tm, theirs)):
        m.emb.weight.grad = empty.clone()
        opt.step()
    assert ours.state[om.emb.weight]["step"] == theirs.state[tm.emb.weight]["step"] == 1
    assert torch.equal(om.emb.weight.detach(), before)
    assert ours.last_stats[0].rows_updated == 0
    assert torch.count_nonzero(ours.state[om.emb.weight]["exp_avg"]) == 0


def test_closure_and_alias():
    assert ft.LazyAdam is ft.SparseAdam
    m = Tower(k=9)
    opt = ft.LazyAdam(m.parameters())
    x, _, y = make_batches(1, 60, 8, k=9)[0]

    def closure():
        opt.zero_grad()
        loss = ((m(x) - y) ** 2).mean()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert isinstance(loss, torch.Tensor) and opt.state[m.emb.weight]["step"] == 1


# ---- state dicts ---------------------------------------------------------------------------------
@pytest.mark.parametrize("direction", ["torch_to_fusekit", "fusekit_to_torch"])
def test_state_dict_interchanges_with_torch(direction):
    first, then, lr = 10, 10, 0.01
    batches = make_batches(first + then, 60, 40, k=10)
    src_cls, dst_cls = ((torch.optim.SparseAdam, ft.SparseAdam) if direction == "torch_to_fusekit"
                        else (ft.SparseAdam, torch.optim.SparseAdam))
    m = Tower(k=10)
    src = src_cls(m.parameters(), lr=lr)
    train(m, src, batches[:first])
    # state_dict() returns the live tensors (and torch's load keeps them): a checkpoint is a copy.
    sd = copy.deepcopy(src.state_dict())
    assert set(sd["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    assert sd["state"][0]["step"] == first
    frozen = copy.deepcopy(sd)
    # The reference: the source optimizer going on; the copy: a new model and the other class.
    m2 = copy.deepcopy(m)
    dst = dst_cls(m2.parameters(), lr=lr)
    dst.load_state_dict(sd)
    assert isinstance(dst.state[m2.emb.weight]["step"], int)
    train(m, src, batches[first:])
    train(m2, dst, batches[first:])
    ours, theirs = (dst, src) if dst_cls is ft.SparseAdam else (src, dst)
    pw_ours, pw_theirs = ((m2.emb.weight, m.emb.weight) if dst_cls is ft.SparseAdam
                          else (m.emb.weight, m2.emb.weight))
    assert_close_to_torch(ours, theirs, [pw_ours], [pw_theirs], first + then, lr)
    if dst_cls is ft.SparseAdam:  # fusekit copies what it loads: the given dict is not written
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(sd["state"][0][key], frozen["state"][0][key])


def test_save_load_round_trip_continues_bitwise():
    steps, lr = 16, 0.01
    batches = make_batches(steps, 60, 40, k=11)
    m_a = Tower(k=11)
    m_b = copy.deepcopy(m_a)
    a = ft.SparseAdam(m_a.parameters(), lr=lr)
    train(m_a, a, batches)  # uninterrupted
    b = ft.SparseAdam(m_b.parameters(), lr=lr)
    train(m_b, b, batches[: steps // 2])
    buf = io.BytesIO()
    torch.save({"model": m_b.state_dict(), "opt": b.state_dict()}, buf)
    buf.seek(0)
    ck = torch.load(buf)
    m_c = Tower(k=99)  # a different start, overwritten by the checkpoint
    m_c.load_state_dict(ck["model"])
    c = ft.SparseAdam(m_c.parameters(), lr=lr)
    c.load_state_dict(ck["opt"])
    assert_bitwise_same(snapshot(c, [m_c.emb.weight]), snapshot(b, [m_b.emb.weight]))
    train(m_c, c, batches[steps // 2:])
    # The same operator on the same state: the resumed run equals the uninterrupted one bit for bit.
    assert_bitwise_same(snapshot(c, [m_c.emb.weight]), snapshot(a, [m_a.emb.weight]))


def test_pickle_keeps_the_hugepages_flag():
    opt = ft.SparseAdam(Tower(k=12).parameters(), hugepages=False)
    clone = pickle.loads(pickle.dumps(opt))
    assert clone.hugepages is False
    assert clone.param_groups[0]["lr"] == 1e-3 and "hugepages" not in clone.param_groups[0]


# ---- refusals ------------------------------------------------------------------------------------
def test_dense_gradient_refused_with_torch_message():
    m = nn.Embedding(20, 4, sparse=False)
    opt = ft.SparseAdam(m.parameters())
    m(torch.tensor([1, 2, 2])).sum().backward()
    before = m.weight.detach().clone()
    with pytest.raises(RuntimeError) as ours_err:
        opt.step()
    theirs = torch.optim.SparseAdam(m.parameters())
    with pytest.raises(RuntimeError) as theirs_err:
        theirs.step()
    # torch's exception type and message, after fusekit's prefix
    assert str(theirs_err.value) == (
        "SparseAdam does not support dense gradients, please consider Adam instead")
    assert str(ours_err.value) == "fusekit.torch.SparseAdam: " + str(theirs_err.value)
    assert torch.equal(m.weight.detach(), before) and len(opt.state) == 0


def test_float64_param_refused_by_name():
    m = nn.Sequential(nn.Embedding(10, 4, sparse=True).double())
    with pytest.raises(TypeError, match=r"parameter '0\.weight' .*torch\.float64.*float32"):
        ft.SparseAdam(m.named_parameters())
    with pytest.raises(TypeError, match=r"group 0, index 0.*float64"):
        ft.SparseAdam(m.parameters())
    # A param that becomes float64 after construction: refused at step, nothing written.
    m32 = nn.Embedding(10, 4, sparse=True)
    opt = ft.SparseAdam(m32.parameters())
    m32.weight.data = m32.weight.data.double()
    m32(torch.tensor([1, 2])).sum().backward()
    before = m32.weight.detach().clone()
    with pytest.raises(TypeError, match="float32"):
        opt.step()
    assert torch.equal(m32.weight.detach(), before) and len(opt.state) == 0
    # and a group added later
    with pytest.raises(TypeError, match="float64"):
        opt.add_param_group({"params": [nn.Parameter(torch.zeros(3, 2, dtype=torch.float64))]})
    assert len(opt.param_groups) == 1


@pytest.mark.parametrize("kwargs", [
    {"lr": -1e-3}, {"lr": torch.tensor([1e-3, 1e-3])}, {"eps": 0.0}, {"eps": -1.0},
    {"betas": (1.0, 0.999)}, {"betas": (-0.1, 0.999)}, {"betas": (0.9, 1.0)},
    {"betas": (0.9, -0.5)},
])
def test_constructor_validation_as_torch(kwargs):
    # torch's exception type, and its message inside fusekit's (prefix first, then the reason)
    p = [nn.Parameter(torch.zeros(4, 2))]
    with pytest.raises(ValueError) as theirs:
        torch.optim.SparseAdam(p, **kwargs)
    with pytest.raises(ValueError) as ours:
        ft.SparseAdam(p, **kwargs)
    assert str(ours.value).startswith("fusekit.torch.SparseAdam: " + str(theirs.value))


def test_lr_zero_accepted_where_torch_refuses():
    # One rule for lr in every fusekit.torch optimizer: finite and >= 0 (torch's Adam allows 0,
    # its SparseAdam does not): documented in docs/torch_sparse_adam.md.
    p = nn.Parameter(torch.randn(4, 2))
    with pytest.raises(ValueError, match="Invalid learning rate: 0.0"):
        torch.optim.SparseAdam([p], lr=0.0)
    opt = ft.SparseAdam([p], lr=0.0)
    before = p.detach().clone()
    p.grad = torch.sparse_coo_tensor([[1]], torch.ones(1, 2), (4, 2))
    opt.step()
    assert torch.equal(p.detach(), before) and opt.state[p]["step"] == 1


@pytest.mark.parametrize("make", [
    lambda: torch.zeros(4, 2).to_sparse(), lambda: torch.zeros(4, 2, dtype=torch.complex64)])
def test_sparse_and_complex_params_refused_as_torch(make):
    p = make()
    with pytest.raises(ValueError) as theirs:
        torch.optim.SparseAdam([p])
    with pytest.raises(ValueError) as ours:
        ft.SparseAdam([p])
    assert str(ours.value).startswith("fusekit.torch.SparseAdam: " + str(theirs.value))


@pytest.mark.parametrize("kwargs,pattern", [
    ({"betas": (0.9, 1 - 1e-9)}, "index 1.*float32"),  # torch accepts; 1.0 in float32
    ({"eps": 1e-60}, "eps.*float32"),  # torch accepts; 0 in float32
])
def test_values_float32_cannot_hold_refused(kwargs, pattern):
    torch.optim.SparseAdam([nn.Parameter(torch.zeros(4, 2))], **kwargs)  # fine for torch
    with pytest.raises(ValueError, match=pattern):
        ft.SparseAdam([nn.Parameter(torch.zeros(4, 2))], **kwargs)


@pytest.mark.parametrize("first_step", [True, False])
@pytest.mark.parametrize("two_params", [False, True])
def test_out_of_range_index_refused_nothing_modified(first_step, two_params):
    torch.manual_seed(SEED + 13)
    ps = [nn.Parameter(torch.randn(30, 4)), nn.Parameter(torch.randn(20, 4))]
    if not two_params:
        ps = ps[1:]
    opt = ft.SparseAdam(ps, lr=0.01)
    if not first_step:
        for s in range(3):
            for p in ps:
                p.grad = hand_grad(p.shape[0], 4, 10, s)
            opt.step()
    for p in ps:
        p.grad = hand_grad(p.shape[0], 4, 10, 50)
    bad = hand_grad(20, 4, 10, 51)
    bad._indices()[0, 6] = 20  # one past the end, built by hand (torch's modules never do this)
    ps[-1].grad = bad
    before = snapshot(opt, ps)
    ptrs = [p.data_ptr() for p in ps]
    with pytest.raises(fusekit.Error) as err:
        opt.step()
    assert err.value.code == 161002
    assert "20" in str(err.value) and "nothing was modified" in str(err.value)
    assert_bitwise_same(snapshot(opt, ps), before)
    assert [p.data_ptr() for p in ps] == ptrs
    assert len(opt.state) == (0 if first_step else len(ps))


def test_negative_index_is_padding():
    """A negative index (no torch module makes one; a hand-built COO can hold it) is ignored:
    the result is torch's on the same gradient without those entries."""
    rows, dim, lr = 25, 3, 0.01
    torch.manual_seed(SEED + 14)
    start = torch.randn(rows, dim)
    po, pt = nn.Parameter(start.clone()), nn.Parameter(start.clone())
    ours, theirs = ft.SparseAdam([po], lr=lr), torch.optim.SparseAdam([pt], lr=lr)
    for s in range(8):
        g = hand_grad(rows, dim, 20, 60 + s, low=-3)
        idx, vals = g._indices(), g._values()
        assert bool((idx < 0).any())
        keep = idx[0] >= 0
        po.grad = g
        pt.grad = torch.sparse_coo_tensor(idx[:, keep], vals[keep], (rows, dim),
                                          check_invariants=True)
        ours.step()
        theirs.step()
        assert ours.last_stats[0].indices_padding == int((~keep).sum())
    assert_close_to_torch(ours, theirs, [po], [pt], 8, lr)


def test_nonfinite_row_left_unchanged_others_updated():
    rows, dim, lr = 30, 6, 0.01
    torch.manual_seed(SEED + 15)
    start = torch.randn(rows, dim)
    po, pt = nn.Parameter(start.clone()), nn.Parameter(start.clone())
    ours, theirs = ft.SparseAdam([po], lr=lr), torch.optim.SparseAdam([pt], lr=lr)
    for s in range(3):  # some history first, so m and v of the bad row are not zero
        g = hand_grad(rows, dim, 40, 70 + s)
        po.grad, pt.grad = g, g.clone()
        ours.step()
        theirs.step()
    g = hand_grad(rows, dim, 40, 80)
    idx, vals = g._indices().clone(), g._values().clone()
    idx[0, :3] = 7  # row 7 three times, one of them non-finite
    vals[1, 2] = float("nan")
    vals[0, 4] = float("inf")
    idx[0, 3] = 9  # row 9 Inf alone
    vals[3, 0] = float("-inf")
    keep = (idx[0] != 7) & (idx[0] != 9)
    assert bool(keep.any())
    row_before = [t.clone() for t in (po.detach()[[7, 9]], ours.state[po]["exp_avg"][[7, 9]],
                                      ours.state[po]["exp_avg_sq"][[7, 9]])]
    po.grad = torch.sparse_coo_tensor(idx, vals, (rows, dim), check_invariants=True)
    pt.grad = torch.sparse_coo_tensor(idx[:, keep], vals[keep], (rows, dim),
                                      check_invariants=True)
    ours.step()
    theirs.step()
    assert ours.last_stats[0].rows_skipped_nonfinite == 2
    after = (po.detach()[[7, 9]], ours.state[po]["exp_avg"][[7, 9]],
             ours.state[po]["exp_avg_sq"][[7, 9]])
    for a, b in zip(after, row_before):
        assert torch.equal(a, b)
    # The other rows: torch's step on the gradient without rows 7 and 9.
    assert torch.isfinite(po).all()
    assert_close_to_torch(ours, theirs, [po], [pt], 4, lr)
    changed = torch.unique(idx[0, keep])
    assert not torch.equal(po.detach()[changed], start[changed])


# ---- huge pages ----------------------------------------------------------------------------------


@pytest.mark.parametrize("hugepages", [True, False])
def test_big_param_gets_huge_pages_in_place(hugepages):
    rows, dim = 65536, 16  # 4 MiB
    torch.manual_seed(SEED + 16)
    m = nn.Embedding(rows, dim, sparse=True)
    small = nn.Embedding(100, 4, sparse=True)  # under 2 MiB: never moved
    ref = copy.deepcopy(m)
    param, ptr, small_ptr = m.weight, m.weight.data_ptr(), small.weight.data_ptr()
    assert ptr % HUGE_PAGE_BYTES != 0  # torch's allocation, not fusekit's
    opt = ft.SparseAdam(list(m.parameters()) + list(small.parameters()), lr=0.01,
                        hugepages=hugepages)
    theirs = torch.optim.SparseAdam(ref.parameters(), lr=0.01)
    x = torch.randint(0, rows, (512,), generator=gen(16))
    for mod, o in ((m, opt), (ref, theirs)):
        o.zero_grad()
        mod(x).square().sum().backward()
        if mod is m:
            small(torch.tensor([1, 2])).sum().backward()
        o.step()
    assert m.weight is param and opt.param_groups[0]["params"][0] is param
    assert small.weight.data_ptr() == small_ptr
    # The parameter's storage never moves (FSDP, DDP and pinned copies may hold it): huge pages
    # come to it in place; the moments are the optimizer's own, allocated on huge pages.
    assert param.data_ptr() == ptr
    if hugepages:
        for key in ("exp_avg", "exp_avg_sq"):
            assert opt.state[param][key].data_ptr() % HUGE_PAGE_BYTES == 0
        if collapse_expected():  # one of the two 2 MiB pages inside an unaligned 4 MiB table
            assert ft.hugepage_backed_fraction(param.data) >= 0.45
    # The module computes with the stepped storage.
    out = m(x)
    assert torch.equal(out, nn.functional.embedding(x, param))
    torch.testing.assert_close(param.detach(), ref.weight.detach(), rtol=1e-5,
                               atol=param_atol(1, 0.01))
    # A second step trains on the same memory.
    ptr1, before = param.data_ptr(), param.detach().clone()
    opt.zero_grad()
    m(x).sum().backward()
    assert param.grad is not None  # autograd reaches the Parameter the module holds
    opt.step()
    assert param.data_ptr() == ptr1
    assert not torch.equal(param.detach()[x], before[x])
    assert torch.equal(m(x), param.detach()[x])  # and the module reads the stepped memory


def test_loaded_state_goes_to_huge_pages():
    rows, dim = 65536, 8  # 2 MiB
    torch.manual_seed(SEED + 17)
    m = nn.Embedding(rows, dim, sparse=True)
    src = torch.optim.SparseAdam(m.parameters())
    m(torch.randint(0, rows, (64,), generator=gen(17))).sum().backward()
    src.step()
    sd = src.state_dict()
    dst = ft.SparseAdam(m.parameters())
    dst.load_state_dict(sd)
    for key in ("exp_avg", "exp_avg_sq"):
        got = dst.state[m.weight][key]
        assert got.data_ptr() % HUGE_PAGE_BYTES == 0
        assert got.data_ptr() != sd["state"][0][key].data_ptr()
        assert torch.equal(got, sd["state"][0][key])


# ---- threads -------------------------------------------------------------------------------------
def test_bitwise_identical_for_one_and_two_threads():
    def run(threads):
        fusekit.set_num_threads(threads)
        try:
            assert fusekit.get_num_threads() == threads
            torch.manual_seed(SEED + 18)
            m = nn.Embedding(20000, 16, sparse=True)
            opt = ft.SparseAdam(m.parameters(), lr=0.01, hugepages=False)
            g = gen(18)
            for _ in range(4):
                x = torch.randint(0, 5000, (8192,), generator=g)  # many repeats
                opt.zero_grad()
                m(x).square().sum().backward()
                opt.step()
            return snapshot(opt, [m.weight])
        finally:
            fusekit.set_num_threads(0)

    assert_bitwise_same(run(1), run(2))
