"""balancekv: blockwise BalanceKV, the paper's pseudocode (BalanceKV-NeurIPS App. B.1)."""
from __future__ import annotations

from kvbounds.algorithms import token_selection as ts
from kvbounds.algorithms.blockwise_balance_kv import compress_cache
from kvbounds.algorithms.equal_memory import balance_layout
from kvbounds.e2e import balancekv_layers
from kvbounds.methods import Method

__all__ = ["compress", "METHOD"]


def compress(K, V, floats: int, rng, *, sink: int, window: int, block_size: int = 64, Q=None):
    """Blockwise BalanceKV, the paper's pseudocode (BalanceKV-NeurIPS App. B.1): the largest T-cache that fits, the
    floats left over as exact recent tokens (:func:`kvbounds.algorithms.equal_memory.balance_layout`)."""
    T, win = balance_layout(K.shape[-2], K.shape[-1], sink, window, floats)
    idx, lw = compress_cache(K, V, sink=sink, window=win, levels=T, block_size=block_size, rng=rng)
    return ts.gather_selection(K, V, idx, lw)


METHOD = Method("balancekv", compress, algorithm="BalanceKV", variant="pseudocode", paper="BalanceKV-NeurIPS",
                randomized=True, compress_layers=balancekv_layers, press="BalanceKVPress",
                label="blockwise BalanceKV, the paper's pseudocode (BalanceKV-NeurIPS App. B.1)",
                device_host_reads="the walk's FAIL flags, one bool per head and level (block_walk.panel_walk)",
                ablation="balancekv_coin")
