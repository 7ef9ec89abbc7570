"""subspace_random: a weaker subspace control, kept for reference, data-blind random bases of the same
rank."""
from __future__ import annotations

from kvbounds.battery import subspace_random as compress
from kvbounds.methods import Method

__all__ = ["compress", "METHOD"]

# the contract function is the battery's (kvbounds.battery.subspace_random)
METHOD = Method("subspace_random", compress, role="ablation", randomized=True,
                host_only="an ablation of the battery (kvbounds.battery): numpy only",
                label="a weaker subspace control, kept for reference: data-blind random bases of the same rank")
