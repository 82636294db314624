"""fusekit as TorchRec's CPU embedding optimizer (fusekit.torchrec, docs/torchrec.md): TorchRec's
DistributedModelParallel with fusekit's sharders, gloo ranks on loopback, in the TorchRec lane's
environment (requirements/torchrec.txt: torch 2.14.1, fbgemm-gpu-cpu 1.9.0, torchrec 1.9.2).

tests/integration/torchrec_train.py runs the ranks: an EmbeddingBagCollection of three tables
(a sum table looked up by two features, a mean table, a wider sum table; the last rows of each
never looked up), Adam through apply_optimizer_in_backward (or the sharder's fused_params), every
rank's shards checked after 4 steps against a float64 lazy Adam with FBGEMM TBE's arithmetic
written in that script (weights, momentum1, exp_avg_sq), the rows never looked up bit for bit
their start.
"""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from launch import HERE, ranks  # noqa: E402

SCRIPT = HERE / "torchrec_train.py"


def test_import_error_names_what_to_install(tmp_path):
    """Without TorchRec, importing fusekit.torchrec says what to install."""
    import subprocess
    import sys
    blocker = tmp_path / "torchrec.py"
    blocker.write_text("raise ImportError('no torchrec here')\n")
    code = "import fusekit.torchrec"
    env = dict(__import__("os").environ)
    env["PYTHONPATH"] = f"{tmp_path}:{env.get('PYTHONPATH', '')}"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode != 0
    assert "ImportError: fusekit.torchrec needs TorchRec" in r.stderr, r.stderr
    assert "torchrec==1.9.2" in r.stderr and "fbgemm-gpu-cpu" in r.stderr, r.stderr


def test_one_process_plans_against_float64_adam(tmp_path):
    """World size 1: table-wise with and without weights (is_weighted=True), row-wise weighted,
    the sharder's fused_params with an LR scheduler on model.fused_optimizer, 8-bit state
    (fusekit.torch.SparseAdam8bit in backward, both formats), fusekit.torch.SparseAdam in
    backward."""
    out = tmp_path / "plans.txt"
    ranks(SCRIPT, "plans", out, "tw", "tw:weighted", "rw:weighted", "tw:fused_params,sched",
          "tw:dynamic_map", "tw:weighted,fp8", "rw:sparse_adam", world=1)
    done = out.read_text().splitlines()
    assert len(done) == 7, done
    assert all("'fused'" in line for line in done), done


def test_two_ranks_every_plan_against_float64_adam(tmp_path):
    """2 gloo ranks: table-wise, row-wise (hand-written and the planner's: fusekit's sharder makes
    the CPU planner offer it), column-wise, table-row-wise, table-column-wise (the planner's,
    constrained to it), a mixed plan (column-wise sum,
    row-wise mean, table-wise), weighted and not, the planner's own plan; 8-bit state row-wise,
    column-wise (a per-row absmax per column shard) and in the mixed plan (the sharder's
    state_format)."""
    out = tmp_path / "plans.txt"
    specs = ["tw", "rw", "rw:weighted", "cw:weighted", "twrw", "mixed", "mixed:weighted",
             "planner_rw", "planner_twcw:weighted", "planner", "mixed:fused_params,sched",
             "rw:dynamic_map",
             "cw:weighted,fp8", "mixed:weighted,sharder_fp8"]
    ranks(SCRIPT, "plans", out, *specs)
    done = out.read_text().splitlines()
    assert [line.split()[0] for line in done] == specs, done
    kinds = {spec: line for spec, line in zip(specs, done)}
    assert "('row_wise', 'fused')" in kinds["planner_rw"]
    assert "('column_wise', 'fused')" in kinds["mixed"] and "('row_wise', 'fused')" in \
        kinds["mixed"] and "('table_wise', 'fused')" in kinds["mixed"]
    assert "('table_row_wise', 'fused')" in kinds["twrw"]
    assert "('table_column_wise', 'fused')" in kinds["planner_twcw:weighted"]


def test_refusals_modify_nothing():
    """An id out of range: refused by name, every shard unchanged; Adagrad and SGD (which the
    kernel does not run): refused naming EmbOptimType.ADAM; weight_decay: refused."""
    ranks(SCRIPT, "refuse", world=1)


def _load_dumps(prefix, world=2):
    return [torch.load(f"{prefix}.{r}", weights_only=True) for r in range(world)]


def _full(dumps):
    """Whole tables from every rank's shards: {(kind, table): tensor}."""
    parts = {}
    for d in dumps:
        for key, t in d.items():
            kind, table, off = key.split("|")
            offsets = eval(off)  # a tuple of one or two ints, written by torchrec_train.py
            r0, c0 = (offsets[0], 0) if len(offsets) == 1 else offsets
            parts.setdefault((kind, table), []).append((r0, c0, t if t.dim() == 2 else t[:, None]))
    out = {}
    for k, ps in parts.items():
        rows = max(r0 + t.shape[0] for r0, _, t in ps)
        cols = max(c0 + t.shape[1] for _, c0, t in ps)
        full = torch.zeros((rows, cols), dtype=ps[0][2].dtype)
        seen = torch.zeros((rows, cols), dtype=torch.bool)
        for r0, c0, t in ps:
            full[r0:r0 + t.shape[0], c0:c0 + t.shape[1]] = t
            seen[r0:r0 + t.shape[0], c0:c0 + t.shape[1]] = True
        assert seen.all(), k
        out[k] = full
    return out


@pytest.mark.parametrize("state", ["fp32", "dynamic_map", "fp8"])
def test_dcp_resume_bitwise_and_into_row_wise(tmp_path, state):
    """6 steps table-wise straight, against 3 steps, torch.distributed.checkpoint save (weights
    from model.state_dict(), momentum1 and exp_avg_sq from model.fused_optimizer.state_dict(),
    ShardedTensors), new processes, load, set_optimizer_step(3), 3 more steps: the same bits.
    The same checkpoint loaded into a row-wise plan: the loaded weights and moments equal the
    saved ones bit for bit, and its 3 more steps match the float64 reference."""
    tw, rw = ("tw", "rw") if state == "fp32" else (f"tw@{state}", f"rw@{state}")
    ranks(SCRIPT, "run", tmp_path / "straight", tw, 6)
    ranks(SCRIPT, "save", tmp_path / "ckpt", tw, 3)
    ranks(SCRIPT, "resume", tmp_path / "resumed", tmp_path / "ckpt", tw, 3, 3)
    straight = _load_dumps(tmp_path / "straight")
    resumed = _load_dumps(tmp_path / "resumed")
    for a, b in zip(straight, resumed):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key
    saved = _full(_load_dumps(tmp_path / "ckpt" / "saved"))
    extra = {"fp32": set(), "dynamic_map": {"exp_avg_absmax", "exp_avg_sq_absmax"},
             "fp8": {"exp_avg_scale", "exp_avg_sq_scale"}}[state]
    assert {k for k, _ in saved} == {"weight", "momentum1", "exp_avg_sq"} | extra
    ranks(SCRIPT, "resume", tmp_path / "rw", tmp_path / "ckpt", rw, 3, 3)
    loaded = _full(_load_dumps(tmp_path / "rw.loaded"))
    assert loaded.keys() == saved.keys()
    for key in saved:
        assert torch.equal(loaded[key], saved[key]), key
    # Row-wise really: every rank holds part of each table.
    for d in _load_dumps(tmp_path / "rw.loaded"):
        assert {key.split("|")[1] for key in d} == {"t_sum", "t_mean", "t_big"}
    # And the row-wise run's end against the table-wise run's: the same steps, other shardings
    # (the check against the float64 reference ran in the ranks).
    if state == "fp32":
        ended = _full(_load_dumps(tmp_path / "rw"))
        for key, t in _full(straight).items():
            torch.testing.assert_close(ended[key], t, rtol=1e-5, atol=1e-6, msg=str(key))


@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_tbe_forward_and_weight_gradient_against_torch(pooling):
    """FusedAdamTBE alone (what TorchRec calls the kernel's ``emb_module``): two tables, three
    features (the first table looked up by two), weighted bags: the pooled output against
    F.embedding_bag in float64, the gradient of the per-sample weights against autograd's, and
    one step against a float64 Adam (the table shared by two features: one step on the sum of
    both features' gradients)."""
    import numpy as np
    from fusekit.torchrec import FusedAdamTBE

    g = np.random.RandomState(5)
    rows, dims, ftm, bags = [30, 20], [8, 4], [0, 1, 0], 5
    tbe = FusedAdamTBE(rows, dims, ftm, pooling, ["a", "b"], learning_rate=0.05, beta1=0.8,
                       beta2=0.99, eps=1e-3, hugepages=False)
    tables = [torch.from_numpy(g.uniform(-1, 1, size=(r, d)).astype(np.float32))
              for r, d in zip(rows, dims)]
    for w, t in zip(tbe.split_embedding_weights(), tables):
        w.copy_(t)
    lengths = g.randint(0, 4, size=len(ftm) * bags)
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]))
    ids = torch.from_numpy(np.concatenate([g.randint(0, rows[ftm[i // bags]] - 3, size=n)
                                           for i, n in enumerate(lengths)]).astype(np.int64))
    psw = torch.from_numpy(g.uniform(0.5, 1.5, size=ids.numel()).astype(np.float32))
    psw.requires_grad_(True)
    out = tbe(ids, offsets, psw)
    G = torch.from_numpy(g.normal(size=tuple(out.shape)).astype(np.float32))
    # The reference: float64 pooling with the weights, its autograd for the weights' gradient.
    psw64 = psw.detach().double().requires_grad_(True)
    outs, col, grads = [], 0, [torch.zeros(r, d, dtype=torch.float64) for r, d in zip(rows, dims)]
    for f, t in enumerate(ftm):
        lo, hi = int(offsets[f * bags]), int(offsets[(f + 1) * bags])
        off = offsets[f * bags:(f + 1) * bags + 1] - lo
        y = torch.nn.functional.embedding_bag(ids[lo:hi], tables[t].double(), off, mode="sum",
                                              per_sample_weights=psw64[lo:hi],
                                              include_last_offset=True)
        n = (off[1:] - off[:-1]).double()
        scale = 1 / n.clamp(min=1) if pooling == "mean" else torch.ones_like(n)
        outs.append(y * scale[:, None])
        gf = G[:, col:col + dims[t]].double() * scale[:, None]
        for b in range(bags):
            for i in range(int(off[b]), int(off[b + 1])):
                grads[t][ids[lo + i]] += gf[b] * psw64[lo + i].detach()
        col += dims[t]
    ref_out = torch.cat(outs, 1)
    torch.testing.assert_close(out.double().detach(), ref_out, rtol=1e-5, atol=1e-6)
    (ref_out * G.double()).sum().backward()
    (out * G).sum().backward()
    torch.testing.assert_close(psw.grad.double(), psw64.grad, rtol=1e-5, atol=1e-6)
    assert tbe.get_optimizer_step() == 1
    for t in range(2):
        touched = torch.zeros(rows[t], dtype=torch.bool)
        for f, tt in enumerate(ftm):
            if tt == t:
                touched[ids[int(offsets[f * bags]):int(offsets[(f + 1) * bags])]] = True
        gr = grads[t][touched]
        m = 0.2 * gr
        v = 0.01 * gr * gr
        want = tables[t].double().clone()
        want[touched] -= 0.05 * (m / 0.2) / ((v / 0.01).sqrt() + 1e-3)
        got = tbe.split_embedding_weights()[t]
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
        assert torch.equal(got[~touched], tables[t][~touched])
        m_got, v_got = tbe.split_optimizer_states()[t]
        torch.testing.assert_close(m_got[touched].double(), m, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("state_format,guard", [("dynamic_map", True), ("dynamic_map", False),
                                                 ("fp8", True)])
@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_tbe_8bit_steps_against_golden_bitwise(pooling, state_format, guard):
    """FusedAdamTBE with 8-bit state alone: two tables, three features (the first table looked up
    by two), weighted bags, a random 8-bit state to start from, 3 steps, each against the NumPy
    golden golden/embedding_bag_lazy_adam_quant.py (written from the operator's definition) with
    FBGEMM's Adam form (lr_t = lr sqrt(1 - beta2^t) / (1 - beta1^t), eps_t = eps sqrt(1 - beta2^t)):
    the weights, the codes and the per-row scales bit for bit, the rows never looked up included.
    The table two features share gets one step on the sum of both features' gradients (the first
    feature's lookups, then the third's, in order)."""
    import math
    import sys

    import numpy as np
    from fusekit.torchrec import FusedAdamTBE

    sys.path.insert(0, str(HERE.parents[1]))  # golden/
    from golden.apply_adam_w_quant import create_dynamic_map
    from golden.embedding_bag_lazy_adam_quant import (embedding_bag_lazy_adam_quant_golden,
                                                      random_state)

    rng = np.random.default_rng(7)
    rows, dims, ftm, bags = [40, 25], [8, 20], [0, 1, 0], 6
    lr, b1, b2, eps = 0.05, 0.8, 0.99, 1e-3
    tbe = FusedAdamTBE(rows, dims, ftm, pooling, ["a", "b"], learning_rate=lr, beta1=b1,
                       beta2=b2, eps=eps, hugepages=False, state_format=state_format,
                       guard_lost_v=guard)
    fp8 = state_format == "fp8"
    qm, qv = (None, None) if fp8 else (create_dynamic_map(True), create_dynamic_map(False))
    want = []  # per table: [m, v, var, scale_m, scale_v], the golden's
    for t, (r, d) in enumerate(zip(rows, dims)):
        m, v, am, av = random_state(rng, r, d, state_format)
        var = rng.uniform(-1, 1, size=(r, d)).astype(np.float32)
        for x, y in zip([tbe.split_embedding_weights()[t]] + tbe.split_optimizer_states()[t],
                        (var, m, v, am[:, 0], av[:, 0])):
            x.copy_(torch.from_numpy(np.ascontiguousarray(y)))
        want.append([m, v, var, am, av])
    for step in range(1, 4):
        lengths = rng.integers(0, 5, size=len(ftm) * bags)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        ids = np.concatenate([rng.integers(0, rows[ftm[i // bags]] - 3, size=n)
                              for i, n in enumerate(lengths)]).astype(np.int64)
        psw = rng.uniform(0.5, 1.5, size=ids.size).astype(np.float32)
        out = tbe(torch.from_numpy(ids), torch.from_numpy(offsets), torch.from_numpy(psw))
        G = rng.normal(size=tuple(out.shape)).astype(np.float32)
        out.backward(torch.from_numpy(G))
        assert tbe.get_optimizer_step() == step
        lr_t = lr * math.sqrt(1 - b2 ** step) / (1 - b1 ** step)
        eps_t = eps * math.sqrt(1 - b2 ** step)
        for t in range(len(rows)):
            # The table's batch: its features' bags one after the other.
            cols, grads, tids, tw, offs = 0, [], [], [], [0]
            for f, tt in enumerate(ftm):
                lo, hi = offsets[f * bags], offsets[(f + 1) * bags]
                if tt == t:
                    grads.append(G[:, cols:cols + dims[tt]])
                    tids.append(ids[lo:hi])
                    tw.append(psw[lo:hi])
                    offs.extend(offs[-1] + np.cumsum(lengths[f * bags:(f + 1) * bags]))
                cols += dims[tt]
            m, v, var, am, av = want[t]
            m, v, var, am, av, _, _ = embedding_bag_lazy_adam_quant_golden(
                np.ascontiguousarray(np.concatenate(grads)), np.concatenate(tids),
                np.asarray(offs, np.int64), np.concatenate(tw), m, v, var, qm, qv, am, av,
                lr_t, b1, b2, eps_t, mode=pooling, state_format=state_format,
                guard_lost_v=guard)
            want[t] = [m, v, var, am, av]
            got = [tbe.split_optimizer_states()[t][0], tbe.split_optimizer_states()[t][1],
                   tbe.split_embedding_weights()[t], tbe.split_optimizer_states()[t][2],
                   tbe.split_optimizer_states()[t][3]]
            for name, x, y in zip(("m", "v", "var", "scale_m", "scale_v"), got, want[t]):
                x = x.numpy()
                y = y.reshape(x.shape)
                assert np.array_equal(x.view(np.uint8), y.view(np.uint8)), (
                    f"step {step}, table {t}, {name}: {int((x != y).sum())} elements differ")


def test_unsupported_settings_are_refused_by_name():
    from fusekit.torchrec._kernel import adam_hyperparameters
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    with pytest.raises(ValueError, match="no optimizer"):
        adam_hyperparameters({}, ["t"])
    with pytest.raises(ValueError, match="LAMB is not supported.*EmbOptimType.ADAM"):
        adam_hyperparameters({"optimizer": EmbOptimType.LAMB}, ["t"])
    with pytest.raises(ValueError, match="amsgrad"):
        adam_hyperparameters({"optimizer": EmbOptimType.ADAM, "amsgrad": True}, ["t"])
    with pytest.raises(ValueError, match="'max_norm' is not supported"):
        adam_hyperparameters({"optimizer": EmbOptimType.ADAM, "max_norm": 1.0}, ["t"])
    got = adam_hyperparameters({"optimizer": EmbOptimType.ADAM, "learning_rate": 0.5,
                                "betas": (0.7, 0.9), "eps": 0.1, "cache_precision": None}, ["t"])
    assert got == {"learning_rate": 0.5, "beta1": 0.7, "beta2": 0.9, "eps": 0.1}


def test_dlrm_example_every_route(tmp_path):
    """examples/python/train_dlrm_torchrec.py at a tiny size (docs/torchrec.md's DLRM run): every
    route trains (the held-out loss falls), and fusekit's lazy Adam, fp32 and 8-bit, ends near the
    dense Adam route (the same optimizer, lazy): within 0.01 of its held-out loss."""
    import json
    import os
    import subprocess
    import sys
    example = HERE.parents[1] / "examples" / "python" / "train_dlrm_torchrec.py"
    js = tmp_path / "dlrm.json"
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    r = subprocess.run([sys.executable, str(example), "--rows", "3000", "--dim", "8", "--batch",
                        "256", "--steps", "60", "--eval-every", "30", "--eval-size", "2048",
                        "--lr", "3e-3", "--json", str(js)],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    results = {x["route"]: x for x in json.loads(js.read_text())["results"]}
    assert set(results) == {"fusekit", "fusekit8bit", "rowwise_adagrad", "dense_adam"}
    for route, x in results.items():
        start, end = x["curve"][0][1], x["curve"][-1][1]
        assert end < start - 0.005, (route, x["curve"])
        assert x["step_ms"] > 0
    for route in ("fusekit", "fusekit8bit"):
        assert abs(results[route]["final"] - results["dense_adam"]["final"]) < 0.01, results
