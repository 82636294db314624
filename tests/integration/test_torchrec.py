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
    the sharder's fused_params with an LR scheduler on model.fused_optimizer."""
    out = tmp_path / "plans.txt"
    ranks(SCRIPT, "plans", out, "tw", "tw:weighted", "rw:weighted", "tw:fused_params,sched",
          world=1)
    done = out.read_text().splitlines()
    assert len(done) == 4, done
    assert all("'fused'" in line for line in done), done


def test_two_ranks_every_plan_against_float64_adam(tmp_path):
    """2 gloo ranks: table-wise, row-wise (hand-written and the planner's: fusekit's sharder makes
    the CPU planner offer it), column-wise, table-row-wise, a mixed plan (column-wise sum,
    row-wise mean, table-wise), weighted and not, the planner's own plan."""
    out = tmp_path / "plans.txt"
    specs = ["tw", "rw", "rw:weighted", "cw:weighted", "twrw", "mixed", "mixed:weighted",
             "planner_rw", "planner", "mixed:fused_params,sched"]
    ranks(SCRIPT, "plans", out, *specs)
    done = out.read_text().splitlines()
    assert [line.split()[0] for line in done] == specs, done
    kinds = {spec: line for spec, line in zip(specs, done)}
    assert "('row_wise', 'fused')" in kinds["planner_rw"]
    assert "('column_wise', 'fused')" in kinds["mixed"] and "('row_wise', 'fused')" in \
        kinds["mixed"] and "('table_wise', 'fused')" in kinds["mixed"]
    assert "('table_row_wise', 'fused')" in kinds["twrw"]


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
            r0, c0 = eval(off)  # a tuple of two ints, written by torchrec_train.py
            parts.setdefault((kind, table), []).append((r0, c0, t))
    out = {}
    for k, ps in parts.items():
        rows = max(r0 + t.shape[0] for r0, _, t in ps)
        cols = max(c0 + t.shape[1] for _, c0, t in ps)
        full = torch.full((rows, cols), float("nan"))
        for r0, c0, t in ps:
            full[r0:r0 + t.shape[0], c0:c0 + t.shape[1]] = t
        assert not full.isnan().any(), k
        out[k] = full
    return out


def test_dcp_resume_bitwise_and_into_row_wise(tmp_path):
    """6 steps table-wise straight, against 3 steps, torch.distributed.checkpoint save (weights
    from model.state_dict(), momentum1 and exp_avg_sq from model.fused_optimizer.state_dict(),
    ShardedTensors), new processes, load, set_optimizer_step(3), 3 more steps: the same bits.
    The same checkpoint loaded into a row-wise plan: the loaded weights and moments equal the
    saved ones bit for bit, and its 3 more steps match the float64 reference."""
    ranks(SCRIPT, "run", tmp_path / "straight", "tw", 6)
    ranks(SCRIPT, "save", tmp_path / "ckpt", "tw", 3)
    ranks(SCRIPT, "resume", tmp_path / "resumed", tmp_path / "ckpt", "tw", 3, 3)
    straight = _load_dumps(tmp_path / "straight")
    resumed = _load_dumps(tmp_path / "resumed")
    for a, b in zip(straight, resumed):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key
    saved = _full(_load_dumps(tmp_path / "ckpt" / "saved"))
    assert {k for k, _ in saved} == {"weight", "momentum1", "exp_avg_sq"}
    ranks(SCRIPT, "resume", tmp_path / "rw", tmp_path / "ckpt", "rw", 3, 3)
    loaded = _full(_load_dumps(tmp_path / "rw.loaded"))
    assert loaded.keys() == saved.keys()
    for key in saved:
        assert torch.equal(loaded[key], saved[key]), key
    # Row-wise really: every rank holds part of each table.
    for d in _load_dumps(tmp_path / "rw.loaded"):
        assert {key.split("|")[1] for key in d} == {"t_sum", "t_mean", "t_big"}
    # And the row-wise run's end against the table-wise run's: the same steps, other shardings
    # (the check against the float64 reference ran in the ranks).
    ended = _full(_load_dumps(tmp_path / "rw"))
    for key, t in _full(straight).items():
        torch.testing.assert_close(ended[key], t, rtol=1e-5, atol=1e-6, msg=str(key))
