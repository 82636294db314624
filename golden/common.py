"""Shared pieces of the single-operator golden flow: .bin files, params.txt, the precision rules.

Each operator's module names its gate in GATE: "bitwise" where its doc promises results bitwise
equal to the golden (LazyAdam, ApplyAdamWQuant, LazyAdamQuant: docs/<op>.md), checked with
bitwise_rule (every element's bits, codes exactly); otherwise the tolerance its doc states
(AddLora: one ulp plus the cancellation bound). The Rec SDK rule (precision_rule, 1e-6) is
printed beside the bitwise one for information; it gates nothing where the gate is bitwise."""
import os

import numpy as np

LOSS = 1e-6  # Rec SDK verify_result.py tolerance


def write_bin(path, array):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.ascontiguousarray(array).tofile(path)


def read_bin(path, dtype, shape=None):
    a = np.fromfile(path, dtype=dtype)
    return a.reshape(shape) if shape is not None else a


def write_params(path, params):
    with open(path, "w") as f:
        for k, v in params.items():
            f.write(f"{k} = {v!r}\n" if isinstance(v, float) else f"{k} = {v}\n")


def read_params(path):
    out = {}
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0]
            if "=" in line:
                k, v = line.split("=", 1)
                out[k.strip()] = v.strip()
    return out


def bitwise_rule(real, golden):
    """Every element bit for bit (the arrays' own storage: float16 as 16 bits, codes as bytes):
    returns (passed, detail); passes only with zero elements that differ."""
    real, golden = np.ascontiguousarray(real), np.ascontiguousarray(golden)
    if real.shape != golden.shape or real.dtype.itemsize != golden.dtype.itemsize:
        return False, (f"size {real.size} ({real.dtype}) != golden size {golden.size} "
                       f"({golden.dtype})")
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[real.dtype.itemsize]
    differ = int(np.count_nonzero(real.view(bits) != golden.view(bits)))
    return differ == 0, f"{differ} of {real.size} elements not bitwise equal"


def bitwise_result(name, real, golden, informational=True):
    """A verify() result under the bitwise gate: (name, passed, detail), the Rec SDK rule's numbers
    appended for information (floats only)."""
    ok, detail = bitwise_rule(real, golden)
    if informational and real.size == golden.size and real.size > 0:
        if real.dtype.kind == "f":
            _, rec = precision_rule(real, golden)
            detail += f"; Rec SDK rule (informational): {rec}"
        elif real.dtype.kind == "u":
            step = int(np.abs(real.astype(np.int32) - golden.astype(np.int32)).max())
            detail += f"; largest code difference {step}"
    return name, ok, detail


def precision_rule(real, golden, loss=LOSS):
    """Rec SDK's comparison (common.md): returns (passed, detail)."""
    real = np.asarray(real, dtype=np.float64).ravel()
    golden = np.asarray(golden, dtype=np.float64).ravel()
    if real.shape != golden.shape:
        return False, f"size {real.size} != golden size {golden.size}"
    if real.size == 0:
        return True, "empty"
    abs_err = np.abs(real - golden)
    rel_err = abs_err / (np.maximum(np.abs(real), np.abs(golden)) + 1e-9)
    # NaN anywhere in real (an unwritten element, say) counts as an error.
    abs_err = np.where(np.isnan(abs_err), np.inf, abs_err)
    rel_err = np.where(np.isnan(rel_err), np.inf, rel_err)
    n_abs = int(np.count_nonzero(abs_err > loss))
    n_rel = int(np.count_nonzero(rel_err > loss))
    passed = (n_abs == 0 or n_rel == 0 or n_rel <= real.size * loss or n_abs <= real.size * loss)
    detail = (f"max abs err {abs_err.max():.3g}, max rel err {rel_err.max():.3g}, "
              f"{n_rel} of {real.size} over {loss:g}")
    return bool(passed), detail
