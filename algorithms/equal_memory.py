"""Every method at equal memory: a method's cache per KV head holds at most a float budget (keys, values and
log-weights counted by :func:`kvbounds.algorithms.compressed_kv.memory_floats`), within :data:`MEMORY_TOLERANCE`
of it. The method registry's contract (:mod:`kvbounds.methods`) is

    compress(K, V, floats, rng, *, sink, window, block_size=64, Q=None) -> CompressedKV

for one layer's K, V (Hkv, n, d) of any backend (numpy on the harness's host path, torch on its device path),
``floats`` per KV head, the first ``sink`` and last ``window`` tokens exact, random draws from the numpy Generator
``rng``; the result lives where K does. Each method's contract function is in its module of :mod:`kvbounds.catalog`;
this module holds what fits a method to a budget: BalanceKV's layout (the largest T-cache that fits, the rest exact
recent tokens: :func:`balance_layout`) and the rounds of SubGen, subspace and k-center with cluster sizes
(:func:`fit_to_floats`), with the checks of sizes and arrays they share.
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms.arrays import array_namespace

from . import cache_compressors as ca
from . import token_selection as ts
from .blockwise_balance_kv import compress_cache
from .subgen_rounds import subgen_held_floats
from .validation import InputError, check_int

__all__ = ["check_sizes", "check_layer_kv", "balance_levels", "balance_floats", "balance_layout", "balance_budgets",
           "MEMORY_TOLERANCE", "budget_problem", "fit_to_floats"]


def check_sizes(**sizes) -> None:
    """Token counts and float budgets of the budget solver: integers >= 0 (n, d, floats >= 1)."""
    for name, v in sizes.items():
        check_int(v, name, minimum=1 if name in ("n", "d", "floats") else 0)


def check_layer_kv(K, V) -> None:
    """K (Hkv, n, d) and V (Hkv, n, dv) arrays (numpy or torch) of the same heads and tokens."""
    for name, x in (("K", K), ("V", V)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype") or len(x.shape) != 3:
            raise InputError(f"{name} must be a (KV heads, tokens, head_dim) numpy array or torch tensor, got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
    if tuple(V.shape[:2]) != tuple(K.shape[:2]):
        raise InputError(f"V {tuple(V.shape)} must have K's heads and tokens {tuple(K.shape[:2])}")



def balance_levels(n: int, d: int, sink: int, window: int, floats: int, per_token_weights: int = 0) -> int:
    """The fewest halvings T whose blockwise BalanceKV cache fits ``floats`` per head: keys and values of the
    kept tokens, one constant log-weight (2^T) per head, plus ``per_token_weights`` per kept middle token."""
    check_sizes(n=n, d=d, sink=sink, window=window, floats=floats, per_token_weights=per_token_weights)
    n_mid = n - sink - window
    if n_mid <= 0:
        raise InputError(f"sink + window = {sink} + {window} leaves no middle to compress in n = {n} tokens")
    T = 0
    while balance_floats(n, d, sink, window, T, per_token_weights) > floats:
        T += 1
        if n_mid >> T == 0:
            raise InputError(f"budget {floats} floats cannot hold BalanceKV's exact sink + window")
    return T


def balance_floats(n: int, d: int, sink: int, window: int, T: int, per_token_weights: int = 0) -> int:
    """Floats per head of a blockwise BalanceKV cache: sink + window exact tokens, n_mid // 2^T kept middle
    tokens with ``per_token_weights`` each, and one constant log-weight (T log 2)."""
    check_sizes(n=n, d=d, sink=sink, window=window, T=T, per_token_weights=per_token_weights)
    kept = (n - sink - window) >> T
    return (sink + window + kept) * 2 * d + kept * per_token_weights + 1


def balance_layout(n: int, d: int, sink: int, window: int, floats: int, per_token_weights: int = 0) -> tuple[int, int]:
    """(T, window') of the BalanceKV cache at equal memory: the largest T-cache that fits ``floats`` (the fewest
    halvings, :func:`balance_levels`), the floats left over filled with exact recent tokens (window' >= window;
    BalanceKV-NeurIPS B.1 keeps the last window exactly, so a longer window is the same algorithm). Within one
    token's floats of ``floats``, never above it."""
    T = balance_levels(n, d, sink, window, floats, per_token_weights)
    lo, hi = 0, n - sink - window - (1 << T)   # largest extra e with the cache still fitting (monotone in e)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if balance_floats(n, d, sink, window + mid, T, per_token_weights) <= floats:
            lo = mid
        else:
            hi = mid - 1
    return T, window + lo


def balance_budgets(n: int, window: int, levels=(3, 2)) -> list[float]:
    """Budgets (fractions of the cache's floats) at which blockwise BalanceKV with ``window`` exact tokens at each
    end and T halvings of the middle needs no filling (plus 0.1% slack for its weight per head). No longer needed
    for equal memory (:func:`balance_layout` fills any budget); kept for callers that want these sizes."""
    check_sizes(n=n, window=window)
    if isinstance(levels, (str, bytes)) or not hasattr(levels, "__iter__"):
        raise InputError(f"levels must be a sequence of halvings T (integers >= 0), got {levels!r}")
    levels = [check_int(T, "levels[i]") for T in levels]
    return [round((2 * window + ((n - 2 * window) >> T)) / n + 1e-3, 6) for T in levels]


# equal memory: every method holds within MEMORY_TOLERANCE of budget x exact floats and never more than +tolerance
MEMORY_TOLERANCE = 0.01


def budget_problem(n: int, d: int, sink: int, window: int, budget: float) -> str | None:
    """Why ``budget`` cannot be met within :data:`MEMORY_TOLERANCE` by every method at context ``n`` (None when it
    can): it must lie in (0, 1], leave a middle (sink + window < n), cover the exact sink + window plus at least one
    middle token, and hold at least 1/tolerance tokens' floats (a token is the granularity of every method)."""
    try:
        check_sizes(n=n, d=d, sink=sink, window=window)
    except InputError as e:
        return str(e)
    if not (isinstance(budget, (int, float)) and 0 < budget <= 1):
        return f"budget must lie in (0, 1], got {budget!r}"
    if sink + window >= n:
        return f"n = {n} is too small for sink + window = {sink} + {window} (need n > sink + window)"
    tokens = budget * n
    if tokens < sink + window + 2:
        return (f"budget {budget:g} holds {tokens:.0f} tokens' floats at n = {n}: not more than the exact sink + "
                f"window ({sink + window})")
    if tokens < 1 / MEMORY_TOLERANCE + 2:
        return (f"budget {budget:g} holds {tokens:.0f} tokens' floats at n = {n}: one token is more than "
                f"{MEMORY_TOLERANCE:.0%} of it, so equal memory within {MEMORY_TOLERANCE:.0%} cannot be met")
    return None



_SUBSPACE_PROBE = True   # False: subspace's rounds on every head (the code before issue 26; tests compare the two)
_SUBGEN_COUNT = True     # False: SubGen's rounds build their caches (the code before; tests compare the two)


def fit_to_floats(method: str, K, V, floats: int, rng, *, sink: int, window: int, traversal=None) -> ts.CompressedKV:
    """SubGen / subspace / k-center with cluster sizes at equal memory. k-center's clusters of size 1 need no
    weight, so it holds less than counted: it gets more centres the same way as SubGen. SubGen's l2 draws repeat tokens, so it holds less than the floats it is
    given: it is given more (its nominal budget raised by the shortfall over its efficiency, the same seed each
    round, at most 6 rounds; when the draws saturate, exact recent tokens as below). A subspace rank costs 2 (n_mid + d) floats at once: the floats left over go to exact
    recent tokens (a longer last window). Either way the largest cache that fits ``floats`` is kept. ``traversal``
    (numpy): the greedy k-center traversal (:class:`~kvbounds.algorithms.kcenter.FarthestFirst`) of SubGen's middle
    or of k-center's keys before its window, shared by the rounds that keep the window (the same clusters as a new
    traversal per round). Subspace's held
    floats per head depend only on n, d and the rank (not on the data): its rounds run on the first head and the
    cache is built once, for every head, at the round kept."""
    d, H = K.shape[-1], K.shape[0]
    seed = int(rng.integers(2**63))
    best = [0.0, None, floats, 0]            # held floats per head, cache, nominal budget, extra window
    probe = method == "subspace" and _SUBSPACE_PROBE
    Kr, Vr, Hr = (K[:1], V[:1], 1) if probe else (K, V, H)
    count = method == "subgen" and _SUBGEN_COUNT and isinstance(K, np.ndarray)
    if count:                                # checked once, as the compressor checks them
        K, V = ca.check_cache(K, V, sink, window, floats)
        Kr, Vr = K, V
    norms2 = np.sum(V.astype(np.float64) ** 2, axis=-1) if count else None     # SubGen's l2 weights, every round

    def build(nominal: int, extra: int):
        c, trav = ca.SubGenCompressor(sink=sink, window=window + extra), None if extra else traversal
        if count:                            # K, V checked above
            return c._compress_checked(K, V, nominal, np.random.default_rng(seed), trav)
        return c.compress(K, V, budget_floats=nominal, rng=np.random.default_rng(seed), traversal=trav)

    def run(nominal: int, extra: int) -> float:
        K, V = Kr, Vr
        if count:                            # the floats it would hold; the cache kept is built once, below
            held = subgen_held_floats(K, V, nominal, seed, sink=sink, window=window + extra,
                                      traversal=None if extra else traversal, norms2=norms2) / Hr
            if best[0] < held <= floats:
                best[:] = [held, (nominal, extra), nominal, extra]
            return held
        if method == "subgen":
            c = build(nominal, extra)
        elif method == "kcenter_sized":
            # the last window's weights are 0 (no float), a centre's log-size one float unless its cluster is 1
            c = ts.KCenter(window=window, weights="cluster_size", traversal=traversal).compress(
                K, V, budget=min(K.shape[-2], window + (nominal - window * 2 * d) // (2 * d + 1)))
        else:
            c = ca.SubspaceCompressor(sink=sink, window=window + extra).compress(K, V, budget_floats=nominal)
        held = ts.memory_floats(c) / Hr
        if best[0] < held <= floats:
            best[:] = [held, c, nominal, extra]
        return held

    done = lambda: best[0] >= (1 - MEMORY_TOLERANCE / 2) * floats
    if method in ("subgen", "kcenter_sized"):    # phase 1: more draws / centres, secant on the nominal budget
        nominal, prev, base = floats, None, (sink + window) * 2 * d
        for _ in range(5):
            held = run(nominal, 0)
            if done():
                break
            eff = ((held - prev[1]) / (nominal - prev[0]) if prev and nominal != prev[0] else
                   (held - base) / max(nominal - base, 1))
            if eff < 0.5 and held <= floats:
                break                        # the draws saturate: few distinct tokens left
            prev = (nominal, held)
            nominal = int(nominal + (floats - held) / max(eff, 0.1) - (d if held > floats else 0))
    else:
        run(floats, 0)
    extra = 0                                # phase 2: what is left goes to exact recent tokens
    for _ in range(4):
        short = int(floats - best[0]) // (2 * d)
        if done() or best[1] is None or short <= 0 or K.shape[-2] - sink - window - extra - short < 2:
            break
        extra += short
        run(best[2] + (short * 2 * d if method == "subgen" else 0), extra)
    if best[1] is None:
        raise InputError(f"{method} holds more than the budget of {floats} floats per head")
    if probe:
        return ca.SubspaceCompressor(sink=sink, window=window + best[3]).compress(K, V, budget_floats=best[2])
    return build(best[2], best[3]) if count else best[1]
