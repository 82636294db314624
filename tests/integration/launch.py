"""Launching the integration tests' multi-process runs: gloo ranks on loopback; and a rank's end."""
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
    variables (a value None: the rank's number, as LOCAL_RANK). A rank that dies of a signal prints
    every thread's Python stack first (PYTHONFAULTHANDLER); a failure shows every rank's exit
    status and output."""
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                WORLD_SIZE=str(world), OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")

    def env_of(r):
        extra = {k: str(r) if v is None else v for k, v in (env or {}).items()}
        return dict(base, RANK=str(r), **extra)

    procs = [subprocess.Popen([sys.executable, str(script), *map(str, args)],
                              env=env_of(r), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(world)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        raise AssertionError("\n".join(
            f"--- rank {r} of {script.name} {' '.join(map(str, args))}: exit {p.returncode}\n{t}"
            for r, (p, t) in enumerate(zip(procs, outs))))


def end_rank():
    """A rank's end, called after its last collective and dist.destroy_process_group(), once every
    output is written: exit at once (status 0) instead of finalizing the interpreter.

    Why: gloo's worker thread (c10d::ProcessGroupGloo::runLoop, torch 2.15) releases a finished
    collective's work object, which holds tensors with Python references (dist.barrier()'s
    AsyncBarrierWork), a moment after the collective has returned, and destroy_process_group() does
    not wait for it. When the main thread is finalizing the interpreter by then, that thread's GIL
    acquire ends it by a forced unwind through a noexcept destructor: std::terminate, "terminate
    called without an active exception", status -6. It failed CI once (the FSDP2 DCP test's save)
    and came back here once in about 210 launches (the core dump's stack: docs/ci.md). PyTorch's
    pull request 179291 describes the same race. ranks() sets PYTHONFAULTHANDLER, so that a rank
    dying of a signal prints where every thread was."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
