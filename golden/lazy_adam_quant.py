"""LazyAdamQuant golden data: LazyAdam's inputs (Rec SDK gen_data.py's shape and distributions for
the seed size) with m and v as 8-bit codes into the dynamic maps and one float32 absmax per row and
block of 256 columns; the golden computed in NumPy float32 from docs/lazy_adam_quant.md, written
from the spec and not from the C++:

  per distinct row r of the batch (negative indices are padding):
    g = the gradient rows of r summed in order of occurrence, in float32
    per column j of block b = j // 256:
      m = qmapM[mCode] * absmaxM[r, b];  v = qmapV[vCode] * absmaxV[r, b]
      m = m * beta1 + g * (1 - beta1)
      v = |v * beta2 + (g * g) * (1 - beta2)|
      var = var + (m * -lr) / (sqrt(v) + epsilon)
    the row is left unchanged when any new m, v or var (as var's dtype stores it) is NaN or Inf;
    else per block: absmaxM = max |m|, absmaxV = max v (+0), codes = nearest map entry to
    m / absmaxM and v / absmaxV (an absmax of 0 divides by 1), ties to the lower index, m's sign
    fix (ApplyAdamWQuant's rule).

The maps, the nearest code and the 16-bit storage come from golden/apply_adam_w_quant.py (NumPy, the
same rules).

The sizes whose format is "fp8" run the FP8 state format instead (docs/fp8_state.md: m as E4M3,
sqrt(v) as UE4M4, one scale per row block, no maps), with golden/fp8_state.py as the golden;
params.txt names the format (state_format = dynamic_map or fp8) and the runner takes it from
there."""
import numpy as np

from golden.apply_adam_w_quant import create_dynamic_map, narrow, nearest_code, storage_dtype, widen
from golden.common import bitwise_result, read_bin, read_params, write_bin, write_params

# docs/lazy_adam_quant.md: "bitwise identical ... the NumPy golden": codes exactly, var and absmax
# bit for bit (the golden flow checks them so).
GATE = "bitwise"

F32 = np.float32
BLOCK = 256

SIZES = {
    # name: (rows R, indices N, dim D, table dtype, gradient dtype, duplicates, padding, state
    # format: "dynamic_map" or "fp8" (docs/fp8_state.md))
    "seed": (2_000_000, 564_096, 32, "float32", "float32", False, False, "dynamic_map"),  # gen_data.py's
    "small": (20_000, 5_641, 32, "float32", "float32", True, True, "dynamic_map"),
    "small_bf16": (5_000, 3_000, 300, "bfloat16", "float32", True, True, "dynamic_map"),  # 2 blocks a row
    "small_fp16": (4_000, 2_000, 257, "float16", "float16", True, False, "dynamic_map"),
    "small_bf16_d8": (30_000, 20_000, 8, "bfloat16", "bfloat16", False, True, "dynamic_map"),
    "seed_fp8": (2_000_000, 564_096, 32, "float32", "float32", False, False, "fp8"),
    "small_fp8": (20_000, 5_641, 32, "float32", "float32", True, True, "fp8"),
    "small_fp8_bf16": (5_000, 3_000, 300, "bfloat16", "float32", True, True, "fp8"),
    "small_fp8_fp16_d8": (30_000, 20_000, 8, "float16", "float16", False, True, "fp8"),
}

# The flows scripts/main.sh runs besides the main size (the seed's), per mode ("default", or
# "small" for --small): the FP8 state format at the same shape.
EXTRA_SIZES = {"default": ["seed_fp8"], "small": ["small_fp8"]}

DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}


def lazy_adam_quant_golden(grad, indices, m, v, var, qm, qv, am, av, lr, beta1, beta2, eps,
                           dtype, gdtype, guard_lost_v=False):
    """grad [N, D] (storage of gdtype); indices [N]; m, v uint8 [R, D]; var [R, D] (storage of
    dtype); am, av float32 [R, ceil(D / 256)]. Returns new (m, v, var, am, av, skipped rows).

    guard_lost_v (docs/fp8_state.md, "The lost-v guard"): where the dequantized old v is 0 and the
    dequantized old m is not, the old v is taken as m * m before the update. Off by default:
    bit for bit today's results."""
    with np.errstate(all="ignore"):  # skipped rows compute NaN and Inf on the way
        return _golden(grad, indices, m, v, var, qm, qv, am, av, lr, beta1, beta2, eps, dtype, gdtype,
                       guard_lost_v)


def _golden(grad, indices, m, v, var, qm, qv, am, av, lr, beta1, beta2, eps, dtype, gdtype,
            guard_lost_v=False):
    b1, b2, e, lr = F32(beta1), F32(beta2), F32(eps), F32(lr)
    omb1, omb2 = F32(1) - b1, F32(1) - b2
    m, v, var, am, av = m.copy(), v.copy(), var.copy(), am.copy(), av.copy()
    R, D = m.shape
    nb = (D + BLOCK - 1) // BLOCK
    idx = indices.astype(np.int64).ravel()
    keep = idx >= 0
    g_all = widen(grad.reshape(-1), gdtype).reshape(grad.shape)[keep]
    ki = idx[keep]
    rows = np.unique(ki)
    if len(rows) == 0:
        return m, v, var, am, av, 0
    # The sum of each row's gradients in order of occurrence, left to right, in float32.
    order = np.argsort(ki, kind="stable")
    starts = np.searchsorted(ki[order], rows)
    counts = np.diff(np.append(starts, len(order)))
    g = g_all[order[starts]].copy()
    for k in range(1, int(counts.max())):
        sel = counts > k
        g[sel] = g[sel] + g_all[order[starts[sel] + k]]

    scale = lambda a: np.repeat(a[rows], BLOCK, axis=1)[:, :D]  # noqa: E731  (absmax per column)
    mm = qm[m[rows]] * scale(am)
    vv = qv[v[rows]] * scale(av)
    if guard_lost_v:  # the lost second moment: the smallest one consistent with |m| <= sqrt(v)
        vv = np.where((vv == 0) & (mm != 0), mm * mm, vv)
    mm = mm * b1 + g * omb1
    vv = np.abs(vv * b2 + (g * g) * omb2)
    w = widen(var[rows].reshape(-1), dtype).reshape(len(rows), D) + (mm * (-lr)) / (np.sqrt(vv) + e)
    w_stored = narrow(w.reshape(-1), dtype)
    finite = np.all(np.isfinite(mm) & np.isfinite(vv) &
                    np.isfinite(widen(w_stored, dtype).reshape(len(rows), D)), axis=1)
    skipped = int(np.sum(~finite))
    rows, mm, vv = rows[finite], mm[finite], vv[finite]
    w_stored = w_stored.reshape(-1, D)[finite]

    # Per block: the maxima (the valid columns only), the codes of the normalized values.
    pad = nb * BLOCK - D
    mb = np.concatenate([np.abs(mm), np.zeros((len(rows), pad), F32)], axis=1).reshape(len(rows), nb, BLOCK)
    vb = np.concatenate([vv, np.zeros((len(rows), pad), F32)], axis=1).reshape(len(rows), nb, BLOCK)
    new_am = (np.max(mb, axis=2) + F32(0)).astype(F32)
    new_av = (np.max(vb, axis=2) + F32(0)).astype(F32)
    div_m = np.repeat(np.where(new_am == 0, F32(1), new_am), BLOCK, axis=1)[:, :D]
    div_v = np.repeat(np.where(new_av == 0, F32(1), new_av), BLOCK, axis=1)[:, :D]
    m[rows] = nearest_code(qm, (mm / div_m).astype(F32).ravel(), True).reshape(-1, D)
    v[rows] = nearest_code(qv, (vv / div_v).astype(F32).ravel(), False).reshape(-1, D)
    var[rows] = w_stored.view(var.dtype)
    am[rows] = new_am
    av[rows] = new_av
    return m, v, var, am, av, skipped


def fp8_state(rng, R, D, indices):
    """An FP8 state of [R, D] (docs/fp8_state.md): m and sqrt(v) drawn per row block (magnitudes
    1e-5 to 1e-1, elements spread over the codes' range, subnormal codes included), coded by
    golden/fp8_state.py's block rule as a run leaves them; then, on rows the batch names: an
    all-zero m block (scale 0), a row whose v codes are all 0 under a non-zero m (the lost-v guard
    on every column), a few lost v, an E4M3 NaN code (non-finite state: the row is left unchanged).
    Returns (m codes, v codes, m scales, v scales)."""
    from golden.fp8_state import quantize_blocks
    nb = (D + BLOCK - 1) // BLOCK
    w = min(D, BLOCK)  # block width: rows of up to 256 columns are one block
    pad = nb * w - D
    valid_row = np.arange(nb * w).reshape(nb, w) < D
    mc = np.empty((R * nb, w), np.uint8)
    vc = np.empty((R * nb, w), np.uint8)
    sm = np.empty(R * nb, F32)
    sv = np.empty(R * nb, F32)
    step = max(1, (1 << 20) // w) * nb  # blocks at a time (whole rows): bounded temporaries
    for lo in range(0, R * nb, step):
        hi = min(R * nb, lo + step)
        k = hi - lo
        valid = np.broadcast_to(valid_row, (k // nb, nb, w)).reshape(k, w)
        mag = (10.0 ** rng.uniform(-5, -1, (k, 1))).astype(F32)
        mm = (rng.standard_normal((k, w), dtype=F32) * mag *
              np.exp(rng.uniform(-6, 0, (k, w))).astype(F32)).astype(F32)
        ss = (np.abs(rng.standard_normal((k, w), dtype=F32)) * mag * 2).astype(F32)
        mc[lo:hi], sm[lo:hi] = quantize_blocks(mm, "e4m3", valid)
        vc[lo:hi], sv[lo:hi] = quantize_blocks(ss, "ue4m4", valid)
    mc = mc.reshape(R, nb * w)[:, :D].copy() if pad else mc.reshape(R, D)
    vc = vc.reshape(R, nb * w)[:, :D].copy() if pad else vc.reshape(R, D)
    sm, sv = sm.reshape(R, nb), sv.reshape(R, nb)
    named = indices[indices >= 0]
    if len(named) > 40:
        r0, r1, r2, r3 = (int(named[k]) for k in (11, 23, 31, 37))
        mc[r0, :min(D, BLOCK)], sm[r0, 0] = 0, F32(0)  # an all-zero m block
        vc[r1], sv[r1] = 0, F32(0)  # every v of the row lost under a non-zero m
        vc[r2, ::3] = 0  # a few lost v
        mc[r3, D // 2] = 0xFF  # E4M3's NaN code (negative): the row is left unchanged
    return mc, vc, sm, sv


def generate_fp8(out_dir, size, seed):
    """The FP8 state format's flow: the dynamic-map flow's batch and table (the same draws), the
    state from fp8_state(), golden from golden/fp8_state.py (no map files; absmaxM and absmaxV hold
    the blocks' scales)."""
    from golden.fp8_state import lazy_adam_quant_fp8
    R, N, D, dtype, gdtype, dups, padding, _ = SIZES[size]
    nb = (D + BLOCK - 1) // BLOCK
    rng = np.random.default_rng(seed)
    lr, beta1, beta2, eps = 0.001, 0.9, 0.999, 1e-7
    var = narrow(rng.uniform(1, 2, R * D).astype(F32), dtype).reshape(R, D)
    indices, grad = batch(rng, R, N, D, gdtype, dups, padding, size)
    m, v, sm, sv = fp8_state(rng, R, D, indices)
    ins = {"gradient": grad, "indices": indices, "inputM": m, "inputV": v, "inputVar": var,
           "absmaxM": sm, "absmaxV": sv, "lr": np.array([lr], F32)}
    for name, a in ins.items():
        write_bin(f"{out_dir}/input/{name}.bin", a)
    gvar, gm, gv, gsm, gsv, skipped = lazy_adam_quant_fp8(var, grad, indices, m, v, sm, sv, lr, beta1,
                                                          beta2, eps, dtype=dtype, grad_dtype=gdtype)
    for name, a in {"inputM": gm, "inputV": gv, "inputVar": gvar, "absmaxM": gsm,
                    "absmaxV": gsv}.items():
        write_bin(f"{out_dir}/golden/{name}.bin", a)
    write_params(f"{out_dir}/params.txt", dict(rows=R, n=N, dim=D, blocks=nb, dtype=dtype,
                                               grad_dtype=gdtype, lr=lr, beta1=beta1, beta2=beta2,
                                               epsilon=eps, skipped_rows=skipped, state_format="fp8",
                                               seed=seed, size=size))


def batch(rng, R, N, D, gdtype, dups, padding, size):
    """The batch: N indices (a permutation of the rows cut; duplicates and padding where the size
    asks) and the gradient [N, D] (one NaN: a non-finite row, left unchanged)."""
    indices = rng.permutation(R)[:N].astype(np.int32)
    if dups:  # some rows named again (summed in order of occurrence)
        rep = rng.random(N) < 0.1
        indices[rep] = indices[rng.integers(0, N, int(rep.sum()))]
    if padding:
        indices[rng.random(N) < 0.02] = -1
    grad32 = rng.uniform(-1, 1, (N, D)).astype(F32) if not size.startswith("seed") else \
        rng.uniform(1, 2, (N, D)).astype(F32)
    if N > 10:
        grad32[7, D // 2] = np.nan  # a non-finite row, left unchanged
    return indices, narrow(grad32.ravel(), gdtype).reshape(N, D)


def generate(out_dir, size="seed", seed=0):
    R, N, D, dtype, gdtype, dups, padding, fmt = SIZES[size]
    if fmt == "fp8":
        return generate_fp8(out_dir, size, seed)
    nb = (D + BLOCK - 1) // BLOCK
    rng = np.random.default_rng(seed)
    lr, beta1, beta2, eps = 0.001, 0.9, 0.999, 1e-7
    qm, qv = create_dynamic_map(True), create_dynamic_map(False)
    var = narrow(rng.uniform(1, 2, R * D).astype(F32), dtype).reshape(R, D)
    m = rng.integers(0, 256, (R, D), dtype=np.uint8)
    v = rng.integers(0, 256, (R, D), dtype=np.uint8)
    am = rng.uniform(0.001, 0.05, (R, nb)).astype(F32)
    av = rng.uniform(1e-6, 1e-3, (R, nb)).astype(F32)
    am[1, 0] = 0  # an all-zero moment block
    indices, grad = batch(rng, R, N, D, gdtype, dups, padding, size)
    ins = {"gradient": grad, "indices": indices, "inputM": m, "inputV": v, "inputVar": var,
           "qmapM": qm, "qmapV": qv, "absmaxM": am, "absmaxV": av, "lr": np.array([lr], F32)}
    for name, a in ins.items():
        write_bin(f"{out_dir}/input/{name}.bin", a)
    gm, gv, gvar, gam, gav, skipped = lazy_adam_quant_golden(grad, indices, m, v, var, qm, qv, am,
                                                             av, lr, beta1, beta2, eps, dtype, gdtype)
    for name, a in {"inputM": gm, "inputV": gv, "inputVar": gvar, "absmaxM": gam,
                    "absmaxV": gav}.items():
        write_bin(f"{out_dir}/golden/{name}.bin", a)
    write_params(f"{out_dir}/params.txt", dict(rows=R, n=N, dim=D, blocks=nb, dtype=dtype,
                                               grad_dtype=gdtype, lr=lr, beta1=beta1, beta2=beta2,
                                               epsilon=eps, skipped_rows=skipped,
                                               state_format="dynamic_map", seed=seed, size=size))


def verify(out_dir):
    p = read_params(f"{out_dir}/params.txt")
    R, D, nb, dtype = int(p["rows"]), int(p["dim"]), int(p["blocks"]), p["dtype"]
    st = storage_dtype(dtype)
    results = []
    for name in ["inputM", "inputV"]:
        real = read_bin(f"{out_dir}/output/{name}.bin", np.uint8)
        gold = read_bin(f"{out_dir}/golden/{name}.bin", np.uint8)
        name_, ok, detail = bitwise_result(name, real, gold)
        results.append((name_, ok and real.size == R * D, detail))
    # (16-bit var widened to float32: exact, so its bits are the storage's)
    real = widen(read_bin(f"{out_dir}/output/inputVar.bin", st), dtype)
    gold = widen(read_bin(f"{out_dir}/golden/inputVar.bin", st), dtype)
    name_, ok, detail = bitwise_result("inputVar", real, gold)
    results.append((name_, ok and real.size == R * D, detail))
    for name in ["absmaxM", "absmaxV"]:
        real = read_bin(f"{out_dir}/output/{name}.bin", F32)
        gold = read_bin(f"{out_dir}/golden/{name}.bin", F32)
        name_, ok, detail = bitwise_result(name, real, gold)
        results.append((name_, ok and real.size == R * nb, detail))
    return results
