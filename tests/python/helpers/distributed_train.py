"""Trains the small model of test_distributed.py, either as one rank of a torch.distributed gloo
group (DistributedDataParallel over the model; fusekit.torch.SparseAdam for the sparse embedding
table; fusekit.torch.AdamW8bit for the dense layers inside ZeroRedundancyOptimizer, so the 8-bit
state is sharded over the ranks), or as one process on the whole batch. Saves the final
parameters (and the optimizer-state bytes this process holds) with torch.save.

  distributed_train.py single OUT [FORMAT]
  distributed_train.py rank OUT [FORMAT]     (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the env)

FORMAT: dynamic_map (the default: the table on fusekit.torch.SparseAdam, float32 state) or fp8
(the table on SparseAdam8bit and the dense layers on AdamW8bit, both with state_format="fp8").
"""
import os
import sys

import torch
import torch.nn as nn

import fusekit
import fusekit.torch as ft

SEED = 20261201
ROWS, DIM, HIDDEN = 5000, 16, 256
BATCH, BAG, STEPS = 64, 4, 8  # BATCH: the whole batch of a step, split evenly over the ranks


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.EmbeddingBag(ROWS, DIM, mode="sum", sparse=True)
        self.up = nn.Linear(DIM, HIDDEN)  # 4096 weights: 8-bit state (min_8bit_size = 4096)
        self.out = nn.Linear(HIDDEN, 1)  # small: float32 state

    def forward(self, ids):
        return self.out(torch.relu(self.up(self.table(ids)))).squeeze(-1)


def batches():
    g = torch.Generator().manual_seed(SEED + 1)
    for _ in range(STEPS):
        ids = torch.randint(0, ROWS, (BATCH, BAG), generator=g)
        ids[:, 1] = ids[:, 0]  # duplicates inside a bag
        ids[: BATCH // 4, 2] = 7  # a row many samples share
        yield ids, torch.randn(BATCH, generator=g)


def optimizers(model, dense_wrapper=None, state_format="dynamic_map"):
    if state_format == "fp8":
        sparse = ft.SparseAdam8bit(list(model.table.parameters()), lr=0.01, state_format="fp8")
    else:
        sparse = ft.SparseAdam(list(model.table.parameters()), lr=0.01)
    dense_params = list(model.up.parameters()) + list(model.out.parameters())
    kw = dict(lr=1e-3, weight_decay=0.01, state_format=state_format)
    if dense_wrapper is None:
        dense = ft.AdamW8bit(dense_params, **kw)
    else:
        dense = dense_wrapper(dense_params, optimizer_class=ft.AdamW8bit, **kw)
    return sparse, dense


def state_bytes(opt):
    inner = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer keeps its shard's optimizer here
    return sum(t.numel() * t.element_size() for s in inner.state.values() for t in s.values()
               if torch.is_tensor(t))


def train_step(model, sparse, dense, ids, y):
    loss = nn.functional.mse_loss(model(ids), y)
    sparse.zero_grad()
    dense.zero_grad()
    loss.backward()
    sparse.step()
    dense.step()


def save(model, dense, out, sparse):
    inner = getattr(dense, "optim", dense)
    torch.save({"params": {k: v.detach().clone() for k, v in model.state_dict().items()},
                "dense_state_bytes": state_bytes(dense),
                "dense_state_keys": sorted({k for s in inner.state.values() for k in s}),
                "sparse_state_keys": sorted({k for s in sparse.state.values() for k in s})}, out)


def main():
    mode, out = sys.argv[1], sys.argv[2]
    state_format = sys.argv[3] if len(sys.argv) > 3 else "dynamic_map"
    torch.set_num_threads(1)
    fusekit.set_num_threads(1)
    torch.manual_seed(SEED)
    model = Model()
    if mode == "single":
        sparse, dense = optimizers(model, state_format=state_format)
        for ids, y in batches():
            train_step(model, sparse, dense, ids, y)
        save(model, dense, out, sparse)
        return

    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = DDP(model)
    sparse, dense = optimizers(model, ZeroRedundancyOptimizer, state_format)
    per = BATCH // world
    for ids, y in batches():
        sl = slice(rank * per, (rank + 1) * per)
        train_step(ddp, sparse, dense, ids[sl], y[sl])  # DDP averages the ranks' gradients
    save(model, dense, out, sparse)
    dist.barrier()
    dist.destroy_process_group()
    # Exit without finalizing the interpreter: gloo's worker thread (torch 2.15) may still be
    # releasing the barrier's work object, whose tensors hold Python references, and a GIL acquire
    # during finalization aborts the process (tests/integration/launch.py, end_rank).
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
