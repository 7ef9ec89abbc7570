"""balancekv_released: BalanceKV as the authors released it (their walk; BalanceKV-NeurIPS code)."""
from __future__ import annotations

import numpy as np

from kvbounds.algorithms import cache_compressors as ca
from kvbounds.algorithms import token_selection as ts
from kvbounds.algorithms.arrays import array_namespace
from kvbounds.algorithms.equal_memory import balance_layout
from kvbounds.algorithms.validation import InputError
from kvbounds.e2e import released_layers
from kvbounds.methods import Method

__all__ = ["compress", "METHOD"]


def compress(K, V, floats: int, rng, *, sink: int, window: int, block_size: int = 64, Q=None, **walk):
    """The authors' released BalanceKV walk: a = log w per token (one float each, counted), b = T log 2 (one per
    head); levels whose kernel overflows float32 run in float64. ``walk``: changes to the released walk's settings
    (``gamma=0.0``: random signs, its ablation, :mod:`kvbounds.catalog.balancekv_released_coin`)."""
    fn = ca.released_balancekv()
    if fn is None:
        raise InputError("balancekv_released needs kvbounds.algorithms.balance_kv_released (not present)")
    T, win = balance_layout(K.shape[-2], K.shape[-1], sink, window, floats, per_token_weights=1)
    # SmolLM2's keys overflow the released kernel in float32 from n ~ 1024 on: those levels run in float64
    idx, a, b = fn(K, V, sink=sink, window=win, levels=T, block_size=block_size, rng=rng, overflow="float64", **walk)
    c = ts.gather_selection(K, V, idx, a)
    if isinstance(K, np.ndarray):
        c.log_w_den = np.array(np.broadcast_to(np.asarray(b, np.float32), c.log_w_num.shape))
    else:
        xp = array_namespace(K)
        c.log_w_den = xp.asarray(xp.broadcast_to(xp.astype(b, xp.float32), c.log_w_num.shape), copy=True)
    return c


METHOD = Method("balancekv_released", compress, algorithm="BalanceKV", variant="released",
                paper="BalanceKV-NeurIPS", randomized=True, compress_layers=released_layers,
                press="BalanceKVReleasedPress", label="BalanceKV as the authors released it (their walk)",
                ablation="balancekv_released_coin")
