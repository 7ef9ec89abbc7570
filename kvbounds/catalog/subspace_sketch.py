"""subspace_sketch: the subspace method's ablation, bases of the same rank from a Gaussian random projection of
the middle."""
from __future__ import annotations

from kvbounds.battery import subspace_sketch as compress
from kvbounds.methods import Method

__all__ = ["compress", "METHOD"]

# the contract function is the battery's (kvbounds.battery.subspace_sketch): the claims' checks use it too
METHOD = Method("subspace_sketch", compress, role="ablation", randomized=True,
                host_only="an ablation of the battery (kvbounds.battery): numpy only",
                label="the subspace method's ablation: bases of the same rank from a Gaussian random projection of the "
                      "middle (found by chance from the data)")
