"""Kernel thinning (Dwivedi & Mackey, "Kernel Thinning", COLT 2021 / JMLR 2024) as a KV-cache baseline, through
the ``goodpoints`` package (its ``kt.thin``: KT-SPLIT then KT-SWAP); the optional extra ``kvbounds[kt]``.

Why a baseline: BalanceKV-preprint / BalanceKV-NeurIPS (claims BKV.vs-uniform, BKV.e2e) compress by discrepancy
(signed walks that halve the tokens); kernel thinning is the discrepancy-based halving with the sharpest known MMD
guarantees. A user deciding whether discrepancy-based compression is worth it sees both beside uniform sampling.

The kernel. The cache must answer, for every query q, the numerator sum_j e^{<q,k_j>/sqrt d} v_j and the
denominator sum_j e^{<q,k_j>/sqrt d}: integrals of f_q(k, v) = e^{<q,k>/sqrt d} (1, v) against the tokens'
empirical measure. Those functions lie in the RKHS of
    kappa((k, v), (k', v')) = e^{<k,k'>/sqrt d} (1 + <v, v'> / s^2)        (s^2 = mean ||v||^2 of the head),
the softmax (exponential dot-product) kernel on keys times a linear kernel on values, so kernel thinning in
kappa controls both sums for every query at once - the same target as BalanceKV's discrepancy. Keys and
values enter centred (their means over the tokens being thinned subtracted): attention is exactly invariant
to it (<q, k - mu> shifts every logit of q by the same amount; values shifted by mu shift the weighted mean by
mu), and on real keys, which share a large common component (SmolLM2 layer 1: mean key norm 17 of 21), it
shrinks kappa's dynamic range e^{||k||^2 / sqrt d}. kappa is used for KT-SPLIT and KT-SWAP ("target KT"); its
entries are computed in float64 with the largest exponent subtracted (a constant factor, which changes no
choice of KT).

Sizes. Kernel thinning halves: m rounds keep n / 2^m points. The first ``sink`` and last ``window`` tokens are
kept exactly (as :class:`kvbounds.algorithms.token_selection.Uniform`); of the n_mid middle tokens, kept = budget -
sink - window, m = floor(log2(n_mid / kept)) rounds; when kept * 2^m < n_mid a uniform subset of kept * 2^m middle
tokens (drawn from ``rng``) is thinned (goodpoints' own recipe for sizes that are not n / 2^m). Each kept middle
token has weight n_mid / kept, as uniform sampling's. goodpoints' seed is drawn from ``rng``.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math

import numpy as np

from kvbounds.algorithms.arrays import array_namespace, like, to_numpy

from .token_selection import TokenSelector, check_fields
from .uniform_sampling import check_int, check_rng
from .validation import InputError

__all__ = ["goodpoints_missing", "TILE", "KernelThinning"]


def goodpoints_missing() -> str | None:
    """None when goodpoints is importable, else the reason and the install command."""
    if importlib.util.find_spec("goodpoints") is None:
        return "kernel thinning needs the package 'goodpoints': pip install 'kvbounds[kt]'"
    return None


def _centred(K: np.ndarray, V: np.ndarray):
    """(keys, values) minus their means in float64, s^2 = mean ||v - mu_v||^2, and the largest ||k - mu_k||^2 /
    sqrt d (an upper bound of every exponent, subtracted). An InputError when the kernel cannot be computed: squared
    norms beyond float64 (the kernel would be NaN: inf - inf in the exponent, inf / inf in the value factor, and KT
    would thin on it), or keys so long that float64's rounding of an exponent <k, k'> / sqrt d - shift, up to
    2 (d + 2) 2^-53 shift, exceeds 1 (every entry off by more than a factor e; past ~709 entries are inf).
    Otherwise every entry is finite: <k, k'> <= max ||k||^2 and |<v, v'>| <= n s^2."""
    K, V = K.astype(np.float64), V.astype(np.float64)
    K, V = K - K.mean(axis=0), V - V.mean(axis=0)
    d = K.shape[-1]
    with np.errstate(over="ignore"):          # an overflow is refused by name below
        s2 = float(np.mean(np.sum(V * V, axis=-1))) or 1.0
        shift = float(np.max(np.sum(K * K, axis=-1))) / math.sqrt(d)
    for x, what in ((shift, "keys' squared norms ||k - mean k||^2"), (s2, "values' squared norms ||v - mean v||^2")):
        if not math.isfinite(x):
            raise InputError(f"kernel thinning: the {what} overflow float64; scale them down")
    if 2 * (d + 2) * 2.0 ** -53 * shift > 1:
        raise InputError(f"kernel thinning: keys too long for the kernel e^(<k, k'> / sqrt d): max ||k - mean k||^2 / "
                         f"sqrt d = {shift:.3g}, so float64 rounds its exponents by more than 1 (limit "
                         f"{1 / (2 * (d + 2) * 2.0 ** -53):.3g}); scale the keys down")
    return K, V, s2, shift


def _kernel_function(K: np.ndarray, V: np.ndarray):
    """kappa(y, X) in goodpoints' form for X = the centred rows [k, v] that :func:`_centred_rows` returns."""
    d = K.shape[-1]
    _, _, s2, shift = _centred(K, V)
    return lambda y, X: (np.exp(y[:, :d] @ X[:, :d].T / math.sqrt(d) - shift) * (1.0 + y[:, d:] @ X[:, d:].T / s2))[0]


def _centred_rows(K: np.ndarray, V: np.ndarray) -> np.ndarray:
    Kc, Vc, _, _ = _centred(K, V)
    return np.concatenate([Kc, Vc], axis=-1)


TILE = 64      # rows per tile of the kernel matrix's upper triangle (_kernel_matrix)


def _repeated_tokens(K: np.ndarray, V: np.ndarray) -> bool:
    """Whether two tokens have the same (key, value) row (-0.0 and 0.0 one value). Two such tokens share their
    first key coordinate: only the tokens whose first coordinate ties another's are compared in full (as byte
    strings, sorted), so tokens with distinct first coordinates cost one sort of n numbers."""
    first = K[:, 0] + 0.0
    order = np.argsort(first, kind="stable")
    tie = np.flatnonzero(first[order[1:]] == first[order[:-1]])
    if not tie.size:
        return False
    cand = np.unique(np.concatenate([order[tie], order[tie + 1]]))
    X = np.ascontiguousarray(np.concatenate([K[cand], V[cand]], axis=-1) + 0.0)
    rows = np.sort(X.view(np.dtype((np.void, X.shape[1] * X.itemsize))).ravel())
    return bool(np.any(rows[1:] == rows[:-1]))


def _kernel_matrix(K: np.ndarray, V: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The (n, n) matrix of kappa over the tokens, float64 (one product instead of goodpoints' row loop):
    exp(K K^T / sqrt d - shift) * (1 + V V^T / s^2), the same operations entry by entry, evaluated on the upper
    triangle only (tile by tile of rows) and mirrored. ``K @ K.T`` of one array is numpy's symmetric product
    (BLAS syrk), so both Grams are exactly symmetric and the mirror is the matrix itself, bit for bit; this halves
    the float64 exponentials. ``out`` (2, n, n) float64: scratch written over (the result is ``out[0]``), reused
    head after head: fresh memory costs a page fault per 4 KiB on first touch, which cost more than the arithmetic.

    Tokens that coincide (equal centred key and value): goodpoints' own matrix (``kt.kernel_matrix``, row by row),
    bit for bit. KT's choice between two coinciding tokens is an exact tie in exact arithmetic; goodpoints' matrix
    breaks it by the last bits of its row products, which depend on the token's position (the matrix is not
    exactly symmetric), ours by those of syrk's: with repeated tokens the indices differed from ``kt.thin``'s on
    29 of 100 inputs. With distinct tokens the two matrices differ in their last bits too, but no choice of KT is
    that close: the same indices on 200 of 200 inputs (tests/algorithms/test_kernel_thinning.py)."""
    Kc, Vc, s2, shift = _centred(K, V)
    n = Kc.shape[0]
    if out is None:
        out = np.empty((2, n, n))
    if _repeated_tokens(Kc, Vc):                  # repeated tokens (rare in a real cache): goodpoints' matrix
        from goodpoints import kt
        out[0] = kt.kernel_matrix(np.concatenate([Kc, Vc], axis=-1), _kernel_function(K, V))
        return out[0]
    return _triangle(Kc, Vc, s2, shift, out)


def _triangle(K: np.ndarray, V: np.ndarray, s2: float, shift: float, out: np.ndarray) -> np.ndarray:
    """:func:`_kernel_matrix` of centred tokens on the upper triangle, mirrored, into ``out[0]``."""
    n = K.shape[0]
    A, B = np.matmul(K, K.T, out=out[0]), np.matmul(V, V.T, out=out[1])
    root = math.sqrt(K.shape[-1])
    for i0 in range(0, n, TILE):
        i1 = min(n, i0 + TILE)
        a, b = A[i0:i1, i0:], B[i0:i1, i0:]          # rows i0..i1 from the diagonal on, in place
        a /= root
        a -= shift
        np.exp(a, out=a)
        b /= s2
        b += 1.0
        a *= b
        A[i1:, i0:i1] = a[:, i1 - i0:].T
    return A


def _thin_indices(K: np.ndarray, V: np.ndarray, rounds: int, seed: int, scratch: np.ndarray | None = None
                  ) -> np.ndarray:
    """goodpoints' kernel-thinning coreset (sorted row indices, n / 2^rounds of them) of the tokens (K, V) (n, d):
    ``kt.thin_K`` on kappa's matrix, the same split and swap as ``kt.thin(X, rounds, kappa, kappa, store_K=True)``
    on the centred rows X. ``scratch``: :func:`_kernel_matrix`'s ``out``."""
    from goodpoints import kt
    if rounds == 0:                     # kt.thin_K keeps every row without reading the kernel
        return np.arange(K.shape[0])
    Km = _kernel_matrix(K, V, scratch)
    return np.sort(kt.thin_K(Km, Km, rounds, seed=seed, unique=True))


@dataclasses.dataclass
class KernelThinning(TokenSelector):
    """Sink and window exact, the middle by kernel thinning (goodpoints); weights n_mid / kept. numpy in and out
    (other backends are copied to the host and back)."""
    sink: int = 0
    window: int = 0
    name = "kernel_thinning"

    def __post_init__(self):
        check_fields(self, ("sink", "window"))
        why = goodpoints_missing()
        if why:
            raise InputError(why)

    def _select(self, K, V, budget, rng, Q):
        xp, n, lead = array_namespace(K), K.shape[-2], tuple(K.shape[:-2])
        check_rng(rng)
        sink, window = check_int(self.sink, "sink"), check_int(self.window, "window")
        if sink + window >= budget:
            raise InputError(f"sink + window = {sink + window} must be below the budget {budget}")
        n_mid, kept = n - sink - window, budget - sink - window
        rounds = int(math.floor(math.log2(n_mid / kept)))
        Kn, Vn = to_numpy(K).reshape(-1, n, K.shape[-1]), to_numpy(V).reshape(-1, n, V.shape[-1])
        rows, scratch = [], np.empty((2, kept << rounds, kept << rounds)) if rounds else None
        for h in range(Kn.shape[0]):
            pool = np.sort(rng.choice(n_mid, kept << rounds, replace=False)) if kept << rounds < n_mid \
                else np.arange(n_mid)
            pool = pool + sink
            seed = int(rng.integers(2 ** 31 - 1))
            mid = pool[_thin_indices(Kn[h, pool], Vn[h, pool], rounds, seed, scratch)]
            rows.append(np.concatenate([np.arange(sink), mid, np.arange(n - window, n)]))
        idx = np.stack(rows).reshape(lead + (budget,)).astype(np.int64)
        lw = np.concatenate([np.zeros(sink), np.full(kept, math.log(n_mid / kept)), np.zeros(window)])
        return like(idx, K), xp.broadcast_to(like(lw, K), idx.shape)
