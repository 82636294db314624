"""Train a small two-tower click model with torch.optim.SparseAdam and fusekit.torch.SparseAdam.

The model: a user table and an item table (nn.Embedding(sparse=True), a few million rows in all),
and a small dense MLP on [u, i, u * i] optimized with torch.optim.Adam. The data: synthetic clicks
with Zipf-distributed user and item ids (the hot ids scattered over the table by a fixed
permutation) and a planted ground truth (latent user and item vectors, and an item popularity
bias), so the loss has something to fall to.

Every optimizer named in --optimizers trains the same model from the same start (same seed) on the
same batches, one after the other. The script prints, per optimizer, the final training loss,
the held-out log loss and AUC (numpy, Mann-Whitney), the median seconds of the embedding
optimizer's step alone and of the whole train step; it writes a plot of the loss curves (--plot)
and the figures as JSON (--json).

    python examples/python/train_recsys.py                      # defaults: a few minutes, 2 cores
    python examples/python/train_recsys.py --steps 50 --rows 200000,100000   # a quick look

New embedding optimizers are added by name in SPARSE_OPTIMIZERS (`fusekit8bit`:
fusekit.torch.SparseAdam8bit, 8-bit state in the dynamic-map format; `fusekit8bit_fp8`: the same in
the FP8 state format, state_format="fp8"). The first optimizer named is the reference: the others'
held-out log loss is printed relative to its, and the plot's lower panel shows each training curve
minus its. The float32 run beside the two 8-bit formats (docs/torch_sparse_adam8bit.md):

    python examples/python/train_recsys.py --optimizers fusekit,fusekit8bit,fusekit8bit_fp8 \
        --plot docs/recsys_8bit_loss.png --json out/recsys_8bit.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import time

import numpy as np
import torch
from torch import nn

from recsys_data import World


def _torch_sparse_adam(params, lr):
    return torch.optim.SparseAdam(params, lr=lr)


def _fusekit_sparse_adam(params, lr):
    import fusekit.torch
    return fusekit.torch.SparseAdam(params, lr=lr)


def _fusekit_sparse_adam8bit(params, lr):
    import fusekit.torch
    return fusekit.torch.SparseAdam8bit(params, lr=lr)


def _fusekit_sparse_adam8bit_fp8(params, lr):
    import fusekit.torch
    return fusekit.torch.SparseAdam8bit(params, lr=lr, state_format="fp8")


# name -> (factory(params, lr) -> optimizer, label for the plot). Add new ones here.
SPARSE_OPTIMIZERS = {
    "torch": (_torch_sparse_adam, "torch.optim.SparseAdam"),
    "fusekit": (_fusekit_sparse_adam, "fusekit.torch.SparseAdam"),
    "fusekit8bit": (_fusekit_sparse_adam8bit, "fusekit.torch.SparseAdam8bit"),
    "fusekit8bit_fp8": (_fusekit_sparse_adam8bit_fp8, "fusekit.torch.SparseAdam8bit fp8"),
}


def state_bytes(opt):
    """Bytes of the tensors in an optimizer's state (a tensor shared by several states, such as
    the 8-bit maps, counted once)."""
    seen, total = set(), 0
    for st in opt.state.values():
        for t in st.values():
            if isinstance(t, torch.Tensor) and id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
    return total


# ---- data ----------------------------------------------------------------------------------
# ZipfIds and World (the planted truth) live in recsys_data.py, shared with
# examples/tensorflow/train_recsys.py.


# ---- model ---------------------------------------------------------------------------------
class TwoTower(nn.Module):
    def __init__(self, users, items, dim, hidden):
        super().__init__()
        self.user = nn.Embedding(users, dim, sparse=True)
        self.item = nn.Embedding(items, dim, sparse=True)
        nn.init.normal_(self.user.weight, std=0.05)
        nn.init.normal_(self.item.weight, std=0.05)
        self.mlp = nn.Sequential(nn.Linear(3 * dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, u, i):
        eu, ei = self.user(u), self.item(i)
        return self.mlp(torch.cat([eu, ei, eu * ei], dim=1)).squeeze(1) + (eu * ei).sum(1)

    def sparse_parameters(self):
        return [self.user.weight, self.item.weight]

    def dense_parameters(self):
        return list(self.mlp.parameters())


def auc(scores, labels):
    """Area under the ROC curve (Mann-Whitney U, ties given the average rank)."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels) > 0.5
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s), dtype=np.float64)
    # average rank (1-based) over each run of equal scores
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    ends = np.r_[starts[1:], len(s)]
    avg = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def log_loss(logits, labels):
    return float(nn.functional.binary_cross_entropy_with_logits(logits, labels))


# ---- one run -------------------------------------------------------------------------------
def train_one(name, args, world, batches, heldout):
    factory, label = SPARSE_OPTIMIZERS[name]
    torch.manual_seed(args.seed)
    users, items = args.rows
    model = TwoTower(users, items, args.dim, args.hidden)
    sparse_opt = factory(model.sparse_parameters(), args.lr)
    dense_opt = torch.optim.Adam(model.dense_parameters(), lr=args.dense_lr)
    losses, t_sparse, t_step = [], [], []
    for u, i, y in batches:
        t0 = time.perf_counter()
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        loss = nn.functional.binary_cross_entropy_with_logits(model(u, i), y)
        loss.backward()
        t1 = time.perf_counter()
        sparse_opt.step()
        t2 = time.perf_counter()
        dense_opt.step()
        t3 = time.perf_counter()
        losses.append(float(loss.detach()))
        t_sparse.append(t2 - t1)
        t_step.append(t3 - t0)
    hu, hi, hy = heldout
    with torch.no_grad():
        scores = torch.cat([model(hu[k:k + 65536], hi[k:k + 65536])
                            for k in range(0, len(hy), 65536)])
    tail = max(1, len(losses) // 10)
    result = {
        "optimizer": name,
        "label": label,
        "final_train_loss": statistics.fmean(losses[-tail:]),  # mean of the last 10% of steps
        "heldout_log_loss": log_loss(scores, hy),
        "heldout_auc": auc(scores.numpy(), hy.numpy()),
        "median_sparse_step_s": statistics.median(t_sparse),
        "median_train_step_s": statistics.median(t_step),
        "first_sparse_step_s": t_sparse[0],
        # the embedding optimizer's state per table row (all rows: the state covers the tables)
        "state_bytes": state_bytes(sparse_opt),
        "state_bytes_per_row": state_bytes(sparse_opt) / sum(p.shape[0]
                                                             for p in model.sparse_parameters()),
        "losses": losses,
    }
    del model, sparse_opt, dense_opt
    return result


def smooth(x, k):
    if k <= 1 or len(x) < k:
        return np.asarray(x)
    c = np.cumsum(np.r_[0.0, x])
    return (c[k:] - c[:-k]) / k


def plot(results, path, args, oracle):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = max(1, args.steps // 30)
    styles = ["-", "--", ":", "-."]
    if len(results) > 1:  # a lower panel: each curve minus the first's, step by step
        fig, (ax, dx) = plt.subplots(2, 1, figsize=(7, 5.6), dpi=110, sharex=True,
                                     gridspec_kw={"height_ratios": [2.2, 1]})
    else:
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
        dx = None
    base = np.asarray(results[0]["losses"])
    for n, r in enumerate(results):
        y = smooth(r["losses"], k)
        x = np.arange(len(y)) + k
        line, = ax.plot(x, y, styles[n % len(styles)], lw=1.6,
                        label=f"{r['label']} (held-out log loss {r['heldout_log_loss']:.5f}, "
                              f"AUC {r['heldout_auc']:.4f})")
        if dx is not None and n > 0:
            dx.plot(np.arange(1, len(base) + 1), np.asarray(r["losses"]) - base, lw=0.9,
                    color=line.get_color(), label=r["label"])
    ax.axhline(oracle, color="grey", lw=0.8, ls=":", label=f"planted truth's log loss {oracle:.3f}")
    if dx is not None:
        dx.axhline(0, color="k", lw=0.6)
        dx.set_xlabel("step")
        dx.set_ylabel("training loss\nminus the first run's", fontsize=9)
        dx.grid(alpha=0.3)
        dx.legend(fontsize=7)
    else:
        ax.set_xlabel("step")
    ax.set_ylabel(f"training log loss (moving mean of {k})")
    users, items = args.rows
    ax.set_title(f"two-tower click model: {users:,} + {items:,} rows x {args.dim}, "
                 f"batch {args.batch}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16384)
    p.add_argument("--rows", default="2000000,1000000",
                   help="user rows,item rows (default 2000000,1000000)")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01, help="embedding (sparse) learning rate")
    p.add_argument("--dense-lr", type=float, default=0.003)
    p.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of the ids")
    p.add_argument("--heldout", type=int, default=200_000)
    p.add_argument("--optimizers", default="torch,fusekit",
                   help="comma list of: " + ", ".join(SPARSE_OPTIMIZERS))
    p.add_argument("--plot", default="docs/recsys_loss.png")
    p.add_argument("--json", default="out/recsys.json")
    p.add_argument("--seed", type=int, default=20261207)
    args = p.parse_args(argv)
    args.rows = tuple(int(r) for r in args.rows.split(","))
    if len(args.rows) != 2:
        p.error("--rows takes two numbers: user rows,item rows")
    args.optimizers = [o.strip() for o in args.optimizers.split(",") if o.strip()]
    unknown = [o for o in args.optimizers if o not in SPARSE_OPTIMIZERS]
    if unknown or not args.optimizers:
        p.error(f"unknown optimizer(s) {unknown}; known: {', '.join(SPARSE_OPTIMIZERS)}")
    return args


def main(argv=None):
    args = parse_args(argv)
    users, items = args.rows
    t0 = time.perf_counter()
    world = World(users, items, rank=8, seed=args.seed, zipf_s=args.zipf)
    rng = np.random.default_rng(args.seed + 1)
    batches = []
    for _ in range(args.steps):
        u, i, y = world.sample(args.batch, rng)
        batches.append((torch.from_numpy(u), torch.from_numpy(i), torch.from_numpy(y)))
    hu, hi, hy = world.sample(args.heldout, np.random.default_rng(args.seed + 2))
    # The log loss of the true click probabilities on the held-out set: the floor to aim at.
    logit = world.logits(hu, hi)
    oracle = log_loss(torch.from_numpy(logit), torch.from_numpy(hy))
    oracle_auc = auc(logit, hy)
    heldout = (torch.from_numpy(hu), torch.from_numpy(hi), torch.from_numpy(hy))
    u0 = torch.cat([b[0] for b in batches])
    touched = len(torch.unique(u0[: args.batch]))
    print(f"data: {args.steps} batches of {args.batch}, {users:,} users x {items:,} items, "
          f"dim {args.dim}; one batch touches {touched:,} distinct users "
          f"({time.perf_counter() - t0:.1f} s to make)")
    print(f"planted truth on the held-out set: log loss {oracle:.4f}, AUC {oracle_auc:.4f}")
    print(f"threads: torch {torch.get_num_threads()}", end="")
    try:
        import fusekit
        print(f", fusekit {fusekit.get_num_threads()}")
    except ImportError:
        print()

    results = []
    for name in args.optimizers:
        t = time.perf_counter()
        r = train_one(name, args, world, batches, heldout)
        r["wall_s"] = time.perf_counter() - t
        results.append(r)
        print(f"{r['label']:>26s}: final train loss {r['final_train_loss']:.4f}, held-out log loss "
              f"{r['heldout_log_loss']:.4f}, AUC {r['heldout_auc']:.4f}; median step: sparse "
              f"optimizer {r['median_sparse_step_s'] * 1e3:.2f} ms, whole train step "
              f"{r['median_train_step_s'] * 1e3:.2f} ms (first sparse step "
              f"{r['first_sparse_step_s'] * 1e3:.0f} ms; {r['wall_s']:.0f} s in all); "
              f"optimizer state {r['state_bytes_per_row']:.2f} bytes per row "
              f"({r['state_bytes'] / 1e6:.1f} MB)")
    if len(results) > 1:
        base = results[0]
        for r in results:
            r["heldout_log_loss_rel_to_first"] = (r["heldout_log_loss"] / base["heldout_log_loss"]
                                                  - 1.0)
        for r in results[1:]:
            print(f"{r['label']} vs {base['label']}: held-out log loss "
                  f"{100 * r['heldout_log_loss_rel_to_first']:+.4f}%, sparse step "
                  f"{base['median_sparse_step_s'] / r['median_sparse_step_s']:.2f}x faster, "
                  f"train step {base['median_train_step_s'] / r['median_train_step_s']:.2f}x; "
                  f"largest loss gap over the run "
                  f"{max(abs(a - b) for a, b in zip(base['losses'], r['losses'])):.2e}")

    if args.plot:
        plot(results, args.plot, args, oracle)
        print(f"plot: {args.plot}")
    if args.json:
        path = pathlib.Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "args": {k: v for k, v in vars(args).items()},
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                        "torch": torch.__version__, "torch_threads": torch.get_num_threads()},
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "planted_truth": {"heldout_log_loss": oracle, "heldout_auc": oracle_auc},
            "results": results,
        }
        path.write_text(json.dumps(doc, indent=1))
        print(f"figures: {args.json}")
    return results


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
