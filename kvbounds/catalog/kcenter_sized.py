"""kcenter_sized: greedy k-center, each centre weighted by its cluster's size, fitted to the budget."""
from __future__ import annotations

from kvbounds.algorithms.equal_memory import fit_to_floats
from kvbounds.e2e import prefix_traversal_layers
from kvbounds.methods import Method

__all__ = ["compress", "METHOD"]


def compress(K, V, floats: int, rng, *, sink: int, window: int, block_size: int = 64, Q=None):
    """Greedy k-center with each centre weighted by its cluster's size, fitted to the budget
    (:func:`kvbounds.algorithms.equal_memory.fit_to_floats`)."""
    return fit_to_floats("kcenter_sized", K, V, floats, rng, sink=sink, window=window)


METHOD = Method("kcenter_sized", compress, algorithm="SubGen/ClusterGen", variant="kcenter_sized",
                paper="ClusterGen", compress_layers=prefix_traversal_layers, press="KCenterPress",
                press_options=(("cluster_sized", True),),
                label="greedy k-center, each centre weighted by its cluster's size",
                device_host_reads=("greedy k-center's radii and cluster labels (kcenter.greedy_k_center, "
                                   "recent_plus_centers); memory_floats: the log-weights (one per token and head), to "
                                   "fit the budget (equal memory)"),
                ablation="kcenter_sized_random")
