"""A DLRM-style click model trained with TorchRec on the CPU, its embedding tables' optimizer chosen
from the routes a TorchRec user has there (docs/torchrec.md):

  fusekit       Adam on the rows of the batch: fusekit's fused embedding-bag backward + lazy Adam,
                through fusekit.torchrec's sharders (what a GPU user writes: apply_optimizer_in_
                backward(torch.optim.Adam, ...), then DistributedModelParallel);
  fusekit8bit   the same with 8-bit optimizer state (fusekit.torch.SparseAdam8bit in backward);
  rowwise_adagrad  FBGEMM's CPU table-batched embedding (TBE) with EXACT_ROWWISE_ADAGRAD, the
                fused optimizer TorchRec offers on the CPU;
  dense_adam    the DENSE compute kernel and torch.optim.Adam: Adam, but on the whole table every
                step (the table's gradient and both moments are dense).

Synthetic click data: 13 dense features and 26 sparse features with Zipf-skewed ids (the hot ids
scattered over each table by a permutation, examples/python/recsys_data.py), bags of 1..max_bag
ids; a planted ground truth (a linear term in the dense features, a bias per id of every feature
and a low-rank interaction between the first two features) gives the labels. The dense part of
the model (DLRM's bottom and top MLPs) always trains with torch.optim.Adam. One process (gloo,
world size 1; TorchRec's sharding runs unchanged, every table on rank 0). Prints the held-out loss
at each evaluation, the median step time (forward + backward + optimizer) per route, and can write
a JSON and a plot.

  python examples/python/train_dlrm_torchrec.py --routes fusekit rowwise_adagrad dense_adam \\
      --rows 100000 --steps 300 --json out.json --plot docs/torchrec_dlrm_loss.png
"""
import argparse
import json
import math
import os
import pathlib
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from recsys_data import ZipfIds  # noqa: E402

ROUTES = ("fusekit", "fusekit8bit", "rowwise_adagrad", "dense_adam")
NUM_DENSE, NUM_SPARSE = 13, 26


class ClickWorld:
    """The planted truth: logit = <w, dense> + sum_f bias_f[id_f] + scale * <u[id_0], z[id_1]>,
    each bag's ids contributing the mean of their terms."""

    def __init__(self, rows: List[int], rank: int, zipf_s: float, max_bag: int, seed: int):
        rng = np.random.default_rng(seed)
        self.rows, self.max_bag = rows, max_bag
        self.ids = [ZipfIds(n, zipf_s, rng) for n in rows]
        self.w = (rng.standard_normal(NUM_DENSE) * 0.3).astype(np.float32)
        self.bias = [(rng.standard_normal(n) * 0.5).astype(np.float32) for n in rows]
        self.u = rng.standard_normal((rows[0], rank)).astype(np.float32)
        self.z = rng.standard_normal((rows[1], rank)).astype(np.float32)
        self.scale = np.float32(1.5 / math.sqrt(rank))

    def sample(self, n: int, rng: np.random.Generator
               ) -> Tuple[np.ndarray, List[np.ndarray], List[np.ndarray], np.ndarray]:
        """n examples: dense [n, 13], per feature its lengths [n] and ids, labels [n]."""
        dense = rng.standard_normal((n, NUM_DENSE)).astype(np.float32)
        logit = dense @ self.w - 0.5
        lengths, values = [], []
        firsts = []
        for f in range(NUM_SPARSE):
            lens = rng.integers(1, self.max_bag + 1, n)
            ids = self.ids[f].draw(int(lens.sum()), rng)
            bag = np.repeat(np.arange(n), lens)
            logit += np.bincount(bag, self.bias[f][ids], minlength=n) / lens
            starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
            firsts.append(ids[starts])
            lengths.append(lens)
            values.append(ids)
        logit += self.scale * np.einsum("nk,nk->n", self.u[firsts[0]], self.z[firsts[1]])
        y = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        return dense, lengths, values, y


def make_batch(world: ClickWorld, n: int, rng: np.random.Generator) -> Tuple[Any, ...]:
    from torchrec import KeyedJaggedTensor
    dense, lengths, values, y = world.sample(n, rng)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{f}" for f in range(NUM_SPARSE)],
        values=torch.from_numpy(np.concatenate(values).astype(np.int64)),
        lengths=torch.from_numpy(np.concatenate(lengths).astype(np.int64)))
    return torch.from_numpy(dense), kjt, torch.from_numpy(y)


def build(route: str, rows: List[int], dim: int, lr: float, seed: int) -> Tuple[Any, Any]:
    """The DLRM model under DistributedModelParallel and the optimizer of its dense part (and, on
    the dense route, of its tables)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
    from torchrec.distributed.types import ShardingEnv
    from torchrec.models.dlrm import DLRM
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    torch.manual_seed(seed)
    tables = [EmbeddingBagConfig(name=f"t{f}", embedding_dim=dim, num_embeddings=rows[f],
                                 feature_names=[f"f{f}"]) for f in range(NUM_SPARSE)]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    with torch.no_grad():  # the same start for every route: N(0, 1/dim) rows
        g = torch.Generator().manual_seed(seed)
        for t in tables:
            w = ebc.embedding_bags[t.name].weight
            w.copy_(torch.randn(w.shape, generator=g) / math.sqrt(dim))
    model = DLRM(embedding_bag_collection=ebc, dense_in_features=NUM_DENSE,
                 dense_arch_layer_sizes=[64, dim], over_arch_layer_sizes=[64, 32, 1])
    sharders: List[Any]
    plan = None
    if route == "fusekit":
        import fusekit.torchrec
        apply_optimizer_in_backward(torch.optim.Adam, ebc.parameters(), {"lr": lr})
        sharders = list(fusekit.torchrec.sharders())
    elif route == "fusekit8bit":
        import fusekit.torch as ft
        import fusekit.torchrec
        apply_optimizer_in_backward(ft.SparseAdam8bit, ebc.parameters(), {"lr": lr})
        sharders = list(fusekit.torchrec.sharders())
    elif route == "rowwise_adagrad":
        sharders = [EmbeddingBagCollectionSharder(fused_params={
            "optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": lr * 10,
            "eps": 1e-8})]
    elif route == "dense_adam":
        sharder = EmbeddingBagCollectionSharder()
        sharders = [sharder]
        plan = construct_module_sharding_plan(
            ebc, {t.name: table_wise(rank=0, compute_kernel="dense") for t in tables},
            sharder=sharder, local_size=1, world_size=1, device_type="cpu")
    else:
        raise ValueError(f"route {route!r}: one of {ROUTES}")
    from torchrec.distributed.types import ShardingPlan
    dmp = DistributedModelParallel(
        model, env=ShardingEnv.from_process_group(dist.group.WORLD), device=torch.device("cpu"),
        sharders=sharders,
        plan=None if plan is None else ShardingPlan({"sparse_arch.embedding_bag_collection": plan}))
    fused = {id(p) for p in ebc.parameters()} if route != "dense_adam" else set()
    dense_params = [p for n, p in dmp.named_parameters()
                    if p.requires_grad and id(p) not in fused and "embedding_bags" not in n]
    if route == "dense_adam":
        dense_params = [p for p in dmp.parameters() if p.requires_grad]
    return dmp, torch.optim.Adam(dense_params, lr=lr)


def train(route: str, args: argparse.Namespace) -> Dict[str, Any]:
    rows = [max(8, args.rows // (1 + (f % 4))) for f in range(NUM_SPARSE)]
    world = ClickWorld(rows, rank=4, zipf_s=args.zipf, max_bag=args.max_bag, seed=args.seed)
    held = make_batch(world, args.eval_size, np.random.default_rng(args.seed + 1))
    model, opt = build(route, rows, args.dim, args.lr, args.seed)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    rng = np.random.default_rng(args.seed + 2)

    def held_out() -> float:
        with torch.no_grad():
            return float(loss_fn(model(held[0], held[1]).squeeze(-1), held[2]))

    curve: List[Tuple[int, float]] = [(0, held_out())]
    times = []
    for step in range(1, args.steps + 1):
        dense, kjt, y = make_batch(world, args.batch, rng)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(dense, kjt).squeeze(-1), y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        if step % args.eval_every == 0 or step == args.steps:
            curve.append((step, held_out()))
            print(f"[{route}] step {step}: held-out loss {curve[-1][1]:.5f}", flush=True)
    warm = times[min(5, len(times) - 1):]
    out = {"route": route, "curve": curve, "step_ms": 1e3 * float(np.median(warm)),
           "final": curve[-1][1]}
    print(f"[{route}] median step {out['step_ms']:.2f} ms, final held-out loss {out['final']:.5f}",
          flush=True)
    return out


def plot(results: List[Dict[str, Any]], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in results:
        s, loss = zip(*r["curve"])
        ax.plot(s, loss, label=f"{r['route']} ({r['step_ms']:.1f} ms/step)")
    ax.set_xlabel("step")
    ax.set_ylabel("held-out BCE loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--routes", nargs="+", default=list(ROUTES), choices=ROUTES)
    p.add_argument("--rows", type=int, default=100_000, help="rows of the largest table")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--max-bag", type=int, default=3)
    p.add_argument("--zipf", type=float, default=1.05)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-size", type=int, default=8192)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    p.add_argument("--plot")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        dist.init_process_group("gloo", rank=0, world_size=1)
    results = [train(route, args) for route in args.routes]
    print("\nroute             median step ms   final held-out loss")
    for r in results:
        print(f"{r['route']:<17} {r['step_ms']:>14.2f}   {r['final']:.5f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)
    if args.plot:
        try:
            plot(results, args.plot, f"DLRM, 26 tables (largest {args.rows} x {args.dim}), "
                                     f"batch {args.batch}")
        except ImportError as e:  # the torchrec environment has no matplotlib
            print(f"--plot {args.plot}: not drawn ({e}); the --json file has the curves")
    return results


if __name__ == "__main__":
    main()
