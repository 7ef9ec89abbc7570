"""kcenter_random: k-center's ablation, random centres, the same window, weights 1."""
from __future__ import annotations

import numpy as np

from kvbounds.algorithms.compressed_kv import gather_selection
from kvbounds.algorithms.validation import InputError, check_int, check_rng
from kvbounds.methods import Method

__all__ = ["compress", "METHOD"]


def numpy_kv(K, V):
    """K, V as given, when both are numpy arrays (the random-centre ablations run on the host)."""
    for x, name in ((K, "K"), (V, "V")):
        if not isinstance(x, np.ndarray):
            raise InputError(f"{name} must be a numpy array (this ablation runs on the host)")
    return K, V


def compress(K, V, floats: int, rng, *, sink: int, window: int, block_size: int = 64, Q=None):
    """k-center's layout (the last ``window`` tokens and centres before it, ``floats // (2d)`` tokens, weights 1)
    with the centres drawn uniformly without replacement."""
    K, V = numpy_kv(K, V)
    n, d = K.shape[-2], K.shape[-1]
    m = min(check_int(floats, "floats") // (2 * d), n)
    w = min(check_int(window, "window"), m)
    pick = np.sort(check_rng(rng).choice(n - w, m - w, replace=False)) if m > w else np.zeros(0, np.int64)
    idx = np.concatenate([pick, np.arange(n - w, n)]).astype(np.int64)
    return gather_selection(K, V, idx, np.zeros(len(idx)))


METHOD = Method("kcenter_random", compress, role="ablation", randomized=True,
                host_only="an ablation of the battery (kvbounds.battery): numpy only",
                label="k-center's ablation: random centres, the same window, weights 1")
