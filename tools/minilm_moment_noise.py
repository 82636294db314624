"""Does zero-mean error in Adam's moments alone move the MiniLM example's held-out loss? (issue
#33's fidelity; the numbers docs/torch_adam8bit.md quotes)

  PY=$(bash scripts/python_env.sh examples | tail -1)
  PYTHONPATH=build/python $PY tools/minilm_moment_noise.py

torch.optim.AdamW against torch.optim.AdamW whose float32 moments get a zero-mean relative error
after each step, m * (1 + u / 16) and sqrt(v) * (1 + u' / 32) with u, u' uniform in [-1, 1] (the
largest relative rounding errors of E4M3 and UE4M4 in their normal range, without blocks, scales
or 8 bits), from the same start on the same batches as examples/python/finetune_minilm.py at its
default seed (the same held-out sets). About 4 minutes on two cores.

  ... tools/minilm_moment_noise.py --split    the error in m alone and in v alone instead
                                             (three runs in lockstep: about 6 minutes)
  ... tools/minilm_moment_noise.py --v-only 64  the error in sqrt(v) alone, up to 1/64 (a format
                                             with one more mantissa bit)"""
import pathlib
import sys

SPLIT = "--split" in sys.argv[1:]
V_ONLY = int(sys.argv[sys.argv.index("--v-only") + 1]) if "--v-only" in sys.argv else 0
sys.argv = sys.argv[:1]
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # golden
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # minilm_study
import torch  # noqa: E402

from minilm_study import KW, compare  # noqa: E402

gen = torch.Generator().manual_seed(1)


class Noisy(torch.optim.AdamW):
    def __init__(self, params, on_m=True, on_v=True, v_err=1 / 32, **kw):
        super().__init__(params, **kw)
        self.on_m, self.on_v, self.v_err = on_m, on_v, v_err

    def step(self, closure=None):
        r = super().step(closure)
        with torch.no_grad():
            for st in self.state.values():
                m, v = st["exp_avg"], st["exp_avg_sq"]
                if self.on_m:
                    m.mul_(1 + 0.0625 * (2 * torch.rand(m.shape, generator=gen) - 1))
                if self.on_v:
                    s = v.sqrt().mul_(1 + self.v_err * (2 * torch.rand(v.shape, generator=gen) - 1))
                    v.copy_(s * s)
        return r


if V_ONLY:
    runs = [(f"noisy_v_1/{V_ONLY}", lambda ps: Noisy(ps, on_m=False, v_err=1 / V_ONLY, **KW))]
elif SPLIT:
    runs = [("noisy_m", lambda ps: Noisy(ps, on_v=False, **KW)),
            ("noisy_v", lambda ps: Noisy(ps, on_m=False, **KW))]
else:
    runs = [("noisy", lambda ps: Noisy(ps, **KW))]
compare(runs)
