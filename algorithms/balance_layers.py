"""Blockwise BalanceKV's cache (BalanceKV-NeurIPS App. B.1, :func:`kvbounds.algorithms.blockwise_balance_kv.compress_cache`)
and the authors' released walk's (:func:`kvbounds.algorithms.balance_kv_released.compress_cache_released`) for
every layer of a model at once (the end-to-end harness's cost; claims BKV.e2e, BKV.vs-uniform).

One call per layer spends most of its time in the walk's ~b small sequential steps per level, each a few numpy
operations on a handful of blocks; stacking the layers makes each step act on every layer's blocks at once.
:func:`compress_cache_layers` returns exactly what one ``compress_cache`` call per layer, in layer order, with the
same ``rng``, returns: each layer's uniforms are pre-drawn as its own contiguous stretch of the stream (numpy's
``Generator.random`` fills arrays in C order, one 64-bit draw per double, so ``random(a)`` then ``random(b)`` is
``random(a + b)``) and handed to the walk level by level (:class:`_LayerUniforms`); layers are stacked only
while the walk's panel width stays the one-layer call's (``block_walk.STEP_ENTRIES``), so every block's Gram
panel and step sees the same arithmetic. Tests pin the equality (tests/algorithms/test_balance_layers.py).
"""
from __future__ import annotations

import math

import numpy as np

from .block_walk import STEP_ENTRIES
from .blockwise_balance_kv import WALK_PANEL, check_block, check_levels, compress_cache
from .validation import InputError, check_array, check_int, check_rng

__all__ = ["compress_cache_layers", "compress_cache_released_layers", "RELEASED_BYTES"]


class _LayerUniforms:
    """``random(shape)`` for the stacked call: shape (Lc * H, nb, b), the next stretch of each layer's uniforms."""

    def __init__(self, R: np.ndarray):
        self.R, self.off = R, 0                        # R (Lc, S): layer l's S uniforms in its stream order

    def random(self, shape):
        size = math.prod(shape) // self.R.shape[0]
        out = self.R[:, self.off:self.off + size].reshape(shape)
        self.off += size
        return out


def _level_shapes(n_mid: int, levels: int, block_size: int):
    """Per level (blocks nb, walk length b, panel width) of one head's middle of n_mid tokens."""
    out, m = [], n_mid
    for _ in range(levels):
        b = min(block_size, m + m % 2)
        out.append((-(-m // block_size), b, WALK_PANEL if b % WALK_PANEL == 0 else b))
        m //= 2
    return out


def _check_layer_stack(K, V, rng, name: str, per_layer: str) -> None:
    """The stacked host path's inputs: numpy K (L, ..., n, d) and V (L, ..., n, s) agreeing in all but the last
    dimension, and a numpy Generator; ``name`` is the caller, ``per_layer`` the function to call otherwise."""
    if not (isinstance(K, np.ndarray) and isinstance(V, np.ndarray)):
        raise InputError(f"{name} takes numpy arrays (the host path), got {type(K).__name__} and "
                         f"{type(V).__name__}; call {per_layer} per layer for other backends")
    check_array(K, "K", ndim=tuple(range(3, 8)), min_rows=1)
    check_array(V, "V", ndim=K.ndim)
    if tuple(V.shape[:-1]) != tuple(K.shape[:-1]):
        raise InputError(f"K and V must agree in all but the last dimension, got {K.shape} and {V.shape}")
    check_rng(rng)


def compress_cache_layers(K, V, *, sink: int, window: int, levels: int, block_size: int, rng: np.random.Generator,
                          **kw):
    """``compress_cache`` (method "balance") of every layer: K (L, ..., n, d), V (L, ..., n, s) numpy, layer first.
    Returns ``(indices, log_weights)`` (L, ..., n_kept), equal to stacking ``compress_cache(K[l], V[l], ...)`` for
    l = 0..L-1 called in that order with ``rng``; ``kw`` as compress_cache's (not ``method``)."""
    if "method" in kw:
        raise InputError("compress_cache_layers runs blockwise BalanceKV only (method='balance')")
    _check_layer_stack(K, V, rng, "compress_cache_layers", "compress_cache")
    L, H, n = K.shape[0], math.prod(K.shape[1:-2]), K.shape[-2]
    n_mid = n - check_int(sink, "sink") - check_int(window, "window")
    levels = check_levels(levels, n_mid) if n_mid > 0 else check_int(levels, "levels")
    shapes = _level_shapes(n_mid, levels, check_block(block_size)) if n_mid > 0 else []
    S = sum(2 * H * nb * block_size for nb, _, _ in shapes)       # the walk's and the priorities' uniforms
    widest = max((H * nb * p for nb, _, p in shapes), default=1)
    per = max(1, STEP_ENTRIES // widest) if widest <= STEP_ENTRIES else 1
    R = rng.random((L, S))
    parts = [compress_cache(K[l0:l0 + per], V[l0:l0 + per], sink=sink, window=window, levels=levels,
                            block_size=block_size, rng=rng, _uniforms=_LayerUniforms(R[l0:l0 + per]), **kw)
             for l0 in range(0, L, per)]
    return np.concatenate([p[0] for p in parts]), np.concatenate([np.broadcast_to(p[1], p[0].shape) for p in parts])


def compress_cache_released_layers(K, V, *, sink: int, window: int, levels: int, block_size: int,
                                   rng: np.random.Generator, **walk):
    """``compress_cache_released`` of every layer: K (L, ..., n, d), V (L, ..., n, s) numpy, layer first. Returns
    ``(indices, log_w_num, log_w_den)`` (L, ..., n_kept), equal to stacking ``compress_cache_released(K[l], V[l],
    ...)`` for l = 0..L-1 called in that order with ``rng``: each layer's uniforms pre-drawn as its own stretch of
    the stream (:class:`_LayerUniforms`), and a layer whose kernel overflows K's dtype at a level evaluated in
    float64 on its own (``overflow="float64"``), as its own call would. ``walk``: as compress_cache_released's
    (not ``uniforms`` or ``diagnostics``)."""
    from .balance_kv_released import compress_cache_released
    for name in ("uniforms", "diagnostics"):
        if name in walk:
            raise InputError(f"compress_cache_released_layers draws from rng and keeps no diagnostics ({name})")
    _check_layer_stack(K, V, rng, "compress_cache_released_layers", "compress_cache_released")
    if K.dtype != V.dtype:            # the rest of compress_cache_released's checks: then its calls skip them
        raise InputError(f"K and V must have the same dtype, got {K.dtype} and {V.dtype}")
    L, H, n = K.shape[0], math.prod(K.shape[1:-2]), K.shape[-2]
    m = n - check_int(sink, "sink") - check_int(window, "window")
    b = check_block(block_size)
    # the per-layer call's rule (released_select's), before the levels drive the loop below
    levels = check_levels(levels, m) if m > 0 else check_int(levels, "levels")
    S = 0
    for _ in range(levels if m > 0 else 0):   # released_select's (heads, blocks, b) per level
        S += H * (-(-m // b)) * b
        m //= 2
    R = rng.random((L, S))
    # layers in groups whose first-level kernels (H x blocks x b x b) stay within RELEASED_BYTES: each walk step
    # reads a column of every block's kernel, which is slower than one layer at a time once it leaves the cache
    nb0 = -(-(n - sink - window) // b) if n - sink - window > 0 else 1
    per = max(1, RELEASED_BYTES // max(1, H * nb0 * b * b * K.dtype.itemsize))
    parts = []
    for l0 in range(0, L, per):
        U = _LayerUniforms(R[l0:l0 + per])
        parts.append(compress_cache_released(K[l0:l0 + per], V[l0:l0 + per], sink=sink, window=window, levels=levels,
                                             block_size=block_size, uniforms=lambda shape, U=U: U.random(shape).astype(
                                                 K.dtype), _groups=H, _checked=True, **walk))
    return tuple(np.concatenate([p[j] for p in parts]) for j in range(3))


RELEASED_BYTES = 1 << 23
