"""One rank of an FSDP2 run (torch.distributed.fsdp.fully_shard on 2 gloo ranks, loopback): a
small MLP, each rank half of a fixed batch, 20 steps of an optimizer named on the command line.
Writes the losses, the full parameters and what the optimizer's state looks like to a file.

    fsdp2_train.py OPTIMIZER OFFLOAD OUT     OPTIMIZER: torch | fusekit; OFFLOAD: 0 | 1
"""
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

import fusekit
import fusekit.torch as ft

SEED = 20261202
STEPS = 20


def main():
    which, offload, out = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
    torch.set_num_threads(1)
    fusekit.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(32, 96), nn.Tanh(), nn.Linear(96, 64), nn.Tanh(),
                          nn.Linear(64, 4))
    # pin_memory=False: pinning host memory needs a CUDA driver (this runs on CPU-only machines)
    kw = {"offload_policy": CPUOffloadPolicy(pin_memory=False)} if offload else {}
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, **kw)
    fully_shard(model, **kw)
    cls = ft.AdamW if which == "fusekit" else torch.optim.AdamW
    opt = cls(model.parameters(), lr=3e-3, weight_decay=0.01)
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(256, 32, generator=g)
    y = (x @ torch.randn(32, 4, generator=g)).tanh()
    per = x.shape[0] // world
    xs, ys = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
    ptrs = [p.to_local().untyped_storage().data_ptr() for p in model.parameters()]
    losses = []
    for _ in range(STEPS):
        loss = nn.functional.mse_loss(model(xs), ys)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(float(total) / world)
    params = {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}
    state = next(iter(opt.state.values()))
    info = {
        "losses": losses,
        "params": params,
        "storage_kept": ptrs == [p.to_local().untyped_storage().data_ptr()
                                 for p in model.parameters()],
        "state_is_dtensor": type(state["exp_avg"]).__name__ == "DTensor",
        "state_local_numel": sum(s["exp_avg"].to_local().numel() for s in opt.state.values()),
        "param_numel": sum(p.numel() for p in model.parameters()),
    }
    if rank == 0:
        torch.save(info, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
