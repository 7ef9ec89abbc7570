"""The self-balancing walk of Alweiss, Liu and Sawhney, as restated in BalanceKV-NeurIPS Alg. 3 (Thm A.1) and BalanceKV-preprint Alg. 4.

Claims: SBW.balance (and, through :func:`gram_walk`, SB.discrepancy).

Alg. 3, with ``w = sum_{U+} u - sum_{U-} u``::

    c <- 30 log(n/delta)                                   (line 2)
    for each u_i:  x = <w, u_i>
        if |x| > c r^2: FAIL                               (lines 5-6)
        p_i = 1/2 - x / (2 c r^2)                          (line 8)
        eps_i = +1 with probability p_i, else -1           (line 9)
    output the smaller of U+, U-                           (lines 12-16)

The walk is sequential in i; every function here is batched over leading dimensions (blocks, heads,
trials) so each of the n steps is one array operation. The coin flips are uniforms drawn by a numpy
``Generator`` up front (eps_i = +1 iff uniform_i < p_i), so a seed gives the same signs on every backend.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from kvbounds.algorithms.arrays import array_namespace, like, to_numpy, device as _dev

from .validation import InputError, check_array, check_positive, check_probability, check_rng, namespace

__all__ = ["WalkFailed", "WalkResult", "walk_constant", "walk_choose", "walk_finish", "walk_finish_np",
           "self_balancing_walk_result", "self_balancing_walk", "gram_walk", "gram_walk_unchecked", "smaller_side"]


class WalkFailed(RuntimeError):
    """The FAIL event of Alg. 3 line 6 (|<w, u_i>| > c r^2)."""

    def __init__(self, index: int, inner: float, threshold: float):
        super().__init__(f"self-balancing walk FAILED at step {index}: |<w, u_i>| = {inner:.4g} > c r^2 = {threshold:.4g}")
        self.index, self.inner, self.threshold = index, inner, threshold


@dataclasses.dataclass
class WalkResult:
    signs: Any           # (..., n) in {+1, -1}, same backend as the input
    failed: np.ndarray   # (...,) bool: the FAIL event happened (the walk then continues with p clipped)
    fail_index: np.ndarray  # (...,) first failing step, -1 if none
    max_abs_inner: np.ndarray  # (...,) max_i |<w_{i-1}, u_i>| / (c r^2), the walk's own slack certificate


def walk_constant(n: int, delta: float) -> float:
    """c = 30 log(n/delta) (BalanceKV-NeurIPS Alg. 3 line 2, Alg. 2 line 3)."""
    check_positive(n, "n", integer=True)
    check_probability(delta, "delta")
    return 30.0 * math.log(n / delta)


def walk_choose(xp, x, u, c):
    """One step: FAIL flag, and the sign drawn from p = 1/2 - x/(2c) (x already divided by r^2)."""
    fail = xp.abs(x) > c
    p = xp.clip(0.5 - x / (2.0 * c), 0.0, 1.0)
    one = xp.ones_like(x)
    return fail, xp.where(u < p, one, -one)


def walk_finish(xp, signs, fails, ratios, on_fail, scale=1.0):
    # kept on the device during the walk and moved once here (no per-step synchronisation)
    failed_np = to_numpy(xp.stack(fails, axis=-1))
    ratio_np = to_numpy(xp.stack(ratios, axis=-1))
    return walk_finish_np(signs, failed_np, ratio_np, on_fail, scale)


def walk_finish_np(signs, failed_np, ratio_np, on_fail, scale):
    any_fail = failed_np.any(axis=-1)
    first = np.where(any_fail, failed_np.argmax(axis=-1), -1)
    max_ratio = ratio_np.max(axis=-1)
    if on_fail == "raise" and np.any(any_fail):
        idx = int(np.min(first[any_fail]))
        at = np.argwhere(failed_np[..., idx])[0]          # the first batch entry failing at that step
        raise WalkFailed(idx, float(ratio_np[tuple(at)][idx]) * scale, scale)
    return WalkResult(signs, any_fail, first, max_ratio)


def self_balancing_walk_result(U, *, delta: float, rng: np.random.Generator, r: float | None = None,
                               c: float | None = None, on_fail: str = "raise") -> WalkResult:
    """Alg. 3 on vectors ``U`` of shape (n, d) or batched (..., n, d).

    ``r`` defaults to max ||u_i|| (per batch entry it is the global max); a given ``r`` below the
    largest norm is an error. ``c`` defaults to 30 log(n/delta). ``on_fail``: "raise" (WalkFailed) or
    "continue" (clip p to [0, 1], record the event)."""
    check_array(U, "U", ndim=tuple(range(2, 8)), min_rows=1)
    check_probability(delta, "delta")
    check_rng(rng)
    if on_fail not in ("raise", "continue"):
        raise InputError(f"on_fail must be 'raise' or 'continue', got {on_fail!r}")
    xp = array_namespace(U)
    n = U.shape[-2]
    norms = xp.linalg.vector_norm(U, axis=-1)
    rmax = float(xp.max(norms))
    if not math.isfinite(rmax):
        raise InputError(f"U is too large: its row norms overflow {U.dtype}")
    if r is None:
        r = rmax if rmax > 0 else 1.0
    check_positive(r, "r")
    r = float(r)
    if c is not None:
        check_positive(c, "c")
    if rmax > r * (1 + 1e-12):
        raise InputError(f"radius r = {r} is below the largest vector norm {rmax:.6g}")
    c = walk_constant(n, delta) if c is None else float(c)
    check_positive(c, "c")
    batch = tuple(U.shape[:-2])
    uniforms = like(rng.random(batch + (n,)), U)
    Ur = U / r   # x / r^2 = <w/r, u_i/r>
    w = xp.zeros(batch + (U.shape[-1],), dtype=U.dtype, device=_dev(U))
    cols, fails, ratios = [], [], []
    for i in range(n):
        ui = Ur[..., i, :]
        x = xp.sum(w * ui, axis=-1)
        fail, eps = walk_choose(xp, x, uniforms[..., i], c)
        w = w + eps[..., None] * ui
        cols.append(eps)
        fails.append(fail)
        ratios.append(xp.abs(x) / c)
    return walk_finish(xp, xp.stack(cols, axis=-1), fails, ratios, on_fail, scale=c * r * r)


def self_balancing_walk(U, *, delta: float, rng: np.random.Generator, r: float | None = None,
                        c: float | None = None):
    """Public name: the +-1 signs (n,) (or (..., n)) of Alg. 3; raises :class:`WalkFailed` on FAIL."""
    return self_balancing_walk_result(U, delta=delta, rng=rng, r=r, c=c, on_fail="raise").signs


def gram_walk(G, uniforms, c: float, *, on_fail: str = "raise") -> WalkResult:
    """The walk in a kernel's feature space, given the Gram matrix divided by R^2 (BalanceKV-NeurIPS Alg. 2 lines 5-11).
    A WalkFailed from here reports |y^T eta| and c R^2 in units of R^2.

    ``G`` (..., n, n) with ``G[i, j] = <phi_i, phi_j> / R^2``; the walk's inner product at step i is
    ``x_i = sum_{j<i} eta_j G[i, j]``, maintained incrementally in O(n) per step."""
    check_array(G, "G", ndim=tuple(range(2, 9)), min_rows=1)
    check_array(uniforms, "uniforms", ndim=G.ndim - 1)
    if G.shape[-1] != G.shape[-2] or tuple(uniforms.shape) != tuple(G.shape[:-1]):
        raise InputError(f"G must be (..., n, n) and uniforms (..., n), got {tuple(G.shape)} and {tuple(uniforms.shape)}")
    namespace(G, uniforms, names="G and uniforms")
    check_positive(c, "c")
    c = float(c)
    if on_fail not in ("raise", "continue"):
        raise InputError(f"on_fail must be 'raise' or 'continue', got {on_fail!r}")
    return gram_walk_unchecked(G, uniforms, float(c), on_fail)


def gram_walk_unchecked(G, uniforms, c: float, on_fail: str) -> WalkResult:
    """:func:`gram_walk` for callers that have checked its inputs (SoftmaxBalance: no host read per check)."""
    if type(G) is np.ndarray and G.ndim == 2 and type(uniforms) is np.ndarray:
        return _gram_walk_numpy(G, uniforms, c, on_fail)
    return _gram_walk_array(G, uniforms, c, on_fail)


def _gram_walk_array(G, uniforms, c, on_fail):
    """gram_walk on any array-API backend, batched: the reference path."""
    xp = array_namespace(G)
    n = G.shape[-1]
    s = xp.zeros(G.shape[:-1], dtype=G.dtype, device=_dev(G))   # s[..., i] = sum_{j chosen} eta_j G[j, i]
    cols, fails, ratios = [], [], []
    for i in range(n):
        x = s[..., i]
        fail, eta = walk_choose(xp, x, uniforms[..., i], c)
        s = s + eta[..., None] * G[..., i, :]
        cols.append(eta)
        fails.append(fail)
        ratios.append(xp.abs(x) / c)
    return walk_finish(xp, xp.stack(cols, axis=-1), fails, ratios, on_fail, scale=c)


def _gram_walk_numpy(G: np.ndarray, uniforms: np.ndarray, c: float, on_fail: str) -> WalkResult:
    """gram_walk for one numpy Gram matrix (n, n): the per-step scalar work (x, the FAIL test, p, the coin) in
    plain Python floats, the update s += eta_i G[i, :] as one numpy operation. The same floating-point
    operations in the same order as the array-API loop, so the same signs and the same state (a test
    compares them)."""
    n = G.shape[-1]
    s = np.zeros(n, dtype=G.dtype)
    signs = np.empty(n, dtype=G.dtype)
    failed = np.zeros(n, dtype=bool)
    ratios = np.empty(n, dtype=G.dtype)
    u = uniforms.tolist()
    two_c = 2.0 * c
    for i in range(n):
        x = s[i]                                   # numpy float scalar: G's dtype, as in the array loop
        p = 0.5 - x / two_c
        p = 0.0 if p < 0.0 else (1.0 if p > 1.0 else p)
        eta = 1.0 if u[i] < p else -1.0
        failed[i] = abs(x) > c
        ratios[i] = abs(x) / c
        signs[i] = eta
        if eta > 0:
            s += G[i]
        else:
            s -= G[i]
    return walk_finish_np(signs, failed, ratios, on_fail, c)


def smaller_side(signs):
    """Boolean mask of U' (Alg. 3 lines 12-16): the +1 side if it is not larger than the -1 side, else the -1 side."""
    check_array(signs, "signs", ndim=tuple(range(1, 9)))
    xp = array_namespace(signs)
    n_plus = xp.sum(xp.astype(signs > 0, xp.int64), axis=-1, keepdims=True)
    n = signs.shape[-1]
    keep_plus = 2 * n_plus <= n
    return xp.where(keep_plus, signs > 0, signs < 0)

