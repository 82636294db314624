"""EmbeddingBagLazyAdamQuant golden: the 8-bit twin of EmbeddingBagLazyAdam, computed in NumPy
float32 from docs/embedding_bag_lazy_adam_quant.md (written from the definition, not from the C++):
the fused gradient, then LazyAdamQuant's row step.

  per distinct row r named by indices:
    g = x_{i1} + x_{i2} + ... in order of occurrence, x_i = grad_output[b_i] * c_i, c_i = s_b * w_i
        (golden/embedding_bag_lazy_adam.py's bag_row_gradients: EmbeddingBagLazyAdam's gradient)
    then LazyAdamQuant's step of that row with g as its one gradient row: dequantize m and v, the
    lost-v guard when on, LazyAdam's update, the row left unchanged when a new m, v or var is not
    finite, the new block scales and codes (golden/lazy_adam_quant.py for the dynamic maps,
    golden/fp8_state.py for the FP8 format).

Refusals: golden/embedding_bag_lazy_adam.py's check (ids out of [0, R), offsets)."""
import numpy as np

from golden.apply_adam_w_quant import create_dynamic_map
from golden.common import bitwise_result, read_bin, read_params, write_bin, write_params
from golden.embedding_bag_lazy_adam import bag_row_gradients, check, make_batch
from golden.fp8_state import lazy_adam_quant_fp8
from golden.lazy_adam_quant import lazy_adam_quant_golden

# docs/embedding_bag_lazy_adam_quant.md: bitwise equal to this golden (codes exactly, var and the
# block scales bit for bit).
GATE = "bitwise"

F32 = np.float32
BLOCK = 256

SIZES = {
    # name: (rows R, dim D, bags B, ids per bag (lo, hi), pooling, weighted, id range (skew), state
    # format, lost-v guard)
    "seed": (1_000_000, 32, 8192, (1, 4), "sum", False, 1_000_000, "dynamic_map", True),
    "seed_fp8": (1_000_000, 32, 8192, (1, 4), "sum", False, 1_000_000, "fp8", True),
    "small": (20_000, 32, 1024, (0, 6), "mean", True, 5_000, "dynamic_map", True),
    "small_fp8": (20_000, 32, 1024, (0, 6), "mean", True, 5_000, "fp8", True),
    "small_d300": (5_000, 300, 256, (0, 6), "sum", True, 2_000, "dynamic_map", False),
}

# The flows scripts/main.sh runs besides the main size: the FP8 state format at the same shape.
EXTRA_SIZES = {"default": ["seed_fp8"], "small": ["small_fp8", "small_d300"]}


def embedding_bag_lazy_adam_quant_golden(grad_output, indices, offsets, per_sample_weights, m, v,
                                         var, qm, qv, am, av, lr, beta1, beta2, eps, mode="sum",
                                         state_format="dynamic_map", guard_lost_v=True):
    """grad_output float32 [B, D]; indices [L]; offsets [B + 1]; per_sample_weights float32 [L] or
    None; m, v uint8 [R, D]; var float32 [R, D]; qm, qv the maps (None for "fp8"); am, av float32
    [R, ceil(D / 256)] (absmax, or the FP8 scales). Returns new (m, v, var, am, av, rows updated,
    rows skipped)."""
    check(grad_output, indices, offsets, per_sample_weights, m.shape[0])
    if mode not in ("sum", "mean"):
        raise ValueError(f"mode = {mode!r} must be 'sum' or 'mean'")
    if indices.size == 0 or m.shape[1] == 0:
        return m.copy(), v.copy(), var.copy(), am.copy(), av.copy(), 0, 0
    with np.errstate(all="ignore"):  # skipped rows compute NaN and Inf on the way
        rows, g = bag_row_gradients(grad_output, indices, offsets, per_sample_weights, mode)
    # LazyAdamQuant's step with each row's gradient given once (the sum is already made).
    if state_format == "fp8":
        var, m, v, am, av, skipped = lazy_adam_quant_fp8(var, g, rows, m, v, am, av, lr, beta1,
                                                         beta2, eps)
    else:
        m, v, var, am, av, skipped = lazy_adam_quant_golden(g, rows, m, v, var, qm, qv, am, av, lr,
                                                            beta1, beta2, eps, "float32",
                                                            "float32", guard_lost_v)
    return m, v, var, am, av, len(rows) - skipped, skipped


def random_state(rng, R, D, state_format):
    """A state as a run some steps in would hold: random codes and block scales (absmax in the
    dynamic-map format, scales in the FP8 one), some blocks zero."""
    nb = (D + BLOCK - 1) // BLOCK
    m = rng.integers(0, 256, (R, D), dtype=np.uint8)
    v = rng.integers(0, 256, (R, D), dtype=np.uint8)
    if state_format == "fp8":
        m[(m & 0x7F) == 0x7F] ^= 1  # not E4M3's NaN codes
        am = rng.uniform(0, 0.01 / 448, (R, nb)).astype(F32)
        av = rng.uniform(0, 0.1 / 496, (R, nb)).astype(F32)
    else:
        am = rng.uniform(0, 0.01, (R, nb)).astype(F32)
        av = rng.uniform(0, 1e-3, (R, nb)).astype(F32)
    am[rng.uniform(0, 1, (R, nb)) < 0.05] = 0
    av[rng.uniform(0, 1, (R, nb)) < 0.05] = 0  # v lost beside m: the guard's case
    return m, v, am, av


def generate(out_dir, size="seed", seed=0):
    R, D, B, bag_len, mode, weighted, id_range, fmt, guard = SIZES[size]
    rng = np.random.default_rng(seed)
    lr, beta1, beta2, eps = 0.001, 0.9, 0.999, 1e-8
    var = rng.uniform(-1, 1, (R, D)).astype(F32)
    m, v, am, av = random_state(rng, R, D, fmt)
    qm = create_dynamic_map(True) if fmt == "dynamic_map" else None
    qv = create_dynamic_map(False) if fmt == "dynamic_map" else None
    grad_output, indices, offsets, weights = make_batch(rng, R, D, B, bag_len, weighted, id_range)
    inputs = [("grad_output", grad_output), ("indices", indices), ("offsets", offsets),
              ("m", m), ("v", v), ("var", var), ("absmax_m", am), ("absmax_v", av)]
    if weighted:
        inputs.append(("per_sample_weights", weights))
    for name, a in inputs:
        write_bin(f"{out_dir}/input/{name}.bin", a)
    gm, gv, gvar, gam, gav, updated, skipped = embedding_bag_lazy_adam_quant_golden(
        grad_output, indices, offsets, weights, m, v, var, qm, qv, am, av, lr, beta1, beta2, eps,
        mode, fmt, guard)
    for name, a in [("m", gm), ("v", gv), ("var", gvar), ("absmax_m", gam), ("absmax_v", gav)]:
        write_bin(f"{out_dir}/golden/{name}.bin", a)
    write_params(f"{out_dir}/params.txt",
                 dict(rows=R, dim=D, bags=B, lookups=len(indices), mode=mode,
                      weighted=int(weighted), lr=lr, beta1=beta1, beta2=beta2, epsilon=eps,
                      state_format=fmt, guard_lost_v=int(guard), rows_updated=updated,
                      rows_skipped=skipped, seed=seed, size=size))


def verify(out_dir):
    p = read_params(f"{out_dir}/params.txt")
    R, D = int(p["rows"]), int(p["dim"])
    nb = (D + BLOCK - 1) // BLOCK
    results = []
    for name, dtype, shape in [("m", np.uint8, (R, D)), ("v", np.uint8, (R, D)),
                               ("var", np.float32, (R, D)), ("absmax_m", np.float32, (R, nb)),
                               ("absmax_v", np.float32, (R, nb))]:
        real = read_bin(f"{out_dir}/output/{name}.bin", dtype, shape)
        gold = read_bin(f"{out_dir}/golden/{name}.bin", dtype, shape)
        results.append(bitwise_result(name, real, gold))
    return results
