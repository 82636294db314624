"""EmbeddingBagLazyAdam from Python: fusekit.embedding_bag_lazy_adam and its plan bit for bit
against golden/embedding_bag_lazy_adam.py (NumPy, written from the doc), refusals that modify
nothing; fusekit.torch.FusedEmbeddingBag bit for bit against the golden, and against its peer,
nn.EmbeddingBag(sparse=True) + torch.optim.SparseAdam, within float32 tolerance over several
steps; its state_dict round trip."""
import copy
import re

import numpy as np
import pytest

import fusekit
from golden.embedding_bag_lazy_adam import embedding_bag_lazy_adam_golden as golden
from golden.embedding_bag_lazy_adam import make_batch
from conftest import runnable_implementations

F32 = np.float32


def _table(rng, rows, dim):
    return (rng.uniform(-1, 1, (rows, dim)).astype(F32), rng.uniform(-0.1, 0.1, (rows, dim)).astype(F32),
            rng.uniform(0, 0.01, (rows, dim)).astype(F32))


@pytest.mark.parametrize("impl", runnable_implementations(
    fusekit.implementations("embedding_bag_lazy_adam")))
@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dim", [1, 8, 17, 32, 300])
def test_function_matches_golden_bitwise(impl, mode, weighted, dim):
    rng = np.random.default_rng(dim * 4 + weighted * 2 + (mode == "mean"))
    var, m, v = _table(rng, 500, dim)
    go, idx, off, w = make_batch(rng, 500, dim, 64, (0, 6), weighted, 300)
    step, lr = 3, 0.01
    want = golden(go, idx, off, w, m, v, var, fusekit.bias_corrected_lr(lr, step), 0.9, 0.999,
                  1e-8, mode)
    st = fusekit.embedding_bag_lazy_adam(var, go, idx.astype(np.int32), off, m, v,
                                         per_sample_weights=w, mode=mode, step=step, lr=lr,
                                         implementation=impl)
    for got, exp in zip((m, v, var), want[:3]):
        assert np.array_equal(got.view(np.uint32), exp.view(np.uint32))
    assert (st.rows_updated, st.rows_skipped_nonfinite) == want[3:]
    assert st.rows_updated > 20


def test_plan_runs_any_batch():
    rng = np.random.default_rng(1)
    var, m, v = _table(rng, 1000, 16)
    go, idx, off, w = make_batch(rng, 1000, 16, 10, (1, 3), True, 1000)
    plan = fusekit.EmbeddingBagLazyAdamPlan((go, idx, off, w, m, v, var), dict(mode=1))
    for k, bags in enumerate([1, 300, 0, 77]):
        go, idx, off, w = make_batch(rng, 1000, 16, bags, (0, 8), True, 700)
        lr_t = fusekit.bias_corrected_lr(1e-3, k)
        want = golden(go, idx, off, w, m, v, var, lr_t, 0.9, 0.999, 1e-8, "mean")
        plan.run((go, idx, off, w, m, v, var), lr=lr_t)
        for got, exp in zip((m, v, var), want[:3]):
            assert np.array_equal(got.view(np.uint32), exp.view(np.uint32))


@pytest.mark.parametrize("edit, message", [
    (lambda idx, off: idx.__setitem__(5, 1000), "indices[5] = 1000 but the table has 1000 rows"),
    (lambda idx, off: idx.__setitem__(7, -1), "indices[7] = -1 is negative"),
    (lambda idx, off: off.__setitem__(0, 1), "offsets[0] = 1"),
    (lambda idx, off: off.__setitem__(-1, off[-1] - 1), "the last offset must be the number"),
    (lambda idx, off: off.__setitem__(3, off[-1] + 1), "offsets must be non-decreasing"),
])
def test_refusals_modify_nothing(edit, message):
    rng = np.random.default_rng(2)
    var, m, v = _table(rng, 1000, 8)
    go, idx, off, _ = make_batch(rng, 1000, 8, 20, (1, 3), False, 1000)
    edit(idx, off)
    before = [a.copy() for a in (var, m, v)]
    with pytest.raises(fusekit.Error, match=re.escape(message)):
        fusekit.embedding_bag_lazy_adam(var, go, idx, off, m, v, step=0)
    for a, b in zip((var, m, v), before):
        assert np.array_equal(a, b)
    with pytest.raises(fusekit.Error, match="mode = 'max'"):
        fusekit.embedding_bag_lazy_adam(var, go, idx, off, m, v, step=0, mode="max")
    with pytest.raises(fusekit.Error, match="offsets has 20 entries but grad_output has 20 bags"):
        fusekit.embedding_bag_lazy_adam(var, go, idx, off[:-1], m, v, step=0)


# ---- fusekit.torch.FusedEmbeddingBag ---------------------------------------------------------

torch = pytest.importorskip("torch")
import fusekit.torch  # noqa: E402


def _batches(seed, rows, steps, bags, bag_len, weighted):
    from helpers.bags import bag_batches
    return bag_batches(seed, rows, 16, steps, bags, bag_len, weighted)


@pytest.mark.parametrize("mode, weighted", [("sum", False), ("sum", True), ("mean", False)])
def test_module_matches_sparse_adam_and_golden(mode, weighted):
    rows, dim, lr = 2000, 16, 0.01
    torch.manual_seed(0)
    peer = torch.nn.EmbeddingBag(rows, dim, mode=mode, sparse=True)
    opt = torch.optim.SparseAdam(peer.parameters(), lr=lr)
    mod = fusekit.torch.FusedEmbeddingBag(rows, dim, mode=mode, lr=lr, _weight=peer.weight)
    assert mod.weight.grad is None
    for k, (idx, offs, w, target) in enumerate(_batches(3, rows, 6, 64, (0, 5), weighted)):
        # Golden first, from the module's state before the step.
        var0 = mod.weight.detach().numpy().copy()
        m0, v0 = mod.exp_avg.numpy().copy(), mod.exp_avg_sq.numpy().copy()
        out = mod(idx, offs, per_sample_weights=w)
        out_peer = peer(idx, offs, per_sample_weights=w)
        assert torch.equal(out, out_peer) if k == 0 else torch.allclose(out, out_peer, atol=1e-5)
        loss = ((out - target) ** 2).sum()
        (grad_output,) = torch.autograd.grad(loss, out, retain_graph=True)
        loss.backward()
        opt.zero_grad()
        ((out_peer - target) ** 2).sum().backward()
        opt.step()
        full = np.append(offs.numpy(), len(idx))
        want = golden(grad_output.numpy(), idx.numpy(), full, None if w is None else w.numpy(),
                      m0, v0, var0, fusekit.bias_corrected_lr(lr, k), 0.9, 0.999, 1e-8, mode)
        assert np.array_equal(mod.weight.detach().numpy().view(np.uint32),
                              want[2].view(np.uint32))
        assert np.array_equal(mod.exp_avg.numpy().view(np.uint32), want[0].view(np.uint32))
        assert mod.weight.grad is None
        assert int(mod.step) == k + 1
        torch.testing.assert_close(mod.weight.detach(), peer.weight.detach(), rtol=1e-5,
                                   atol=1e-6)
        st = opt.state[peer.weight]
        torch.testing.assert_close(mod.exp_avg, st["exp_avg"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(mod.exp_avg_sq, st["exp_avg_sq"], rtol=1e-4, atol=1e-9)


def test_module_state_dict_round_trip_and_2d_input():
    torch.manual_seed(1)
    a = fusekit.torch.FusedEmbeddingBag(300, 8, mode="mean", lr=0.05)
    batches = [torch.randint(0, 300, (32, 4)) for _ in range(4)]
    for x in batches[:2]:
        a(x).sum().backward()
    b = fusekit.torch.FusedEmbeddingBag(300, 8, mode="mean", lr=0.05)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    assert set(a.state_dict()) == {"weight", "exp_avg", "exp_avg_sq", "step"}
    for x in batches[2:]:
        a(x).sum().backward()
        b(x).sum().backward()
    for k, t in a.state_dict().items():
        assert torch.equal(t, b.state_dict()[k]), k
    assert int(b.step) == 4
    # No gradient, no step: eval and no_grad only pool.
    with torch.no_grad():
        y = a(batches[0])
    assert y.shape == (32, 8) and int(a.step) == 4


def test_module_refusals():
    mod = fusekit.torch.FusedEmbeddingBag(10, 4)
    before = mod.state_dict()
    before = {k: v.clone() for k, v in before.items()}
    with pytest.raises((fusekit.Error, IndexError, RuntimeError)):
        mod(torch.tensor([[1, 10]])).sum().backward()
    for k, t in mod.state_dict().items():
        assert torch.equal(t, before[k]), k
    with pytest.raises(ValueError, match="mode = 'max'"):
        fusekit.torch.FusedEmbeddingBag(10, 4, mode="max")
    with pytest.raises(NotImplementedError, match="padding_idx"):
        fusekit.torch.FusedEmbeddingBag(10, 4, padding_idx=0)
