"""The omp section: whether OMP_WAIT_POLICY matters: the same short probe (a torch op, then a
fusekit op) in child processes (python -m fusekit.bench --omp-probe) with the variable unset and
passive, alternating."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

import fusekit

from .results import Config, Recorder


def omp_probe(quick: bool, repeats: int) -> Dict[str, float]:
    """Run in a child process: a fusekit op right after a torch op (torch's OpenMP threads may
    still be spinning), alone, and the torch op alone / right after fusekit. Microseconds."""
    import torch

    H, W, L, B = (512, 32, 2, 32) if quick else (4096, 32, 8, 32)
    n_t = (1 << 18) if quick else (1 << 22)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(B, H, generator=g).half()
    y = torch.randn(B, H, generator=g).half()
    wa = (torch.randn(W, L, 16, H, generator=g) * 0.02).half()
    wb = (torch.randn(W, L, H, 16, generator=g) * 0.02).half()
    idx = torch.randperm(W, generator=g)[:B] % W
    big = torch.randn(n_t, generator=g)
    n_adam = (1 << 16) if quick else (1 << 22)
    av, ag = torch.zeros(n_adam), torch.ones(n_adam)
    am, avv = torch.zeros(n_adam), torch.zeros(n_adam)
    layer = [0]

    def fk_lora() -> None:
        fusekit.add_lora(y, x, wb, idx, wa, layer_idx=layer[0], scale=0.5)
        layer[0] = (layer[0] + 1) % L

    def fk_adam() -> None:
        fusekit.adam_w(av, ag, am, avv, step=0)

    def torch_op() -> None:
        big.mul_(1.0000001)

    iters = 10 if quick else 50
    out: Dict[str, List[float]] = {}
    lora_name = f"fusekit add_lora decode H={H}"
    adam_name = f"fusekit adam_w {n_adam / 2**20:g}M"
    mul_name = f"torch mul_ {n_t / 2**20:g}M"

    def median_of(fn: Callable[[], None], pre: Optional[Callable[[], None]] = None,
                  pause: float = 0.0) -> float:
        time.sleep(0.3)  # torch's OpenMP threads stop spinning from the last measurement
        ts = []
        for _ in range(max(5, iters // 3) if pause else iters):
            if pre is not None:
                pre()
            elif pause:
                time.sleep(pause)  # let every thread go idle (torch's sleep after spinning)
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts) * 1e6

    for _ in range(3):
        fk_lora()
        fk_adam()
        torch_op()
    for rep in range(repeats):
        for name, fn in ((lora_name, fk_lora), (adam_name, fk_adam)):
            out.setdefault(f"{name}: back to back", []).append(median_of(fn))
            out.setdefault(f"{name}: after a torch op", []).append(median_of(fn, pre=torch_op))
            out.setdefault(f"{name}: after 20 ms idle", []).append(
                median_of(fn, pause=0.02))
        out.setdefault(f"{mul_name}: back to back", []).append(median_of(torch_op))
        out.setdefault(f"{mul_name}: after fusekit add_lora", []).append(
            median_of(torch_op, pre=fk_lora))
        out.setdefault(f"{mul_name}: after 20 ms idle", []).append(
            median_of(torch_op, pause=0.02))
        # A loop of both, as a model alternates them: time per pair.
        t0 = time.perf_counter()
        for _ in range(iters):
            torch_op()
            fk_lora()
        out.setdefault(f"pair: {mul_name} + {lora_name}", []).append(
            (time.perf_counter() - t0) / iters * 1e6)
    # CPU time torch's other threads (OpenMP workers) take in the 100 ms after one torch op: the
    # spinning that takes a core from whatever runs next (from /proc/self/task/*/schedstat).
    for _ in range(3):
        time.sleep(0.2)
        c0 = _other_threads_cpu_s()
        torch_op()
        time.sleep(0.1)
        c1 = _other_threads_cpu_s()
        if c0 >= 0:
            out.setdefault("torch threads' CPU in the 100 ms after one torch op", []).append(
                (c1 - c0) * 1e6)
    return {k: statistics.median(v) for k, v in out.items()}


def _other_threads_cpu_s() -> float:
    """CPU seconds run so far by this process's threads other than the main one (-1: unknown)."""
    total = 0
    try:
        for tid in os.listdir("/proc/self/task"):
            if int(tid) != os.getpid():
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
    except OSError:
        return -1.0
    return total / 1e9


def bench_omp(rec: Recorder, cfg: Config) -> None:
    rounds = 1 if cfg.quick else 2
    print(f"[omp] OMP_WAIT_POLICY: probe in child processes, unset and passive alternating "
          f"(ABBA), {rounds} round(s)", flush=True)
    samples: Dict[str, Dict[str, List[float]]] = {"unset": {}, "passive": {}}
    for rnd in range(rounds):
        for policy in (("unset", "passive") if rnd % 2 == 0 else ("passive", "unset")):
            env = dict(os.environ)
            env.pop("OMP_WAIT_POLICY", None)
            if policy != "unset":
                env["OMP_WAIT_POLICY"] = policy
            cmd = [sys.executable, "-m", "fusekit.bench", "--omp-probe", "--repeats",
                   str(min(cfg.repeats, 2))] + (["--quick"] if cfg.quick else [])
            try:
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
                line = [ln for ln in p.stdout.splitlines() if ln.startswith("OMP_PROBE ")]
                if not line:
                    raise RuntimeError((p.stderr or p.stdout)[-500:])
                for k, v in json.loads(line[-1][len("OMP_PROBE "):]).items():
                    samples[policy].setdefault(k, []).append(v)
            except Exception as e:  # noqa: BLE001
                rec.skip("omp", "OMP_WAIT_POLICY", policy, f"{type(e).__name__}: {e}")
    runs = {pol: {k: statistics.median(v) for k, v in d.items()} for pol, d in samples.items()
            if d}
    rec.omp = {"us_median": runs, "samples": samples, "load_1min_after": os.getloadavg()[0]}
    if len(runs) == 2:
        print(f"  {'probe (us per call, medians)':<48} {'unset':>10} {'passive':>10} "
              f"{'unset/passive':>14}")
        for k in runs["unset"]:
            a, b = runs["unset"][k], runs["passive"].get(k, float("nan"))
            print(f"  {k:<48} {a:>10.0f} {b:>10.0f} {a / b:>14.2f}")
