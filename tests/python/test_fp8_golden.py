"""Self-checks of golden/fp8_state.py (docs/fp8_state.md's FP8 state format, issue #33) and of the
lost-v guard added to the dynamic-map goldens: NumPy only, recorded seeds.

The codes are checked against an independent float64 brute-force search (the nearest of the
format's finite values, ties to the even code), not against the golden's own bit rule; the steps
against a float64 re-derivation of the Adam arithmetic, within the format's rounding bounds."""
import numpy as np
import pytest

from golden import fp8_state as fp8
from golden.apply_adam_w_quant import create_dynamic_map, golden_step, narrow, powf, widen
from golden.lazy_adam_quant import lazy_adam_quant_golden

F32 = np.float32
FORMATS = ["e4m3", "ue4m4", "e5m2", "ue3m5"]  # e5m2 and ue3m5: the format study's only
SIGNED = {"e4m3": True, "ue4m4": False, "e5m2": True, "ue3m5": False}
LARGEST_CODE = {"e4m3": 0x7E, "ue4m4": 0xFF, "e5m2": 0x7B, "ue3m5": 0xFF}
LARGEST = {"e4m3": 448.0, "ue4m4": 496.0, "e5m2": 57344.0, "ue3m5": 31.5}
SMALLEST_NORMAL = {"e4m3": 2.0 ** -6, "ue4m4": 2.0 ** -6, "e5m2": 2.0 ** -14, "ue3m5": 2.0 ** -2}


# ---- an independent reference: the values from first principles, the nearest by search --------
def ref_value(code, fmt):
    """Written out again from the doc's words (not the golden's table)."""
    if fmt == "e4m3":
        s, e, f = code >> 7, (code >> 3) & 15, code & 7
        if (code & 0x7F) == 0x7F:
            return np.nan
        mag = f * 2.0 ** -9 if e == 0 else 2.0 ** (e - 7) * (1 + f / 8)
    elif fmt == "ue4m4":
        s, e, f = 0, code >> 4, code & 15
        mag = f * 2.0 ** -10 if e == 0 else 2.0 ** (e - 7) * (1 + f / 16)
    elif fmt == "ue3m5":
        s, e, f = 0, code >> 5, code & 31
        mag = f * 2.0 ** -7 if e == 0 else 2.0 ** (e - 3) * (1 + f / 32)
    else:
        s, e, f = code >> 7, (code >> 2) & 31, code & 3
        if e == 31:
            mag = np.inf if f == 0 else np.nan
        else:
            mag = f * 2.0 ** -16 if e == 0 else 2.0 ** (e - 15) * (1 + f / 4)
    return -mag if s else mag


def brute_force_encode(x, fmt):
    """float64 nearest search over the positive finite codes, ties to the even code, the sign
    bit of x added for the signed formats; beyond the largest value the nearest is the largest."""
    x = np.asarray(x, F32)
    codes = np.arange(LARGEST_CODE[fmt] + 1)
    vals = np.array([ref_value(c, fmt) for c in codes])
    a = np.abs(x.astype(np.float64))
    d = np.abs(vals[None, :] - a[:, None])
    best = d.min(axis=1, keepdims=True)
    tie = d == best
    # among the (at most two) nearest: the even code if there are two
    first = np.argmax(tie, axis=1)
    two = tie.sum(axis=1) > 1
    code = np.where(two & (first % 2 == 1), first + 1, first)
    if SIGNED[fmt]:
        code = code | (np.signbit(x).astype(np.int64) << 7)
    return code.astype(np.uint8)


def random_values(rng, n, fmt):
    """float32 magnitudes across the whole range: log-uniform 2^-149..2^24 (float32 subnormals to
    past saturation), uniform over the format's subnormals and first binades, and uniform in its
    normal range; random signs for the signed formats."""
    lo_norm = SMALLEST_NORMAL[fmt]
    parts = [
        2.0 ** rng.uniform(-149, 24, n),
        rng.uniform(0, 4 * lo_norm, n),
        rng.uniform(0, LARGEST[fmt] * 1.2, n),
    ]
    x = np.concatenate(parts).astype(F32)
    if SIGNED[fmt]:
        x = np.where(rng.random(x.size) < 0.5, -x, x).astype(F32)
    return x


# ---- the codes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_table_matches_the_doc(fmt):
    got = fp8.fp8_decode(np.arange(256, dtype=np.uint8), fmt)
    want = np.array([ref_value(c, fmt) for c in range(256)])
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert np.array_equal(got[ok].astype(np.float64), want[ok])  # exact in float32
    assert np.array_equal(np.signbit(got[ok]), np.signbit(want[ok]))
    assert float(fp8.MAX[fmt]) == LARGEST[fmt]
    assert float(np.nanmax(got[np.isfinite(got)])) == LARGEST[fmt]


def test_e4m3_nan_codes_and_negative_zero():
    d = fp8.e4m3_decode(np.array([0x7F, 0xFF, 0x80, 0x00, 0x7E, 0xFE], np.uint8))
    assert np.isnan(d[0]) and np.isnan(d[1])
    assert d[2] == 0 and np.signbit(d[2]) and not np.signbit(d[3])
    assert d[4] == 448 and d[5] == -448
    assert fp8.e4m3_encode(F32(-0.0)) == 0x80 and fp8.e4m3_encode(F32(0.0)) == 0x00
    # a negative magnitude that rounds to zero keeps its sign (the doc's rule)
    assert fp8.e4m3_encode(F32(-1e-30)) == 0x80
    assert np.all(np.isfinite(fp8.ue4m4_decode(np.arange(256, dtype=np.uint8))))


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_code_round_trips(fmt):
    codes = np.arange(256, dtype=np.uint8)
    vals = fp8.fp8_decode(codes, fmt)
    fin = np.isfinite(vals)
    assert np.array_equal(fp8.fp8_encode(vals[fin], fmt), codes[fin])
    # -0 (0x80) round-trips in the signed formats, as the sign is kept
    if SIGNED[fmt]:
        assert fp8.fp8_encode(fp8.fp8_decode(np.uint8(0x80), fmt), fmt) == 0x80
    # the non-finite codes are never produced: they re-encode to the largest finite value
    assert np.all(fp8.fp8_encode(np.abs(vals[np.isinf(vals)]), fmt) == LARGEST_CODE[fmt])


@pytest.mark.parametrize("fmt", FORMATS)
def test_ties_to_even_at_exact_midpoints(fmt):
    top = LARGEST_CODE[fmt]
    vals = np.array([ref_value(c, fmt) for c in range(top + 1)])
    lo = np.arange(top)
    mid = (vals[:-1] + vals[1:]) / 2
    mid32 = mid.astype(F32)
    assert np.array_equal(mid32.astype(np.float64), mid)  # the midpoints are float32 numbers
    even = np.where(lo % 2 == 0, lo, lo + 1)
    assert np.array_equal(fp8.fp8_encode(mid32, fmt), even.astype(np.uint8))
    assert np.array_equal(fp8.fp8_encode(np.nextafter(mid32, F32(np.inf)), fmt), (lo + 1).astype(np.uint8))
    assert np.array_equal(fp8.fp8_encode(np.nextafter(mid32, F32(0)), fmt), lo.astype(np.uint8))
    if SIGNED[fmt]:
        assert np.array_equal(fp8.fp8_encode(-mid32, fmt), (even | 0x80).astype(np.uint8))


@pytest.mark.parametrize("fmt", FORMATS)
def test_saturation(fmt):
    top, big = LARGEST_CODE[fmt], LARGEST[fmt]
    x = np.array([big, np.nextafter(F32(big), F32(np.inf)), big * 1.0625, big * 1.5, big * 2, 1e30,
                  np.finfo(F32).max, np.inf], F32)
    assert np.all(fp8.fp8_encode(x, fmt) == top)
    if SIGNED[fmt]:
        assert np.all(fp8.fp8_encode(-x, fmt) == (top | 0x80))
    else:  # UE4M4 codes |x|
        assert np.all(fp8.fp8_encode(-x, fmt) == top)


@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_is_monotonic(fmt):
    rng = np.random.default_rng(20240533)
    x = random_values(rng, 20000, fmt)
    if not SIGNED[fmt]:
        x = np.abs(x)  # UE4M4 codes |x|
    x = np.sort(x)
    d = fp8.fp8_decode(fp8.fp8_encode(x, fmt), fmt).astype(np.float64)
    assert np.all(np.diff(d) >= 0)
    # and over the codes themselves: the positive half is ordered by code
    pos = x[x >= 0]
    assert np.all(np.diff(fp8.fp8_encode(pos, fmt).astype(np.int64)) >= 0)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("seed", [1, 33])
def test_encode_equals_brute_force_nearest(fmt, seed):
    rng = np.random.default_rng(seed)
    x = random_values(rng, 6000, fmt)
    if not SIGNED[fmt]:
        x = np.abs(x)
    want = brute_force_encode(x, fmt)
    got = fp8.fp8_encode(x, fmt)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} differ, e.g. x={x[bad[:5]]} got={got[bad[:5]]} want={want[bad[:5]]}"


def test_named_encoders_are_the_generic_ones():
    rng = np.random.default_rng(7)
    x = random_values(rng, 1000, "e4m3")
    assert np.array_equal(fp8.e4m3_encode(x), fp8.fp8_encode(x, "e4m3"))
    assert np.array_equal(fp8.ue4m4_encode(np.abs(x)), fp8.fp8_encode(np.abs(x), "ue4m4"))
    c = np.arange(256, dtype=np.uint8)
    assert np.array_equal(fp8.e4m3_decode(c), fp8.fp8_decode(c, "e4m3"), equal_nan=True)
    assert np.array_equal(fp8.ue4m4_decode(c), fp8.fp8_decode(c, "ue4m4"))


# ---- blocks -----------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["e4m3", "ue4m4"])
def test_quantize_block_rules(fmt):
    rng = np.random.default_rng(5)
    top = F32(LARGEST[fmt])
    x = (rng.standard_normal(256) * 0.01).astype(F32)
    if fmt == "ue4m4":
        x = np.abs(x)
    codes, scale = fp8.quantize_block(x, fmt)
    a = F32(np.max(np.abs(x)))
    assert scale == F32(a / top)
    assert np.array_equal(codes, fp8.fp8_encode((x * F32(top / a)).astype(F32), fmt))
    # the largest element takes the largest code (or its negative)
    assert codes[np.argmax(np.abs(x))] & 0x7F == LARGEST_CODE[fmt] & 0x7F
    # decoding: within half a step of the format (relative 2^-(mantissa bits + 1) in the normal range)
    dq = fp8.dequantize(codes, scale, fmt)
    mbits = 3 if fmt == "e4m3" else 4
    sub_step = float(scale) * 2.0 ** (-9 if fmt == "e4m3" else -10)
    err = np.abs(dq.astype(np.float64) - x)
    assert np.all(err <= np.maximum(np.abs(x) * 2.0 ** -(mbits + 1), sub_step / 2) * (1 + 1e-5))
    # a block below 2^-96 is stored as zero; at 2^-96 it is not
    just_below = np.nextafter(F32(2.0 ** -96), F32(0))
    for tiny, zero in [(2.0 ** -97, True), (just_below, True), (2.0 ** -96, False)]:
        c, s = fp8.quantize_block(np.array([tiny, tiny / 4, 0], F32), fmt)
        assert (s == 0 and not c.any()) if zero else (s > 0 and c[0] & 0x7F == LARGEST_CODE[fmt] & 0x7F)
    # an all-zero block, -0 included: scale +0, every code 0 (not 0x80)
    c, s = fp8.quantize_block(np.array([-0.0, 0.0, -0.0], F32), fmt)
    assert s == 0 and not np.signbit(s) and not c.any()


def test_quantize_blocks_ignores_invalid_elements():
    x = np.array([[1.0, 2.0, 100.0], [3.0, -4.0, 1e9]], F32)
    valid = np.array([[True, True, False], [True, True, False]])
    c, s = fp8.quantize_blocks(x, "e4m3", valid)
    assert np.array_equal(s, np.array([F32(2) / F32(448), F32(4) / F32(448)], F32))
    assert c[0, 2] == 0 and c[1, 2] == 0 and c[1, 1] == 0xFE


# ---- the steps against a float64 re-derivation ------------------------------------------------
def within_format(dq, exact, scale, fmt):
    """Whether each decoded value is within the format's rounding of the exact one (plus float32
    slack): half a step relative in the normal range, half the subnormal step absolute."""
    mbits = 3 if fmt == "e4m3" else 4
    sub = scale * 2.0 ** (-9 if fmt == "e4m3" else -10)
    bound = np.maximum(np.abs(exact) * 2.0 ** -(mbits + 1), sub / 2) * (1 + 1e-4) + 1e-30
    return np.abs(dq.astype(np.float64) - exact) <= bound


def random_state(rng, n, nb):
    mc = rng.integers(0, 256, n).astype(np.uint8)
    mc = np.where((mc & 0x7F) == 0x7F, mc ^ 1, mc).astype(np.uint8)  # no NaN codes
    vc = rng.integers(0, 256, n).astype(np.uint8)
    sm = rng.uniform(1e-5, 1e-3, nb).astype(F32)
    sv = rng.uniform(1e-5, 1e-3, nb).astype(F32)
    return mc, vc, sm, sv


def test_apply_adam_w_quant_fp8_against_float64():
    rng = np.random.default_rng(3301)
    n = 700  # three blocks, the last one partial
    nb = 3
    var = rng.uniform(-1, 1, n).astype(F32)
    grad = rng.normal(0, 0.01, n).astype(F32)
    mc, vc, sm, sv = random_state(rng, n, nb)
    vc[:40] = 0  # some lost second moments (m's codes there are mostly not 0)
    step, lr, b1, b2, wd, eps, gs = 9, 1e-3, 0.9, 0.999, 0.01, 1e-8, 0.5
    out_var, out_mc, out_vc, out_sm, out_sv, skipped = fp8.apply_adam_w_quant_fp8(
        var, grad, mc, vc, sm, sv, step, lr, b1, b2, wd, eps, gs)
    assert skipped == 0

    col = np.arange(n) // 256
    m_old = fp8.e4m3_decode(mc).astype(np.float64) * sm[col]
    s_old = fp8.ue4m4_decode(vc).astype(np.float64) * sv[col]
    v_old = s_old ** 2
    v_old = np.where((v_old == 0) & (m_old != 0), m_old ** 2, v_old)
    g = grad.astype(np.float64) * gs
    m = b1 * m_old + (1 - b1) * g
    v = b2 * v_old + (1 - b2) * g * g
    t = step + 1
    c2s = np.sqrt(1 - b2 ** t)
    upd = -lr * c2s / (1 - b1 ** t) * m / (np.sqrt(v) + eps * c2s)
    w = (var + upd) * (1 - lr * wd)
    assert np.all(np.abs(out_var - w) <= 1e-6 * np.abs(w) + 1e-4 * np.abs(upd))
    s = np.sqrt(v)
    for b in range(nb):
        sel = col == b
        assert abs(out_sm[b] - np.abs(m[sel]).max() / 448) <= 1e-5 * out_sm[b]
        assert abs(out_sv[b] - s[sel].max() / 496) <= 1e-5 * out_sv[b]
    assert np.all(within_format(fp8.dequantize(out_mc, out_sm[col], "e4m3"), m, out_sm[col], "e4m3"))
    assert np.all(within_format(fp8.dequantize(out_vc, out_sv[col], "ue4m4"), s, out_sv[col], "ue4m4"))


def test_apply_adam_w_quant_fp8_16bit_var_is_the_float32_step_narrowed():
    rng = np.random.default_rng(44)
    n = 600
    mc, vc, sm, sv = random_state(rng, n, 3)
    grad32 = rng.normal(0, 0.01, n).astype(F32)
    for dtype in ["float16", "bfloat16"]:
        var = narrow(rng.uniform(-1, 1, n).astype(F32), dtype)
        grad = narrow(grad32, dtype)
        args = (mc, vc, sm, sv, 4, 1e-3, 0.9, 0.999, 0.01, 1e-8, 1.0)
        got = fp8.apply_adam_w_quant_fp8(var, grad, *args)
        ref = fp8.apply_adam_w_quant_fp8(widen(var, dtype), widen(grad, dtype), *args)
        assert got[0].dtype == var.dtype
        assert np.array_equal(got[0], narrow(ref[0], dtype))
        for a, b in zip(got[1:], ref[1:]):
            assert np.array_equal(a, b)


def test_apply_adam_w_quant_fp8_guard_on_non_finite():
    rng = np.random.default_rng(12)
    n = 1024
    var = rng.uniform(-1, 1, n).astype(F32)
    grad = rng.normal(0, 0.01, n).astype(F32)
    mc, vc, sm, sv = random_state(rng, n, 4)
    grad[300] = np.nan   # block 1: a NaN gradient
    mc[600] = 0xFF       # block 2: a NaN code in m's state
    sv[3] = np.inf       # block 3: an infinite scale
    out = fp8.apply_adam_w_quant_fp8(var, grad, mc, vc, sm, sv, 0, 1e-3, 0.9, 0.999, 0.0, 1e-8, 1.0)
    assert out[5] == 3
    kept = slice(256, 1024)
    assert np.array_equal(out[0][kept].view(np.uint32), var[kept].view(np.uint32))
    assert np.array_equal(out[1][kept], mc[kept]) and np.array_equal(out[2][kept], vc[kept])
    assert np.array_equal(out[3][1:], sm[1:]) and np.array_equal(out[4][1:], sv[1:])
    assert not np.array_equal(out[0][:256], var[:256])
    assert out[1][600] == 0xFF and not np.any((out[1][:256] & 0x7F) == 0x7F)  # never written


def test_lazy_adam_quant_fp8_against_float64():
    rng = np.random.default_rng(77)
    R, D, N = 50, 300, 40  # two blocks per row, the second partial
    nb = 2
    var = rng.uniform(-1, 1, (R, D)).astype(F32)
    mc, vc, sm, sv = random_state(rng, R * D, R * nb)
    mc, vc, sm, sv = mc.reshape(R, D), vc.reshape(R, D), sm.reshape(R, nb), sv.reshape(R, nb)
    vc[:, :5] = 0
    idx = rng.integers(0, R, N).astype(np.int32)
    idx[3] = idx[10] = idx[20]   # a row named three times
    idx[5] = -1                  # padding
    grad = rng.normal(0, 0.1, (N, D)).astype(F32)
    lr, b1, b2, e = 1e-3, 0.9, 0.999, 1e-7
    out_var, out_mc, out_vc, out_sm, out_sv, skipped = fp8.lazy_adam_quant_fp8(
        var, grad, idx, mc, vc, sm, sv, lr, b1, b2, e)
    assert skipped == 0
    touched = np.unique(idx[idx >= 0])
    untouched = np.setdiff1d(np.arange(R), touched)
    for a, b in [(out_var, var), (out_mc, mc), (out_vc, vc), (out_sm, sm), (out_sv, sv)]:
        assert np.array_equal(a[untouched], b[untouched])
    cols = np.arange(D) // 256
    for r in touched:
        g = sum(grad[k].astype(np.float64) for k in range(N) if idx[k] == r)
        m_old = fp8.e4m3_decode(mc[r]).astype(np.float64) * sm[r, cols]
        s_old = fp8.ue4m4_decode(vc[r]).astype(np.float64) * sv[r, cols]
        v_old = np.where((s_old == 0) & (m_old != 0), m_old ** 2, s_old ** 2)
        m = b1 * m_old + (1 - b1) * g
        v = np.abs(b2 * v_old + (1 - b2) * g * g)
        upd = -lr * m / (np.sqrt(v) + e)
        w = var[r] + upd
        assert np.all(np.abs(out_var[r] - w) <= 1e-6 * np.abs(w) + 1e-4 * np.abs(upd))
        s = np.sqrt(v)
        sm_r, sv_r = out_sm[r, cols], out_sv[r, cols]
        assert np.all(within_format(fp8.dequantize(out_mc[r], sm_r, "e4m3"), m, sm_r, "e4m3"))
        assert np.all(within_format(fp8.dequantize(out_vc[r], sv_r, "ue4m4"), s, sv_r, "ue4m4"))
        for b in range(nb):
            assert abs(out_sm[r, b] - np.abs(m[cols == b]).max() / 448) <= 1e-5 * out_sm[r, b]


def test_lazy_adam_quant_fp8_row_guard():
    rng = np.random.default_rng(8)
    R, D = 10, 40
    var = rng.uniform(-1, 1, (R, D)).astype(F32)
    mc, vc, sm, sv = random_state(rng, R * D, R)
    mc, vc, sm, sv = mc.reshape(R, D), vc.reshape(R, D), sm.reshape(R, 1), sv.reshape(R, 1)
    idx = np.array([1, 2, 3], np.int32)
    grad = rng.normal(0, 0.1, (3, D)).astype(F32)
    grad[1, 7] = np.inf   # row 2
    mc[3, 0] = 0x7F       # row 3: NaN state
    out = fp8.lazy_adam_quant_fp8(var, grad, idx, mc, vc, sm, sv, 1e-3, 0.9, 0.999, 1e-7)
    assert out[5] == 2
    for r in (2, 3):
        assert np.array_equal(out[0][r], var[r]) and np.array_equal(out[1][r], mc[r])
        assert np.array_equal(out[3][r], sm[r]) and np.array_equal(out[4][r], sv[r])
    assert not np.array_equal(out[0][1], var[1])


# ---- the lost-v guard changes only the lost elements ------------------------------------------
def lost_case(rng, n, nb):
    """States where some elements' v codes to zero while their m does not, with no gradient there
    (the issue's hazard: the unguarded update is m / eps)."""
    mc, vc, sm, sv = random_state(rng, n, nb)
    lost = rng.random(n) < 0.05
    vc[lost] = 0
    grad = rng.normal(0, 0.01, n).astype(F32)
    grad[lost] = 0
    return grad, mc, vc, sm, sv


def test_fp8_guard_changes_only_lost_elements():
    rng = np.random.default_rng(1333)
    n, nb = 1000, 4
    var = rng.uniform(-1, 1, n).astype(F32)
    grad, mc, vc, sm, sv = lost_case(rng, n, nb)
    col = np.arange(n) // 256
    lost = (fp8.ue4m4_decode(vc) * sv[col] == 0) & (fp8.e4m3_decode(mc) * sm[col] != 0)
    assert lost.sum() > 10
    args = (0, 1e-3, 0.9, 0.999, 0.0, 1e-8, 1.0)
    on = fp8.apply_adam_w_quant_fp8(var, grad, mc, vc, sm, sv, *args)
    off = fp8.apply_adam_w_quant_fp8(var, grad, mc, vc, sm, sv, *args, _guard_lost_v=False)
    assert np.array_equal(on[0][~lost], off[0][~lost])
    assert np.all(on[0][lost] != off[0][lost])
    assert np.array_equal(on[1], off[1]) and np.array_equal(on[3], off[3])  # m does not see v
    # guarded, a lost element with no new gradient moves by at most beta1 / sqrt(beta2) of the
    # step size, one with a gradient by sqrt(beta1^2 / beta2 + (1 - beta1)^2 / (1 - beta2)) of it
    step_size = 1e-3 * np.sqrt(1 - 0.999) / (1 - 0.9)
    quiet = lost & (grad == 0)
    assert quiet.sum() > 10
    assert np.max(np.abs(on[0][quiet] - var[quiet])) <= 0.9005 * step_size * (1 + 1e-4)
    assert np.max(np.abs(on[0][lost] - var[lost])) <= 3.291 * step_size
    assert np.max(np.abs(off[0][quiet] - var[quiet])) > 1.0  # unguarded: m / eps


def test_dynamic_map_guard_changes_only_lost_elements():
    rng = np.random.default_rng(2024)
    n, nb = 1000, 4
    qm, qv = create_dynamic_map(True), create_dynamic_map(False)
    var = rng.uniform(-1, 1, n).astype(F32)
    grad = rng.normal(0, 0.01, n).astype(F32)
    m = rng.integers(0, 256, n).astype(np.uint8)
    v = rng.integers(1, 256, n).astype(np.uint8)
    am = rng.uniform(1e-3, 5e-2, nb).astype(F32)
    av = rng.uniform(1e-6, 1e-3, nb).astype(F32)
    zero_v = int(np.searchsorted(qv, 0))
    lost_at = rng.random(n) < 0.05
    v[lost_at] = zero_v
    grad[lost_at] = 0
    col = np.arange(n) // 256
    lost = (qv[v] * av[col] == 0) & (qm[m] * am[col] != 0)
    assert lost.sum() > 10
    args = (var, grad, m, v, qm, qv, am, av, 3, 1e-3, 0.9, 0.999, 0.0, 1e-8, 1.0, "float32")
    off = golden_step(*args)
    on = golden_step(*args, guard_lost_v=True)
    assert np.array_equal(on[0][~lost], off[0][~lost])
    assert np.all(on[0][lost] != off[0][lost])
    assert np.array_equal(on[1], off[1]) and np.array_equal(on[3], off[3])
    t = F32(4)
    c2s = np.sqrt(F32(1) - powf(0.999, t), dtype=F32)
    step_size = abs(F32(F32(-F32(1e-3) * c2s) / (F32(1) - powf(0.9, t))))
    assert np.max(np.abs(on[0][lost] - var[lost])) <= 0.9005 * step_size * (1 + 1e-5)
    # with nothing lost, the guard changes nothing, bit for bit
    v2 = np.where(lost_at, np.uint8(200), v).astype(np.uint8)
    args2 = args[:3] + (v2,) + args[4:]
    for a, b in zip(golden_step(*args2), golden_step(*args2, guard_lost_v=True)):
        assert np.array_equal(np.atleast_1d(a).view(np.uint8), np.atleast_1d(b).view(np.uint8))


def test_lazy_dynamic_map_guard_changes_only_lost_elements():
    rng = np.random.default_rng(99)
    R, D, N = 30, 64, 20
    qm, qv = create_dynamic_map(True), create_dynamic_map(False)
    var = rng.uniform(-1, 1, (R, D)).astype(F32)
    m = rng.integers(0, 256, (R, D)).astype(np.uint8)
    v = rng.integers(1, 256, (R, D)).astype(np.uint8)
    am = rng.uniform(1e-3, 5e-2, (R, 1)).astype(F32)
    av = rng.uniform(1e-6, 1e-3, (R, 1)).astype(F32)
    lost_at = rng.random((R, D)) < 0.05
    v[lost_at] = int(np.searchsorted(qv, 0))
    idx = rng.permutation(R)[:N].astype(np.int32)
    grad = rng.normal(0, 0.01, (N, D)).astype(F32)
    grad[lost_at[idx]] = 0
    lost = (qv[v] * av == 0) & (qm[m] * am != 0)
    args = (grad, idx, m, v, var, qm, qv, am, av, 1e-3, 0.9, 0.999, 1e-7, "float32", "float32")
    off = lazy_adam_quant_golden(*args)
    on = lazy_adam_quant_golden(*args, guard_lost_v=True)
    touched = np.zeros((R, D), bool)
    touched[idx] = True
    sel = lost & touched
    assert sel.sum() > 10
    assert np.array_equal(on[2][~sel], off[2][~sel])
    assert np.all(on[2][sel] != off[2][sel])
    assert np.array_equal(on[0], off[0]) and np.array_equal(on[3], off[3])
    assert np.max(np.abs(on[2][sel] - var[sel])) <= 0.9005 * 1e-3 * (1 + 1e-5)
