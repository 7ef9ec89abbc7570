"""subgen: SubGen's estimator (SubGen Alg. 1), cluster representatives for the denominator, l2-sampled values."""
from __future__ import annotations

from kvbounds.algorithms.equal_memory import fit_to_floats
from kvbounds.e2e import middle_traversal_layers
from kvbounds.methods import Method

__all__ = ["compress", "METHOD"]


def compress(K, V, floats: int, rng, *, sink: int, window: int, block_size: int = 64, Q=None):
    """SubGen's estimator (SubGen Alg. 1), split numerator/denominator weights, fitted to the budget
    (:func:`kvbounds.algorithms.equal_memory.fit_to_floats`)."""
    return fit_to_floats("subgen", K, V, floats, rng, sink=sink, window=window)


METHOD = Method("subgen", compress, algorithm="SubGen/ClusterGen", variant="subgen", paper="SubGen", randomized=True,
                compress_layers=middle_traversal_layers, press="SubGenPress",
                label=("SubGen's estimator: cluster representatives for the denominator, l2-sampled values "
                       "(SubGen Alg. 1)"),
                device_host_reads=("greedy k-center's radii (kcenter.greedy_k_center); memory_floats: the log-weights "
                                   "(one per token and head), to fit the budget (equal memory)"),
                ablation="subgen_uniform")
