"""LazyAdam golden data: Rec SDK gen_data.py's shape and distributions, golden computed in NumPy
float32 with the formula of spec/lazy_adam.md (duplicates summed in order of occurrence)."""
import numpy as np

from golden.common import bitwise_result, read_bin, read_params, write_bin, write_params

# docs/lazy_adam.md: "bitwise identical to the NumPy golden".
GATE = "bitwise"

SIZES = {
    # name: (table rows R, unique indices N, dim D)
    "seed": (2_000_000, 564_096, 32),  # Rec SDK gen_data.py
    "small": (20_000, 5_641, 32),
}


def lazy_adam_golden(grad, indices, m, v, var, lr, beta1, beta2, eps):
    """Returns new (m, v, var). float32 throughout, in the kernel's order of operations."""
    f32 = np.float32
    b1, b2, e, lr = f32(beta1), f32(beta2), f32(eps), f32(lr)
    omb1, omb2 = f32(1) - b1, f32(1) - b2
    m, v, var = m.copy(), v.copy(), var.copy()
    idx = indices.astype(np.int64).ravel()
    keep = idx >= 0
    rows, first = np.unique(idx[keep], return_index=True)
    g = grad[keep]
    ki = idx[keep]
    if len(rows) == len(ki):  # no duplicates: the gradient rows as they are
        gsum = g[np.argsort(ki, kind="stable")]
    else:  # sum in order of occurrence, left to right, in float32
        order = np.argsort(ki, kind="stable")
        gsum = np.zeros((len(rows), grad.shape[1]), dtype=f32)
        starts = np.searchsorted(ki[order], rows)
        counts = np.diff(np.append(starts, len(order)))
        gsum[:] = g[order[starts]]
        for k in range(1, counts.max()):
            sel = counts > k
            gsum[sel] = gsum[sel] + g[order[starts[sel] + k]]
    finite = np.all(np.isfinite(gsum), axis=1)
    rows, gsum = rows[finite], gsum[finite]
    mm = m[rows] * b1 + gsum * omb1
    vv = np.abs(v[rows] * b2 + (gsum * gsum) * omb2)
    d = np.sqrt(vv) + e
    var[rows] = var[rows] + (mm * (-lr)) / d
    m[rows] = mm
    v[rows] = vv
    return m, v, var


def generate(out_dir, size="seed", seed=0):
    R, N, D = SIZES[size]
    rng = np.random.default_rng(seed)
    lr, beta1, beta2, eps = 0.001, 0.9, 0.999, 1e-7
    var = rng.uniform(1, 2, (R, D)).astype(np.float32)
    m = rng.uniform(1, 2, (R, D)).astype(np.float32)
    v = rng.uniform(1, 2, (R, D)).astype(np.float32)
    indices = rng.permutation(R)[:N].astype(np.int32)
    grad = rng.uniform(1, 2, (N, D)).astype(np.float32)
    for name, a in [("gradient", grad), ("indices", indices), ("inputM", m), ("inputV", v),
                    ("inputVar", var), ("lr", np.array([lr], np.float32))]:
        write_bin(f"{out_dir}/input/{name}.bin", a)
    gm, gv, gvar = lazy_adam_golden(grad, indices, m, v, var, lr, beta1, beta2, eps)
    for name, a in [("inputM", gm), ("inputV", gv), ("inputVar", gvar)]:
        write_bin(f"{out_dir}/golden/{name}.bin", a)
    write_params(f"{out_dir}/params.txt", dict(rows=R, n=N, dim=D, lr=lr, beta1=beta1, beta2=beta2,
                                               epsilon=eps, seed=seed, size=size))


def verify(out_dir):
    p = read_params(f"{out_dir}/params.txt")
    R, D = int(p["rows"]), int(p["dim"])
    results = []
    for name in ["inputM", "inputV", "inputVar"]:
        real = read_bin(f"{out_dir}/output/{name}.bin", np.float32, (R, D))
        gold = read_bin(f"{out_dir}/golden/{name}.bin", np.float32, (R, D))
        results.append(bitwise_result(name, real, gold))
    return results
