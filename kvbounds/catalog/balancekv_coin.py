"""balancekv_coin: the pseudocode's ablation, its walk with fair coins (random halving), the same blocks and cut."""
from __future__ import annotations

from kvbounds.algorithms.blockwise_balance_kv import compress_cache
from kvbounds.algorithms.compressed_kv import gather_selection
from kvbounds.algorithms.equal_memory import balance_layout
from kvbounds.battery import COIN_C
from kvbounds.methods import Method

__all__ = ["compress", "METHOD"]


def compress(K, V, floats: int, rng, *, sink: int, window: int, block_size: int = 64, Q=None):
    """Blockwise BalanceKV (BalanceKV-NeurIPS App. B.1) at its layout for ``floats`` (equal_memory.balance_layout)
    with fair coins for the walk (:data:`kvbounds.battery.COIN_C`)."""
    T, win = balance_layout(K.shape[-2], K.shape[-1], sink, window, floats)
    idx, lw = compress_cache(K, V, sink=sink, window=win, levels=T, block_size=block_size, rng=rng, c=COIN_C)
    return gather_selection(K, V, idx, lw)


METHOD = Method("balancekv_coin", compress, role="ablation", randomized=True,
                label="the pseudocode's ablation: its walk with fair coins (random halving), the same blocks and cut")
