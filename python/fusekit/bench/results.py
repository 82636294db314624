"""What a run records: each timing (Result), each fusekit-vs-peer comparison (Comparison), each
implementation that could not run (Skip), collected by a Recorder; the run's configuration
(Config) and the sections it may run."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

SECTIONS: Tuple[str, ...] = ("lazy_adam", "embedding_bag", "torchrec", "adam8bit", "offload",
                              "lora", "overhead", "omp")


@dataclass
class Config:
    quick: bool = False
    repeats: int = 7
    only: Tuple[str, ...] = SECTIONS
    offload_sizes: Tuple[float, ...] = (64, 512)  # millions (2^20) of parameters


@dataclass
class Result:
    section: str
    case: str
    impl: str
    seconds: float  # median per step / call
    repeats: int
    metrics: Dict[str, Any] = field(default_factory=dict)  # GB/s, GFLOP/s, state bytes, ...
    note: str = ""


@dataclass
class Comparison:
    section: str
    case: str
    fusekit: str  # impl name of the fusekit row
    peer: str
    fusekit_s: float
    peer_s: float
    speedup: float  # peer_s / fusekit_s
    target: str = ""
    met: Optional[bool] = None


@dataclass
class Skip:
    section: str
    case: str
    impl: str
    reason: str


class Recorder:
    def __init__(self, verbose: bool = True):
        self.results: List[Result] = []
        self.comparisons: List[Comparison] = []
        self.skips: List[Skip] = []
        self.omp: Dict[str, Any] = {}
        self.verbose = verbose

    def add(self, r: Result) -> Result:
        self.results.append(r)
        if self.verbose:
            extra = "".join(f", {k} {_fmt_metric(v)}" for k, v in r.metrics.items())
            print(f"  {r.case:<34} {r.impl:<44} {_fmt_time(r.seconds):>10} (n={r.repeats}{extra})",
                  flush=True)
        return r

    def skip(self, section: str, case: str, impl: str, reason: str) -> None:
        self.skips.append(Skip(section, case, impl, reason))
        if self.verbose:
            print(f"  {case:<34} {impl:<44}    skipped: {reason}", flush=True)

    def compare(self, fk: Optional[Result], peer: Optional[Result], *,
                min_speedup: Optional[float] = None, max_us: Optional[float] = None,
                target: str = "") -> Optional[Comparison]:
        """Speed-up of ``fk`` over ``peer``; ``min_speedup``: the target as peer/fusekit >= x;
        ``max_us``: an absolute target on fusekit's time per call."""
        if fk is None or peer is None:
            return None
        speedup = peer.seconds / fk.seconds if fk.seconds > 0 else float("inf")
        met: Optional[bool] = None
        if min_speedup is not None:
            met = speedup >= min_speedup
        if max_us is not None:
            met = fk.seconds * 1e6 < max_us
        c = Comparison(fk.section, fk.case, fk.impl, peer.impl, fk.seconds, peer.seconds,
                       speedup, target, met)
        self.comparisons.append(c)
        return c


def _fmt_time(s: float) -> str:
    if s != s:  # NaN
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.2f} us" if s < 1e-4 else f"{s * 1e6:.0f} us"
    if s < 1.0:
        return f"{s * 1e3:.2f} ms" if s < 0.1 else f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def _fmt_metric(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)
