"""The end-to-end harness's host path with every layer in one call (compression cheap next to the
prefill; claims BKV.e2e, SG.e2e). Each function returns exactly what :func:`kvbounds.e2e.compress_ours`
gives one layer at a time, in layer order, with the same ``rng`` (tests/e2e/test_e2e_layers.py): BalanceKV's and the
released walk's levels stacked over layers (:mod:`kvbounds.algorithms.balance_layers`), SubGen's greedy k-center
traversal run once for every layer and shared by the rounds of its equal-memory fit, k-center and subspace on the
(layers x heads) stack.
"""
from __future__ import annotations

import numpy as np

from kvbounds import methods as registry
from kvbounds.algorithms import cache_compressors as ca
from kvbounds.algorithms import token_selection as ts
from kvbounds.algorithms.balance_layers import compress_cache_layers
from kvbounds.algorithms.compressed_kv import take_rows
from kvbounds.algorithms.equal_memory import balance_layout, check_layer_kv, check_sizes, fit_to_floats
from kvbounds.algorithms.validation import check_rng

from ._methods import compress_ours
from kvbounds.algorithms.balance_layers import compress_cache_released_layers
from kvbounds.algorithms.kcenter import FarthestFirst


def compress_stacked(method: str, state, floats: int, rng, *, sink: int, window: int, block_size: int = 64):
    """Every layer of ``state`` compressed by ``method`` on the host in one stacked call (its registry entry's
    ``compress_layers``), or None when the method has no stacked form (the caller then goes layer by layer)."""
    fn = registry.get_method(method).function("compress_layers")
    if fn is None:
        return None
    return fn(method, state, floats, rng, sink=sink, window=window, block_size=block_size)


def balancekv_layers(method: str, state, floats: int, rng, *, sink: int, window: int, block_size: int = 64):
    """compress_ours("balancekv") of every layer on the host, the layers' walks stacked
    (:func:`kvbounds.algorithms.balance_layers.compress_cache_layers`: the same indices as one call per layer)."""
    K = np.stack([X[0].float().cpu().numpy() for X in state.keys])
    V = np.stack([X[0].float().cpu().numpy() for X in state.values])
    T, win = balance_layout(state.n, K.shape[-1], sink, window, floats)
    idx, lw = compress_cache_layers(K, V, sink=sink, window=win, levels=T, block_size=block_size, rng=rng)
    return [ts.gather_selection(K[l], V[l], idx[l], lw[l]) for l in range(K.shape[0])]


def released_layers(method: str, state, floats: int, rng, *, sink: int, window: int, block_size: int = 64):
    """compress_ours("balancekv_released") of every layer on the host, the layers' walks stacked
    (:func:`kvbounds.algorithms.balance_layers.compress_cache_released_layers`: the same caches as one call per
    layer, a layer whose kernel overflows float32 evaluated in float64 on its own)."""
    if ca.released_balancekv() is None:          # the released walk's module is absent: compress_ours says so
        return None
    K = np.stack([X[0].float().cpu().numpy() for X in state.keys])
    V = np.stack([X[0].float().cpu().numpy() for X in state.values])
    T, win = balance_layout(state.n, K.shape[-1], sink, window, floats, per_token_weights=1)
    idx, a, b = compress_cache_released_layers(K, V, sink=sink, window=win, levels=T, block_size=block_size, rng=rng,
                                               overflow="float64")
    # every layer's rows in one gather (what gather_selection takes per layer: the walk's indices are in range and
    # its log-weights finite by construction, K and V were checked by the walk)
    Ks, Vs = take_rows(np, K, idx), take_rows(np, V, idx)
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return [ts.CompressedKV(Ks[l], Vs[l], a[l].copy(), b[l].copy()) for l in range(K.shape[0])]


def middle_traversal_layers(method: str, state, floats: int, rng, *, sink: int, window: int,
                            block_size: int = 64) -> list[ts.CompressedKV]:
    """:func:`traversal_layers` with the traversal of each layer's middle (SubGen's clusters)."""
    return traversal_layers(method, state, floats, rng, sink=sink, window=window, middle=True)


def prefix_traversal_layers(method: str, state, floats: int, rng, *, sink: int, window: int,
                            block_size: int = 64) -> list[ts.CompressedKV]:
    """:func:`traversal_layers` with the traversal of each layer's tokens before its window (k-center's)."""
    return traversal_layers(method, state, floats, rng, sink=sink, window=window, middle=False)


def traversal_layers(method: str, state, floats: int, rng, *, sink: int, window: int,
                     middle: bool) -> list[ts.CompressedKV]:
    """compress_ours("subgen" / "kcenter_sized") of every layer on the host, in layer order (the same draws), with
    one greedy k-center traversal of all layers' keys (:class:`~kvbounds.algorithms.kcenter.FarthestFirst`: SubGen's
    middle, k-center's tokens before its window) run to the first round's k for every layer at once and then
    continued per layer by the rounds of :func:`~kvbounds.algorithms.equal_memory.fit_to_floats`."""
    K = np.stack([X[0].float().cpu().numpy() for X in state.keys])
    V = np.stack([X[0].float().cpu().numpy() for X in state.values])
    check_layer_kv(K[0], V[0])
    check_sizes(floats=floats, sink=sink, window=window)
    check_rng(rng)
    n, d = K.shape[-2], K.shape[-1]
    trav = [None] * K.shape[0]
    left = floats - (sink + window) * 2 * d
    if middle and sink + window < n and left >= 3 * d + 2:        # else fit_to_floats raises the reason
        ff = FarthestFirst(K[:, :, sink:n - window])
        ff.advance(ca.SubGenCompressor(sink=sink, window=window).sizes(n - sink - window, d, left, floats)[0])
        trav = ff.layers()
    k = min(n, window + (floats - window * 2 * d) // (2 * d + 1)) - window     # fit_to_floats' first k-center budget
    if not middle and 0 < k <= n - window:
        ff = FarthestFirst(K[:, :, :n - window])
        ff.advance(k)
        trav = ff.layers()
    return [fit_to_floats(method, K[l], V[l], floats, rng, sink=sink, window=window, traversal=trav[l])
            for l in range(K.shape[0])]


# Methods whose heads are independent and draw nothing (k-center; subspace, whose fit to the budget reads only
# per-head float counts that are the same in every layer: rank from n, d and the budget, so its rounds are the same
# in one call as per layer): every layer's heads in one call give each layer the tokens and weights of its own call.
# SubGen and k-center with cluster sizes are fitted layer by layer (their counts depend on the data); their rounds
# share one traversal per layer (:func:`traversal_layers`).

def layers_as_heads(method: str, state, floats: int, rng, *, sink: int, window: int, block_size: int = 64,
                    seed_per_layer: bool = False) -> list[ts.CompressedKV]:
    """compress_ours of every layer on the host in one call on the (layers x heads, n, d) stack, split back.
    ``seed_per_layer``: the method's fit draws one seed per call (unused by its result): the stream is advanced as
    layer by layer would."""
    K, V = (np.concatenate([X[0].float().cpu().numpy() for X in xs]) for xs in (state.keys, state.values))
    L = len(state.keys)
    c = compress_ours(method, K, V, floats, rng, sink=sink, window=window)
    if seed_per_layer:
        for _ in range(L - 1):
            rng.integers(2**63)
    return c.head_groups(L)


def fitted_layers_as_heads(method: str, state, floats: int, rng, *, sink: int, window: int,
                           block_size: int = 64) -> list[ts.CompressedKV]:
    """:func:`layers_as_heads` for a method fitted by :func:`~kvbounds.algorithms.equal_memory.fit_to_floats`
    (one seed drawn per call)."""
    return layers_as_heads(method, state, floats, rng, sink=sink, window=window, seed_per_layer=True)
