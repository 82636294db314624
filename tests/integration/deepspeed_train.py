"""One rank of DeepSpeed ZeRO runs with the optimizer offloaded to the CPU and a client optimizer
(2 gloo ranks on loopback, DeepSpeed's CPU accelerator): a small MLP, each rank half of a fixed
batch. For each optimizer (torch.optim.AdamW, fusekit.torch.AdamW, fusekit.torch.AdamW8bit with the
dynamic-map and the fp8 state format), from
the same initial model: 12 steps, save_checkpoint after step 7, then load_checkpoint and the last
5 steps again. Writes the losses of both passes per optimizer to a file.

    deepspeed_train.py STAGE CKPT_DIR OUT       STAGE: 2 | 3
"""
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import fusekit  # noqa: E402
import fusekit.torch as ft  # noqa: E402
from launch import end_rank  # noqa: E402

SEED = 20261204
STEPS, SAVE_AT = 12, 7
OPTIMIZERS = {
    "torch": lambda ps: torch.optim.AdamW(ps, lr=3e-3, weight_decay=0.01),
    "fusekit": lambda ps: ft.AdamW(ps, lr=3e-3, weight_decay=0.01),
    # DeepSpeed hands the optimizer one flat partition per rank: 8-bit whatever min_8bit_size says
    "fusekit8bit": lambda ps: ft.AdamW8bit(ps, lr=3e-3, weight_decay=0.01),
    "fusekit_fp8": lambda ps: ft.AdamW8bit(ps, lr=3e-3, weight_decay=0.01, state_format="fp8"),
    "fusekit_fp8_ue3m5": lambda ps: ft.AdamW8bit(ps, lr=3e-3, weight_decay=0.01,
                                                 state_format="fp8_ue3m5"),
}


def config(stage, per_rank, world):
    return {
        "train_batch_size": per_rank * world,
        "train_micro_batch_size_per_gpu": per_rank,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,  # DeepSpeed 0.19 clips at 1.0 unless told
        "zero_optimization": {
            "stage": stage,
            # pin_memory: False: pinning needs a CUDA driver
            "offload_optimizer": {"device": "cpu", "pin_memory": False},
        },
        "zero_force_ds_cpu_optimizer": False,  # keep the client optimizer (not DeepSpeedCPUAdam)
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10 ** 9,
    }


def run(which, stage, ckpt, rank, world):
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(32, 95), nn.Tanh(), nn.Linear(95, 64), nn.Tanh(),
                          nn.Linear(64, 4))
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(256, 32, generator=g)
    y = (x @ torch.randn(32, 4, generator=g)).tanh()
    per = x.shape[0] // world
    xs, ys = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
    opt = OPTIMIZERS[which](model.parameters())
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt,
                                           config=config(stage, per, world))

    def step():
        loss = nn.functional.mse_loss(engine(xs), ys)
        engine.backward(loss)
        engine.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        return float(total) / world

    losses = []
    for s in range(STEPS):
        losses.append(step())
        if s + 1 == SAVE_AT:
            engine.save_checkpoint(ckpt, tag=which)
    engine.load_checkpoint(ckpt, tag=which)
    again = [step() for _ in range(STEPS - SAVE_AT)]
    state = next(iter(engine.optimizer.optimizer.state.values())) if which != "torch" else {}
    return {"losses": losses, "again": again,
            "state_dtype": str(state.get("state1", state.get("exp_avg", torch.empty(0))).dtype),
            "state_keys": sorted(state)}


def main():
    stage, ckpt, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    torch.set_num_threads(1)
    fusekit.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {which: run(which, stage, ckpt, rank, world) for which in OPTIMIZERS}
    if rank == 0:
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()
    end_rank()


if __name__ == "__main__":
    main()
