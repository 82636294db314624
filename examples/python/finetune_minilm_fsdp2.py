"""Fine-tune all-MiniLM-L6-v2 under PyTorch FSDP2 with the optimizer step offloaded to the CPU:
2 gloo ranks on this machine, every encoder layer and the whole model ``fully_shard``-ed with
``CPUOffloadPolicy``, and four optimizers from the same start on the same batches:
``torch.optim.AdamW`` (torch's default on CPU tensors, foreach; and ``fused=True``),
``fusekit.torch.AdamW`` and ``fusekit.torch.AdamW8bit``.

The task and the model are finetune_minilm.py's (six classes of template sentences, a linear head
on the mean-pooled encoder, dropout off, 22.6M parameters). Each rank takes half of every batch;
the runs advance in lockstep (one step of each optimizer in turn) so that a busy machine slows them
alike. Reported per optimizer: the loss curve (the mean over the ranks), the final loss, held-out
accuracy, the host memory of the optimizer state (every rank's shard: the sum of the local state
tensors' bytes over the ranks), and the medians of the seconds per optimizer step and per train
step (forward, backward with FSDP's all-gather and reduce-scatter, step), as rank 0 saw them.
Written to out/minilm_fsdp2.json and docs/minilm_fsdp2.png of the checkout.

    nice python examples/python/finetune_minilm_fsdp2.py    # 150 steps, batch 16 (8 per rank)

Run it with the interpreter of ``scripts/python_env.sh examples``; it starts its two ranks itself
(one thread each), on a free loopback port.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import socket
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import finetune_minilm as single  # noqa: E402  (the task, the model, the plot)

ROOT = single.ROOT


def local_state_bytes(opt) -> int:
    """Bytes of this rank's optimizer state: each DTensor's local shard, each storage once."""
    seen, total = set(), 0
    for s in opt.state.values():
        for v in s.values():
            if not torch.is_tensor(v):
                continue
            t = v.to_local() if hasattr(v, "to_local") else v
            key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            if key not in seen:
                seen.add(key)
                total += key[1]
    return total


def rank_main(args):
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    import fusekit
    import fusekit.torch as ft

    torch.set_num_threads(1)
    fusekit.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    tok, enc, path = single.load_encoder()
    torch.manual_seed(args.seed)
    init_state = {k: v.clone() for k, v in
                  single.Classifier(enc, len(single.CLASSES)).state_dict().items()}

    def sharded_model():
        _, e, _ = single.load_encoder()
        model = single.Classifier(e, len(single.CLASSES))
        model.load_state_dict(init_state)
        model.train()
        policy = CPUOffloadPolicy(pin_memory=False)  # pinning needs a CUDA driver
        for layer in model.encoder.encoder.layer:
            fully_shard(layer, offload_policy=policy)
        fully_shard(model, offload_policy=policy)
        return model

    rng = np.random.default_rng(args.seed)

    def encode(texts, labels):
        b = tok(texts, padding="max_length", truncation=True, max_length=args.seq_len,
                return_tensors="pt")
        return b["input_ids"], b["attention_mask"], torch.tensor(labels)

    per = args.batch // world
    batches = []
    for _ in range(args.steps):
        ids, mask, y = encode(*single.make_sentences(rng, args.batch))
        sl = slice(rank * per, (rank + 1) * per)
        batches.append((ids[sl], mask[sl], y[sl]))
    eval_set = encode(*single.make_sentences(np.random.default_rng(args.seed + 1), 384))

    kw = dict(lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=args.weight_decay)
    optimizers = [
        ("torch.optim.AdamW", lambda ps: torch.optim.AdamW(ps, **kw)),  # foreach: torch's default
        ("torch.optim.AdamW(fused)", lambda ps: torch.optim.AdamW(ps, fused=True, **kw)),
        ("fusekit.torch.AdamW", lambda ps: ft.AdamW(ps, **kw)),
        ("fusekit.torch.AdamW8bit", lambda ps: ft.AdamW8bit(ps, **kw)),
    ]
    runs = []
    for name, make in optimizers:
        model = sharded_model()
        runs.append({"name": name, "model": model, "opt": make(model.parameters()),
                     "losses": [], "opt_s": [], "step_s": []})
    t0 = time.perf_counter()
    for i, (ids, mask, y) in enumerate(batches):
        for r in runs:
            ta = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(r["model"](ids, mask), y)
            r["opt"].zero_grad(set_to_none=True)
            loss.backward()
            tb = time.perf_counter()
            r["opt"].step()
            tc = time.perf_counter()
            total = loss.detach().clone()
            dist.all_reduce(total)
            r["losses"].append(float(total) / world)
            r["opt_s"].append(tc - tb)
            r["step_s"].append(tc - ta)
        if rank == 0 and args.verbose and (i % 25 == 0 or i == len(batches) - 1):
            print(f"  step {i:4d} " + ", ".join(
                f"{r['name']} {r['losses'][-1]:.4f} ({1e3 * r['opt_s'][-1]:.0f} ms)"
                for r in runs), flush=True)
    trained_s = time.perf_counter() - t0

    results = {}
    warm = min(args.warmup, args.steps - 1)
    for r in runs:
        model = r["model"]
        model.eval()
        with torch.no_grad():
            ids, mask, y = eval_set  # every rank the whole held-out set
            logits = model(ids, mask)
            eval_loss = torch.nn.functional.cross_entropy(logits, y).item()
            acc = (logits.argmax(1) == y).float().mean().item()
        sb = torch.tensor(local_state_bytes(r["opt"]))
        dist.all_reduce(sb)
        nparams = sum(p.numel() for p in model.parameters())
        results[r["name"]] = {
            "losses": r["losses"],
            "final_loss": r["losses"][-1],
            "final_loss_mean20": float(np.mean(r["losses"][-20:])),
            "eval_loss": eval_loss,
            "eval_accuracy": acc,
            "params": nparams,
            "state_bytes": int(sb),
            "state_bytes_per_param": int(sb) / nparams,
            "opt_step_s_median": statistics.median(r["opt_s"][warm:]),
            "train_step_s_median": statistics.median(r["step_s"][warm:]),
        }
    if rank == 0:
        ref = np.array(results["torch.optim.AdamW"]["losses"])
        for res in results.values():
            diff = np.abs(np.array(res["losses"]) - ref)
            res["max_rel_loss_diff_vs_torch"] = float(np.max(diff / ref))
            res["median_rel_loss_diff_vs_torch"] = float(np.median(diff / ref))
        out = {
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "machine": {"cpu": _cpu(), "threads": 1, "ranks": world,
                        "platform": platform.platform(), "torch": torch.__version__,
                        "fusekit": fusekit.__version__},
            "config": vars(args) | {"classes": len(single.CLASSES), "model": "all-MiniLM-L6-v2",
                                    "fsdp": "fully_shard per encoder layer and the root, "
                                            "CPUOffloadPolicy(pin_memory=False), gloo"},
            "trained_s": trained_s,
            "results": results,
        }
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    # A gloo rank's exit on torch 2.15: gloo's worker thread may release the last collective's
    # work object (its tensors hold Python references) just after the collective returns, and if
    # the interpreter is being finalized by then the process aborts ("terminate called without an
    # active exception", once in about 210 exits here; PyTorch pull request 179291). Every output is
    # written: leave without finalizing.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


def report(out, plot_path):
    for name, s in out["results"].items():
        print(f"{name:>24}: final loss {s['final_loss']:.4f} (mean of last 20 "
              f"{s['final_loss_mean20']:.4f}), held-out accuracy {s['eval_accuracy']:.3f}, "
              f"state {s['state_bytes'] / 2**20:.1f} MiB over the ranks "
              f"({s['state_bytes_per_param']:.3f} B/param), opt step "
              f"{1e3 * s['opt_step_s_median']:.1f} ms, train step "
              f"{1e3 * s['train_step_s_median']:.1f} ms")
    cfg = out["config"]
    single.plot(out, plot_path, title=(
        f"MiniLM-L6, FSDP2 + CPU offload, {out['machine']['ranks']} gloo ranks, "
        f"batch {cfg['batch']}, lr {cfg['lr']:g}"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch", type=int, default=16, help="over all ranks")
    ap.add_argument("--seq-len", type=int, default=22)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the medians")
    ap.add_argument("--json", default=str(ROOT / "out" / "minilm_fsdp2.json"))
    ap.add_argument("--plot", default=str(ROOT / "docs" / "minilm_fsdp2.png"))
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--plot-only", action="store_true",
                    help="no training: redraw --plot from the figures in --json")
    args = ap.parse_args()
    if "RANK" in os.environ:
        return rank_main(args)
    if not args.plot_only:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   WORLD_SIZE=str(args.ranks), OMP_NUM_THREADS="1")
        print(f"all-MiniLM-L6-v2 under FSDP2 (CPUOffloadPolicy), {args.ranks} gloo ranks; "
              f"{args.steps} steps, batch {args.batch}", flush=True)
        t0 = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, __file__, *sys.argv[1:]],
                                  env=dict(env, RANK=str(r))) for r in range(args.ranks)]
        codes = [p.wait() for p in procs]
        if any(codes):
            sys.exit(f"a rank failed: exit codes {codes}")
        print(f"done in {time.perf_counter() - t0:.0f} s")
    with open(args.json) as f:
        report(json.load(f), args.plot)


if __name__ == "__main__":
    main()
