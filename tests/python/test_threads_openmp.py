"""fusekit's chunks on the host process's OpenMP team (FUSEKIT_THREADS_ON_OPENMP=1, libgomp loaded
by torch): the bits equal those of fusekit's own threads and of one thread, for the operators
whose work is split (adam_w, add_lora decode and prefill, lazy_adam). Run in child processes: the
variable is read once per process."""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

CHILD = r"""
import hashlib, json, sys
import torch  # libgomp in the process
import fusekit
torch.manual_seed(7)
out = {}
for threads in (1, 2, 3):
    fusekit.set_num_threads(threads)
    var = torch.randn(300_000); grad = torch.randn(300_000)
    m = torch.randn(300_000) * 0.1; v = torch.rand(300_000) * 0.01
    fusekit.adam_w(var, grad, m, v, step=3, lr=1e-2, weight_decay=0.01)
    y = torch.randn(64, 1024, dtype=torch.bfloat16); x = torch.randn(64, 512, dtype=torch.bfloat16)
    wa = torch.randn(4, 1, 16, 512, dtype=torch.bfloat16); wb = torch.randn(4, 1, 1024, 16, dtype=torch.bfloat16)
    idx = torch.tensor([i % 4 if i < 40 else (i % 32) % 5 - 1 for i in range(64)], dtype=torch.int64)
    fusekit.add_lora(y, x, wb, idx, wa)
    g = torch.randn(5000, 64); rows = torch.randint(0, 3000, (5000,))
    tm = torch.randn(3000, 64) * 0.1; tv = torch.rand(3000, 64); tw = torch.randn(3000, 64)
    fusekit.lazy_adam(tw, g, rows, tm, tv, step=0, lr=1e-2)
    torch.manual_seed(7)  # the same inputs for every thread count
    h = hashlib.sha256()
    for t in (var, m, v, y, tm, tv, tw):
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    out[threads] = h.hexdigest()
print(json.dumps(out))
"""


def run_child(env_value):
    env = dict(os.environ, FUSEKIT_THREADS_ON_OPENMP=env_value)
    r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                       check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_chunks_on_the_openmp_team_give_the_bits_of_fusekits_own_threads():
    own = run_child("0")
    team = run_child("1")
    assert len(set(own.values())) == 1, own  # bitwise the same for 1, 2, 3 threads
    assert team == own
