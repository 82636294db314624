"""What the MiniLM fidelity studies share (tools/minilm_moment_noise.py,
tools/minilm_v_format_emulation.py): examples/python/finetune_minilm.py's model, batches and
held-out sets at a seed, optimizers run in lockstep beside plain torch.optim.AdamW from the same
start on the same batches, and one line each against it. The caller empties sys.argv first (the
example parses its own)."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples" / "python"))
import numpy as np  # noqa: E402
import torch  # noqa: E402

import finetune_minilm as f  # noqa: E402
import fusekit  # noqa: E402

#: the example's AdamW hyperparameters
KW = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def compare(optimizers, seed=20261201, eval_seed=20261202, steps=250, batch=8):
    """optimizers: [(name, make(params) -> optimizer)]. Runs "torch" (torch.optim.AdamW) and each
    of them, one step of each per batch, and prints each run's held-out loss, its loss on unseen
    words, accuracy and how far the weights moved, against torch's."""
    torch.set_num_threads(2)
    fusekit.set_num_threads(2)
    tok, enc, _ = f.load_encoder()
    torch.manual_seed(seed)
    init = {k: v.clone() for k, v in f.Classifier(enc, len(f.CLASSES)).state_dict().items()}

    def factory():
        _, e, _ = f.load_encoder()
        return f.Classifier(e, len(f.CLASSES))

    def encode(texts, labels):
        b = tok(texts, padding="max_length", truncation=True, max_length=22, return_tensors="pt")
        return b["input_ids"], b["attention_mask"], torch.tensor(labels)

    rng = np.random.default_rng(seed)
    batches = [encode(*f.make_sentences(rng, batch)) for _ in range(steps)]
    eval_set = encode(*f.make_sentences(np.random.default_rng(eval_seed), 384))
    unseen = encode(*f.make_sentences(np.random.default_rng([eval_seed, 1]), 384, f.UNSEEN))
    runs = [f.Run("torch", lambda ps: torch.optim.AdamW(ps, **KW), init, factory)]
    runs += [f.Run(name, make, init, factory) for name, make in optimizers]
    for b in batches:
        for r in runs:
            r.step(*b)
    res = {r.name: r.summary(eval_set, unseen, 5) for r in runs}
    t = res["torch"]
    for n, s in res.items():
        print(n, "held-out %.6f (%+.3f%%) unseen %.4f (%+.3f%%) acc %.3f moved %.4f" % (
            s["eval_loss"], 100 * (s["eval_loss"] / t["eval_loss"] - 1), s["unseen_loss"],
            100 * (s["unseen_loss"] / t["unseen_loss"] - 1), s["unseen_accuracy"],
            s["weights_moved_l2"]))
