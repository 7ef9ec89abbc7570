"""balancekv_released_coin: the released walk's ablation, gamma = 0 (random signs), the same cut and estimator."""
from __future__ import annotations

from kvbounds.methods import Method

from . import balancekv_released

__all__ = ["compress", "METHOD"]


def compress(K, V, floats: int, rng, *, sink: int, window: int, block_size: int = 64, Q=None):
    """The released BalanceKV walk at gamma = 0 (random signs, the same cut and estimator), at its layout for
    ``floats`` (:func:`kvbounds.catalog.balancekv_released.compress` with one change)."""
    return balancekv_released.compress(K, V, floats, rng, sink=sink, window=window, block_size=block_size, Q=Q,
                                       gamma=0.0)


METHOD = Method("balancekv_released_coin", compress, role="ablation", randomized=True,
                label="the released walk's ablation: gamma = 0 (random signs), the same cut and estimator")
