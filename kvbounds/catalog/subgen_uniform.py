"""subgen_uniform: SubGen's ablation, its split of floats, uniform draws for its cluster and l2 samples."""
from __future__ import annotations

import numpy as np

from kvbounds.algorithms.validation import InputError, check_rng
from kvbounds.battery import split_uniform
from kvbounds.methods import Method

from . import subgen

__all__ = ["compress", "METHOD"]


def compress(K, V, floats: int, rng, *, sink: int, window: int, block_size: int = 64, Q=None):
    """SubGen's cache at ``floats`` (its split between denominator-only and numerator tokens, read from the cache
    SubGen builds) with uniform draws in place of its cluster samples and its l2 samples, the same sink and window
    exact (:func:`kvbounds.battery.split_uniform`)."""
    for x, name in ((K, "K"), (V, "V")):
        if not isinstance(x, np.ndarray):
            raise InputError(f"{name} must be a numpy array (this ablation runs on the host)")
    c = subgen.compress(K, V, floats, np.random.default_rng(check_rng(rng).integers(2**63)), sink=sink, window=window)
    a, b = (np.asarray(x, np.float64).reshape(-1, np.asarray(x).shape[-1]) for x in (c.log_w_num, c.log_w_den))
    den = int(np.mean(np.sum(np.isfinite(b) & ~np.isfinite(a), axis=-1)))
    num = int(np.mean(np.sum(np.isfinite(a) & ~((a == 0) & (b == 0)), axis=-1)))
    d, dv = K.shape[-1], V.shape[-1]
    return split_uniform(K, V, den * d + 1, num * (d + dv) + 1, rng, sink=sink, window=window)


METHOD = Method("subgen_uniform", compress, role="ablation", randomized=True,
                host_only="an ablation of the battery (kvbounds.battery): numpy only",
                label="SubGen's ablation: its split of floats, uniform draws for its cluster and l2 samples")
