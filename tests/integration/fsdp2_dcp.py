"""One rank of an FSDP2 run that saves and resumes through torch.distributed.checkpoint: a small
fully_shard-ed MLP on 2 gloo ranks stepped by fusekit.torch.AdamW (DTensor state).

    fsdp2_dcp.py run STEPS OUT          STEPS steps from the start; full parameters to OUT
    fsdp2_dcp.py save STEPS CKPT        STEPS steps, then dcp.save of the model and optimizer
    fsdp2_dcp.py resume STEPS CKPT OUT  dcp.load, STEPS more steps; full parameters to OUT
"""
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (get_state_dict, set_state_dict)
from torch.distributed.fsdp import fully_shard

import fusekit
import fusekit.torch as ft

SEED = 20261203


def batch(step, rank, world):
    g = torch.Generator().manual_seed(SEED + step)
    x = torch.randn(64, 16, generator=g)
    y = (x[:, :4] * 2).tanh()
    per = x.shape[0] // world
    return x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]


def main():
    mode, steps = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    fusekit.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(16, 48), nn.Tanh(), nn.Linear(48, 4))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = ft.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    first = 0
    if mode == "resume":
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=sys.argv[3])
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        first = int(float(next(iter(opt.state.values()))["step"]))
    for s in range(first, first + steps):
        x, y = batch(s, rank, world)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if mode == "save":
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=sys.argv[3])
    else:
        params = {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}
        if rank == 0:
            torch.save(params, sys.argv[4] if mode == "resume" else sys.argv[3])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
