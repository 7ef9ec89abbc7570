"""kcenter: greedy k-center of the keys plus the recent window, weights 1 (ClusterGen Sec. 4.1)."""
from __future__ import annotations

from kvbounds.algorithms import token_selection as ts
from kvbounds.e2e import layers_as_heads
from kvbounds.methods import Method

__all__ = ["compress", "METHOD"]


def compress(K, V, floats: int, rng, *, sink: int, window: int, block_size: int = 64, Q=None):
    """Greedy k-center of the keys before the last ``window`` tokens plus that window (ClusterGen Sec. 4.1);
    weights 1."""
    return ts.KCenter(window=window).compress(K, V, budget=floats // (2 * K.shape[-1]))


METHOD = Method("kcenter", compress, algorithm="SubGen/ClusterGen", variant="kcenter", paper="ClusterGen",
                compress_layers=layers_as_heads, press="KCenterPress", press_options=(("cluster_sized", False),),
                label="greedy k-center of the keys plus the recent window, weights 1 (ClusterGen Sec. 4.1)",
                device_host_reads=("greedy k-center's radii and cluster labels (kcenter.greedy_k_center, "
                                   "recent_plus_centers)"),
                ablation="kcenter_random")
