"""The floats a SubGen cache would hold, counted from its draws without building it (the equal-memory
fit of :func:`kvbounds.algorithms.equal_memory.fit_to_floats` asks 3-5 budgets per layer and keeps one cache;
claim SG.e2e).

SubGen (arXiv:2402.06082, Alg. 1) as :class:`kvbounds.algorithms.cache_compressors.SubGenCompressor` builds it:
per head, the exact sink + window (keys and values, no weight), k cluster representatives (a key and the log of
its cluster's size, b; a = -inf) and the distinct tokens of t l2 draws (a key, a value and the log of its
importance weight, a; b = -inf). :func:`subgen_held_floats` is
:func:`kvbounds.algorithms.token_selection.memory_floats` of that cache, from the same draws (the same seed, the
same float64 probabilities) and, only when every cluster could have one size, the cluster sizes (tests compare
the two on every round of the fit).
"""
from __future__ import annotations

import numpy as np

from kvbounds.algorithms import cache_compressors as ca
from kvbounds.algorithms.compressed_kv import weight_floats
from kvbounds.algorithms.validation import InputError

__all__ = ["subgen_held_floats"]


def subgen_held_floats(K: np.ndarray, V: np.ndarray, budget_floats: int, seed: int, *, sink: int, window: int,
                       traversal=None, norms2=None) -> int:
    """memory_floats of ``SubGenCompressor(sink, window).compress(K, V, budget_floats=budget_floats,
    rng=np.random.default_rng(seed), traversal=traversal)`` for numpy K, V (H, n, d) already checked by that
    compressor (:func:`kvbounds.algorithms.cache_compressors.check_cache`). ``norms2``: optional (H, n) float64
    squared norms of V's rows, ``np.sum(V.astype(np.float64) ** 2, axis=-1)`` (the rounds of one fit share them)."""
    from kvbounds.algorithms.kcenter import greedy_k_center
    n, d, left = ca.split_budget(K, sink, window, budget_floats)
    lo, hi = sink, n - window
    n_mid, H = hi - lo, K.shape[0]
    k, t = ca.SubGenCompressor(sink=sink, window=window).sizes(n_mid, d, left, budget_floats)
    # the representatives' log-sizes are one float per head when all sizes are equal, else k: sizes >= 1 summing to
    # n_mid can all be equal only when k divides n_mid (then they are read from the clusters)
    if k == 1 or k == n_mid:
        b_floats = np.ones(H, np.int64)
    elif n_mid % k:
        b_floats = np.full(H, k, np.int64)
    else:
        res = traversal.result(k) if traversal is not None else greedy_k_center(K[:, lo:hi], k)
        counts = ca.cluster_counts(np.reshape(res.assignment, (H, n_mid)), k)
        b_floats = np.where((counts == counts[:, :1]).all(axis=1), 1, k)
    rng = np.random.default_rng(seed)
    if norms2 is not None and (not isinstance(norms2, np.ndarray) or norms2.shape != V.shape[:2]
                               or norms2.dtype != np.float64):
        raise InputError(f"norms2 must be V's squared row norms, a float64 numpy array of shape {V.shape[:2]}")
    P = np.sum(V[:, lo:hi].astype(np.float64) ** 2, axis=-1) if norms2 is None else norms2[:, lo:hi]
    floats = 0
    for h in range(H):                       # the compressor's draws, head by head, from the same stream
        a = np.asarray(ca.l2_sample(P[h], t, rng)[1])
        a = a[np.isfinite(a)]                # a sample whose weight overflows float32 is not used on either side
        floats += (sink + window) * 2 * d + k * d + int(a.size) * 2 * d + weight_floats(a) + int(b_floats[h])
    return floats
