"""Shared pieces of the single-operator golden flow: .bin files, params.txt, the precision rule."""
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
