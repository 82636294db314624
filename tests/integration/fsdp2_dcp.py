"""One rank of an FSDP2 run that saves and resumes through torch.distributed.checkpoint: a small
fully_shard-ed MLP on gloo ranks stepped by fusekit.torch.AdamW or AdamW8bit (DTensor state).

    fsdp2_dcp.py OPT run STEPS OUT          STEPS steps from the start; full parameters to OUT
    fsdp2_dcp.py OPT save STEPS CKPT        STEPS steps, then dcp.save of the model and optimizer
                                            (and the full optimizer state to CKPT/full_state.pt)
    fsdp2_dcp.py OPT resume STEPS CKPT OUT  dcp.load, STEPS more steps; full parameters to OUT
    fsdp2_dcp.py OPT reload 0 CKPT OUT      dcp.load (at any world size); the full optimizer state
                                            loaded, or the refusal's message, to OUT

OPT: adamw | adamw8bit | adamw8bit_fp8 | adamw8bit_fp8_ue3m5 (min_8bit_size 256: the weights' and
the 300-bias's state 8-bit, the other biases' float32; adamw8bit_fp8: state_format="fp8",
adamw8bit_fp8_ue3m5: "fp8_ue3m5").
"""
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

import fusekit
import fusekit.torch as ft
from launch import end_rank

SEED = 20261203


def batch(step, rank, world):
    g = torch.Generator().manual_seed(SEED + step)
    x = torch.randn(64, 16, generator=g)
    y = (x[:, :1] * 2).tanh()
    per = x.shape[0] // world
    return x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]


def full_state(opt):
    """{parameter index: {state key: full tensor}} of every DTensor state."""
    out = {}
    for i, st in enumerate(opt.state.values()):
        out[i] = {k: v.full_tensor().clone() for k, v in st.items()
                  if type(v).__name__ == "DTensor"}
    return out


def main():
    which, mode, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    fusekit.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    # Shards of unequal length, and an empty one: the last weight [1, 300] has one row, which
    # rank 0 holds whole (8-bit state, 2 blocks) while rank 1's shard of it is empty.
    model = nn.Sequential(nn.Linear(16, 47), nn.Tanh(), nn.Linear(47, 300), nn.Tanh(),
                          nn.Linear(300, 1))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    if which == "adamw":
        opt = ft.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    else:
        opt = ft.AdamW8bit(model.parameters(), lr=1e-2, weight_decay=0.01, min_8bit_size=256,
                           state_format={"adamw8bit_fp8": "fp8",
                                         "adamw8bit_fp8_ue3m5": "fp8_ue3m5"}.get(which,
                                                                                 "dynamic_map"))
    first = 0
    if mode in ("resume", "reload"):
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        try:
            dcp.load(state, checkpoint_id=sys.argv[4])
            set_state_dict(model, opt, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])
        except BaseException as e:  # noqa: BLE001  (DCP's CheckpointException is a BaseException)
            if mode != "reload":
                raise
            if rank == 0:
                torch.save({"refused": f"{type(e).__name__}: {e}"}, sys.argv[5])
            dist.barrier()
            dist.destroy_process_group()
            end_rank()
        if mode == "reload":
            st = full_state(opt)
            if rank == 0:
                torch.save({"state": st}, sys.argv[5])
            dist.barrier()
            dist.destroy_process_group()
            end_rank()
        first = int(float(next(iter(opt.state.values()))["step"]))
    for s in range(first, first + steps):
        x, y = batch(s, rank, world)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if mode == "save":
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=sys.argv[4])
        st = full_state(opt)
        if rank == 0:
            torch.save(st, f"{sys.argv[4]}/full_state.pt")
    else:
        params = {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}
        if rank == 0:
            torch.save(params, sys.argv[5] if mode == "resume" else sys.argv[4])
    dist.barrier()
    dist.destroy_process_group()
    end_rank()


if __name__ == "__main__":
    main()
