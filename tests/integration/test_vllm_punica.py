"""fusekit.vllm against vLLM's own PunicaWrapperCPU (the vLLM lane of the integration tests, its
own environment): the wrapper made and fed as vLLM does (update_metadata with a LoRAMapping, every
max_loras slot occupied), its LoRA methods run stock and patched, against a float64 reference in
which a token without an adapter (-1) gets nothing. Shows that stock vLLM adds the last slot's
adapter to those tokens and the plugin does not; FUSEKIT_VLLM=0 and an unknown version leave
vLLM untouched."""
import logging
import math

import pytest

torch = pytest.importorskip("torch")
vllm = pytest.importorskip("vllm")

import fusekit.vllm as fv  # noqa: E402
from vllm.lora.layers.utils import LoRAMapping  # noqa: E402
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU  # noqa: E402

SEED = 20261205
MAX_LORAS = 4
IDS = [11, 22, 33, 44]  # every slot occupied


@pytest.fixture
def stock():
    fv.unregister()
    yield
    fv.unregister()


def wrapper(ids, prefill):
    """A PunicaWrapperCPU fed as vLLM feeds it: one LoRA id per token (0: none)."""
    w = PunicaWrapperCPU(256, 256, device="cpu")  # max_batches: segments of one adapter
    mapping = LoRAMapping(index_mapping=tuple(ids), prompt_mapping=tuple(ids), is_prefill=prefill)
    w.update_metadata(mapping, IDS, MAX_LORAS, 1000)
    return w


def reference_linear(y, x, a_st, b_st, scale, slices, idx):
    out = y.double().clone()
    off = 0
    for a, b, n in zip(a_st, b_st, slices):
        for t in range(x.shape[0]):
            s = int(idx[t])
            if s < 0:
                continue
            out[t, off:off + n] += scale * (x[t].double() @ a[s, 0].double().T) @ b[s, 0].double().T
        off += n
    return out


def make(dtype, tokens, hidden, slices, rank, gen):
    x = (torch.randn(tokens, hidden, generator=gen) / math.sqrt(hidden)).to(dtype)
    y = torch.randn(tokens, sum(slices), generator=gen).to(dtype)
    a_st = tuple(torch.randn(MAX_LORAS, 1, rank, hidden, generator=gen).to(dtype) for _ in slices)
    b_st = tuple(torch.randn(MAX_LORAS, 1, n, rank, generator=gen).to(dtype) / math.sqrt(rank)
                 for n in slices)
    return y, x, a_st, b_st


@pytest.mark.parametrize("prefill", [True, False], ids=["prefill", "decode"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_add_lora_linear_patched_matches_reference_and_stock_does_not(stock, dtype, prefill):
    gen = torch.Generator().manual_seed(SEED)
    tokens, hidden, slices, rank = 23, 64, (32, 16, 16), 8  # qkv
    ids = [IDS[i % 4] if i % 5 else 0 for i in range(tokens)]  # every 5th token: no adapter
    w = wrapper(ids, prefill)
    idx = w.token_lora_indices.clone()
    assert (idx == -1).sum() == 5 and idx.max() == MAX_LORAS - 1
    y, x, a_st, b_st = make(dtype, tokens, hidden, slices, rank, gen)
    want = reference_linear(y, x, a_st, b_st, 1.0, slices, idx)
    none = idx < 0

    y_stock = y.clone()
    w.add_lora_linear(y_stock, x, a_st, b_st, 1.0, slices)
    # vLLM's torch ops index the stacked weights with -1: the last slot's adapter is added.
    assert not torch.equal(y_stock[none], y[none])

    fv.register()
    assert fv.is_patched()
    y_ours = y.clone()
    w.add_lora_linear(y_ours, x, a_st, b_st, 1.0, slices)
    assert torch.equal(y_ours[none], y[none])  # untouched, bit for bit
    eps = {torch.float32: 2.0 ** -23, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}[dtype]
    err = (y_ours.double() - want).abs()
    bound = eps * want.abs() + 1e-5 * (1.0 + want.abs())  # one rounding into the dtype
    assert torch.all(err <= bound), float((err - bound).max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_thread_counts_and_the_strided_fallback_give_the_same_bits(stock, monkeypatch, dtype):
    """FUSEKIT_VLLM_THREADS (1 by default) changes how many threads run a call, never its bits;
    an x whose innermost dimension is strided takes fusekit.torch.add_lora_ (a contiguous copy)
    instead of the direct binding call, with the same bits."""
    gen = torch.Generator().manual_seed(SEED + 1)
    tokens, hidden, slices, rank = 96, 1024, (1024, 256, 256), 16  # enough work for threads
    ids = [IDS[i % 4] if i % 7 else 0 for i in range(tokens)]
    w = wrapper(ids, False)
    y, x, a_st, b_st = make(dtype, tokens, hidden, slices, rank, gen)
    want = reference_linear(y, x, a_st, b_st, 1.0, slices, w.token_lora_indices)
    fv.register()
    got = {}
    for threads in ("1", "2", "3", "0"):
        monkeypatch.setenv("FUSEKIT_VLLM_THREADS", threads)
        monkeypatch.setattr(fv, "_APPLY", None)  # made again with this thread count
        y_ours = y.clone()
        w.add_lora_linear(y_ours, x, a_st, b_st, 1.0, slices)
        got[threads] = y_ours
    x_strided = x.t().contiguous().t()
    assert x_strided.stride(-1) != 1 and torch.equal(x_strided, x)
    y_fallback = y.clone()
    w.add_lora_linear(y_fallback, x_strided, a_st, b_st, 1.0, slices)
    for threads, y_ours in got.items():
        assert torch.equal(y_ours, got["1"]), threads
    assert torch.equal(y_fallback, got["1"])
    assert not torch.equal(got["1"], y)  # the update landed
    eps = {torch.float32: 2.0 ** -23, torch.bfloat16: 2.0 ** -8}[dtype]
    err = (got["1"].double() - want).abs()
    assert torch.all(err <= eps * want.abs() + 1e-5 * (1.0 + want.abs()))


def test_logits_and_embedding(stock):
    gen = torch.Generator().manual_seed(SEED + 1)
    seqs, hidden, vocab, rank = 6, 48, 100, 8
    ids = [IDS[0], 0, IDS[3], IDS[1], 0, IDS[2]]
    w = wrapper(ids, False)
    sidx = w.sampler_indices.clone()
    x = torch.randn(seqs, hidden, generator=gen)
    y = torch.randn(seqs, vocab + 4, generator=gen)  # the model pads the vocabulary wider
    a = torch.randn(MAX_LORAS, 1, rank, hidden, generator=gen)
    b = torch.randn(MAX_LORAS, 1, vocab + 8, rank, generator=gen)  # the adapter pads more
    want = y.double().clone()
    for t in range(seqs):
        s = int(sidx[t])
        if s >= 0:
            want[t] += 0.5 * ((x[t].double() @ a[s, 0].double().T) @ b[s, 0, :vocab + 4].double().T)
    fv.register()
    got = y.clone()
    w.add_lora_logits(got, x, a, b, 0.5)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
    assert torch.equal(got[sidx < 0], y[sidx < 0])
    # The embedding's B: y += x @ B[idx]^T, x already [tokens, rank].
    e = torch.randn(seqs, rank, generator=gen)
    yb = torch.randn(seqs, hidden, generator=gen)
    bb = torch.randn(MAX_LORAS, 1, hidden, rank, generator=gen)
    tidx = w.token_lora_indices.clone()
    want = yb.double().clone()
    for t in range(seqs):
        s = int(tidx[t])
        if s >= 0:
            want[t] += e[t].double() @ bb[s, 0].double().T
    got = yb.clone()
    w.add_lora_embedding(got, e, bb, True)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_off_switch_and_unknown_version_leave_vllm_untouched(stock, monkeypatch):
    original = PunicaWrapperCPU.add_lora_linear
    monkeypatch.setenv("FUSEKIT_VLLM", "0")
    fv.register()
    assert PunicaWrapperCPU.add_lora_linear is original and not fv.is_patched()
    monkeypatch.delenv("FUSEKIT_VLLM")
    monkeypatch.setattr(vllm, "__version__", "0.31.9")
    lines = _Lines()
    fv._log.addHandler(lines)
    try:
        fv.register()
    finally:
        fv._log.removeHandler(lines)
    assert PunicaWrapperCPU.add_lora_linear is original and not fv.is_patched()
    assert any("0.31.9 is not a version" in m for m in lines.lines), lines.lines


def test_register_logs_one_line(stock):
    lines = _Lines()
    fv._log.addHandler(lines)
    level = fv._log.level
    fv._log.setLevel(logging.INFO)
    try:
        fv.register()
        fv.register()  # idempotent: patched once, said once
    finally:
        fv._log.removeHandler(lines)
        fv._log.setLevel(level)
    assert [m for m in lines.lines if "runs LoRA on fusekit's AddLora" in m] == lines.lines
    assert len(lines.lines) == 1


def test_vllm_loads_the_plugin_from_the_installed_wheel(stock):
    """The installed fusekit declares the entry point; vLLM's own loader finds it and calls
    register() (this test runs against the wheel, not the source tree: .ci/integration)."""
    from importlib.metadata import entry_points

    from vllm.plugins import load_general_plugins

    eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "fusekit"]
    if not eps:
        pytest.skip("fusekit is not installed as a distribution here (a source-tree run)")
    assert eps[0].value == "fusekit.vllm:register"
    load_general_plugins()
    assert fv.is_patched()
    assert PunicaWrapperCPU.add_lora_linear is fv._add_lora_linear


@pytest.mark.parametrize("case", ["float64", "mixed dtypes", "embedding add_inputs=False"])
def test_what_addlora_does_not_take_goes_to_vllm_unchanged(stock, case):
    """Inputs the operator does not take reach vLLM's own method, as they are: the patched
    wrapper's result equals the stock one bit for bit (the -1 behaviour included)."""
    gen = torch.Generator().manual_seed(SEED + 2)
    tokens, hidden, slices, rank = 9, 32, (16, 16), 4
    ids = [IDS[i % 4] if i % 3 else 0 for i in range(tokens)]
    w = wrapper(ids, True)
    if case == "embedding add_inputs=False":
        e = torch.randn(tokens, rank, generator=gen)
        y = torch.randn(tokens, hidden, generator=gen)
        b = torch.randn(MAX_LORAS, 1, hidden, rank, generator=gen)

        def call(out):
            w.add_lora_embedding(out, e, b, False)
    else:
        y, x, a_st, b_st = make(torch.float64 if case == "float64" else torch.float32, tokens,
                                hidden, slices, rank, gen)
        if case == "mixed dtypes":  # float32 activations, bfloat16 adapter weights
            a_st = tuple(t.to(torch.bfloat16) for t in a_st)
            b_st = tuple(t.to(torch.bfloat16) for t in b_st)

        def call(out):
            w.add_lora_linear(out, x, a_st, b_st, 1.0, slices)
    want = y.clone()
    try:
        call(want)
    except Exception as e:  # noqa: BLE001  (vLLM's own method refuses it: so must the patched)
        fv.register()
        with pytest.raises(type(e)):
            call(y.clone())
        return
    assert not torch.equal(want, y)
    fv.register()
    got = y.clone()
    call(got)
    assert torch.equal(got, want)
