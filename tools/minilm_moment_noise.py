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
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples" / "python"))
import numpy as np  # noqa: E402
import torch  # noqa: E402

import finetune_minilm as f  # noqa: E402
import fusekit  # noqa: E402

torch.set_num_threads(2)
fusekit.set_num_threads(2)
seed, eval_seed = 20261201, 20261202
tok, enc, path = f.load_encoder()
torch.manual_seed(seed)
model0 = f.Classifier(enc, len(f.CLASSES))
init = {k: v.clone() for k, v in model0.state_dict().items()}


def factory():
    _, e, _ = f.load_encoder()
    return f.Classifier(e, len(f.CLASSES))


rng = np.random.default_rng(seed)


def encode(texts, labels):
    b = tok(texts, padding="max_length", truncation=True, max_length=22, return_tensors="pt")
    return b["input_ids"], b["attention_mask"], torch.tensor(labels)


batches = [encode(*f.make_sentences(rng, 8)) for _ in range(250)]
eval_set = encode(*f.make_sentences(np.random.default_rng(eval_seed), 384))
unseen = encode(*f.make_sentences(np.random.default_rng([eval_seed, 1]), 384, f.UNSEEN))
kw = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
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


runs = [f.Run("torch", lambda ps: torch.optim.AdamW(ps, **kw), init, factory)]
if V_ONLY:
    runs += [f.Run(f"noisy_v_1/{V_ONLY}",
                   lambda ps: Noisy(ps, on_m=False, v_err=1 / V_ONLY, **kw), init, factory)]
elif SPLIT:
    runs += [f.Run("noisy_m", lambda ps: Noisy(ps, on_v=False, **kw), init, factory),
             f.Run("noisy_v", lambda ps: Noisy(ps, on_m=False, **kw), init, factory)]
else:
    runs += [f.Run("noisy", lambda ps: Noisy(ps, **kw), init, factory)]
for b in batches:
    for r in runs:
        r.step(*b)
res = {r.name: r.summary(eval_set, unseen, 5) for r in runs}
t = res["torch"]
for n, s in res.items():
    print(n, "held-out %.6f (%+.3f%%) unseen %.4f (%+.3f%%) acc %.3f moved %.4f" % (
        s["eval_loss"], 100 * (s["eval_loss"] / t["eval_loss"] - 1), s["unseen_loss"],
        100 * (s["unseen_loss"] / t["unseen_loss"] - 1), s["unseen_accuracy"], s["weights_moved_l2"]))
