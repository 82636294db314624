"""fusekit.torch.AdamW under PyTorch FSDP2 (fully_shard), 2 gloo ranks on loopback, with and
without CPUOffloadPolicy, against torch.optim.AdamW in the same setting (the peer a user
replaces): the losses of 20 steps within 1% of torch's, torch's run must learn, the parameters
close to float32 rounding, the state sharded as DTensors (each rank holds half of it), and the
parameters' storage never replaced (tests/integration/fsdp2_train.py); and a save through
torch.distributed.checkpoint, restart and resume equal bit for bit to the uninterrupted run
(tests/integration/fsdp2_dcp.py)."""
import os
import pathlib
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

SCRIPT = pathlib.Path(__file__).parent / "fsdp2_train.py"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranks(script, *args):
    """Runs `script args` as 2 gloo ranks on loopback; each must exit 0."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2",
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), *map(str, args)],
                              env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    for p in procs:
        text, _ = p.communicate(timeout=300)
        assert p.returncode == 0, text


def run(which, offload, out):
    ranks(SCRIPT, which, int(offload), out)
    return torch.load(out, weights_only=True)


@pytest.mark.parametrize("offload", [False, True], ids=["no_offload", "cpu_offload"])
def test_fsdp2_adamw_matches_torch(tmp_path, offload):
    ours = run("fusekit", offload, tmp_path / "fusekit.pt")
    theirs = run("torch", offload, tmp_path / "torch.pt")
    lt, lo = theirs["losses"], ours["losses"]
    assert lt[-1] < 0.8 * lt[0], lt  # the yardstick learns
    for a, b in zip(lo, lt):
        assert abs(a - b) <= 0.01 * abs(b), (lo, lt)
    for name, w in ours["params"].items():
        torch.testing.assert_close(w, theirs["params"][name], rtol=1e-4, atol=1e-5, msg=name)
    assert ours["state_is_dtensor"] and ours["storage_kept"]
    # Each rank's state is its shard: half the parameters (rows split over 2 ranks).
    assert ours["state_local_numel"] * 2 == ours["param_numel"]


def test_dcp_save_restart_resume_is_bitwise_the_uninterrupted_run(tmp_path):
    """12 steps straight, against 7 steps, torch.distributed.checkpoint save (the optimizer's
    DTensor state: every rank's shard), new processes, load, 5 more steps: the same bits."""
    script = pathlib.Path(__file__).parent / "fsdp2_dcp.py"
    ranks(script, "run", 12, tmp_path / "straight.pt")
    ranks(script, "save", 7, tmp_path / "ckpt")
    ranks(script, "resume", 5, tmp_path / "ckpt", tmp_path / "resumed.pt")
    straight = torch.load(tmp_path / "straight.pt", weights_only=True)
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=True)
    for name, w in straight.items():
        assert torch.equal(w, resumed[name]), name
