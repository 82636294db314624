"""pytest setup: the repository root on sys.path, so the tests can use golden/ (the NumPy
references written from the specs) as their oracles; `runnable_implementations`, the parameters
of the tests that run each implementation; `collapse_expected`, whether huge pages can come to
memory in place here."""
import pathlib
import platform
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# What each hand-written instruction-set kernel needs from the CPU, read here from /proc/cpuinfo
# (not from the library): where the CPU has it, the kernel's tests run; where it lacks it, they
# are skipped with the reason.
_NEEDS = {"cpu_avx512vbmi": ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512vbmi")}


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def runnable_implementations(names):
    """pytest parameters for the implementations `names` (fusekit.implementations(op)), each one
    this CPU cannot run marked as skipped, with the flags it lacks."""
    flags = _cpu_flags()
    out = []
    for name in names:
        lacking = [f for f in _NEEDS.get(name, ()) if f not in flags]
        marks = pytest.mark.skip(reason=f"{name}: this CPU lacks {', '.join(lacking)}") \
            if lacking else ()
        out.append(pytest.param(name, marks=marks, id=name))
    return out


def collapse_expected() -> bool:
    """Whether this machine can back memory with huge pages in place: transparent huge pages not
    "never" and a kernel with MADV_COLLAPSE (Linux 6.1)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            if "[never]" in f.read():
                return False
    except OSError:
        return False
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    return (major, minor) >= (6, 1)


@pytest.fixture(scope="session")
def one_rank_group():
    """A one-rank gloo process group in this process (DTensor parameters as FSDP2 makes them, on
    a mesh of one): made once per session, as a process can hold one default group."""
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch without distributed (gloo) support")
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
