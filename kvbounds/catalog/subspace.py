"""subspace: top-r projection of the middle keys and values (Subspace-FD-draft)."""
from __future__ import annotations

from kvbounds.algorithms.equal_memory import fit_to_floats
from kvbounds.e2e import fitted_layers_as_heads
from kvbounds.methods import Method

__all__ = ["compress", "METHOD"]


def compress(K, V, floats: int, rng, *, sink: int, window: int, block_size: int = 64, Q=None):
    """Top-r projection of the middle keys and values (Subspace-FD-draft), fitted to the budget
    (:func:`kvbounds.algorithms.equal_memory.fit_to_floats`)."""
    return fit_to_floats("subspace", K, V, floats, rng, sink=sink, window=window)


METHOD = Method("subspace", compress, algorithm="Subspace/FD", variant="subspace", paper="Subspace-FD-draft",
                compress_layers=fitted_layers_as_heads, press="SubspacePress",
                label="top-r projection of the middle keys and values (Subspace-FD-draft)",
                device_host_reads=("memory_floats: the log-weights (one per token and head), to fit the budget "
                                   "(equal memory)"),
                ablation="subspace_sketch")
