"""kernel_thinning: uniform's layout, the middle chosen by kernel thinning (goodpoints, the extra
kvbounds[kt])."""
from __future__ import annotations

from kvbounds.algorithms.kernel_thinning import KernelThinning
from kvbounds.methods import Method

__all__ = ["compress", "METHOD"]


def compress(K, V, floats: int, rng, *, sink: int, window: int, block_size: int = 64, Q=None):
    """Uniform's layout and weights, the middle chosen by kernel thinning (goodpoints, the extra kvbounds[kt])."""
    return KernelThinning(sink=sink, window=window).compress(K, V, budget=(floats - 1) // (2 * K.shape[-1]), rng=rng)


METHOD = Method("kernel_thinning", compress, role="baseline", randomized=True, requires="goodpoints",
                press="KernelThinningPress", label="sink and window exact, the middle by kernel thinning (goodpoints)")
