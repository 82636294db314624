"""ApplyAdamWQuant golden data: inputs for the seed's operator and its golden outputs computed in
NumPy float32 with the formula of spec/apply_adam_w_quant.md (CANN's kernel: t = step + 1, eps
scaled by sqrt(1 - beta2^t), weight decay after the step; nearest code with ties to the lower
index; the sign fix for m; a block whose gradient, or whose new m, v or var as stored, would be NaN
or Inf is left unchanged).

Also the dynamic quantization maps (bitsandbytes' create_dynamic_map construction), so that a
script can start from nothing: create_dynamic_map(signed=True) / (signed=False).

The sizes whose maps are "fp8" run the FP8 state format instead (docs/fp8_state.md: m as E4M3,
sqrt(v) as UE4M4, one scale per block, no maps), with golden/fp8_state.py as the golden; params.txt
names the format (state_format = dynamic_map or fp8) and the runner takes it from there."""
import ctypes
import ctypes.util

import numpy as np

from golden.common import bitwise_result, read_bin, read_params, write_bin, write_params

# docs/apply_adam_w_quant.md: "bitwise identical ... the NumPy golden": codes exactly (stricter than
# the spec's allowance of one-step differences for 1 in 10,000), var and absmax bit for bit.
GATE = "bitwise"

F32 = np.float32
BLOCK = 256

SIZES = {
    # name: (shape, dtype, maps)  maps: "dynamic" or "linspace" (the dynamic-map state format), or
    # "fp8" / "fp8_ue3m5" (the FP8 state formats, sqrt(v) as UE4M4 / UE3M5: no maps;
    # docs/fp8_state.md)
    "seed": ((1, 256), "float32", "dynamic"),          # the seed example's shape
    "small": ((517, 1000), "float32", "dynamic"),      # 517,000: a partial last block
    "small_linspace": ((300, 1001), "float32", "linspace"),
    "small_fp16": ((257, 999), "float16", "dynamic"),
    "small_bf16": ((255, 1003), "bfloat16", "dynamic"),
    "medium": ((4096, 4096), "float32", "dynamic"),    # 16.8M
    "large": ((8192, 8192), "float32", "dynamic"),     # 67M: the benchmark's size
    "small_fp8": ((517, 1000), "float32", "fp8"),      # a partial last block
    "small_fp8_bf16": ((255, 1003), "bfloat16", "fp8"),
    "small_fp8_fp16": ((257, 999), "float16", "fp8"),
    "medium_fp8": ((4096, 4096), "float32", "fp8"),    # the main job's FP8 size
    "large_fp8": ((8192, 8192), "float32", "fp8"),
    "small_fp8_ue3m5": ((517, 1000), "float32", "fp8_ue3m5"),
    "small_fp8_ue3m5_bf16": ((255, 1003), "bfloat16", "fp8_ue3m5"),
    "medium_fp8_ue3m5": ((4096, 4096), "float32", "fp8_ue3m5"),
}

# The main job's size: 16.8M elements, large enough for a meaningful speed (the seed example's own
# [1, 256] runs in the tests).
DEFAULT_SIZE = "medium"

# The flows scripts/main.sh runs besides the main size, per mode ("default", or "small" for
# --small): the FP8 state formats at the same shape.
EXTRA_SIZES = {"default": ["medium_fp8", "medium_fp8_ue3m5"],
               "small": ["small_fp8", "small_fp8_ue3m5"]}

DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}


def _load_powf():
    # beta^t in float32 is the C library's powf, as CANN's kernel and fusekit's compute it. NumPy's
    # float32 power is not that function (0.9^4: 0.6561 against powf's 0.6560999), nor is a
    # float64 pow rounded once (they differ for about 1% of (beta, t) pairs): both would put the
    # golden a few ulps off the kernel at some steps.
    name = ctypes.util.find_library("m") or "libm.so.6"
    try:
        f = ctypes.CDLL(name).powf
    except (OSError, AttributeError):
        return None
    f.restype, f.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
    return f


_POWF = _load_powf()


def powf(base, exponent):
    if _POWF is None:  # no C library to ask: float64, rounded once
        return F32(np.power(np.float64(base), np.float64(exponent)))
    return F32(_POWF(F32(base), F32(exponent)))


def create_dynamic_map(signed=True, max_exponent_bits=7):
    """bitsandbytes' create_dynamic_map construction, in float64, rounded once to float32."""
    e = min(max(max_exponent_bits, 1), 7)
    non_sign_bits = 7
    data = []

    def decade(scale, parts):
        for k in range(parts):
            lo, hi = 0.1 + 0.9 * k / parts, 0.1 + 0.9 * (k + 1) / parts
            data.append(scale * ((lo + hi) / 2.0))
            if signed:
                data.append(-scale * ((lo + hi) / 2.0))

    for i in range(e):
        parts = 2 ** (i + non_sign_bits - e) if signed else 2 ** (i + non_sign_bits - e + 1)
        decade(10.0 ** (-(e - 1) + i), parts)
    extra = 2 ** (non_sign_bits - e) - 1
    if extra > 0:
        decade(1.0, extra)
    data += [0.0, 1.0]
    data += [0.0] * (256 - len(data))
    return np.array(sorted(data[:256]), dtype=np.float64).astype(F32)


# ---- 16-bit storage ---------------------------------------------------------------------------
def widen(a, dtype):
    if dtype == "float32":
        return a.astype(F32)
    if dtype == "float16":
        return a.view(np.float16).astype(F32)
    return (a.view(np.uint16).astype(np.uint32) << 16).view(F32)


def narrow(x, dtype):
    """float32 -> storage, round to nearest even."""
    if dtype == "float32":
        return x.astype(F32)
    if dtype == "float16":
        return x.astype(np.float16)
    b = x.astype(F32).view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    nan = ((b >> 16) | 0x40).astype(np.uint16)
    return np.where(np.isnan(x), nan, r).astype(np.uint16)


def storage_dtype(dtype):
    return {"float32": F32, "float16": np.float16, "bfloat16": np.uint16}[dtype]


# ---- the golden step --------------------------------------------------------------------------
def nearest_code(q, x, sign_fix):
    """The map entry nearest to x (float32 distances to the two bracketing entries), lowest index
    on ties; then, for m with a map holding negatives, the sign fix."""
    x = np.where(np.isnan(x), F32(0), x).astype(F32)
    hi = np.minimum(np.searchsorted(q, x, side="left"), 255)
    lo = np.maximum(hi - 1, 0)
    d_hi = q[hi] - x
    d_lo = x - q[lo]
    pick = np.where(d_hi < d_lo, hi, lo)
    code = np.searchsorted(q, q[pick], side="left")
    if sign_fix and q[0] < 0:
        flip = (x * q[code]) < 0
        code = np.where(flip, np.clip(code + np.where(x > 0, 1, -1), 0, 255), code)
    return code.astype(np.uint8)


def golden_step(var, grad, m, v, qm, qv, am, av, step, lr, beta1, beta2, wd, eps, gnorm, dtype,
                guard_lost_v=False):
    """var, grad: storage arrays (flat); m, v: uint8 (flat); am, av: float32 [blocks].
    Returns new (var, m, v, am, av, skipped_blocks).

    guard_lost_v (docs/fp8_state.md, "The lost-v guard"): where the dequantized old v is 0 and the
    dequantized old m is not, the old v is taken as m * m before the update. Off by default:
    CANN's arithmetic, bit for bit today's results."""
    with np.errstate(all="ignore"):  # the skipped blocks compute NaN on the way
        return _golden_step(var, grad, m, v, qm, qv, am, av, step, lr, beta1, beta2, wd, eps, gnorm, dtype,
                            guard_lost_v)


def _golden_step(var, grad, m, v, qm, qv, am, av, step, lr, beta1, beta2, wd, eps, gnorm, dtype,
                 guard_lost_v=False):
    b1, b2, lr, wd, eps, gs = F32(beta1), F32(beta2), F32(lr), F32(wd), F32(eps), F32(gnorm)
    t = F32(step + 1)
    c1 = F32(1) - powf(b1, t)
    c2s = np.sqrt(F32(1) - powf(b2, t), dtype=F32)
    step_size = F32(F32(-lr * c2s) / c1)
    eps_c2s = F32(eps * c2s)
    decay = F32(F32(1) - lr * wd)
    omb1, omb2 = F32(1) - b1, F32(1) - b2

    n = var.size
    nb = (n + BLOCK - 1) // BLOCK
    pad = nb * BLOCK - n
    valid = np.ones(nb * BLOCK, bool)
    valid[n:] = False
    valid = valid.reshape(nb, BLOCK)

    def blocks(a, fill):
        return np.concatenate([a, np.full(pad, fill, a.dtype)]).reshape(nb, BLOCK)

    w0 = blocks(widen(var, dtype), 0)
    g = blocks(widen(grad, dtype), 0)
    grad_finite = np.all(np.isfinite(g), axis=1)
    g = g * gs
    mm = qm[blocks(m, 0)] * am[:, None]
    vv = qv[blocks(v, 0)] * av[:, None]
    if guard_lost_v:  # the lost second moment: the smallest one consistent with |m| <= sqrt(v)
        vv = np.where((vv == 0) & (mm != 0), mm * mm, vv)
    mm = mm * b1 + g * omb1
    vv = vv * b2 + (g * g) * omb2
    w = w0 + (mm * step_size) / (np.sqrt(vv) + eps_c2s)
    if wd > 0:
        w = w * decay
    # The guard on what the step produces: every new m, v and var (as stored) of the block finite.
    stored_w = widen(narrow(w.ravel(), dtype), dtype).reshape(nb, BLOCK)
    produced = np.isfinite(mm) & np.isfinite(vv) & np.isfinite(stored_w)
    finite = grad_finite & np.all(np.where(valid, produced, True), axis=1)
    new_am = np.max(np.where(valid, np.abs(mm), F32(0)), axis=1) + F32(0)
    new_av = np.max(np.where(valid, vv, F32(-np.inf)), axis=1) + F32(0)
    div_m = np.where(new_am == 0, F32(1), new_am)[:, None]
    div_v = np.where(new_av == 0, F32(1), new_av)[:, None]
    new_mc = nearest_code(qm, (mm / div_m).astype(F32), True)
    new_vc = nearest_code(qv, (vv / div_v).astype(F32), False)

    # Blocks that fail the guard keep everything.
    out_var = np.where(finite[:, None], narrow(w.ravel(), dtype).reshape(nb, BLOCK).view(var.dtype),
                       blocks(var, 0)).ravel()[:n]
    out_m = np.where(finite[:, None], new_mc, blocks(m, 0)).ravel()[:n]
    out_v = np.where(finite[:, None], new_vc, blocks(v, 0)).ravel()[:n]
    out_am = np.where(finite, new_am, am).astype(F32)
    out_av = np.where(finite, new_av, av).astype(F32)
    return out_var, out_m.astype(np.uint8), out_v.astype(np.uint8), out_am, out_av, int(np.sum(~finite))


# ---- the flow ---------------------------------------------------------------------------------
def make_inputs(shape, dtype, maps, seed):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    nb = (n + BLOCK - 1) // BLOCK
    if maps == "dynamic":
        qm, qv = create_dynamic_map(True), create_dynamic_map(False)
    else:
        qm, qv = np.linspace(-1, 1, 256).astype(F32), np.linspace(0, 1, 256).astype(F32)
    var = narrow(rng.uniform(-1, 1, n).astype(F32), dtype)
    grad = rng.normal(0, 0.01, n).astype(F32)
    if nb > 3:
        grad[BLOCK + 5] = np.nan  # a non-finite block, left unchanged
    grad = narrow(grad, dtype)
    m = rng.integers(0, 256, n, dtype=np.uint8)
    v = rng.integers(0, 256, n, dtype=np.uint8)
    am = rng.uniform(0.001, 0.05, nb).astype(F32)
    av = rng.uniform(1e-6, 1e-3, nb).astype(F32)
    if nb > 2:
        am[2] = 0  # an all-zero moment block
    return var, grad, m, v, qm, qv, am, av


def make_fp8_inputs(shape, dtype, seed, v_format="ue4m4"):
    """Inputs in the FP8 state format: m and sqrt(v) drawn per block (magnitudes 1e-5 to 1e-1 of
    block to block, elements spread over the codes' whole range, subnormal codes included) and
    coded by golden/fp8_state.py's block rule, as a run leaves them; then the cases the format's
    definition names: an all-zero block (scale 0), a block whose v codes are all 0 under a non-zero
    m (the lost-v guard on every element), a few lost v elsewhere, an E4M3 NaN code (non-finite
    state: the block is left unchanged), a NaN gradient (the same). v_format: sqrt(v)'s code
    ("ue4m4", state format fp8; "ue3m5", fp8_ue3m5)."""
    from golden.fp8_state import quantize_blocks  # (it imports this module)
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    nb = (n + BLOCK - 1) // BLOCK
    var = narrow(rng.uniform(-1, 1, n).astype(F32), dtype)
    grad = rng.normal(0, 0.01, n).astype(F32)
    if nb > 3:
        grad[BLOCK + 5] = np.nan  # a non-finite block, left unchanged
    grad = narrow(grad, dtype)
    valid = np.arange(nb * BLOCK).reshape(nb, BLOCK) < n
    mag = (10.0 ** rng.uniform(-5, -1, (nb, 1))).astype(F32)
    mm = (rng.standard_normal((nb, BLOCK)) * mag * np.exp(rng.uniform(-6, 0, (nb, BLOCK)))).astype(F32)
    ss = (np.abs(rng.standard_normal((nb, BLOCK))) * mag * 2).astype(F32)
    mc, sm = quantize_blocks(mm, "e4m3", valid)
    vc, sv = quantize_blocks(ss, v_format, valid)
    if nb > 2:  # an all-zero m block
        mc[2], sm[2] = 0, F32(0)
    if nb > 6:
        vc[4], sv[4] = 0, F32(0)  # every v lost under a non-zero m: the guard on the whole block
        vc[6, ::7] = 0  # a few lost v
    if nb > 5:
        mc[5, 17] = 0x7F  # E4M3's NaN code: non-finite state, the block left unchanged
    m = mc.ravel()[:n].copy()
    v = vc.ravel()[:n].copy()
    return var, grad, m, v, sm.astype(F32), sv.astype(F32)


def generate(out_dir, size="seed", seed=0):
    shape, dtype, maps = SIZES[size]
    if maps in ("fp8", "fp8_ue3m5"):
        return generate_fp8(out_dir, size, seed)
    var, grad, m, v, qm, qv, am, av = make_inputs(shape, dtype, maps, seed)
    step, lr, beta1, beta2, wd, eps, gnorm = 9, 1e-3, 0.9, 0.999, 0.01, 1e-8, 0.5
    ins = {"var": var, "grad": grad, "m": m, "v": v, "qmap_m": qm, "qmap_v": qv, "absmax_m": am,
           "absmax_v": av, "step": np.array([step], np.int64)}
    for name, a in ins.items():
        write_bin(f"{out_dir}/input/{name}.bin", a)
    gvar, gm, gv, gam, gav, skipped = golden_step(var, grad, m, v, qm, qv, am, av, step, lr, beta1, beta2,
                                                  wd, eps, gnorm, dtype)
    for name, a in {"var": gvar, "m": gm, "v": gv, "absmax_m": gam, "absmax_v": gav}.items():
        write_bin(f"{out_dir}/golden/{name}.bin", a)
    write_params(f"{out_dir}/params.txt", dict(rows=shape[0], cols=shape[1], dtype=dtype,
                                               dtype_code=DTYPE_CODES[dtype], step=step, lr=lr, beta1=beta1,
                                               beta2=beta2, weight_decay=wd, eps=eps, gnorm_scale=gnorm,
                                               skipped_blocks=skipped, maps=maps,
                                               state_format="dynamic_map", seed=seed, size=size))


def generate_fp8(out_dir, size, seed):
    """An FP8 state format's flow: inputs (make_fp8_inputs), golden from golden/fp8_state.py (no
    map files; absmax_m and absmax_v hold the blocks' scales)."""
    from golden.fp8_state import apply_adam_w_quant_fp8
    shape, dtype, fmt = SIZES[size]
    v_format = "ue3m5" if fmt == "fp8_ue3m5" else "ue4m4"
    var, grad, m, v, sm, sv = make_fp8_inputs(shape, dtype, seed, v_format)
    step, lr, beta1, beta2, wd, eps, gnorm = 9, 1e-3, 0.9, 0.999, 0.01, 1e-8, 0.5
    ins = {"var": var, "grad": grad, "m": m, "v": v, "absmax_m": sm, "absmax_v": sv,
           "step": np.array([step], np.int64)}
    for name, a in ins.items():
        write_bin(f"{out_dir}/input/{name}.bin", a)
    gvar, gm, gv, gsm, gsv, skipped = apply_adam_w_quant_fp8(
        var, grad, m, v, sm, sv, step, lr, beta1, beta2, wd, eps, gnorm, dtype=dtype,
        grad_dtype=dtype, v_format=v_format)
    for name, a in {"var": gvar, "m": gm, "v": gv, "absmax_m": gsm, "absmax_v": gsv}.items():
        write_bin(f"{out_dir}/golden/{name}.bin", a)
    write_params(f"{out_dir}/params.txt", dict(rows=shape[0], cols=shape[1], dtype=dtype,
                                               dtype_code=DTYPE_CODES[dtype], step=step, lr=lr, beta1=beta1,
                                               beta2=beta2, weight_decay=wd, eps=eps, gnorm_scale=gnorm,
                                               skipped_blocks=skipped, maps="none",
                                               state_format=fmt, seed=seed, size=size))


def verify(out_dir):
    p = read_params(f"{out_dir}/params.txt")
    dtype = p["dtype"]
    st = storage_dtype(dtype)
    results = []
    for name in ["m", "v"]:
        real = read_bin(f"{out_dir}/output/{name}.bin", np.uint8)
        gold = read_bin(f"{out_dir}/golden/{name}.bin", np.uint8)
        results.append(bitwise_result(name, real, gold))
    # (16-bit var widened to float32: exact, so its bits are the storage's)
    real = widen(read_bin(f"{out_dir}/output/var.bin", st), dtype)
    gold = widen(read_bin(f"{out_dir}/golden/var.bin", st), dtype)
    results.append(bitwise_result("var", real, gold))
    for name in ["absmax_m", "absmax_v"]:
        real = read_bin(f"{out_dir}/output/{name}.bin", F32)
        gold = read_bin(f"{out_dir}/golden/{name}.bin", F32)
        results.append(bitwise_result(name, real, gold))
    return results
