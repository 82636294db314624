"""fusekit.torch.AdamW and Adam against torch.optim.AdamW / Adam (the peer a user replaces) and a
float64 NumPy reference of the update; state_dict interchange in both directions; refusals that
change nothing; DTensor parameters (a one-rank gloo mesh in this process). Seeds are recorded per
test (SEED + k)."""

import copy
import math

import numpy as np
import pytest
import torch

import fusekit.torch as ft

SEED = 20261202


def gen(k):
    return torch.Generator().manual_seed(SEED + k)


def params(shapes, dtype, k):
    g = gen(k)
    return [torch.nn.Parameter((torch.randn(s, generator=g) * 0.5).to(dtype)) for s in shapes]


def set_grads(ps, k, scale=0.1):
    g = gen(1000 + k)
    for p in ps:
        p.grad = (torch.randn(p.shape, generator=g) * scale).to(p.dtype)


def reference_adamw(p, grads, lr, b1, b2, eps, wd, decoupled=True, maximize=False):
    """torch's documented AdamW / Adam update in float64, state float64, the parameter rounded to
    its dtype after each step (as it is stored)."""
    dt = p.dtype
    x = p.detach().double().numpy().copy()
    m = np.zeros_like(x)
    v = np.zeros_like(x)
    for t, g in enumerate(grads, start=1):
        g = g.double().numpy()
        if maximize:
            g = -g
        if decoupled:
            x = x * (1 - lr * wd)
        else:
            g = g + wd * x
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        mh = m / (1 - b1 ** t)
        vh = v / (1 - b2 ** t)
        x = x - lr * mh / (np.sqrt(vh) + eps)
        x = torch.from_numpy(x).to(dt).double().numpy()
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cls,peer,wd", [(ft.AdamW, torch.optim.AdamW, 0.01),
                                          (ft.Adam, torch.optim.Adam, 0.0),
                                          (ft.Adam, torch.optim.Adam, 0.05)])
def test_matches_float64_reference_and_torch(dtype, cls, peer, wd):
    shapes = [(300,), (17, 33), (5,), (1,)]  # below, at and above vector widths; a scalar-like
    ours = params(shapes, dtype, 1)
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    start = [p.detach().clone() for p in ours]
    lr, betas, eps = 2e-3, (0.9, 0.99), 1e-6
    o = cls(ours, lr=lr, betas=betas, eps=eps, weight_decay=wd)
    t = peer(theirs, lr=lr, betas=betas, eps=eps, weight_decay=wd)
    grads = []
    for step in range(12):
        set_grads(ours, step)
        grads.append([p.grad.clone() for p in ours])
        for a, b in zip(ours, theirs):
            b.grad = a.grad.clone()
        o.step()
        t.step()
    # (rtol, atol) against the float64 reference: float32 accumulates a few ulps of the state per
    # step (relative to the update, lr); bfloat16 and float16 round the parameter each step (one
    # ulp: 2^-8, 2^-11 relative). Against torch, whose moments for bfloat16 and float16 parameters
    # are in that dtype (ours float32), the same scale wider.
    ref_tol = {torch.float32: (1e-5, 2e-3 * lr), torch.bfloat16: (8e-3, 1e-3),
               torch.float16: (2e-3, 1e-4)}[dtype]
    peer_tol = {torch.float32: (1e-5, 2e-3 * lr), torch.bfloat16: (3e-2, 4e-3)}.get(dtype)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        p0 = torch.nn.Parameter(start[i].clone())
        want = reference_adamw(p0, [g[i] for g in grads], lr, *betas, eps, wd,
                               decoupled=cls is ft.AdamW)
        got = a.detach().double().numpy()
        np.testing.assert_allclose(got, want, rtol=ref_tol[0], atol=ref_tol[1])
        if dtype != torch.float16:  # torch's float16 moments with eps = 1e-6 (below float16's
            # normal range) drift far from the reference: not a yardstick there
            np.testing.assert_allclose(got, b.detach().double().numpy(), rtol=peer_tol[0],
                                       atol=peer_tol[1])
        assert not torch.equal(a.detach(), start[i])  # it moved
        s = o.state[a]
        assert set(s) == {"step", "exp_avg", "exp_avg_sq"}
        assert s["exp_avg"].dtype == torch.float32 and float(s["step"]) == 12.0


def test_state_dict_from_torch_and_back():
    ps = params([(64,), (8, 9)], torch.float32, 2)
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    t = torch.optim.AdamW(theirs, lr=1e-3)
    for step in range(3):
        set_grads(theirs, step)
        t.step()
    ours = [torch.nn.Parameter(p.detach().clone()) for p in theirs]
    o = ft.AdamW(ours, lr=1e-3)
    o.load_state_dict(copy.deepcopy(t.state_dict()))
    for a, b in zip(ours, theirs):
        assert torch.equal(o.state[a]["exp_avg"], t.state[b]["exp_avg"])
        assert torch.equal(o.state[a]["exp_avg_sq"], t.state[b]["exp_avg_sq"])
        assert float(o.state[a]["step"]) == 3.0
    # One more step on both from the same state: close (the arithmetic differs by ulps).
    set_grads(ours, 9)
    for a, b in zip(ours, theirs):
        b.grad = a.grad.clone()
    o.step()
    t.step()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    # And back: torch takes fusekit's state and continues from step 4.
    t2 = torch.optim.AdamW([torch.nn.Parameter(a.detach().clone()) for a in ours], lr=1e-3)
    t2.load_state_dict(o.state_dict())
    assert float(next(iter(t2.state.values()))["step"]) == 4.0


def test_bfloat16_parameters_keep_float32_state_through_load():
    ps = params([(40,)], torch.bfloat16, 3)
    o = ft.AdamW(ps, lr=1e-3)
    set_grads(ps, 0)
    o.step()
    sd = copy.deepcopy(o.state_dict())
    o2 = ft.AdamW([torch.nn.Parameter(ps[0].detach().clone())], lr=1e-3)
    o2.load_state_dict(sd)
    s = next(iter(o2.state.values()))
    assert s["exp_avg"].dtype == torch.float32
    assert torch.equal(s["exp_avg"], o.state[ps[0]]["exp_avg"])  # not rounded to bfloat16


def test_refusals_change_nothing():
    p = params([(10,)], torch.float32, 4)[0]
    with pytest.raises(ValueError, match="amsgrad"):
        ft.AdamW([p], amsgrad=True)
    with pytest.raises(ValueError, match="capturable"):
        ft.AdamW([p], capturable=True)
    with pytest.raises(ValueError, match="learning rate"):
        ft.AdamW([p], lr=float("nan"))
    o = ft.AdamW([p], lr=1e-3)
    p.grad = torch.zeros(10).to_sparse()
    before = p.detach().clone()
    with pytest.raises(RuntimeError, match="fusekit.torch.AdamW: Adam does not support sparse gradients"):
        o.step()  # torch's exception type and message
    assert torch.equal(p.detach(), before) and len(o.state) == 0
    bad = {"state": {0: {"step": torch.tensor(1.0), "exp_avg": torch.zeros(3),
                         "exp_avg_sq": torch.zeros(10)}},
           "param_groups": copy.deepcopy(o.state_dict()["param_groups"])}
    with pytest.raises(ValueError, match="exp_avg.*shape"):
        o.load_state_dict(bad)
    assert len(o.state) == 0


def test_non_finite_gradient_leaves_elements_unchanged():
    p = params([(50,)], torch.float32, 5)[0]
    o = ft.AdamW([p], lr=1e-2)
    p.grad = torch.full((50,), 0.1)
    p.grad[7] = float("nan")
    before = p.detach().clone()
    o.step()
    assert o.last_stats == [ft.StepStats(0, 0, 1, 0)] and p[7] == before[7]
    assert not torch.equal(p.detach()[:7], before[:7])


def test_maximize_and_strided_parameter():
    base = torch.randn(20, 6, generator=gen(6))
    p = torch.nn.Parameter(base.t())  # non-contiguous view: stepped through a copy, written back
    q = torch.nn.Parameter(base.t().clone())
    o = ft.AdamW([p], lr=1e-2, maximize=True)
    t = torch.optim.AdamW([q], lr=1e-2, maximize=True)
    for k in range(3):
        g = torch.randn(6, 20, generator=gen(60 + k))
        p.grad, q.grad = g.clone(), g.clone()
        o.step()
        t.step()
    torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=2e-5)  # 2e-3 * lr


def test_dtensor_parameter_steps_its_shard_and_keeps_dtensor_state(one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (1,))
    full = torch.randn(16, 8, generator=gen(7))
    p = torch.nn.Parameter(distribute_tensor(full.clone(), mesh, [Shard(0)]))
    q = torch.nn.Parameter(full.clone())
    o = ft.AdamW([p], lr=1e-2)
    t = torch.optim.AdamW([q], lr=1e-2)
    storage = p.to_local().untyped_storage().data_ptr()
    for k in range(4):
        g = torch.randn(16, 8, generator=gen(70 + k))
        p.grad = distribute_tensor(g.clone(), mesh, [Shard(0)])
        q.grad = g.clone()
        o.step()
        t.step()
    torch.testing.assert_close(p.full_tensor(), q.detach(), rtol=1e-5, atol=2e-5)
    assert p.to_local().untyped_storage().data_ptr() == storage  # never moved
    s = o.state[p]
    assert type(s["exp_avg"]).__name__ == "DTensor"
    assert s["exp_avg"].placements == p.placements
    torch.testing.assert_close(s["exp_avg"].full_tensor(), t.state[q]["exp_avg"], rtol=1e-5,
                               atol=1e-7)
    # Its state_dict loads into a fresh optimizer of the same sharding, unchanged.
    p2 = torch.nn.Parameter(distribute_tensor(full.clone(), mesh, [Shard(0)]))
    o2 = ft.AdamW([p2], lr=1e-2)
    o2.load_state_dict(o.state_dict())
    assert torch.equal(o2.state[p2]["exp_avg_sq"].to_local(), s["exp_avg_sq"].to_local())
    assert math.isclose(float(o2.state[p2]["step"]), 4.0)
