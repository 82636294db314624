"""Checks what the seed's ApplyAdamWQuant example prints against values worked out independently.

The seed runs one step on 256 float32 elements with var = grad = 0, m and v codes 0, qmapM and
qmapV all zeros, absmaxM = 5, absmaxV = 3, step = 0 (t = 1), lr = beta1 = beta2 = weightDecay =
gnormScale = 0.1, eps = 0.01. By hand:
    g = 0 * 0.1 = 0;  m = qmapM[0] * 5 = 0;  v = qmapV[0] * 3 = 0
    m = 0 * 0.1 + 0 * 0.9 = 0;  v = 0
    c2s = sqrt(1 - 0.1) > 0, so the denominator sqrt(0) + 0.01 * c2s is positive
    var = 0 + (0 * step_size) / (positive) = 0;  weight decay: 0 * (1 - 0.01) = 0
so every printed result must be 0.000000, 256 of them. The same numbers are recomputed below in
NumPy float32 from the formula (not from fusekit) as a second check."""
import re

import numpy as np


def expected():
    f = np.float32
    n = 256
    var = np.zeros(n, f)
    grad = np.zeros(n, f)
    qm = np.zeros(256, f)
    qv = np.zeros(256, f)
    lr, b1, b2, wd, eps, gs = (f(0.1), f(0.1), f(0.1), f(0.1), f(0.01), f(0.1))
    t = f(0 + 1)
    c1 = f(1) - b1 ** t
    c2s = np.sqrt(f(1) - b2 ** t)
    g = grad * gs
    m = qm[np.zeros(n, int)] * f(5)
    v = qv[np.zeros(n, int)] * f(3)
    m = m * b1 + g * (f(1) - b1)
    v = v * b2 + (g * g) * (f(1) - b2)
    var = var + (m * (-lr * c2s / c1)) / (np.sqrt(v) + eps * c2s)
    var = var * (f(1) - lr * wd)
    return var


def check(stdout):
    values = {}
    for m in re.finditer(r"result\[(\d+)\] is: (\S+)", stdout):
        values[int(m.group(1))] = m.group(2)
    want = expected()
    if sorted(values) != list(range(256)):
        return False, f"expected result[0..255], got {len(values)} lines"
    bad = [i for i in range(256) if values[i] != f"{want[i]:f}" or values[i] != "0.000000"]
    if bad:
        i = bad[0]
        return False, f"{len(bad)} results differ; result[{i}] is {values[i]}, expected {want[i]:f}"
    return True, "256 results, all 0.000000 as worked out (all-zero maps and inputs: var stays 0)"
