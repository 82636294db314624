"""Launching the integration tests' multi-process runs: gloo ranks on loopback."""
import os
import pathlib
import socket
import subprocess
import sys

HERE = pathlib.Path(__file__).parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranks(script, *args, world=2, env=None):
    """Runs `script args` as `world` gloo ranks on loopback; each must exit 0. ``env``: more
    variables (a value None: the rank's number, as LOCAL_RANK)."""
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                WORLD_SIZE=str(world), OMP_NUM_THREADS="1")

    def env_of(r):
        extra = {k: str(r) if v is None else v for k, v in (env or {}).items()}
        return dict(base, RANK=str(r), **extra)

    procs = [subprocess.Popen([sys.executable, str(script), *map(str, args)],
                              env=env_of(r), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(world)]
    for p in procs:
        text, _ = p.communicate(timeout=300)
        assert p.returncode == 0, text
