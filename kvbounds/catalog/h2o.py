"""h2o: H2O (Zhang et al. 2023), heavy hitters by accumulated attention plus recent tokens."""
from __future__ import annotations

from kvbounds.algorithms import token_selection as ts
from kvbounds.e2e import h2o_prefill
from kvbounds.methods import Method

__all__ = ["compress", "METHOD"]


def compress(K, V, floats: int, rng, *, sink: int, window: int, block_size: int = 64, Q=None):
    """H2O (Zhang et al. 2023): greedy eviction by accumulated attention of the queries ``Q`` (K's shape), the last
    ``window`` tokens always kept; weights 1."""
    return ts.H2O(recent=window).compress(K, V, budget=floats // (2 * K.shape[-1]), Q=Q)


METHOD = Method("h2o", compress, role="baseline", needs_queries=True, needs_scores=True, compress_prefill=h2o_prefill,
                press="H2OPress",
                label="H2O: heavy hitters by accumulated attention plus recent tokens (Zhang et al. 2023)")
