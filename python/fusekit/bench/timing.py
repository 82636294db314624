"""Timing: the median of repeated calls after a warm-up (measure), and the implementations of one
case timed in turn, round by round, so that a change of the shared machine's load reaches all of
them alike (measure_interleaved, run_case)."""
from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple

from .results import Recorder, Result


def _no_metrics(t: float) -> Dict[str, Any]:
    return {}


def measure(fn: Callable[[], Any], repeats: int, *, inner: int = 1, warmup: int = 2,
            slow_s: float = 0.5, slow_repeats: int = 3, very_slow_s: float = 2.0
            ) -> Tuple[float, int]:
    """Median seconds per call of ``fn``: ``warmup`` untimed calls (at most two when they take
    longer than ``slow_s``), then ``repeats`` timings of ``inner`` calls each (a case whose last
    warm-up call took longer than ``slow_s`` gets at most ``slow_repeats``, one call each; longer
    than ``very_slow_s``: one warm-up and one timed call). Returns (median, repeats done)."""
    first = 0.0
    for i in range(max(1, warmup)):
        t0 = time.perf_counter()
        fn()
        first = time.perf_counter() - t0  # the last warm-up call (the first may set things up)
        if first > very_slow_s or (first > slow_s and i >= 1):
            break
    if first > slow_s:
        repeats = min(repeats, 1 if first > very_slow_s else slow_repeats)
        inner = 1
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times), len(times)


def _free() -> None:
    gc.collect()


@dataclass
class Impl:
    """One way of doing a case's step: ``fn`` runs it once (``inner`` calls per timing)."""

    name: str
    fn: Callable[[], Any]
    inner: int = 1
    metrics: Callable[[float], Dict[str, Any]] = _no_metrics
    note: str = ""


def measure_interleaved(impls: List[Impl], repeats: int, *, warmup: int = 2, gap_s: float = 0.03,
                        slow_s: float = 0.5, slow_repeats: int = 3, very_slow_s: float = 2.0
                        ) -> Dict[str, Tuple[float, int]]:
    """Times several implementations of one case in turn, round by round, so that a change in the
    machine's load (it is shared) reaches all of them alike. Each gets ``warmup`` untimed calls
    first (the first may create state); then each round, for each implementation: a pause of
    ``gap_s`` (the previous one's threads stop spinning: torch's OpenMP threads spin ~8 ms after
    a parallel region with the default OMP_WAIT_POLICY), one untimed call when it is fast (its
    own steady state: threads awake, caches warm), then ``inner`` timed calls. An implementation
    slower than ``slow_s`` per call takes part in at most ``slow_repeats`` rounds (``very_slow_s``:
    one), one call each. Returns {name: (median seconds per call, timings taken)}."""
    per_call: Dict[str, float] = {}
    for im in impls:
        last = 0.0
        for i in range(max(1, warmup)):
            t0 = time.perf_counter()
            im.fn()
            last = time.perf_counter() - t0
            if last > very_slow_s or (last > slow_s and i >= 1):
                break
        per_call[im.name] = last
    budget: Dict[str, int] = {}
    for im in impls:
        t = per_call[im.name]
        budget[im.name] = (repeats if t <= slow_s else
                           min(repeats, 1 if t > very_slow_s else slow_repeats))
    times: Dict[str, List[float]] = {im.name: [] for im in impls}
    for r in range(max(1, repeats)):
        for im in impls:
            if r >= budget[im.name]:
                continue
            slow = per_call[im.name] > slow_s
            time.sleep(gap_s)
            if not slow:
                im.fn()
            inner = 1 if slow else im.inner
            t0 = time.perf_counter()
            for _ in range(inner):
                im.fn()
            times[im.name].append((time.perf_counter() - t0) / inner)
    return {k: (statistics.median(v), len(v)) for k, v in times.items()}


def run_case(rec: Recorder, section: str, case: str, impls: List[Impl], repeats: int
             ) -> Dict[str, Result]:
    out: Dict[str, Result] = {}
    for name, (t, n) in measure_interleaved(impls, repeats).items():
        im = next(i for i in impls if i.name == name)
        out[name] = rec.add(Result(section, case, name, t, n, im.metrics(t), im.note))
    return out
