"""EmbeddingBagLazyAdam golden: the fused embedding-bag backward with LazyAdam's step, computed in
NumPy float32 from docs/embedding_bag_lazy_adam.md (written from the doc, not from the C++):

  bag b holds the lookups offsets[b] .. offsets[b + 1] - 1 (offsets: [B + 1])
  c_i = s_b * w_i      s_b = 1 (sum) or float32(1) / float32(len_b) (mean);
                       w_i = per_sample_weights[i], or 1 unweighted
  x_i = grad_output[b_i] * c_i
  per distinct row r named by indices:
    g   = x_{i1}, then g = g + x_{ik} for r's further lookups in order of occurrence
    row skipped (left unchanged, counted) when g holds NaN or Inf; else
    m   = m * beta1 + g * (1 - beta1)
    v   = |v * beta2 + (g * g) * (1 - beta2)|
    var = var + (m * -lr) / (sqrt(v) + epsilon)

Refusals (check() raises ValueError, before anything is computed): an id < 0 or >= R (the first
bad position named), offsets[0] != 0, a decreasing offset, offsets[B] != L, lengths that do not
fit (offsets B + 1, per_sample_weights L)."""
import numpy as np

from golden.common import bitwise_result, read_bin, read_params, write_bin, write_params

# docs/embedding_bag_lazy_adam.md: bitwise equal to this golden.
GATE = "bitwise"

F32 = np.float32

SIZES = {
    # name: (rows R, dim D, bags B, ids per bag (lo, hi), pooling, weighted, id range (skew))
    "seed": (1_000_000, 32, 8192, (1, 4), "sum", False, 1_000_000),  # issue 32's case
    "multi_hot": (1_000_000, 32, 8192, (40, 60), "sum", False, 1_000_000),
    "small": (20_000, 32, 1024, (0, 6), "mean", True, 5_000),
}


def check(grad_output, indices, offsets, per_sample_weights, rows):
    """The refusals of the doc, as ValueError with the first bad position named."""
    B = grad_output.shape[0]
    L = indices.shape[0]
    if offsets.shape[0] != B + 1:
        raise ValueError(f"offsets has {offsets.shape[0]} entries but grad_output has {B} bags")
    if per_sample_weights is not None and per_sample_weights.shape[0] != L:
        raise ValueError(f"per_sample_weights has {per_sample_weights.shape[0]} entries but "
                         f"indices has {L}")
    off = offsets.astype(np.int64)
    if off[0] != 0:
        raise ValueError(f"offsets[0] = {off[0]} but the first bag must start at 0")
    down = np.nonzero(np.diff(off) < 0)[0]
    if len(down):
        b = int(down[0]) + 1
        raise ValueError(f"offsets[{b}] = {off[b]} < offsets[{b - 1}] = {off[b - 1]}: offsets "
                         "must be non-decreasing")
    if off[B] != L:
        raise ValueError(f"offsets[{B}] = {off[B]} but indices has {L} entries")
    idx = indices.astype(np.int64)
    bad = np.nonzero((idx < 0) | (idx >= rows))[0]
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"indices[{i}] = {idx[i]} is out of [0, {rows})")


def embedding_bag_lazy_adam_golden(grad_output, indices, offsets, per_sample_weights, m, v, var,
                                   lr, beta1, beta2, eps, mode="sum"):
    """grad_output float32 [B, D]; indices [L]; offsets [B + 1]; per_sample_weights float32 [L] or
    None; m, v, var float32 [R, D]. Returns new (m, v, var, rows updated, rows skipped)."""
    check(grad_output, indices, offsets, per_sample_weights, m.shape[0])
    with np.errstate(all="ignore"):  # skipped rows compute NaN and Inf on the way
        return _golden(grad_output, indices, offsets, per_sample_weights, m, v, var, lr, beta1,
                       beta2, eps, mode)


def bag_row_gradients(grad_output, indices, offsets, per_sample_weights, mode):
    """The gradient of each row the bags look up (the doc's definition): returns (rows, g), the
    distinct rows in ascending order and g float32 [len(rows), D], each row's contributions
    x_i = grad_output[b_i] * c_i summed in order of occurrence, left to right. Shared with
    golden/embedding_bag_lazy_adam_quant.py (the 8-bit twin: the same gradient, LazyAdamQuant's
    step)."""
    idx = indices.astype(np.int64).ravel()
    L = len(idx)
    D = grad_output.shape[1]
    if L == 0:
        return idx, np.zeros((0, D), F32)
    lengths = np.diff(offsets.astype(np.int64))
    bag_of = np.repeat(np.arange(len(lengths)), lengths)
    if mode == "mean":
        s = np.ones(len(lengths), F32)
        nz = lengths > 0
        s[nz] = F32(1) / lengths[nz].astype(F32)
    elif mode == "sum":
        s = np.ones(len(lengths), F32)
    else:
        raise ValueError(f"mode = {mode!r} must be 'sum' or 'mean'")
    w = np.ones(L, F32) if per_sample_weights is None else per_sample_weights.astype(F32)
    c = (s[bag_of] * w).astype(F32)  # c_i = s_b * w_i, one float32 product
    x = grad_output[bag_of] * c[:, None]  # the per-lookup contributions (here only: the golden)

    # g: each row's contributions summed in order of occurrence, left to right.
    rows = np.unique(idx)
    order = np.argsort(idx, kind="stable")
    starts = np.searchsorted(idx[order], rows)
    counts = np.diff(np.append(starts, L))
    g = x[order[starts]].copy()
    for k in range(1, int(counts.max())):
        sel = counts > k
        g[sel] = g[sel] + x[order[starts[sel] + k]]
    return rows, g


def _golden(grad_output, indices, offsets, per_sample_weights, m, v, var, lr, beta1, beta2, eps,
            mode):
    b1, b2, e, lr = F32(beta1), F32(beta2), F32(eps), F32(lr)
    omb1, omb2 = F32(1) - b1, F32(1) - b2
    m, v, var = m.copy(), v.copy(), var.copy()
    if mode not in ("sum", "mean"):
        raise ValueError(f"mode = {mode!r} must be 'sum' or 'mean'")
    if indices.size == 0 or m.shape[1] == 0:
        return m, v, var, 0, 0
    rows, g = bag_row_gradients(grad_output, indices, offsets, per_sample_weights, mode)
    finite = np.all(np.isfinite(g), axis=1)
    skipped = int(np.sum(~finite))
    rows, g = rows[finite], g[finite]
    mm = m[rows] * b1 + g * omb1
    vv = np.abs(v[rows] * b2 + (g * g) * omb2)
    var[rows] = var[rows] + (mm * (-lr)) / (np.sqrt(vv) + e)
    m[rows] = mm
    v[rows] = vv
    return m, v, var, len(rows), skipped


def make_batch(rng, rows, dim, bags, bag_len, weighted, id_range):
    """A batch: bags of bag_len[0] .. bag_len[1] ids drawn with a skew (squares of uniforms: small
    ids are hot) from [0, id_range), the gradient of the pooled output, the weights."""
    lengths = rng.integers(bag_len[0], bag_len[1] + 1, bags)
    offsets = np.zeros(bags + 1, np.int64)
    offsets[1:] = np.cumsum(lengths)
    L = int(offsets[-1])
    indices = (rng.uniform(0, 1, L) ** 2 * id_range).astype(np.int64)
    grad_output = rng.uniform(-1, 1, (bags, dim)).astype(F32)
    weights = rng.uniform(0.5, 1.5, L).astype(F32) if weighted else None
    return grad_output, indices, offsets, weights


def generate(out_dir, size="seed", seed=0):
    R, D, B, bag_len, mode, weighted, id_range = SIZES[size]
    rng = np.random.default_rng(seed)
    lr, beta1, beta2, eps = 0.001, 0.9, 0.999, 1e-8
    var = rng.uniform(-1, 1, (R, D)).astype(F32)
    m = rng.uniform(-0.1, 0.1, (R, D)).astype(F32)
    v = rng.uniform(0, 0.01, (R, D)).astype(F32)
    grad_output, indices, offsets, weights = make_batch(rng, R, D, B, bag_len, weighted, id_range)
    inputs = [("grad_output", grad_output), ("indices", indices), ("offsets", offsets),
              ("m", m), ("v", v), ("var", var)]
    if weighted:
        inputs.append(("per_sample_weights", weights))
    for name, a in inputs:
        write_bin(f"{out_dir}/input/{name}.bin", a)
    gm, gv, gvar, updated, skipped = embedding_bag_lazy_adam_golden(
        grad_output, indices, offsets, weights, m, v, var, lr, beta1, beta2, eps, mode)
    for name, a in [("m", gm), ("v", gv), ("var", gvar)]:
        write_bin(f"{out_dir}/golden/{name}.bin", a)
    write_params(f"{out_dir}/params.txt",
                 dict(rows=R, dim=D, bags=B, lookups=len(indices), mode=mode,
                      weighted=int(weighted), lr=lr, beta1=beta1, beta2=beta2, epsilon=eps,
                      rows_updated=updated, rows_skipped=skipped, seed=seed, size=size))


def verify(out_dir):
    p = read_params(f"{out_dir}/params.txt")
    R, D = int(p["rows"]), int(p["dim"])
    results = []
    for name in ["m", "v", "var"]:
        real = read_bin(f"{out_dir}/output/{name}.bin", np.float32, (R, D))
        gold = read_bin(f"{out_dir}/golden/{name}.bin", np.float32, (R, D))
        results.append(bitwise_result(name, real, gold))
    return results
