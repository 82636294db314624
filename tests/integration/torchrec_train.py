"""One gloo rank of tests/integration/test_torchrec.py: TorchRec's DistributedModelParallel on CPU
with fusekit's sharders (fusekit.torchrec), checked against an independent float64 lazy Adam
written here (FBGEMM's TBE Adam: one iteration counter per table group, bias correction
1 - beta**t, eps added to sqrt(v_hat)).

  torchrec_train.py plans OUT PLAN[:weighted] ...   every plan trained and checked in turn
  torchrec_train.py run OUT PLAN STEPS              train, dump the local shards to OUT.<rank>
  torchrec_train.py save CKPT PLAN STEPS            train, torch.distributed.checkpoint save
  torchrec_train.py resume OUT CKPT PLAN STEPS0 STEPS
                                                    a fresh model in PLAN, DCP load,
                                                    set_optimizer_step(STEPS0), dump the loaded
                                                    state to OUT.loaded.<rank>, train STEPS more,
                                                    check against the reference, dump
  (PLAN: a plan name, or "PLAN@dynamic_map" / "PLAN@fp8": fusekit.torch.SparseAdam8bit in
  backward, 8-bit state)
  torchrec_train.py refuse                          the refusals (world size 1)

Batches come from recorded seeds: every rank draws every rank's batch, so each rank computes the
whole reference and checks its own shards. The loss is sum_k <pooled_k, G_k> with G random, so
the gradient of the pooled output is G (TorchRec divides it by the world size on its way back).
"""
import math
import os
import sys
import traceback

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from fbgemm_gpu.split_embedding_configs import EmbOptimType
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    row_wise,
    table_row_wise,
    table_wise,
)
from torchrec.distributed.types import ShardingPlan
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

import fusekit.torchrec as ftr
from launch import end_rank

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
B = 6          # bags per feature per rank
LR = 0.02
BETAS = (0.85, 0.995)  # not the defaults: they must reach the kernel
EPS = 1e-2  # large enough that where eps is added shows
UNTOUCHED = 5  # the last rows of every table: never looked up

# (name, rows, dim, pooling, features)
TABLES = [
    ("t_sum", 50, 8, "sum", ["f_sum", "f_sum2"]),   # a table two features look up
    ("t_mean", 40, 8, "mean", ["f_mean"]),
    ("t_big", 64, 16, "sum", ["f_big"]),
]
FEATURES = [(f, t) for t, _, _, _, fs in TABLES for f in fs]
TABLE = {t[0]: t for t in TABLES}


def plan_of(name, model, kernel=None):
    """The hand-written plans (construct_module_sharding_plan) and the planner's. ``kernel``:
    the compute kernel to name (TorchRec picks "fused" by itself only for tables with an
    optimizer in backward)."""
    ranks = list(range(WORLD))
    last = WORLD - 1
    k = dict(compute_kernel=kernel)
    per = {
        "tw": {"t_sum": table_wise(rank=0, **k), "t_mean": table_wise(rank=last, **k),
               "t_big": table_wise(rank=last, **k)},
        "rw": {t: row_wise(**k) for t in TABLE},
        "cw": {t: column_wise(ranks=ranks, **k) for t in TABLE},
        "twrw": {t: table_row_wise(host_index=0) for t in TABLE},
        "mixed": {"t_sum": column_wise(ranks=ranks, **k), "t_mean": row_wise(**k),
                  "t_big": table_wise(rank=0, **k)},
    }
    sharder = ftr.FusekitEmbeddingBagCollectionSharder()
    if name in ("planner_rw", "planner_twcw"):  # the planner, constrained to one type
        from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
        from torchrec.distributed.planner.types import ParameterConstraints
        kind = {"planner_rw": "row_wise", "planner_twcw": "table_column_wise"}[name]
        planner = EmbeddingShardingPlanner(
            topology=Topology(world_size=WORLD, compute_device="cpu"),
            constraints={t: ParameterConstraints(sharding_types=[kind]) for t in TABLE})
        plan = planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
        for t in TABLE:
            assert plan.plan["ebc"][t].sharding_type == kind, plan
            assert plan.plan["ebc"][t].compute_kernel == "fused", plan
        return plan
    if name == "planner":
        from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
        planner = EmbeddingShardingPlanner(topology=Topology(world_size=WORLD,
                                                             compute_device="cpu"))
        return planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
    mp = construct_module_sharding_plan(model.ebc, per_param_sharding=per[name], local_size=WORLD,
                                        world_size=WORLD, device_type="cpu", sharder=sharder)
    return ShardingPlan({"ebc": mp})


class Model(nn.Module):
    def __init__(self, weighted, device="meta"):
        super().__init__()
        self.ebc = torchrec.EmbeddingBagCollection(
            tables=[torchrec.EmbeddingBagConfig(
                name=n, embedding_dim=d, num_embeddings=r, feature_names=fs,
                pooling=torchrec.PoolingType.MEAN if p == "mean" else torchrec.PoolingType.SUM)
                for n, r, d, p, fs in TABLES],
            is_weighted=weighted, device=torch.device(device))

    def forward(self, kjt):
        return self.ebc(kjt)


def initial_tables(seed):
    g = np.random.RandomState(seed)
    return {n: g.uniform(-0.5, 0.5, size=(r, d)).astype(np.float32) for n, r, d, _, _ in TABLES}


def batch(seed, step, rank, weighted):
    """Rank `rank`'s batch at `step`: per feature, B bags of 0-4 ids (skewed towards low rows,
    never the last UNTOUCHED rows), weights in [0.25, 1.75], and G [B, dim]."""
    g = np.random.RandomState([seed, step, rank])
    out = {}
    for f, t in FEATURES:
        _, rows, d, _, _ = TABLE[t]
        lengths = g.randint(0, 5, size=B)
        n = int(lengths.sum())
        ids = np.floor((rows - UNTOUCHED) * g.uniform(0, 1, size=n) ** 2).astype(np.int64)
        w = g.uniform(0.25, 1.75, size=n).astype(np.float32) if weighted else None
        G = g.normal(size=(B, d)).astype(np.float32)
        out[f] = (lengths, ids, w, G)
    return out


def kjt_of(b, weighted):
    keys = [f for f, _ in FEATURES]
    lengths = torch.from_numpy(np.concatenate([b[f][0] for f in keys]))
    values = torch.from_numpy(np.concatenate([b[f][1] for f in keys]))
    weights = torch.from_numpy(np.concatenate([b[f][2] for f in keys])) if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths,
                                               weights=weights)


class Reference:
    """float64 lazy Adam with FBGEMM TBE's arithmetic on the whole tables."""

    def __init__(self, tables, row_wise_tables=()):
        # TorchRec divides a row-wise (or table-row-wise) mean table's weighted bag by the sum of
        # its weights (its mean pooling callback); FBGEMM's TBE, which pools the other shardings'
        # mean tables, by the number of lookups.
        self.row_wise_tables = set(row_wise_tables)
        self.w = {n: tables[n].astype(np.float64) for n in tables}
        self.m = {n: np.zeros_like(self.w[n]) for n in tables}
        self.v = {n: np.zeros_like(self.w[n]) for n in tables}
        self.touched = {n: np.zeros(self.w[n].shape[0], bool) for n in tables}
        self.t = 0

    def step(self, batches, lr, weighted):
        self.t += 1
        t = self.t
        grads = {n: np.zeros_like(self.w[n]) for n in self.w}
        rows = {n: set() for n in self.w}
        for b in batches:  # every rank's batch
            for f, tab in FEATURES:
                lengths, ids, w, G = b[f]
                mean = TABLE[tab][3] == "mean"
                pos = 0
                for bag, n in enumerate(lengths):
                    div = 1.0
                    if mean:
                        div = float(n)
                        if w is not None and tab in self.row_wise_tables:
                            div = float(np.sum(w[pos:pos + n], dtype=np.float64))
                    for i in range(pos, pos + n):
                        c = (1.0 if w is None else float(w[i])) / div
                        grads[tab][ids[i]] += G[bag].astype(np.float64) * c / WORLD
                        rows[tab].add(int(ids[i]))
                    pos += n
        b1, b2 = BETAS
        for n in self.w:
            r = np.array(sorted(rows[n]), dtype=np.int64)
            if r.size == 0:
                continue
            g = grads[n][r]
            self.m[n][r] = b1 * self.m[n][r] + (1 - b1) * g
            self.v[n][r] = b2 * self.v[n][r] + (1 - b2) * g * g
            m_hat = self.m[n][r] / (1 - b1 ** t)
            v_hat = self.v[n][r] / (1 - b2 ** t)
            self.w[n][r] -= lr * m_hat / (np.sqrt(v_hat) + EPS)
            self.touched[n][r] = True


def build(plan_name, weighted, init_seed, via="in_backward"):
    # fusekit.torch.SparseAdam8bit takes CPU parameters only (not meta ones)
    model = Model(weighted, "cpu" if via in ("dynamic_map", "fp8", "sparse_adam") else "meta")
    if via == "in_backward":
        apply_optimizer_in_backward(torch.optim.Adam, model.ebc.parameters(),
                                    {"lr": LR, "betas": BETAS, "eps": EPS})
        sharders = ftr.sharders()
    elif via in ("dynamic_map", "fp8"):  # 8-bit state: fusekit's own optimizer in backward
        import fusekit.torch
        apply_optimizer_in_backward(fusekit.torch.SparseAdam8bit, model.ebc.parameters(),
                                    {"lr": LR, "betas": BETAS, "eps": EPS, "state_format": via})
        sharders = ftr.sharders()
    elif via == "sparse_adam":  # fusekit's float32 SparseAdam in backward: TBE Adam too
        import fusekit.torch
        apply_optimizer_in_backward(fusekit.torch.SparseAdam, model.ebc.parameters(),
                                    {"lr": LR, "betas": BETAS, "eps": EPS})
        sharders = ftr.sharders()
    elif via == "sharder_fp8":  # 8-bit state for every table: the sharder's option
        apply_optimizer_in_backward(torch.optim.Adam, model.ebc.parameters(),
                                    {"lr": LR, "betas": BETAS, "eps": EPS})
        sharders = ftr.sharders(state_format="fp8")
    else:  # the sharder's fused_params
        sharders = ftr.sharders(fused_params={"optimizer": EmbOptimType.ADAM, "learning_rate": LR,
                                              "beta1": BETAS[0], "beta2": BETAS[1], "eps": EPS})
    plan = plan_of(plan_name, model, "fused" if via == "fused_params" else None)
    dmp = DistributedModelParallel(module=model, device=torch.device("cpu"), plan=plan,
                                   sharders=sharders)
    if init_seed is not None:
        full = initial_tables(init_seed)
        missing, _ = dmp.load_state_dict(
            {f"ebc.embedding_bags.{n}.weight": torch.from_numpy(full[n]) for n in full},
            strict=False)
    return dmp


def row_wise_tables(dmp):
    return {t for t, ps in dmp.plan.plan["ebc"].items()
            if ps.sharding_type in ("row_wise", "table_row_wise")}


STATE_NAMES = {
    None: ["exp_avg_sq", "momentum1"],
    "dynamic_map": ["exp_avg_absmax", "exp_avg_sq", "exp_avg_sq_absmax", "momentum1"],
    "fp8": ["exp_avg_scale", "exp_avg_sq", "exp_avg_sq_scale", "momentum1"],
}


def local_shards(dmp, state_format=None):
    """{(kind, table, offsets): tensor}: this rank's shards of the weights and the Adam state."""
    out = {}
    for key, st in dmp.state_dict().items():
        table = key.split(".")[-2]
        for s in st.local_shards():
            out[("weight", table, tuple(s.metadata.shard_offsets))] = s.tensor
    osd = dmp.fused_optimizer.state_dict()
    for pkey, states in osd["state"].items():
        table = pkey.split(".")[-2]
        assert pkey == f"ebc.embedding_bags.{table}.weight", pkey
        # the names TorchRec gives FBGEMM's TBE Adam state
        want = [f"{table}.{n}" for n in STATE_NAMES[state_format]]
        assert sorted(states) == want, states.keys()
        for skey, st in states.items():
            table, kind = skey.split(".")
            assert type(st).__name__ in ("ShardedTensor", "DTensor"), (skey, type(st))
            for s in st.local_shards():
                out[(kind, table, tuple(s.metadata.shard_offsets))] = s.tensor
    return out


def train(dmp, steps, seed, weighted, ref=None, first_step=0, sched=None):
    losses = []
    for s in range(first_step, first_step + steps):
        batches = [batch(seed, s, r, weighted) for r in range(WORLD)]
        mine = batches[RANK]
        out = dmp(kjt_of(mine, weighted)).to_dict()
        loss = sum((out[f] * torch.from_numpy(mine[f][3])).sum() for f, _ in FEATURES)
        loss.backward()
        losses.append(float(loss.detach()))
        lr = dmp.fused_optimizer.param_groups[0]["lr"]
        if ref is not None:
            ref.step(batches, lr, weighted)
        if sched is not None:
            sched.step()
    return losses


def check(dmp, ref, init, what, state_format=None):
    """This rank's shards against the reference; untouched rows bit for bit their start. With
    8-bit state the weights are checked against the float32-state reference within what 8-bit
    moments allow (the largest and the mean difference), the state for its zeros."""
    shards = local_shards(dmp, state_format)
    for (kind, table, off), t in shards.items():
        # A per-row state (8-bit absmax) of a column-wise table: TorchRec stacks the column
        # shards' rows (shard i at rows i * R ..), each shard with its own values.
        r0, c0 = off if len(off) == 2 else (off[0] % TABLE[table][1], 0)
        rr = t.shape[0]
        cc = t.shape[1] if t.dim() == 2 else 1
        untouched = ~ref.touched[table][r0:r0 + rr]  # the last rows of a table always are
        if kind == "weight" or state_format is None:
            want = {"weight": ref.w, "momentum1": ref.m, "exp_avg_sq": ref.v}[kind][table]
            want = torch.from_numpy(want[r0:r0 + rr, c0:c0 + cc])
            if state_format is None:
                torch.testing.assert_close(
                    t.double(), want, rtol=2e-5, atol=2e-6,
                    msg=lambda m: f"{what}: {kind} of {table} at {off}: {m}")
            else:  # within a small part of how far the reference moved the rows
                diff = (t.double() - want).abs()
                moved = (want - torch.from_numpy(init[table][r0:r0 + rr, c0:c0 + cc])).abs()
                print(f"{what}: 8-bit {table} {off}: |diff| mean {float(diff.mean()):.2e} max "
                      f"{float(diff.max()):.2e}; |move| mean {float(moved.mean()):.2e} max "
                      f"{float(moved.max()):.2e}")
                assert diff.mean() < 0.03 * moved.mean() and diff.max() < 0.1 * moved.max(), \
                    (what, table, off, diff.max(), diff.mean(), moved.max(), moved.mean())
        start = init[table][r0:r0 + rr, c0:c0 + cc] if kind == "weight" else \
            np.zeros((rr, cc), np.float32)
        if t.dim() == 1:
            start = start[:, 0]
        elif kind != "weight" and state_format is not None:
            assert t.dtype == torch.uint8, (kind, t.dtype)
            start = start.astype(np.uint8)
        assert torch.equal(t[torch.from_numpy(untouched)],
                           torch.from_numpy(start[untouched])), (what, kind, table, off)
        if kind != "weight" and state_format is not None and t.dim() == 1:
            assert (t[torch.from_numpy(~untouched)] > 0).all(), (what, kind, table)
    return shards


def run_plans(out, specs):
    done = []
    for spec in specs:
        name, _, opts = spec.partition(":")
        weighted = "weighted" in opts
        via = "in_backward"
        for v in ("fused_params", "dynamic_map", "sharder_fp8", "fp8", "sparse_adam"):
            if v in opts.split(","):
                via = v
                break
        state_format = {"dynamic_map": "dynamic_map", "fp8": "fp8",
                        "sharder_fp8": "fp8"}.get(via)
        seed = 7 + len(done)
        dmp = build(name, weighted, seed, via)
        init = initial_tables(seed)
        ref = Reference(init, row_wise_tables(dmp))
        sched = None
        if "sched" in opts:
            sched = torch.optim.lr_scheduler.StepLR(dmp.fused_optimizer, step_size=1, gamma=0.7)
        train(dmp, 4, seed, weighted, ref, sched=sched)
        check(dmp, ref, init, spec, state_format)
        kinds = sorted({(ps.sharding_type, ps.compute_kernel)
                        for ps in dmp.plan.plan["ebc"].values()})
        done.append(f"{spec} {kinds}")
    if RANK == 0:
        with open(out, "w") as f:
            f.write("\n".join(done) + "\n")


def plan_and_via(arg):
    """"tw" or "tw@fp8": the plan, how the optimizer is given, the state format."""
    plan, _, via = arg.partition("@")
    via = via or "in_backward"
    return plan, via, {"dynamic_map": "dynamic_map", "fp8": "fp8", "sharder_fp8": "fp8"}.get(via)


def dump(path, shards):
    torch.save({"|".join(map(str, k)): v.clone() for k, v in shards.items()}, f"{path}.{RANK}")


def main():
    dist.init_process_group("gloo")
    mode = sys.argv[1]
    seed = 11
    if mode == "plans":
        run_plans(sys.argv[2], sys.argv[3:])
    elif mode == "run":
        out, plan, steps = sys.argv[2], sys.argv[3], int(sys.argv[4])
        plan, via, fmt = plan_and_via(plan)
        dmp = build(plan, False, seed, via)
        ref = Reference(initial_tables(seed))
        train(dmp, steps, seed, False, ref)
        dump(out, check(dmp, ref, initial_tables(seed), f"run {plan}", fmt))
    elif mode == "save":
        ckpt, plan, steps = sys.argv[2], sys.argv[3], int(sys.argv[4])
        plan, via, fmt = plan_and_via(plan)
        dmp = build(plan, False, seed, via)
        train(dmp, steps, seed, False)
        import torch.distributed.checkpoint as dcp
        dcp.save({"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()},
                 checkpoint_id=ckpt)
        dump(os.path.join(ckpt, "saved"), local_shards(dmp, fmt))
    elif mode == "resume":
        out, ckpt, plan, steps0, steps = (sys.argv[2], sys.argv[3], sys.argv[4],
                                          int(sys.argv[5]), int(sys.argv[6]))
        plan, via, fmt = plan_and_via(plan)
        dmp = build(plan, False, 999, via)  # another start: all must come from the checkpoint
        import torch.distributed.checkpoint as dcp
        state = {"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}
        dcp.load(state, checkpoint_id=ckpt)
        dmp.load_state_dict(state["model"])
        dmp.fused_optimizer.load_state_dict(state["optim"])
        dmp.fused_optimizer.set_optimizer_step(steps0)
        dump(out + ".loaded", local_shards(dmp, fmt))
        # The reference: the uninterrupted run from the same start.
        ref = Reference(initial_tables(seed))
        for s in range(steps0):
            ref.step([batch(seed, s, r, False) for r in range(WORLD)], LR, False)
        train(dmp, steps, seed, False, ref, first_step=steps0)
        dump(out, check(dmp, ref, initial_tables(seed), f"resume into {plan}", fmt))
    elif mode == "refuse":
        refusals()
    else:
        raise SystemExit(f"unknown mode {mode}")
    dist.barrier()
    dist.destroy_process_group()


def refusals():
    """World size 1: an id out of range, an optimizer the kernel does not have."""
    seed = 3
    dmp = build("tw", False, seed)
    before = {k: v.clone() for k, v in local_shards(dmp).items()}
    b = batch(seed, 0, 0, False)
    lengths, ids, w, G = b["f_mean"]
    ids = ids.copy()
    ids[-1] = 40  # t_mean has 40 rows
    b["f_mean"] = (lengths, ids, w, G)
    try:
        out = dmp(kjt_of(b, False)).to_dict()
        sum(v.sum() for v in out.values()).backward()
    except Exception as e:  # noqa: BLE001
        msg = str(e)
        assert "out of range [0, 40)" in msg and "t_mean" in msg and "nothing was modified" in \
            msg, msg
    else:
        raise AssertionError("an id out of range was not refused")
    after = local_shards(dmp)
    for k, v in before.items():
        assert torch.equal(v, after[k]), k
    # An optimizer the kernel does not have: named, with what is supported.
    for opt in (torch.optim.Adagrad, torch.optim.SGD):
        model = Model(False)
        apply_optimizer_in_backward(opt, model.ebc.parameters(), {"lr": 0.1})
        try:
            DistributedModelParallel(module=model, device=torch.device("cpu"),
                                     plan=plan_of("tw", model), sharders=ftr.sharders())
        except ValueError as e:
            msg = str(e)
            assert "not supported" in msg and "EmbOptimType.ADAM" in msg, msg
        else:
            raise AssertionError(f"{opt.__name__} was not refused")
    # weight_decay: refused by name.
    model = Model(False)
    apply_optimizer_in_backward(torch.optim.Adam, model.ebc.parameters(),
                                {"lr": 0.1, "weight_decay": 0.1})
    try:
        DistributedModelParallel(module=model, device=torch.device("cpu"),
                                 plan=plan_of("tw", model), sharders=ftr.sharders())
    except ValueError as e:
        assert "weight_decay" in str(e), e
    else:
        raise AssertionError("weight_decay was not refused")


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    end_rank()
