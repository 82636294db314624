"""fusekit under an existing distributed engine: two gloo ranks on loopback train a model with a
sparse EmbeddingBag under DistributedDataParallel (fusekit.torch.SparseAdam) and dense layers with
fusekit.torch.AdamW8bit inside ZeroRedundancyOptimizer (the 8-bit state sharded over the ranks).
Both ranks must end with bitwise identical parameters, equal to float32 rounding to one process
training on the whole batch (tests/python/helpers/distributed_train.py). Again with the FP8 state
format (docs/fp8_state.md): the table on SparseAdam8bit and the dense layers on AdamW8bit, both
state_format="fp8"."""
import os
import pathlib
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

SCRIPT = pathlib.Path(__file__).parent / "helpers" / "distributed_train.py"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("state_format", ["dynamic_map", "fp8"])
def test_two_gloo_ranks_match_one_process(tmp_path, state_format):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2",
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), "rank", str(tmp_path / f"rank{r}.pt"),
                               state_format],
                              env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    single = subprocess.run([sys.executable, str(SCRIPT), "single", str(tmp_path / "single.pt"),
                             state_format],
                            env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                            text=True, timeout=300)
    assert single.returncode == 0, single.stdout + single.stderr
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out

    r0, r1, one = (torch.load(tmp_path / f, weights_only=True)
                   for f in ("rank0.pt", "rank1.pt", "single.pt"))
    for name, w in r0["params"].items():
        # DDP broadcasts nothing after the start: each rank steps its own copy of the table (the
        # sparse gradients are all-reduced) and ZeRO broadcasts each dense shard from its owner.
        # Both must hold the same bits.
        assert torch.equal(w, r1["params"][name]), name
        # The single process sums the same gradients in another order (DDP all-reduces each
        # rank's mean, the single process takes the mean of the whole batch) and its 8-bit codes
        # may round a near-tie the other way: float32 rounding, amplified at most by one code's
        # step over these few steps.
        torch.testing.assert_close(w, one["params"][name], rtol=1e-4, atol=2e-5, msg=name)
    # The 8-bit state is sharded: each rank holds only its shard's, and the two together are the
    # single process's.
    assert 0 < r0["dense_state_bytes"] < one["dense_state_bytes"]
    assert r0["dense_state_bytes"] + r1["dense_state_bytes"] == one["dense_state_bytes"]
    fp8_keys = ["scale1", "scale2", "state1", "state2", "step"]
    if state_format == "fp8":
        assert one["dense_state_keys"] == fp8_keys and one["sparse_state_keys"] == fp8_keys
    else:
        assert "qmap1" in one["dense_state_keys"] and "exp_avg" in one["sparse_state_keys"]
