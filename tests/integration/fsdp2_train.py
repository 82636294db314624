"""One rank of FSDP2 runs (torch.distributed.fsdp.fully_shard on 2 gloo ranks, loopback): a small
MLP, each rank half of a fixed batch, 20 steps of each optimizer (torch.optim.AdamW, then
fusekit.torch.AdamW, then fusekit.torch.AdamW8bit with the dynamic-map and with the fp8 state
format), each from the same initial model. Writes, per
optimizer, the losses, the full parameters and what the optimizer's state looks like to a file.

    fsdp2_train.py DTYPE OFFLOAD OUT     DTYPE: float32 | bfloat16 (the parameters'); OFFLOAD: 0 | 1

The hidden widths (95) make shards of unequal length whose last 8-bit block is partial.
"""
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

import fusekit
import fusekit.torch as ft
from launch import end_rank

SEED = 20261202
STEPS = 20
OPTIMIZERS = {
    "torch": lambda ps: torch.optim.AdamW(ps, lr=3e-3, weight_decay=0.01),
    "fusekit": lambda ps: ft.AdamW(ps, lr=3e-3, weight_decay=0.01),
    # min_8bit_size 1024: both large weights 8-bit, the biases and the last layer float32
    "fusekit8bit": lambda ps: ft.AdamW8bit(ps, lr=3e-3, weight_decay=0.01, min_8bit_size=1024),
    "fusekit_fp8": lambda ps: ft.AdamW8bit(ps, lr=3e-3, weight_decay=0.01, min_8bit_size=1024,
                                           state_format="fp8"),
    "fusekit_fp8_ue3m5": lambda ps: ft.AdamW8bit(ps, lr=3e-3, weight_decay=0.01,
                                                 min_8bit_size=1024, state_format="fp8_ue3m5"),
}


def run(which, dtype, offload, rank, world):
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(32, 95), nn.Tanh(), nn.Linear(95, 64), nn.Tanh(),
                          nn.Linear(64, 4)).to(dtype)
    # pin_memory=False: pinning host memory needs a CUDA driver (this runs on CPU-only machines)
    kw = {"offload_policy": CPUOffloadPolicy(pin_memory=False)} if offload else {}
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, **kw)
    fully_shard(model, **kw)
    opt = OPTIMIZERS[which](model.parameters())
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(256, 32, generator=g)
    y = (x @ torch.randn(32, 4, generator=g)).tanh()
    x, y = x.to(dtype), y.to(dtype)
    per = x.shape[0] // world
    xs, ys = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
    ptrs = [p.to_local().untyped_storage().data_ptr() for p in model.parameters()]
    losses = []
    for _ in range(STEPS):
        loss = nn.functional.mse_loss(model(xs).float(), ys.float())
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(float(total) / world)
    params = {k: v.full_tensor().detach().float().clone() for k, v in model.state_dict().items()}
    info = {
        "losses": losses,
        "params": params,
        "storage_kept": ptrs == [p.to_local().untyped_storage().data_ptr()
                                 for p in model.parameters()],
        "param_numel": sum(p.numel() for p in model.parameters()),
    }
    if which != "torch":
        states = list(opt.state.values())
        keys = [k for k in states[0] if k in ("exp_avg", "state1")]
        info["state_is_dtensor"] = all(type(s[k]).__name__ == "DTensor"
                                       for s in states for k in s if k not in ("step", "qmap1",
                                                                              "qmap2"))
        local_numel = sum(s[keys[0]].to_local().numel() for s in states)
        total = torch.tensor(local_numel)
        dist.all_reduce(total)
        info["state_local_numel"] = local_numel  # this rank's (rank 0's in the file)
        info["state_numel_all_ranks"] = int(total)
        info["state_8bit"] = sum(s[keys[0]].dtype == torch.uint8 for s in states)
        info["state_keys"] = sorted({k for s in states for k in s})
    return info


def main():
    dtype = getattr(torch, sys.argv[1])
    offload, out = sys.argv[2] == "1", sys.argv[3]
    torch.set_num_threads(1)
    fusekit.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {which: run(which, dtype, offload, rank, world) for which in OPTIMIZERS}
    if rank == 0:
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()
    end_rank()


if __name__ == "__main__":
    main()
