"""Would a finer 8-bit format for sqrt(v) bring the MiniLM example within 1 % of float32? (issue
#33's fidelity; the numbers docs/torch_adam8bit.md quotes)

  PY=$(bash scripts/python_env.sh examples | tail -1)
  PYTHONPATH=build/python $PY tools/minilm_v_format_emulation.py [FORMAT ...] [--seed S]

torch.optim.AdamW whose moments are stored block-scaled after each step, as fusekit's FP8 state
stores them (docs/fp8_state.md: blocks of 256 over the flattened tensor, scale = block max / the
format's largest value, round to nearest even, subnormals, the lost-v guard v = m * m where v's
value is 0 under a non-zero m): m in E4M3 always, sqrt(v) in each FORMAT given as uEeMm (unsigned, e
exponent bits, m mantissa bits, bias 2^(e-1) - 1, every exponent field finite: UE4M4 is fusekit's),
against plain AdamW, from the same start on the same batches as examples/python/finetune_minilm.py
at its seed (default 20261201; --seed as its --seed). An emulation in float32 torch ops (the update
uses torch's arithmetic, not the operator's): a study of formats, not of fusekit's kernel.
Default formats: ue4m4 ue3m5. About 4 minutes a run on two cores (the emulated stores cost more
than the step), the runs in lockstep."""
import pathlib
import re
import sys

FORMATS = [a for a in sys.argv[1:] if re.fullmatch(r"ue\dm\d", a)] or ["ue4m4", "ue3m5"]
SEED = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 20261201
sys.argv = sys.argv[:1]
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # golden
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # minilm_study
import numpy as np  # noqa: E402
import torch  # noqa: E402

from golden import fp8_state as fp8  # noqa: E402
from minilm_study import KW, compare  # noqa: E402


class Minifloat:
    """e exponent bits, m mantissa bits, bias 2^(e-1) - 1, no infinities or NaN (E4M3: its
    largest value 448, as OCP's E4M3FN)."""

    def __init__(self, e, m, top=None):
        self.m, self.bias = m, 2 ** (e - 1) - 1
        self.emin = 1 - self.bias  # the smallest normal binade
        emax = 2 ** e - 1 - self.bias
        self.top = top if top is not None else 2.0 ** emax * (2 - 2.0 ** -m)

    def round(self, a):
        """a >= 0 float32: the nearest value of the format (ties to even), saturated."""
        _, ex = torch.frexp(a)  # a = mant * 2^ex, mant in [0.5, 1)
        binade = torch.clamp(ex - 1, min=self.emin)
        ulp_exp = (binade - self.m).to(torch.float32)
        q = torch.round(torch.ldexp(a, -ulp_exp))  # round-half-even in ulps
        return torch.clamp(torch.ldexp(q, ulp_exp), max=self.top)


E4M3 = Minifloat(4, 3, top=448.0)


def self_check():
    """The emulated rounding against golden/fp8_state.py's coders, 200,000 float32 values each
    over the formats' whole range (both signs for E4M3): every value equal, or the run stops."""
    rng = np.random.default_rng(20261207)
    mag = (np.abs(rng.standard_normal(200_000)) *
           2.0 ** rng.integers(-14, 9, 200_000)).astype(np.float32)
    for name, fmt, signed in (("ue4m4", Minifloat(4, 4), False), ("ue3m5", Minifloat(3, 5), False),
                              ("e4m3", E4M3, True)):
        x = np.minimum(mag, np.float32(fmt.top))
        if signed:
            x = np.where(rng.random(x.size) < 0.5, -x, x).astype(np.float32)
        want = fp8.fp8_decode(fp8.fp8_encode(x, name), name)
        t = torch.from_numpy(x)
        got = fmt.round(t.abs())
        got = (torch.copysign(got, t) if signed else got).numpy()
        bad = int(np.sum(got != want))
        if bad:
            raise SystemExit(f"emulated {name} differs from the golden coder at {bad} values")
    print("self-check: the emulated E4M3, UE4M4 and UE3M5 rounding equal the golden coders "
          "(200,000 values each)")


self_check()


def stored(x, fmt, signed):
    """x's values after a store in fmt, blocks of 256 over the flattened tensor."""
    flat = x.reshape(-1)
    n = flat.numel()
    pad = (-n) % 256
    blocks = torch.cat([flat, flat.new_zeros(pad)]).view(-1, 256)
    amax = blocks.abs().amax(dim=1, keepdim=True)
    ok = amax >= 2.0 ** -96
    safe = torch.where(ok, amax, torch.ones_like(amax))
    scale = torch.where(ok, safe / fmt.top, torch.zeros_like(amax))
    inv = fmt.top / safe
    y = blocks * inv
    q = fmt.round(y.abs())
    if signed:
        q = torch.copysign(q, y)
    out = (q * scale).view(-1)[:n]
    return out.view_as(x)


class Emulated(torch.optim.AdamW):
    def __init__(self, params, vfmt, **kw):
        super().__init__(params, **kw)
        self.vfmt = vfmt

    @torch.no_grad()
    def step(self, closure=None):
        r = super().step(closure)
        for st in self.state.values():
            m, v = st["exp_avg"], st["exp_avg_sq"]
            mq = stored(m, E4M3, True)
            s = stored(v.sqrt(), self.vfmt, False)
            vq = s * s
            vq = torch.where((vq == 0) & (mq != 0), mq * mq, vq)  # the lost-v guard
            m.copy_(mq)
            v.copy_(vq)
        return r


def fmt_of(name):
    e, m = int(name[2]), int(name[4])
    return Minifloat(e, m)


compare([(f"e4m3+{name}", lambda ps, fm=fmt_of(name): Emulated(ps, fm, **KW))
         for name in FORMATS], seed=SEED)
