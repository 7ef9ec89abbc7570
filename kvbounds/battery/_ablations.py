"""The pieces of the ingredient ablations (each of the package's cache methods with its core ingredient replaced by
chance, at the same floats and the same layout: the battery's ``ablation`` control, :mod:`kvbounds.battery`). Each
ablation is a registered method, a module of :mod:`kvbounds.catalog` named in its method's ``ablation`` field
(balancekv_coin, balancekv_released_coin, subgen_uniform, subspace_sketch, subspace_random, kcenter_random,
kcenter_sized_random). The two subspace ablations are here, since the claims' checks use them too; each follows
the registry's contract ``compress(K, V, floats, rng, *, sink, window, block_size=64, Q=None) -> CompressedKV``:

  * :func:`subspace_sketch`: the middle projected on rank-r bases found by chance from the data (the row space of
    a Gaussian random projection of the middle's keys, and of its values: a randomized range finder without power
    iterations), in place of the top-r ones; :func:`subspace_random` (data-blind random bases) is kept beside it
    as a weaker, informational control.

:func:`split_uniform` is SubGen's: its split of floats between its denominator (cluster samples) and numerator (l2
samples), each side filled with uniform draws (the ablation of the claims' SubGen and of the registry's).
:data:`COIN_C` is BalanceKV's: the walk's constant at which p = 1/2 on the walk's own uniforms (random halving).

Frequent Directions' ablation in the claims' checks (FD.covariance, FD.residual) is :func:`random_projection_sketch`:
a Gaussian random-projection sketch with as many rows as FD's 2l-row buffer holds, so the same floats counted the
same way; it is the sketch a data-oblivious streaming algorithm keeps (each row a_i adds g_i a_i^T, g_i fresh), the
fair chance version of FD's shrinking. :func:`random_basis_sketch` (A's Gram seen through a data-blind random basis of
rank l) is kept beside it as a reference only: it ignores the data's directions altogether, so any sketch that looks at
the data beats it (FD's ratios to it were 0.003-0.56 on the power streams, a straw man). :func:`random_basis` is the
subspace claims' (SUB.*) ablation.
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms.cache_compressors import SubspaceCompressor, split_budget
from kvbounds.algorithms.compressed_kv import CompressedKV
from kvbounds.algorithms.validation import InputError, check_array, check_int, check_rng

from . import _controls as battery

__all__ = ["COIN_C", "subspace_sketch", "subspace_random", "split_uniform", "random_basis", "random_basis_sketch",
           "random_projection_sketch", "sketch_basis"]

# a walk constant so large that p = 1/2 - x/(2c) rounds to 1/2 (|x| / c below float32's and float64's rounding for
# every |x| < 1e22) and that still fits float32 (the walk runs in the keys' dtype): fair coins on the walk's own
# uniforms, with the walk's blocks and cut
COIN_C = 1e30
MAX_DRAWS = 10**7          # split_uniform: more draws than this is no budget a cache holds (refused by name)


def split_uniform(K, V, den_floats: int, num_floats: int, rng, *, sink: int = 0, window: int = 0):
    """SubGen's ablation (uniform samples in place of its clusters and its l2 samples), at SubGen's own split of
    floats: the denominator from ``den_floats // d`` keys drawn uniformly with replacement from the middle, the
    numerator from ``(num_floats - 1) // (d + dv)`` (key, value) pairs drawn the same way, each side weighted
    n_mid / draws (one float per side; split weights: a token serves one side, log_w = -inf on the other), the
    ``sink`` and ``window`` tokens exact on both sides. Memory: draws x widths + 2 weights (+ the exact tokens)."""
    K, V = battery.check_kv(K, V)
    den_floats, num_floats = check_int(den_floats, "den_floats"), check_int(num_floats, "num_floats")
    check_int(sink, "sink"), check_int(window, "window")
    check_rng(rng)
    n, d, dv = K.shape[-2], K.shape[-1], V.shape[-1]
    s, w = min(sink, n), min(window, max(n - sink, 0))
    n_mid = n - s - w
    k_den, k_num = (max(den_floats - 1, 0) // d, max(num_floats - 1, 0) // (d + dv)) if n_mid > 0 else (0, 0)
    if max(k_den, k_num) > MAX_DRAWS:
        raise InputError(f"{max(k_den, k_num)} draws for a middle of {n_mid} tokens: more than {MAX_DRAWS}")
    den = s + rng.integers(0, max(n_mid, 1), k_den)
    num = s + rng.integers(0, max(n_mid, 1), k_num)
    exact = np.concatenate([np.arange(s), np.arange(n - w, n)]).astype(np.int64)
    idx = np.concatenate([exact, den, num]).astype(np.int64)
    lw = lambda k: math.log(n_mid / k) if k else 0.0
    a = np.concatenate([np.zeros(len(exact)), np.full(k_den, -math.inf), np.full(k_num, lw(k_num))])
    b = np.concatenate([np.zeros(len(exact)), np.full(k_den, lw(k_den)), np.full(k_num, -math.inf)])
    lead = K.shape[:-2]
    a, b = (np.broadcast_to(x, lead + (len(idx),)).copy() for x in (a, b))
    return CompressedKV(K[..., idx, :], V[..., idx, :], a, b)


def random_basis(d: int, rank: int, rng) -> np.ndarray:
    """The ablation of a subspace method: ``rank`` orthonormal rows (rank, d) spanning a uniformly random subspace
    of R^d (QR of a Gaussian matrix), in place of the method's learned basis."""
    d, rank = check_int(d, "d", minimum=1), check_int(rank, "rank")
    check_rng(rng)
    if rank > d:
        raise InputError(f"rank = {rank} exceeds the dimension d = {d}")
    if rank == 0:
        return np.zeros((0, d))
    q, _ = np.linalg.qr(rng.standard_normal((d, rank)))
    return q.T.copy()


def random_basis_sketch(A, rank: int, rng) -> np.ndarray:
    """Frequent Directions' ablation: the sketch of A in a random basis U of the same rank (:func:`random_basis`),
    S = (U A^T A U^T)^{1/2} U, so S^T S = P A^T A P with P = U^T U the random projector (what FD's shrinking would
    give if its directions were chosen by chance). Memory: rank x d (the basis) + rank^2 (the small Gram)."""
    if not isinstance(A, np.ndarray):
        raise InputError(f"A must be a numpy array (n, d), got {type(A).__name__}")
    check_array(A, "A", ndim=2, min_rows=1)
    U = random_basis(A.shape[1], min(check_int(rank, "rank"), A.shape[1]), rng)
    with np.errstate(over="ignore", invalid="ignore"):
        B = A @ U.T
        G = B.T @ B
    if not np.all(np.isfinite(G)):
        raise InputError("A's Gram matrix in the random basis overflows float64")
    w, Z = np.linalg.eigh(G)
    return (Z * np.sqrt(np.clip(w, 0.0, None))).T @ U


def random_projection_sketch(A, rows: int, rng) -> np.ndarray:
    """Frequent Directions' ablation: S = G A / sqrt(rows), G (rows, n) with independent standard normal entries,
    so E[S^T S] = A^T A (an unbiased sketch of the covariance that never looks at the data to choose its directions;
    streamed, row a_i adds g_i a_i^T / sqrt(rows) with a fresh g_i, holding rows x d floats throughout). ``rows``:
    FD's buffer, 2l, for the same floats. Memory: rows x d (G is drawn, not held). Numpy float64 (rows, d)."""
    if not isinstance(A, np.ndarray):
        raise InputError(f"A must be a numpy array (n, d), got {type(A).__name__}")
    check_array(A, "A", ndim=2, min_rows=1)
    rows = check_int(rows, "rows", minimum=1, maximum=MAX_DRAWS // max(A.shape[0], 1))
    G = check_rng(rng).standard_normal((rows, A.shape[0]))
    with np.errstate(over="ignore", invalid="ignore"):
        S = (G @ np.asarray(A, np.float64)) / math.sqrt(rows)
    if not np.all(np.isfinite(S)):
        raise InputError("the random projection of A overflows float64")
    return S


def sketch_basis(X, rank: int, rng) -> np.ndarray:
    """``rank`` orthonormal rows (..., rank, d) spanning the rows of G X, G (..., rank, n) standard normal per head:
    the subspace found by chance from X (..., n, d) (a randomized range finder of X^T without power iterations),
    in place of X's top-``rank`` right singular space. ``rank`` at most min(n, d); a rank-deficient X gives a basis
    completed by chance (QR of the sketch)."""
    if not isinstance(X, np.ndarray):
        raise InputError(f"X must be a numpy array (..., n, d), got {type(X).__name__}")
    check_array(X, "X", ndim=tuple(range(2, 8)), min_rows=1)
    n, d = X.shape[-2], X.shape[-1]
    rank = check_int(rank, "rank", maximum=min(n, d))
    if rank == 0:
        return np.zeros(X.shape[:-2] + (0, d))
    G = check_rng(rng).standard_normal(X.shape[:-2] + (rank, n))
    with np.errstate(over="ignore", invalid="ignore"):
        Y = G @ np.asarray(X, np.float64)
    if not np.all(np.isfinite(Y)):
        raise InputError("the random projection of X overflows float64")
    q, _ = np.linalg.qr(np.swapaxes(Y, -1, -2))                 # (..., d, rank): orthonormal columns
    return np.swapaxes(q, -1, -2)


def _numpy(K, V):
    for x, name in ((K, "K"), (V, "V")):
        if not isinstance(x, np.ndarray):
            raise InputError(f"{name} must be a numpy array (this ablation runs on the host)")
    return K, V


def _projected(K, V, lo, hi, Bk, Bv, r):
    """K, V with the middle [lo, hi) projected on the bases (..., r, d), (..., r', dv); the subspace cache."""
    Kp, Vp = np.array(K, np.float64), np.array(V, np.float64)
    Kp[..., lo:hi, :] = Kp[..., lo:hi, :] @ np.swapaxes(Bk, -1, -2) @ Bk
    Vp[..., lo:hi, :] = Vp[..., lo:hi, :] @ np.swapaxes(Bv, -1, -2) @ Bv
    z = np.zeros(K.shape[:-1], np.float32)
    out = CompressedKV(Kp.astype(K.dtype), Vp.astype(V.dtype), z, z.copy())
    out.extra_floats, out.rank, out.projected = 2 * r * K.shape[-1] * int(np.prod(K.shape[:-2], dtype=np.int64)), r, hi - lo
    return out


def subspace_sketch(K, V, floats: int, rng, *, sink: int, window: int, block_size: int = 64, Q=None):
    """The subspace method's cache at ``floats`` (sink and window exact, the middle's keys and values projected on
    rank-r subspaces, r from the budget as SubspaceCompressor.rank_for) with each head's bases found by chance from
    its data (:func:`sketch_basis` of the middle's keys, and of its values) in place of the top-r ones: the
    registered ablation of the subspace method (the same floats as it: the bases, counted as its own)."""
    K, V = _numpy(K, V)
    check_rng(rng)
    n, d, left = split_budget(K, check_int(sink, "sink"), check_int(window, "window"), floats)
    r = SubspaceCompressor(sink=sink, window=window).rank_for(n - sink - window, d, left)
    lo, hi = sink, n - window
    r = min(r, hi - lo, d)
    Bk = sketch_basis(np.asarray(K[..., lo:hi, :], np.float64), r, rng)
    Bv = sketch_basis(np.asarray(V[..., lo:hi, :], np.float64), min(r, V.shape[-1]), rng)
    return _projected(K, V, lo, hi, Bk, Bv, r)


def subspace_random(K, V, floats: int, rng, *, sink: int, window: int, block_size: int = 64, Q=None):
    """The subspace method's cache at ``floats`` (sink and window exact, the middle's keys and values projected on
    rank-r subspaces, r from the budget as SubspaceCompressor.rank_for) with random bases of rank r
    (:func:`random_basis`, one for the keys and one for the values) in place of the top-r ones."""
    K, V = _numpy(K, V)
    check_rng(rng)
    n, d, left = split_budget(K, check_int(sink, "sink"), check_int(window, "window"), floats)
    r = SubspaceCompressor(sink=sink, window=window).rank_for(n - sink - window, d, left)
    lo, hi = sink, n - window
    Bk, Bv = random_basis(d, r, rng), random_basis(V.shape[-1], min(r, V.shape[-1]), rng)
    return _projected(K, V, lo, hi, Bk, Bv, r)
