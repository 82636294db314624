"""Whether a call releases the GIL, decided by the GIL itself, not by a clock.

With the switch interval set far beyond the test's length, CPython takes the GIL from a thread
only when that thread gives it up (blocks, or releases it in C code): Python code never preempts.
An observer thread waits for a start event and then, holding the GIL, polls the call's output
until it sees it written, and reads whether the caller has come back from the call (a flag the
caller sets on the very next line). The observer can hold the GIL while the call runs only if the
call released it, so "output written and the caller not back" proves the release. A call that
holds the GIL never lets the observer in before the caller has set its flag and blocks in
``join``: every round is inconclusive, never proved. A round where the call finishes before the
observer is scheduled is inconclusive too, and is tried again with fresh inputs; no round's
result depends on how long anything takes.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Callable, List, Tuple

# The observer's hang guard only (a probe that never sees a write); no outcome depends on it.
_GIVE_UP_S = 20.0


def releases_gil(make_round: Callable[[], Tuple[Callable[[], object], Callable[[], bool]]],
                 rounds: int = 20) -> List[str]:
    """Runs up to ``rounds`` rounds; ``make_round()`` returns ``(call, written)`` for fresh
    inputs: ``call()`` is the call under test, ``written()`` whether its output has changed
    (called repeatedly while the call may be running). Returns each round's outcome, "proved",
    "late" (the call was over before the observer ran) or "no write" (the guard ran out), and stops
    at the first "proved"."""
    outcomes: List[str] = []
    old = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        for _ in range(rounds):
            call, written = make_round()
            go = threading.Event()
            back = [False]
            seen: List[str] = []

            def observe() -> None:
                go.wait()
                give_up = time.monotonic() + _GIVE_UP_S
                while not written():
                    if time.monotonic() > give_up:
                        seen.append("no write")
                        return
                seen.append("late" if back[0] else "proved")

            t = threading.Thread(target=observe)
            t.start()  # (waits for the thread to start: it then blocks in go.wait())
            go.set()
            call()
            back[0] = True
            t.join()
            outcomes.append(seen[0])
            if seen[0] == "proved":
                break
    finally:
        sys.setswitchinterval(old)
    return outcomes


def memset_holding_gil(array) -> Callable[[], object]:
    """A call that writes ``array`` (a NumPy array: every byte set to 1) while holding the GIL
    (ctypes.PyDLL keeps it for the foreign call): the control that shows a round can fail."""
    import ctypes
    memset = ctypes.PyDLL(None).memset
    memset.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)
    return lambda: memset(array.ctypes.data, 1, array.nbytes)
