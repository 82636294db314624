"""The synthetic click data of the recommendation examples (examples/python/train_recsys.py,
examples/tensorflow/train_recsys.py): Zipf-distributed user and item ids, the hot ids scattered
over the tables by a fixed permutation, and a planted ground truth to learn. NumPy only."""

import math

import numpy as np


class ZipfIds:
    """Ids 0..n-1 drawn with P(rank r) proportional to (r + 1)^-s; rank r is id perm[r]."""

    def __init__(self, n, s, rng):
        w = (np.arange(1, n + 1, dtype=np.float64)) ** -s
        self.cdf = np.cumsum(w)
        self.cdf /= self.cdf[-1]
        self.perm = rng.permutation(n)

    def draw(self, size, rng):
        ranks = np.searchsorted(self.cdf, rng.random(size), side="right")
        return self.perm[np.minimum(ranks, len(self.perm) - 1)]


class World:
    """The planted ground truth: click probability sigmoid(scale * <a_u, b_i> + bias_i)."""

    def __init__(self, users, items, rank, seed, zipf_s):
        rng = np.random.default_rng(seed)
        self.user_ids = ZipfIds(users, zipf_s, rng)
        self.item_ids = ZipfIds(items, zipf_s, rng)
        self.a = rng.standard_normal((users, rank)).astype(np.float32)
        self.b = rng.standard_normal((items, rank)).astype(np.float32)
        self.bias = (rng.standard_normal(items) * 0.8 - 0.3).astype(np.float32)
        self.scale = np.float32(2.0 / math.sqrt(rank))

    def logits(self, u, i):
        return self.scale * np.einsum("nk,nk->n", self.a[u], self.b[i]) + self.bias[i]

    def sample(self, n, rng, index_dtype=np.int64):
        """n clicks: user ids, item ids (index_dtype) and labels (float32)."""
        u = self.user_ids.draw(n, rng)
        i = self.item_ids.draw(n, rng)
        y = (rng.random(n) < 1.0 / (1.0 + np.exp(-self.logits(u, i)))).astype(np.float32)
        return u.astype(index_dtype), i.astype(index_dtype), y
