"""The FP8 state format of the 8-bit optimizers (issue #33): the NumPy golden, written from
docs/fp8_state.md only (not from the C++).

  m: E4M3 (float8_e4m3fn) of m / scaleM;  v: UE4M4 of sqrt(v) / scaleV;  per block of 256 (a row's
  block of 256 columns for LazyAdamQuant) scale = the block's max |x| / the format's largest value
  (448, 496); decode = value(code) * scale in float32.

  encode (float32 x, finite): the nearest code, ties to even (the code whose last mantissa bit is
  0), magnitudes above the largest value saturate to it; E4M3 keeps the sign (-0.0 -> 0x80), its
  codes 0x7f and 0xff decode to NaN (never written).

  the step: the operator's own float32 arithmetic (golden/apply_adam_w_quant.py,
  golden/lazy_adam_quant.py) between two new ends:
    m_old = value_E4M3(mCode) * scaleM;  s_old = value_UE4M4(vCode) * scaleV;  v_old = s_old^2
    the lost-v guard (always on): v_old = m_old * m_old where v_old == 0 and m_old != 0
    ... the Adam step, with s = sqrt(v) the value the update divides by and the value stored ...
    the guard on what the step produces (a block / row with a non-finite new m, v or var as stored
    is left bit for bit unchanged and counted); store var, then per block the scale and codes of m
    (E4M3) and of s (UE4M4).

Also E5M2 (float8_e5m2: 1 sign, 5 exponent bits with bias 15, 2 mantissa bits, largest finite
57344, saturating there; codes 0x7c / 0xfc are +-Inf, 0x7d..0x7f / 0xfd..0xff NaN), for the
format study only (tools/fp8_v_format_study.py): fusekit does not store it. And UE3M5 (unsigned,
3 exponent bits with bias 3, 5 mantissa bits, every code finite, largest 31.5): one more mantissa
bit for sqrt(v) than UE4M4, a 2^12 range instead of 2^19; the state format fp8_ue3m5
(ApplyAdamWQuant only) is the same step with sqrt(v) as UE3M5 (apply_adam_w_quant_fp8's
v_format="ue3m5")."""
import numpy as np

from golden.apply_adam_w_quant import narrow, powf, widen

F32 = np.float32
BLOCK = 256
TINY = F32(2.0 ** -96)  # a block whose max |x| is below this is stored as zero (scale 0, codes 0)

# fmt: (signed, exponent bits, mantissa bits, bias, largest finite code of the positive half)
_FORMATS = {
    "e4m3": (True, 4, 3, 7, 0x7E),
    "ue4m4": (False, 4, 4, 7, 0xFF),
    "e5m2": (True, 5, 2, 15, 0x7B),
    "ue3m5": (False, 3, 5, 3, 0xFF),
}


def _value64(code, fmt):
    """The value of one code, from the formulas of docs/fp8_state.md (float64, exact)."""
    signed, ebits, mbits, bias, _ = _FORMATS[fmt]
    sign = (code >> 7) & 1 if signed else 0
    mag = code & 0x7F if signed else code
    e, f = mag >> mbits, mag & ((1 << mbits) - 1)
    if fmt == "e4m3" and mag == 0x7F:
        return np.nan
    if fmt == "e5m2" and e == 31:
        val = np.inf if f == 0 else np.nan
    elif e == 0:
        val = f * 2.0 ** (1 - bias - mbits)  # E4M3: f * 2^-9; UE4M4: f * 2^-10; E5M2: f * 2^-16
    else:
        val = 2.0 ** (e - bias) * (1 + f / 2.0 ** mbits)
    return -val if sign else val


_TABLES = {fmt: np.array([_value64(c, fmt) for c in range(256)], np.float64).astype(F32)
           for fmt in _FORMATS}
MAX = {fmt: _TABLES[fmt][_FORMATS[fmt][4]] for fmt in _FORMATS}  # 448, 496, 57344, 31.5
MIN_NORMAL = {fmt: F32(2.0 ** (1 - _FORMATS[fmt][3])) for fmt in _FORMATS}  # 2^-6 2^-6 2^-14 2^-2


def fp8_values(fmt):
    """The 256 values of the format (float32, index = code; a copy)."""
    return _TABLES[fmt].copy()


def fp8_decode(codes, fmt):
    """value(code) in float32 (exact); E4M3 0x80 is -0.0, 0x7f / 0xff NaN."""
    return _TABLES[fmt][np.asarray(codes, np.uint8)]


def fp8_encode(x, fmt):
    """The code nearest to float32 x, ties to even, saturating at the largest finite value (the
    rules of docs/fp8_state.md; E5M2 by the same construction). x is taken as float32 (a float64
    argument is rounded to float32 first). The rules are for finite x; +-Inf saturates like any
    large magnitude, NaN is outside them (it codes as the largest value)."""
    signed, ebits, mbits, bias, maxcode = _FORMATS[fmt]
    x = np.asarray(x, F32)
    a = np.abs(x)
    with np.errstate(invalid="ignore"):
        # a < the smallest normal: round_half_even(a * 2^(bias - 1 + mbits)), exact in float32
        small = a < MIN_NORMAL[fmt]
        sub = np.rint(np.where(small, a, F32(0)) * F32(2.0 ** (bias - 1 + mbits))).astype(np.int64)
    # a >= the smallest normal: float32 bits rounded to nearest even at mbits, rebiased 127 -> bias
    b = a.view(np.uint32).astype(np.int64)
    shift = 23 - mbits
    norm = ((b + ((1 << (shift - 1)) - 1) + ((b >> shift) & 1)) >> shift) - ((127 - bias) << mbits)
    code = np.minimum(np.where(small, sub, norm), maxcode)
    if signed:
        code = code | ((x.view(np.uint32).astype(np.int64) >> 31) << 7)
    return code.astype(np.uint8)


def e4m3_decode(codes):
    return fp8_decode(codes, "e4m3")


def e4m3_encode(x):
    return fp8_encode(x, "e4m3")


def ue4m4_decode(codes):
    return fp8_decode(codes, "ue4m4")


def ue4m4_encode(x):
    return fp8_encode(x, "ue4m4")


# ---- blocks -----------------------------------------------------------------------------------
def quantize_blocks(x, fmt, valid=None):
    """x float32 [nb, k] (one block a row), valid bool [nb, k] or None (all). Returns codes uint8
    [nb, k] (0 where not valid) and scales float32 [nb]:
      a = max |x| over the valid elements, + 0;  a < 2^-96: scale 0, codes 0
      else scale = a / MAX, inv = MAX / a (float32 divisions), code = encode(x * inv)."""
    x = np.asarray(x, F32)
    if valid is None:
        valid = np.ones(x.shape, bool)
    top = MAX[fmt]
    with np.errstate(all="ignore"):
        a = (np.max(np.where(valid, np.abs(x), F32(0)), axis=1) + F32(0)).astype(F32)
        zero = ~(a >= TINY)  # a < 2^-96 (a NaN block: the guard refuses it before it is stored)
        safe = np.where(zero, F32(1), a).astype(F32)
        scale = np.where(zero, F32(0), (safe / top).astype(F32)).astype(F32)
        inv = (top / safe).astype(F32)
        codes = fp8_encode((x * inv[:, None]).astype(F32), fmt)
    codes = np.where(valid & ~zero[:, None], codes, np.uint8(0)).astype(np.uint8)
    return codes, scale


def quantize_block(x, fmt):
    """One block (any number of elements): (codes, scale)."""
    x = np.asarray(x, F32)
    codes, scale = quantize_blocks(x.reshape(1, -1), fmt)
    return codes.reshape(x.shape), scale[0]


def dequantize(codes, scale, fmt):
    """value(code) * scale in float32; scale broadcasts against codes as NumPy does (one block's
    scalar, or scales[:, None] for [blocks, 256] codes)."""
    return (fp8_decode(codes, fmt) * np.asarray(scale, F32)).astype(F32)


def _dtype_of(a):
    return {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16",
            np.dtype(np.uint16): "bfloat16"}[np.asarray(a).dtype]


# ---- ApplyAdamWQuant, FP8 state ---------------------------------------------------------------
def apply_adam_w_quant_fp8(var, grad, m_codes, v_codes, scale_m, scale_v, step, lr, beta1, beta2,
                           weight_decay, eps, gnorm_scale, *, dtype=None, grad_dtype=None,
                           v_format="ue4m4", _guard_lost_v=True):
    """One ApplyAdamWQuant step on FP8 state. var, grad: storage arrays of any (equal) size
    (float32, float16, or uint16 holding bfloat16; dtype / grad_dtype name them where the array's
    dtype does not: "float32", "float16", "bfloat16"); m_codes, v_codes: uint8 of var's size;
    scale_m, scale_v: float32 [ceil(n / 256)], blocks of 256 over the flattened tensor, the last
    one partial. Returns new (var, m_codes, v_codes, scale_m, scale_v, blocks_skipped), each array
    in its input's shape. v_format: sqrt(v)'s code, "ue4m4" (state format fp8) or "ue3m5"
    (fp8_ue3m5). _guard_lost_v=False is for studies only: the format has the guard on."""
    assert v_format in ("ue4m4", "ue3m5"), v_format
    with np.errstate(all="ignore"):  # the skipped blocks compute NaN on the way
        return _apply_fp8(var, grad, m_codes, v_codes, scale_m, scale_v, step, lr, beta1, beta2,
                          weight_decay, eps, gnorm_scale, dtype or _dtype_of(var),
                          grad_dtype or _dtype_of(grad), _guard_lost_v, v_format)


def _apply_fp8(var, grad, mc, vc, sm, sv, step, lr, beta1, beta2, wd, eps, gnorm, dtype, gdtype,
               guard, v_format="ue4m4"):
    b1, b2, lr, wd, eps, gs = F32(beta1), F32(beta2), F32(lr), F32(wd), F32(eps), F32(gnorm)
    t = F32(step + 1)
    c1 = F32(1) - powf(b1, t)
    c2s = np.sqrt(F32(1) - powf(b2, t), dtype=F32)
    step_size = F32(F32(-lr * c2s) / c1)
    eps_c2s = F32(eps * c2s)
    decay = F32(F32(1) - lr * wd)
    omb1, omb2 = F32(1) - b1, F32(1) - b2

    shape = np.shape(var)
    var_f, mc_f, vc_f = np.ravel(var), np.ravel(mc).astype(np.uint8), np.ravel(vc).astype(np.uint8)
    sm, sv = np.asarray(sm, F32).ravel(), np.asarray(sv, F32).ravel()
    n = var_f.size
    nb = (n + BLOCK - 1) // BLOCK
    assert sm.size == nb and sv.size == nb and mc_f.size == n and vc_f.size == n
    pad = nb * BLOCK - n
    valid = np.arange(nb * BLOCK).reshape(nb, BLOCK) < n

    def blocks(a, fill):
        return np.concatenate([a, np.full(pad, fill, a.dtype)]).reshape(nb, BLOCK)

    w0 = blocks(widen(var_f, dtype), 0)
    g = blocks(widen(np.ravel(grad), gdtype), 0)
    grad_finite = np.all(np.isfinite(g), axis=1)
    g = g * gs
    m_old = e4m3_decode(blocks(mc_f, 0)) * sm[:, None]
    s_old = fp8_decode(blocks(vc_f, 0), v_format) * sv[:, None]
    v_old = s_old * s_old
    if guard:  # the lost-v guard
        v_old = np.where((v_old == 0) & (m_old != 0), m_old * m_old, v_old)
    mm = m_old * b1 + g * omb1
    vv = v_old * b2 + (g * g) * omb2
    ss = np.sqrt(vv)
    w = w0 + (mm * step_size) / (ss + eps_c2s)
    if wd > 0:
        w = w * decay
    stored = narrow(w.ravel(), dtype)
    produced = np.isfinite(mm) & np.isfinite(vv) & np.isfinite(widen(stored, dtype).reshape(nb, BLOCK))
    finite = grad_finite & np.all(np.where(valid, produced, True), axis=1)
    new_mc, new_sm = quantize_blocks(mm, "e4m3", valid)
    new_vc, new_sv = quantize_blocks(ss, v_format, valid)

    # Blocks that fail the guard keep everything.
    keep = finite[:, None]
    out_var = np.where(keep, stored.reshape(nb, BLOCK).view(var_f.dtype), blocks(var_f, 0)).ravel()[:n]
    out_mc = np.where(keep, new_mc, blocks(mc_f, 0)).ravel()[:n].astype(np.uint8)
    out_vc = np.where(keep, new_vc, blocks(vc_f, 0)).ravel()[:n].astype(np.uint8)
    out_sm = np.where(finite, new_sm, sm).astype(F32)
    out_sv = np.where(finite, new_sv, sv).astype(F32)
    return (out_var.astype(var_f.dtype).reshape(shape), out_mc.reshape(np.shape(mc)),
            out_vc.reshape(np.shape(vc)), out_sm, out_sv, int(np.sum(~finite)))


# ---- LazyAdamQuant, FP8 state -----------------------------------------------------------------
def lazy_adam_quant_fp8(var, grad, indices, m_codes, v_codes, scale_m, scale_v, lr_t, beta1, beta2,
                        epsilon, *, dtype=None, grad_dtype=None, _guard_lost_v=True):
    """One LazyAdamQuant step on FP8 state. var [R, D] (storage of dtype: float32, float16 or
    uint16 holding bfloat16); grad [N, D] (storage of grad_dtype); indices [N] (negative: padding;
    a row named again has its gradients summed in order of occurrence, in float32); m_codes,
    v_codes uint8 [R, D]; scale_m, scale_v float32 [R, ceil(D / 256)]. Returns new
    (var, m_codes, v_codes, scale_m, scale_v, rows_skipped) (copies; the inputs are not written).
    _guard_lost_v=False is for studies only: the format has the guard on."""
    with np.errstate(all="ignore"):  # skipped rows compute NaN and Inf on the way
        return _lazy_fp8(var, grad, indices, m_codes, v_codes, scale_m, scale_v, lr_t, beta1, beta2,
                         epsilon, dtype or _dtype_of(var), grad_dtype or _dtype_of(grad),
                         _guard_lost_v)


def _lazy_fp8(var, grad, indices, mc, vc, sm, sv, lr, beta1, beta2, eps, dtype, gdtype, guard):
    b1, b2, e, lr = F32(beta1), F32(beta2), F32(eps), F32(lr)
    omb1, omb2 = F32(1) - b1, F32(1) - b2
    var, mc, vc = var.copy(), mc.copy(), vc.copy()
    sm, sv = np.asarray(sm, F32).copy(), np.asarray(sv, F32).copy()
    R, D = mc.shape
    nb = (D + BLOCK - 1) // BLOCK
    assert sm.shape == (R, nb) and sv.shape == (R, nb) and var.shape == (R, D)
    idx = np.asarray(indices).astype(np.int64).ravel()
    keep = idx >= 0
    g_all = widen(np.asarray(grad).reshape(-1), gdtype).reshape(-1, D)[keep]
    ki = idx[keep]
    rows = np.unique(ki)
    if len(rows) == 0:
        return var, mc, vc, sm, sv, 0
    # The sum of each row's gradients in order of occurrence, left to right, in float32.
    order = np.argsort(ki, kind="stable")
    starts = np.searchsorted(ki[order], rows)
    counts = np.diff(np.append(starts, len(order)))
    g = g_all[order[starts]].copy()
    for k in range(1, int(counts.max())):
        sel = counts > k
        g[sel] = g[sel] + g_all[order[starts[sel] + k]]

    per_col = lambda a: np.repeat(a[rows], BLOCK, axis=1)[:, :D]  # noqa: E731  (scale per column)
    m_old = e4m3_decode(mc[rows]) * per_col(sm)
    s_old = ue4m4_decode(vc[rows]) * per_col(sv)
    v_old = s_old * s_old
    if guard:  # the lost-v guard
        v_old = np.where((v_old == 0) & (m_old != 0), m_old * m_old, v_old)
    mm = m_old * b1 + g * omb1
    vv = np.abs(v_old * b2 + (g * g) * omb2)
    ss = np.sqrt(vv)
    w = widen(var[rows].reshape(-1), dtype).reshape(len(rows), D) + (mm * (-lr)) / (ss + e)
    w_stored = narrow(w.reshape(-1), dtype)
    finite = np.all(np.isfinite(mm) & np.isfinite(vv) &
                    np.isfinite(widen(w_stored, dtype).reshape(len(rows), D)), axis=1)
    skipped = int(np.sum(~finite))
    rows, mm, ss = rows[finite], mm[finite], ss[finite]
    w_stored = w_stored.reshape(-1, D)[finite]
    if len(rows) == 0:
        return var, mc, vc, sm, sv, skipped

    # Per row and block of 256 columns (the last one partial): scales and codes. A row of at most
    # 256 columns is one block as it is (no padding: the seed's 564,096 rows of 32 padded to 256
    # took 8 GiB of temporaries).
    k = len(rows)
    width = BLOCK if nb > 1 else D
    pad = nb * width - D
    in_row = np.arange(nb * width).reshape(nb, width) < D
    valid = np.broadcast_to(in_row, (k, nb, width)).reshape(k * nb, width)

    def as_blocks(a):
        return np.concatenate([a, np.zeros((k, pad), F32)], axis=1).reshape(k * nb, width)

    new_mc, new_sm = quantize_blocks(as_blocks(mm), "e4m3", valid)
    new_vc, new_sv = quantize_blocks(as_blocks(ss), "ue4m4", valid)
    mc[rows] = new_mc.reshape(k, nb * width)[:, :D]
    vc[rows] = new_vc.reshape(k, nb * width)[:, :D]
    sm[rows] = new_sm.reshape(k, nb)
    sv[rows] = new_sv.reshape(k, nb)
    var[rows] = w_stored.view(var.dtype)
    return var, mc, vc, sm, sv, skipped
