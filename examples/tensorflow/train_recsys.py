"""Train a small two-tower click model in Keras 3 with keras.optimizers.Adam, with
fusekit.tensorflow.LazyAdam and with fusekit.tensorflow.LazyAdam8bit (8-bit moments for the
tables): the TensorFlow twin of examples/python/train_recsys.py.

The model: a user table and an item table (keras.layers.Embedding, a few million rows in all) and a
small MLP on [u, i, u * i] plus the dot product <u, i>, one optimizer for everything (LazyAdam is
Adam on the dense weights). The data: synthetic clicks with Zipf-distributed user and item ids (hot
ids scattered over the tables by a fixed permutation) and a planted ground truth (latent user and
item vectors, an item popularity bias), so the loss has something to fall to.

Every optimizer trains the same model from the same start on the same batches, one after the
other (model.train_on_batch, XLA off). Printed per optimizer: the final training loss, held-out
log loss and AUC, the median seconds of a train step, the bytes of optimizer state; a plot of the loss curves (--plot, needs
matplotlib) and the figures as JSON (--json).

    PYTHONPATH=build-tf/python python examples/tensorflow/train_recsys.py      # a few minutes
    PYTHONPATH=build-tf/python python examples/tensorflow/train_recsys.py --steps 50 --rows 200000,100000
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

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import fusekit.tensorflow as ft  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from recsys_data import World  # noqa: E402  (examples/python/recsys_data.py)

OPTIMIZERS = {
    "keras": ("keras.optimizers.Adam", keras.optimizers.Adam),
    "fusekit": ("fusekit.tensorflow.LazyAdam", ft.LazyAdam),
    "fusekit8": ("fusekit.tensorflow.LazyAdam8bit", ft.LazyAdam8bit),
}


def two_tower(users, items, dim, hidden, seed):
    keras.utils.set_random_seed(seed)
    u_in = keras.Input((), dtype="int32", name="user")
    i_in = keras.Input((), dtype="int32", name="item")
    init = keras.initializers.RandomNormal(stddev=0.05)
    eu = keras.layers.Embedding(users, dim, embeddings_initializer=init, name="users")(u_in)
    ei = keras.layers.Embedding(items, dim, embeddings_initializer=init, name="items")(i_in)
    prod = keras.layers.Multiply()([eu, ei])
    h = keras.layers.Dense(hidden, activation="relu")(keras.layers.Concatenate()([eu, ei, prod]))
    mlp = keras.layers.Dense(1)(h)
    dot = keras.ops.sum(prod, axis=1, keepdims=True)
    return keras.Model([u_in, i_in], keras.layers.Add()([mlp, dot]))


def log_loss(logits, labels):
    z = np.asarray(logits, np.float64).reshape(-1)
    return float(np.mean(np.maximum(z, 0) - z * labels + np.log1p(np.exp(-np.abs(z)))))


def auc(scores, labels):
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores), np.float64)
    ranks[order] = np.arange(1, len(scores) + 1)
    pos = labels > 0.5
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def train_one(name, args, batches, heldout):
    label, make = OPTIMIZERS[name]
    users, items = args.rows
    model = two_tower(users, items, args.dim, args.hidden, args.seed)
    model.compile(make(learning_rate=args.lr), keras.losses.BinaryCrossentropy(from_logits=True),
                  jit_compile=False)
    losses, times = [], []
    for u, i, y in batches:
        t0 = time.perf_counter()
        loss = model.train_on_batch([u, i], y[:, None])
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    hu, hi, hy = heldout
    scores = model.predict([hu, hi], batch_size=65536, verbose=0).reshape(-1)
    state = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                for v in model.optimizer.variables)
    result = dict(name=name, label=label, losses=losses,
                  step_s=statistics.median(times[2:]) if len(times) > 2 else times[-1],
                  heldout_log_loss=log_loss(scores, hy), heldout_auc=auc(scores, hy),
                  state_bytes=state)
    print(f"{label}: final loss {np.mean(losses[-10:]):.4f}, held-out log loss "
          f"{result['heldout_log_loss']:.4f}, AUC {result['heldout_auc']:.4f}, "
          f"step {result['step_s'] * 1e3:.1f} ms (median), optimizer state "
          f"{state / 2**20:.1f} MiB", flush=True)
    return result


def plot(results, path, args, oracle):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), dpi=110,
                             gridspec_kw=dict(width_ratios=[2.2, 1]))
    k = max(1, args.steps // 30)
    for n, r in enumerate(results):
        c = np.cumsum(np.r_[0.0, r["losses"]])
        y = (c[k:] - c[:-k]) / k
        axes[0].plot(np.arange(len(y)) + k, y, ["-", "--", ":"][n % 3], lw=1.6,
                     label=f"{r['label']} (held-out AUC {r['heldout_auc']:.4f})")
    axes[0].axhline(oracle, color="grey", lw=0.8, ls=":", label=f"planted truth {oracle:.3f}")
    axes[0].set_xlabel("step")
    axes[0].set_ylabel(f"training log loss (moving mean of {k})")
    axes[0].grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    names = [r["label"].replace("keras.optimizers.", "keras\n").replace("fusekit.tensorflow.",
                                                                         "fusekit\n")
             for r in results]
    bars = axes[1].bar(names, [r["step_s"] * 1e3 for r in results],
                       color=[f"C{n}" for n in range(len(results))])
    axes[1].bar_label(bars, fmt="%.0f ms", fontsize=8)
    axes[1].tick_params(axis="x", labelsize=8)
    axes[1].set_ylabel("train step, median (ms)")
    users, items = args.rows
    fig.suptitle(f"Keras two-tower click model: {users:,} + {items:,} rows x {args.dim}, batch "
                 f"{args.batch}, {platform.machine()}, {len(os.sched_getaffinity(0))} CPUs",
                 fontsize=9)
    fig.tight_layout()
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch", type=int, default=16384)
    p.add_argument("--rows", default="2000000,1000000", help="user rows,item rows")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--zipf", type=float, default=1.0)
    p.add_argument("--heldout", type=int, default=200_000)
    p.add_argument("--optimizers", default="keras,fusekit,fusekit8")
    p.add_argument("--plot", default="")
    p.add_argument("--json", default="")
    p.add_argument("--seed", type=int, default=20261207)
    args = p.parse_args(argv)
    args.rows = tuple(int(r) for r in args.rows.split(","))
    users, items = args.rows
    world = World(users, items, rank=8, seed=args.seed, zipf_s=args.zipf)
    rng = np.random.default_rng(args.seed + 1)
    batches = [world.sample(args.batch, rng, np.int32) for _ in range(args.steps)]
    hu, hi, hy = world.sample(args.heldout, np.random.default_rng(args.seed + 2), np.int32)
    oracle = log_loss(world.logits(hu, hi), hy)
    print(f"data: {args.steps} batches of {args.batch}, {users:,} users x {items:,} items, dim "
          f"{args.dim}; a batch touches {len(np.unique(batches[0][0])):,} distinct users; "
          f"planted truth: held-out log loss {oracle:.4f}", flush=True)
    results = [train_one(name, args, batches, (hu, hi, hy)) for name in args.optimizers.split(",")]
    for r in results[1:]:
        print(f"step time: {results[0]['label']} / {r['label']} = "
              f"{results[0]['step_s'] / r['step_s']:.1f}x")
    if args.plot:
        plot(results, args.plot, args, oracle)
    if args.json:
        pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        report = dict(date=time.strftime("%Y-%m-%d"), tensorflow=tf.__version__,
                      keras=keras.__version__, cpus=len(os.sched_getaffinity(0)),
                      args={k: v for k, v in vars(args).items()}, oracle=oracle, results=results)
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
