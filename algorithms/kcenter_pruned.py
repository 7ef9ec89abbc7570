"""Greedy k-center's farthest-first traversal with the triangle inequality (issue 26: greedy k-center cheap next to
the prefill; claims SG.e2e, SG.clusterability; SubGen Sec. 3.1-3.2 and ClusterGen Sec. 4.1 run the traversal).

:func:`advance` runs the steps of :func:`kvbounds.algorithms.kcenter._advance` bit for bit (the same centres, squared
radii and assignment), but computes a step's distances only for the points its new centre could be closer to than
their own centre. The rest provably keep their distance and centre (Elkan 2003's bound for k-means, used here on the
traversal): with m_i the computed squared distance of point i to its centre a_i and c the new centre,
||c - c_{a_i}|| >= 2 sqrt(m_i + E) implies ||x_i - c||^2 >= m_i + E, so the computed distance is >= m_i and the
dense step would leave i as it is. E bounds the float rounding of every computed squared distance (:func:`_margins`).

The candidates' distances come from the same BLAS kernel as the dense step's (OpenBLAS's gemv computes every row of
a full 4-row block by the same operations, wherever the block lies): the dense step's call must split into full
blocks (n a multiple of 4 x the BLAS threads) and the candidates are packed into chunks of full blocks computed on one
thread. :func:`advance` checks this on every call (:func:`_same_dots`: all rows at shifted positions against the dense
product) and runs the dense steps when it does not hold, or when numpy's BLAS is not OpenBLAS.
"""
from __future__ import annotations

import os

import numpy as np

_PRUNE = True         # False: every step dense (kcenter._advance in head groups), the code before (tests compare)
DENSE_SHARE = 0.25    # a step whose candidates exceed this share of the points runs dense (speed only, not results)
MIN_STEPS = 8         # fewer steps than this in one call: dense (the set-up would cost more than it saves)
PROJECT = 32          # p: the bound projects on the top-p principal directions of each head (speed only)
_BLAS = []            # the threadpoolctl controller of numpy's OpenBLAS, once found (None: not OpenBLAS)


def _blas_threads() -> int | None:
    """The thread count of numpy's OpenBLAS now, or None when numpy's BLAS is not (one identifiable) OpenBLAS."""
    if not _BLAS:
        from threadpoolctl import ThreadpoolController
        libs = ThreadpoolController().select(internal_api="openblas").lib_controllers
        here = os.path.dirname(os.path.dirname(np.__file__))
        own = [c for c in libs if os.path.dirname(c.filepath) == os.path.join(here, "numpy.libs")]
        _BLAS.append((own or libs)[0] if len(own) == 1 or (not own and len(libs) == 1) else None)
    return None if _BLAS[0] is None else int(_BLAS[0].num_threads)


def _gamma(m: int, u: float) -> float:
    return m * u / (1 - m * u)


class _Bound:
    """The projected lower bound of one call's heads: Y = fl(X U) (B, n, p) with U the top-p principal directions of
    each head's points (float64 eigh, stored as float32), and the constants that make the skip test
    z_i >= thr_i rigorous under float rounding (u = eps / 2, gamma_m = m u / (1 - m u), Higham Sec. 3.1), for
    z_i = fl(fl(-2 <y_i, y_c> + ||y_i||^2) + ||y_c||^2) the computed squared projected distance:

    * E = gamma_{d+3} 4 N^2 bounds the rounding of a computed squared distance of two rows of X (dot product
      gamma_d ||x|| ||c||, norm gamma_d ||x||^2, two additions u (||x|| + ||c||)^2 (1 + gamma_d) each),
      N^2 = max computed ||x||^2 / (1 - gamma_d) bounding every squared norm;
    * sigma >= ||U||_2 (U in float32 is orthonormal only to rounding): sigma^2 = 1 + ||U^T U - I||_F (+ slack for
      that float64 sum); so ||U^T (x - c)|| <= sigma ||x - c||;
    * eta = gamma_d sigma sqrt(p) N bounds ||fl(U^T x) - U^T x|| (each coordinate a d-term dot product);
    * E_p = gamma_{p+3} 4 (sigma N + eta)^2 bounds the rounding of z as E does for X.

    Then ||x_i - c|| >= (sqrt(z_i - E_p) - 2 eta) / sigma, and with
    thr_i = (sigma sqrt(m_i + E) + 2 eta)^2 + E_p (float64, rounded up to X's float type), z_i >= thr_i implies
    ||x_i - c||^2 >= m_i + E, so the computed distance is >= m_i and the dense step leaves point i as it is."""

    def __init__(self, Xf, sq, p: int):
        B, n, d = Xf.shape
        u = float(np.finfo(Xf.dtype).eps) / 2
        X64 = Xf.astype(np.float64)
        X64 -= X64.mean(axis=1, keepdims=True)
        U = np.linalg.eigh(np.matmul(X64.transpose(0, 2, 1), X64))[1][:, :, ::-1][:, :, :p]
        self.U = np.ascontiguousarray(U, dtype=Xf.dtype)                         # (B, d, p)
        U64 = self.U.astype(np.float64)
        off = np.linalg.norm(np.matmul(U64.transpose(0, 2, 1), U64) - np.eye(p), axis=(1, 2))
        self.sigma = np.sqrt(1 + off + 4 * p * p * 2.0 ** -52)
        self.Y = np.matmul(Xf, self.U)                                           # (B, n, p)
        self.ysq = np.sum(self.Y * self.Y, axis=-1)
        N = np.sqrt(sq.max(axis=-1).astype(np.float64) / (1 - _gamma(d, u)))
        self.E = _gamma(d + 3, u) * 4 * N * N
        self.eta = _gamma(d, u) * self.sigma * np.sqrt(p) * N
        self.Ep = _gamma(p + 3, u) * 4 * (self.sigma * N + self.eta) ** 2
        self.dtype = Xf.dtype

    def thresholds(self, m, heads=None):
        """thr for squared distances m (float; -1 chosen: -inf, never a candidate; inf: inf) of the points of
        ``heads`` (None: m is (B, n))."""
        g = (lambda a: a[:, None]) if heads is None else (lambda a: a[heads])
        m64 = m.astype(np.float64)
        t = (g(self.sigma) * np.sqrt(np.maximum(m64, 0) + g(self.E)) + 2 * g(self.eta)) ** 2 + g(self.Ep)
        t *= 1 + 2.0 ** -40                   # the float64 evaluation of t errs by far less than 2^-40 relative
        out = t.astype(self.dtype)
        out = np.where(out < t, np.nextafter(out, np.inf), out)
        return np.where(m64 < 0, -np.inf, out).astype(self.dtype)


def _chunk(threads: int) -> int:
    """Rows per packed gemv call: full 4-row blocks on each of ``threads`` threads should OpenBLAS thread it, and
    32 x d float32 (d = 64) under its threading threshold (2304 x 4 elements) so that it does not."""
    return 4 * threads * max(1, 8 // threads)


def _pack(flat, cand, heads, B: int, chunk: int):
    """The rows ``flat[cand]`` (grouped by head, in order within a head) packed into (Q, chunk, d): each chunk holds
    rows of one head, zero-padded. Returns (packed rows, head of each chunk, row of each candidate in the packing)."""
    counts = np.bincount(heads, minlength=B)
    nch = -(-counts // chunk)
    first = np.cumsum(nch) - nch                                   # first chunk of each head
    start = np.cumsum(counts) - counts                             # first candidate of each head
    row = first[heads] * chunk + (np.arange(cand.size) - start[heads])
    G = np.zeros((int(nch.sum()) * chunk, flat.shape[1]), dtype=flat.dtype)
    G[row] = flat.take(cand, axis=0)
    return G.reshape(-1, chunk, flat.shape[1]), np.repeat(np.arange(B), nch), row


def _packed_dots(flat, cand, heads, xc, chunk: int):
    """<x_i, c_head(i)> of the candidates by gemv on packed chunks (one (chunk, d) @ (d, 1) product per chunk)."""
    G, ch_head, row = _pack(flat, cand, heads, xc.shape[0], chunk)
    return np.matmul(G, xc[ch_head][:, :, None]).reshape(-1)[row]


def _same_dots(Xf, flat, idx, chunk: int) -> bool:
    """True when the packed gemv reproduces the dense step's product bit for bit on these points: every row of every
    head with the first centre, each row one position later in the packing than in the dense call."""
    B, n, _ = Xf.shape
    dense = np.matmul(Xf, flat.take(idx, axis=0)[:, :, None])[..., 0]
    order = (np.arange(n) - 1) % n                                  # row n-1 first, then 0, 1, ...
    cand = (order[None, :] + (np.arange(B) * n)[:, None]).reshape(-1)
    got = _packed_dots(flat, cand, np.repeat(np.arange(B), n), flat.take(idx, axis=0), chunk)
    return bool(np.array_equal(got.reshape(B, n), dense[:, order]))


def advance(Xf, sq, nxt, mind, assign, IDX, r2, j0: int, k: int, *, per: int) -> np.ndarray:
    """Steps j0..k-1 of the traversal of every head of Xf (B, n, d), in place on the state of
    :func:`kvbounds.algorithms.kcenter._advance` (``mind``, ``assign``, ``IDX``, ``r2``; ``nxt`` the next centres),
    with the same result; returns the next centres after step k-1. A dense step runs ``_advance`` on groups of
    ``per`` heads; a pruned step computes distances only where the projected bound (:class:`_Bound`) leaves a point
    a candidate (all heads at once: fewer Python steps)."""
    from .kcenter import _advance
    B, n, d = Xf.shape

    def dense(centres, a: int, b: int) -> np.ndarray:
        out = np.empty_like(centres)
        for i in range(0, B, per):
            g = slice(i, i + per)
            out[g] = _advance(Xf[g], sq[g], centres[g], mind[g], assign[g], IDX[g], r2[g], a, b)
        return out

    threads = _blas_threads() if _PRUNE and k - j0 >= MIN_STEPS and Xf.dtype in (np.float32, np.float64) else None
    if threads is None or n % (4 * threads) or d <= PROJECT or not (mind.flags.c_contiguous
                                                                    and assign.flags.c_contiguous):
        return dense(nxt, j0, k)
    chunk = _chunk(threads)
    base = np.arange(B, dtype=np.int64) * n
    flat, sq_flat = Xf.reshape(B * n, d), sq.reshape(-1)
    idx = nxt + base
    if not _same_dots(Xf, flat, idx, chunk):
        return dense(nxt, j0, k)
    mind_flat, assign_flat = mind.reshape(-1), assign.reshape(-1)
    bound = _Bound(Xf, sq, PROJECT)
    Y, ysq = bound.Y, bound.ysq
    Y_flat, ysq_flat = Y.reshape(B * n, -1), ysq.reshape(-1)
    thr = bound.thresholds(mind)               # skip a point when its projected distance z >= thr
    thr_flat = thr.reshape(-1)
    z, near = np.empty((B, n, 1), Xf.dtype), np.empty((B, n), bool)
    zv = z[..., 0]
    for j in range(j0, k):
        cand = None
        if j:
            np.matmul(Y, Y_flat.take(idx, axis=0)[:, :, None], out=z)
            zv *= -2.0
            zv += ysq
            zv += ysq_flat.take(idx)[:, None]
            np.less(zv, thr, out=near)
            cand = np.flatnonzero(near)
            if cand.size > DENSE_SHARE * B * n:
                cand = None
        if cand is None:                       # the dense step, then the bounds of every point again
            idx = dense(idx - base, j, j + 1) + base
            thr[:] = bound.thresholds(mind)
            continue
        xc, sqc = flat.take(idx, axis=0), sq_flat.take(idx)
        heads = cand // n
        v = _packed_dots(flat, cand, heads, xc, chunk)
        v *= -2.0                              # the dense step's arithmetic, in its order
        v += sq_flat.take(cand)
        v += sqc.take(heads)
        np.maximum(v, 0.0, out=v)
        closer = v < mind_flat.take(cand)
        upd, nv = cand[closer], v[closer]
        mind_flat[upd], assign_flat[upd] = nv, j
        thr_flat[upd] = bound.thresholds(nv, heads[closer])
        IDX[:, j] = idx - base
        mind_flat[idx], assign_flat[idx], thr_flat[idx] = -1.0, j, -np.inf
        idx = mind.argmax(axis=-1) + base
        r2[:, j] = mind_flat.take(idx)
    return idx - base
