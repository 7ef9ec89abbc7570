"""uniform: sink and window exact, the middle a weighted uniform sample (the battery's uniform control)."""
from __future__ import annotations

from kvbounds.algorithms import token_selection as ts
from kvbounds.methods import Method

__all__ = ["compress", "METHOD"]


def compress(K, V, floats: int, rng, *, sink: int, window: int, block_size: int = 64, Q=None):
    """Sink and window exact, the middle sampled uniformly without replacement, weight n_mid / kept (one float per
    head for the weight)."""
    return ts.Uniform(sink=sink, window=window).compress(K, V, budget=(floats - 1) // (2 * K.shape[-1]), rng=rng)


METHOD = Method("uniform", compress, role="baseline", randomized=True, press="UniformPress",
                label="sink and window exact, the middle sampled uniformly, weight n_mid / kept")
