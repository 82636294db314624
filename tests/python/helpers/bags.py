"""Batches for the embedding-bag tests (test_embedding_bag.py, test_embedding_bag_quant.py):
nn.EmbeddingBag's form ([B] offsets), ids drawn with a skew (squares of uniforms: small ids are
hot), per-sample weights when asked for, and a regression target [B, dim]; all from `seed`."""
import numpy as np
import torch


def bag_batches(seed, rows, dim, steps, bags, bag_len, weighted):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        lengths = rng.integers(bag_len[0], bag_len[1] + 1, bags)
        idx = (rng.uniform(0, 1, int(lengths.sum())) ** 2 * rows).astype(np.int64)
        offs = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)  # nn's form: [B]
        w = rng.uniform(0.5, 1.5, len(idx)).astype(np.float32) if weighted else None
        target = rng.uniform(-1, 1, (bags, dim)).astype(np.float32)
        out.append((torch.from_numpy(idx), torch.from_numpy(offs),
                    None if w is None else torch.from_numpy(w), torch.from_numpy(target)))
    return out
