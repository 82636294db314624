"""The machine a run measures (CPU, memory, huge pages, threads, versions: the report's "meta"),
and helpers the sections share: what fusekit.torch offers here, the bytes of an optimizer's
state, the memory available."""
from __future__ import annotations

import datetime
import os
import platform
from typing import Any, Dict, Optional, Tuple

import fusekit


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def machine_info(torch: Any) -> Dict[str, Any]:
    cpu = "unknown"
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    flags = ""
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("flags"):
            f = set(line.split(":", 1)[1].split())
            flags = " ".join(x for x in ("avx2", "avx512f", "avx512bw", "avx512_bf16",
                                         "avx512_fp16", "amx_tile") if x in f)
            break
    cpus: Optional[int]
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count()
    versions: Dict[str, str] = {"python": platform.python_version(), "fusekit": fusekit.__version__,
                "torch": torch.__version__}
    try:
        import numpy
        versions["numpy"] = numpy.__version__
    except ImportError:
        pass
    for mod in ("bitsandbytes", "torchao"):
        try:
            versions[mod] = __import__("importlib.metadata").metadata.version(mod)
        except Exception:
            versions[mod] = "not installed"
    thp = _read("/sys/kernel/mm/transparent_hugepage/enabled")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cpu_flags": flags,
        "cpus_allowed": cpus,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "thp_enabled": thp,
        "fusekit_threads": fusekit.get_num_threads(),
        "torch_threads": torch.get_num_threads(),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "(unset)"),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "versions": versions,
        "implementations": {op: fusekit.implementations(op) for op in
                            ("lazy_adam", "adam_w", "apply_adam_w_quant", "add_lora")
                            if _has_impls(op)},
    }


def _has_impls(op: str) -> bool:
    try:
        fusekit.implementations(op)
        return True
    except Exception:
        return False


def _fusekit_torch(name: str) -> Tuple[Any, str]:
    """``fusekit.torch.<name>``, or (None, reason) while that module is missing or broken."""
    try:
        import fusekit.torch as ft
        return getattr(ft, name), ""
    except Exception as e:  # noqa: BLE001 (a helper's module may be half-written)
        return None, f"fusekit.torch.{name} not importable: {type(e).__name__}: {e}"


def _tensor_bytes(t: Any) -> int:
    import torch
    if type(t) is not torch.Tensor and hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()  # e.g. torchao's OptimState8bit: codes, scale, qmap
        return sum(_tensor_bytes(getattr(t, n)) for n in names)
    if torch.is_tensor(t):
        return t.numel() * t.element_size()
    return int(getattr(t, "nbytes", 0))


def state_bytes(opt: Any) -> int:
    total = 0
    for st in opt.state.values():
        for v in st.values():
            if hasattr(v, "nbytes") or hasattr(v, "__tensor_flatten__") or hasattr(v, "numel"):
                try:
                    total += _tensor_bytes(v)
                except Exception:  # noqa: BLE001
                    pass
    return total


def _mem_available() -> int:
    try:
        for line in _read("/proc/meminfo").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except Exception:  # noqa: BLE001
        pass
    return 0
