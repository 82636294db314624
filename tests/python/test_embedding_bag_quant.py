"""EmbeddingBagLazyAdamQuant from Python (the 8-bit twin of EmbeddingBagLazyAdam).

Oracles, none of them the code under test:
- golden/embedding_bag_lazy_adam_quant.py (NumPy float32, written from the definition: the bags'
  row gradients, then LazyAdamQuant's row step): fusekit.embedding_bag_lazy_adam_quant and its plan
  bit for bit (codes exactly), both state formats, every implementation this CPU runs;
- a float64 lazy Adam written here (`Float64EmbeddingBagAdam`: the pooled forward, the loss's
  gradient, each row's gradient, Adam with bias correction, all in float64) for
  fusekit.torch.FusedEmbeddingBag(state="8bit") over a short training run, within
  test_torch_sparse_adam8bit.py's quantization tolerance (largest gap 0.12 T lr, mean gap 3% of
  the mean displacement);
- fusekit.torch.SparseAdam8bit on nn.EmbeddingBag(sparse=True)'s gradient: the same weights and the
  same 8-bit state after each step, bit for bit (sum pooling: the gradient rows are the same
  floats, summed in the same order), as a cross-check of the state's layout and names.
All random inputs come from recorded seeds.
"""
import copy
import re

import numpy as np
import pytest

import fusekit
from conftest import runnable_implementations
from golden.apply_adam_w_quant import create_dynamic_map
from golden.embedding_bag_lazy_adam import make_batch
from golden.embedding_bag_lazy_adam_quant import embedding_bag_lazy_adam_quant_golden as golden
from golden.embedding_bag_lazy_adam_quant import random_state

F32 = np.float32
SEED = 20261207


def _state(rng, rows, dim, fmt):
    var = rng.uniform(-1, 1, (rows, dim)).astype(F32)
    m, v, am, av = random_state(rng, rows, dim, fmt)
    qm = create_dynamic_map(True) if fmt == "dynamic_map" else None
    qv = create_dynamic_map(False) if fmt == "dynamic_map" else None
    return var, m, v, am, av, qm, qv


def _same(got, want):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g.view(np.uint8), w.view(np.uint8))


@pytest.mark.parametrize("impl", runnable_implementations(
    fusekit.implementations("embedding_bag_lazy_adam_quant")))
@pytest.mark.parametrize("fmt", fusekit.SPARSE_STATE_FORMATS)
@pytest.mark.parametrize("mode, weighted", [("sum", False), ("sum", True), ("mean", True)])
@pytest.mark.parametrize("dim", [1, 17, 32, 300])
def test_function_matches_golden_bitwise(impl, fmt, mode, weighted, dim):
    if fmt == "fp8" and impl == "cpu_avx512vbmi":
        pytest.skip("cpu_avx512vbmi runs the dynamic maps only")
    rng = np.random.default_rng(SEED + dim * 8 + weighted * 2 + (mode == "mean") + 4 * (fmt == "fp8"))
    var, m, v, am, av, qm, qv = _state(rng, 500, dim, fmt)
    go, idx, off, w = make_batch(rng, 500, dim, 64, (0, 6), weighted, 300)
    step, lr = 3, 0.01
    want = golden(go, idx, off, w, m, v, var, qm, qv, am, av, fusekit.bias_corrected_lr(lr, step),
                  0.9, 0.999, 1e-8, mode, fmt, True)
    st = fusekit.embedding_bag_lazy_adam_quant(
        var, go, idx.astype(np.int32), off, m, v, qm, qv, am, av, per_sample_weights=w, mode=mode,
        step=step, lr=lr, state_format=fmt, guard_lost_v=True, implementation=impl)
    _same((m, v, var, am, av), want[:5])
    assert (st.rows_updated, st.rows_skipped_nonfinite) == want[5:]
    assert st.rows_updated > 20


@pytest.mark.parametrize("fmt", fusekit.SPARSE_STATE_FORMATS)
def test_plan_runs_any_batch(fmt):
    rng = np.random.default_rng(SEED + 1)
    var, m, v, am, av, qm, qv = _state(rng, 1000, 16, fmt)
    go, idx, off, w = make_batch(rng, 1000, 16, 10, (1, 3), True, 1000)
    no_map = np.empty(0, F32)
    maps = (no_map, no_map) if fmt == "fp8" else (qm, qv)
    attrs = dict(mode=1, state_format=fusekit.SPARSE_STATE_FORMATS.index(fmt), guard_lost_v=1)
    plan = fusekit.EmbeddingBagLazyAdamQuantPlan((go, idx, off, w, m, v, var) + maps + (am, av),
                                                 attrs)
    for k, bags in enumerate([1, 300, 0, 77]):
        go, idx, off, w = make_batch(rng, 1000, 16, bags, (0, 8), True, 700)
        lr_t = fusekit.bias_corrected_lr(1e-3, k)
        want = golden(go, idx, off, w, m, v, var, qm, qv, am, av, lr_t, 0.9, 0.999, 1e-8, "mean",
                      fmt, True)
        plan.run((go, idx, off, w, m, v, var) + maps + (am, av), lr=lr_t)
        _same((m, v, var, am, av), want[:5])


@pytest.mark.parametrize("edit, message", [
    (lambda idx, off, qv: idx.__setitem__(5, 1000), "indices[5] = 1000 but the table has 1000 rows"),
    (lambda idx, off, qv: idx.__setitem__(7, -1), "indices[7] = -1 is negative"),
    (lambda idx, off, qv: off.__setitem__(0, 1), "offsets[0] = 1"),
    (lambda idx, off, qv: off.__setitem__(-1, off[-1] - 1), "the last offset must be the number"),
    (lambda idx, off, qv: qv.__setitem__(9, -1.0), "qmap_v[9] = -1 is less than qmap_v[8]"),
])
def test_refusals_modify_nothing(edit, message):
    rng = np.random.default_rng(SEED + 2)
    var, m, v, am, av, qm, qv = _state(rng, 1000, 8, "dynamic_map")
    go, idx, off, _ = make_batch(rng, 1000, 8, 20, (1, 3), False, 1000)
    edit(idx, off, qv)
    before = [a.copy() for a in (var, m, v, am, av)]
    with pytest.raises(fusekit.Error, match=re.escape(message)):
        fusekit.embedding_bag_lazy_adam_quant(var, go, idx, off, m, v, qm, qv, am, av, step=0)
    for a, b in zip((var, m, v, am, av), before):
        assert np.array_equal(a, b)
    with pytest.raises(fusekit.Error, match="state_format = 'fp16'"):
        fusekit.embedding_bag_lazy_adam_quant(var, go, idx, off, m, v, qm, qv, am, av, step=0,
                                              state_format="fp16")


# ---- fusekit.torch.FusedEmbeddingBag(state="8bit") --------------------------------------------

torch = pytest.importorskip("torch")
import fusekit.torch  # noqa: E402
from fusekit.torch import SparseAdam8bit  # noqa: E402

DIM = 32


def _batches(seed, rows, steps, bags, bag_len, weighted):
    from helpers.bags import bag_batches
    return bag_batches(seed, rows, DIM, steps, bags, bag_len, weighted)


class Float64EmbeddingBagAdam:
    """The float64 reference: nn.EmbeddingBag's pooling, the loss sum((y - target)^2), each looked
    up row's gradient, and Adam on those rows only (lazy), with torch.optim.SparseAdam's bias
    correction; every value in float64."""

    def __init__(self, weight, lr, mode, betas=(0.9, 0.999), eps=1e-8):
        self.w = weight.astype(np.float64)
        self.m = np.zeros_like(self.w)
        self.v = np.zeros_like(self.w)
        self.lr, self.mode, self.betas, self.eps, self.t = lr, mode, betas, eps, 0

    def step(self, idx, offs, w, target):
        idx, offs = idx.numpy(), np.append(offs.numpy(), len(idx))
        lengths = np.diff(offs)
        bag_of = np.repeat(np.arange(len(lengths)), lengths)
        c = np.ones(len(idx)) if w is None else w.numpy().astype(np.float64)
        if self.mode == "mean":
            c = c / np.maximum(lengths[bag_of], 1)
        y = np.zeros((len(lengths), self.w.shape[1]))
        np.add.at(y, bag_of, self.w[idx] * c[:, None])
        grad_y = 2 * (y - target.numpy().astype(np.float64))
        g = np.zeros_like(self.w)
        np.add.at(g, idx, grad_y[bag_of] * c[:, None])
        rows = np.unique(idx)
        b1, b2 = self.betas
        self.t += 1
        self.m[rows] = b1 * self.m[rows] + (1 - b1) * g[rows]
        self.v[rows] = b2 * self.v[rows] + (1 - b2) * g[rows] ** 2
        m_hat = self.m[rows] / (1 - b1 ** self.t)
        v_hat = self.v[rows] / (1 - b2 ** self.t)
        self.w[rows] -= self.lr * m_hat / (np.sqrt(v_hat) + self.eps)


@pytest.mark.parametrize("fmt", fusekit.SPARSE_STATE_FORMATS)
@pytest.mark.parametrize("mode, weighted", [("sum", False), ("sum", True), ("mean", False)])
def test_module_close_to_a_float64_lazy_adam(fmt, mode, weighted):
    """20 steps of a 400 x 32 table against float64 Adam: the tolerance is the 8-bit
    quantization's, as test_torch_sparse_adam8bit.py's test_close_to_torch_sparse_adam states it
    (largest gap 0.12 T lr, mean gap 3% of the mean displacement)."""
    steps, lr, rows = 20, 0.01, 400
    torch.manual_seed(SEED)
    mod = fusekit.torch.FusedEmbeddingBag(rows, DIM, mode=mode, lr=lr, state="8bit",
                                          state_format=fmt)
    start = mod.weight.detach().numpy().astype(np.float64).copy()
    ref = Float64EmbeddingBagAdam(mod.weight.detach().numpy(), lr, mode)
    for idx, offs, w, target in _batches(SEED + 3, rows, steps, 256, (1, 4), weighted):
        ref.step(idx, offs, w, target)
        out = mod(idx, offs, per_sample_weights=w)
        ((out - target) ** 2).sum().backward()
    assert mod.weight.grad is None and int(mod.step) == steps
    got = mod.weight.detach().numpy().astype(np.float64)
    gap = np.abs(got - ref.w)
    moved = np.abs(ref.w - start)
    assert moved.mean() > 0.1 * steps * lr  # the run moved the table: a real comparison
    assert gap.max() <= 0.12 * steps * lr
    assert gap.mean() <= 0.03 * moved.mean()


@pytest.mark.parametrize("fmt", fusekit.SPARSE_STATE_FORMATS)
@pytest.mark.parametrize("weighted", [False, True])
def test_module_steps_as_sparse_adam8bit_on_embedding_bag_gradients(fmt, weighted):
    """nn.EmbeddingBag(sparse=True) + SparseAdam8bit, the same table: after every step the same
    weights and the same 8-bit state (codes, scales, maps, step), bit for bit, and the same state
    bytes."""
    rows, lr = 3000, 0.02
    torch.manual_seed(SEED + 4)
    peer = torch.nn.EmbeddingBag(rows, DIM, mode="sum", sparse=True)
    opt = SparseAdam8bit(peer.parameters(), lr=lr, state_format=fmt, min_8bit_size=1)
    mod = fusekit.torch.FusedEmbeddingBag(rows, DIM, mode="sum", lr=lr, _weight=peer.weight,
                                          state="8bit", state_format=fmt)
    for idx, offs, w, target in _batches(SEED + 5, rows, 4, 512, (1, 4), weighted):
        ((mod(idx, offs, per_sample_weights=w) - target) ** 2).sum().backward()
        opt.zero_grad()
        ((peer(idx, offs, per_sample_weights=w) - target) ** 2).sum().backward()
        opt.step()
        assert torch.equal(mod.weight.detach(), peer.weight.detach())
        st = opt.state[peer.weight]
        buffers = dict(mod.named_buffers())
        keys = ("state1", "state2") + (("scale1", "scale2") if fmt == "fp8" else
                                       ("absmax1", "absmax2", "qmap1", "qmap2"))
        for key in keys:
            assert torch.equal(buffers[key], st[key]), key
        assert int(mod.step) == st["step"]
    assert mod.last_stats.rows_updated > 500
    assert mod.state_bytes() == opt.state_bytes()
    assert mod.state_bytes() < 0.3 * rows * DIM * 8  # against float32 m and v


def test_module_8bit_state_dict_round_trip_and_names():
    torch.manual_seed(SEED + 6)
    kw = dict(mode="mean", lr=0.05, state="8bit", state_format="fp8")
    a = fusekit.torch.FusedEmbeddingBag(300, 8, **kw)
    batches = [torch.randint(0, 300, (32, 4)) for _ in range(4)]
    for x in batches[:2]:
        a(x).sum().backward()
    b = fusekit.torch.FusedEmbeddingBag(300, 8, **kw)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    assert set(a.state_dict()) == {"weight", "state1", "state2", "scale1", "scale2", "step"}
    # The loaded state stays packed by row (state1 and state2 views of one table).
    assert b.state2.data_ptr() - b.state1.data_ptr() == 8
    for x in batches[2:]:
        a(x).sum().backward()
        b(x).sum().backward()
    for k, t in a.state_dict().items():
        assert torch.equal(t, b.state_dict()[k]), k
    assert int(b.step) == 4
    d = fusekit.torch.FusedEmbeddingBag(300, 8, state="8bit")
    assert set(d.state_dict()) == {"weight", "state1", "state2", "absmax1", "absmax2", "qmap1",
                                   "qmap2", "step"}
    assert "state='8bit'" in repr(d)


def test_module_8bit_refusals_modify_nothing():
    mod = fusekit.torch.FusedEmbeddingBag(10, 4, state="8bit")
    before = {k: v.clone() for k, v in mod.state_dict().items()}
    with pytest.raises((fusekit.Error, IndexError, RuntimeError)):
        mod(torch.tensor([[1, 10]])).sum().backward()
    for k, t in mod.state_dict().items():
        assert torch.equal(t, before[k]), k
    with pytest.raises(ValueError, match="state = '4bit'"):
        fusekit.torch.FusedEmbeddingBag(10, 4, state="4bit")
    with pytest.raises(ValueError, match="Invalid state_format value"):
        fusekit.torch.FusedEmbeddingBag(10, 4, state="8bit", state_format="fp16")
    with pytest.raises(ValueError, match="guard_lost_v=False"):
        fusekit.torch.FusedEmbeddingBag(10, 4, state="8bit", state_format="fp8",
                                        guard_lost_v=False)
