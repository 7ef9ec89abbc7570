"""kcenter_sized_random: sized k-center's ablation, random centres weighted by their nearest-centre clusters' sizes."""
from __future__ import annotations

import numpy as np

from kvbounds.algorithms.compressed_kv import gather_selection
from kvbounds.algorithms.validation import check_int, check_rng
from kvbounds.methods import Method

from . import kcenter_random

__all__ = ["compress", "METHOD"]


def compress(K, V, floats: int, rng, *, sink: int, window: int, block_size: int = 64, Q=None):
    """k-center with cluster sizes (the last ``window`` tokens exact, each centre weighted by the size of its
    cluster) with random centres: as many as fit ``floats`` at 2d + 1 floats each, every key before the window
    assigned to its nearest random centre (the same centres for every head; the sizes per head)."""
    K, V = kcenter_random.numpy_kv(K, V)
    n, d = K.shape[-2], K.shape[-1]
    w = min(check_int(window, "window"), n)
    k = min(max(check_int(floats, "floats") - w * 2 * d, 0) // (2 * d + 1), n - w)
    if k == 0:
        return kcenter_random.compress(K, V, floats, rng, sink=sink, window=window)
    cen = np.sort(check_rng(rng).choice(n - w, k, replace=False))
    X = np.asarray(K[..., :n - w, :], np.float64)
    C = X[..., cen, :]
    d2 = (X * X).sum(-1)[..., :, None] - 2 * X @ np.swapaxes(C, -1, -2) + (C * C).sum(-1)[..., None, :]
    lab = np.argmin(d2, axis=-1)                                               # (..., n - w)
    sizes = np.stack([np.bincount(l, minlength=k) for l in lab.reshape(-1, n - w)]).reshape(lab.shape[:-1] + (k,))
    logw = np.log(np.maximum(sizes, 1)).astype(np.float32)
    idx = np.concatenate([cen, np.arange(n - w, n)]).astype(np.int64)
    c = gather_selection(K, V, idx, np.zeros(len(idx)))
    lw = np.concatenate([logw, np.zeros(logw.shape[:-1] + (w,), np.float32)], axis=-1)
    c.log_w_num, c.log_w_den = lw, lw.copy()
    return c


METHOD = Method("kcenter_sized_random", compress, role="ablation", randomized=True,
                host_only="an ablation of the battery (kvbounds.battery): numpy only",
                label="sized k-center's ablation: random centres weighted by their nearest-centre clusters' sizes")
