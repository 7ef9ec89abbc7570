"""Greedy k-center (Gonzalez 1985; Dyer-Frieze 1985) and the clusterability measures built on it.

Seeds: SubGen Sec. 3.1-3.2, Fig. 1 ("greedy k-center algorithm [8]", k = 16); ClusterGen Sec. 3.1, 4.1, Fig. 1,
Table 1-2 ("greedy k-center (Dyer & Frieze, 1985)"). Claims: SG.clusterability, and the practical
variant the papers evaluate (ClusterGen Sec. 4.1: keep the most recent l tokens plus k greedy k-center centers
of the remaining tokens, at budget l + k; applied once to the whole cache).

* :func:`greedy_k_center` - farthest-first traversal: start at a point, repeatedly add the point
  farthest from the chosen centers. Its radius after k centers is at most twice the optimal k-center
  radius (Gonzalez). Batched over leading (head) dimensions; one O(n d) pass per center.
* :func:`covering_radius_curve` - the measure of clusterability used by SG.clusterability: the greedy
  covering radius r(k) for k = 1..k_max of an (n, d) array (real traces call the same function).
* :func:`stream_cluster_counts` - the number of delta-clusters SubGen's UpdateSoftmaxNormalizer opens
  after each prefix of a stream (SubGen Alg. 1 lines 11-23 without the samples): m'(n).
* :func:`recent_plus_centers` - the practical variant's token indices.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from kvbounds.algorithms.arrays import array_namespace, is_gpu_array, like, to_numpy, device as _dev

from .attention import mul_pow2, pow2_exponent
from .validation import InputError, check_array, check_int, check_positive

__all__ = ["KCenterResult", "TRAVERSE_BYTES", "greedy_k_center", "FarthestFirst", "covering_radius_curve",
           "normalized_radius", "stream_cluster_counts", "recent_plus_centers", "clusterability"]


@dataclasses.dataclass
class KCenterResult:
    centers: Any       # (..., k) int64 indices in the order chosen, input backend
    radii: np.ndarray  # (..., k) covering radius after 1, 2, ..., k centers (numpy float64)
    assignment: Any    # (..., n) index (0..k-1) of the nearest chosen center, input backend
    exhausted: np.ndarray | None = None  # (...,) bool: fewer than k distinct points, so the radius reached 0
    #                                      before the k-th center; the later centers are further (distinct)
    #                                      indices of already-covered duplicates



TRAVERSE_BYTES = 1 << 22   # numpy traversal: heads per group (measured on 2 AMD EPYC cores, 90 heads at 1 thread:
#                            448 x 64 float32 points, 110 centres, 0.082 s in 1 MiB groups, 0.067 s in 4 MiB, 0.15 s
#                            all at once; 1984 points, 530 centres: 1.15 s, 1.01 s, 2.6 s)
_NUMPY_LOOP = True   # numpy input: the in-place traversal (_traverse_numpy); False: the array-API loop (tests)


def _check_k(k, n: int, name: str = "k") -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise InputError(f"{name} must be an integer >= 1, got {k!r}")
    if k > n:
        raise InputError(f"{name} = {k} exceeds the number of points n = {n}")
    return int(k)


def greedy_k_center(X, k: int, *, start: int = 0) -> KCenterResult:
    """Farthest-first traversal of the rows of ``X`` (..., n, d): ``k`` centers, first one ``start``.

    Ties go to the lowest index; a point is never chosen twice (with fewer than k distinct points the radius
    reaches 0 and the remaining centers are unchosen duplicates, flagged in ``exhausted``). Distances use
    ||x||^2 - 2<x, c> + ||c||^2 (one matrix-vector product per center, no (n, d) temporary), clamped at 0,
    on X rescaled by a power of two (exact) so squared norms cannot overflow or underflow; the radii are
    exact to ~1e-8 relative to max ||x||."""
    check_array(X, "X", ndim=tuple(range(2, 8)), min_rows=1)
    xp = array_namespace(X)
    lead, n, d = tuple(X.shape[:-2]), X.shape[-2], X.shape[-1]
    k = _check_k(k, n)
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or not 0 <= start < n:
        raise InputError(f"start must be an index in [0, {n}), got {start!r}")
    B = int(np.prod(lead, dtype=np.int64)) if lead else 1
    e = pow2_exponent(xp, X)
    Xf = mul_pow2(xp.reshape(X, (B, n, d)), -e)                              # max |entry| in [1/2, 1)
    sq = xp.sum(Xf * Xf, axis=-1)                                             # (B, n)
    if type(X) is np.ndarray and _NUMPY_LOOP:
        # heads in groups of about TRAVERSE_BYTES of points: fewer Python steps than one head at a time, while the
        # group's points stay near the core (all 90 heads of a model at once ran slower than one layer's 3)
        per = max(1, TRAVERSE_BYTES // max(1, n * d * Xf.dtype.itemsize))
        parts = [_traverse_numpy(Xf[i:i + per], sq[i:i + per], k, int(start)) for i in range(0, B, per)]
        C, r, assign = (np.concatenate([p[f] for p in parts]) for f in range(3))
        return _result(C, r, assign, e, lead, xp)
    rows = xp.arange(B, device=_dev(X)) * n
    flat = xp.reshape(Xf, (B * n, d))
    c = xp.full((B,), int(start), dtype=xp.int64, device=_dev(X))
    mind = xp.full((B, n), math.inf, dtype=X.dtype, device=_dev(X))
    assign = xp.zeros((B, n), dtype=xp.int64, device=_dev(X))
    taken = xp.zeros((B, n), dtype=xp.bool, device=_dev(X))
    centers, radii = [], []
    for j in range(k):
        centers.append(c)
        xc = xp.take(flat, rows + c, axis=0)                                   # (B, d)
        d2 = sq - 2.0 * xp.matmul(Xf, xc[:, :, None])[..., 0] + xp.sum(xc * xc, axis=-1)[:, None]
        d2 = xp.where(d2 > 0, d2, xp.zeros_like(d2))
        closer = d2 < mind
        assign = xp.where(closer, xp.full_like(assign, j), assign)
        mind = xp.where(closer, d2, mind)
        # a chosen center is at distance 0 from itself even where rounding says otherwise
        mind = _set_cols(xp, mind, c, 0.0)
        assign = _set_cols(xp, assign, c, j)
        taken = _set_cols(xp, taken, c, True)
        radii.append(xp.sqrt(xp.max(mind, axis=-1)))
        c = xp.argmax(xp.where(taken, xp.full_like(mind, -1.0), mind), axis=-1)   # farthest point not yet chosen
    return _result(xp.stack(centers, axis=-1), to_numpy(xp.stack(radii, axis=-1)), assign, e, lead, xp)


def _traverse_numpy(Xf, sq, k: int, start: int):
    """The traversal of :func:`greedy_k_center` on numpy (B, n, d): :func:`_advance` from the first centre
    ``start`` of every head to k centres. Returns (centres (B, k), radii (B, k), assignment (B, n))."""
    B, n, _ = Xf.shape
    IDX, r2 = np.empty((B, k), dtype=np.int64), np.empty((B, k), dtype=Xf.dtype)
    mind, assign = np.full((B, n), np.inf, dtype=Xf.dtype), np.zeros((B, n), dtype=np.int64)
    _advance(Xf, sq, np.full(B, start, dtype=np.int64), mind, assign, IDX, r2, 0, k)
    return IDX, np.sqrt(np.maximum(r2, 0.0)), assign


def _advance(Xf, sq, nxt, mind, assign, IDX, r2, j0: int, k: int):
    """Steps j0..k-1 of the farthest-first traversal of Xf (B, n, d), in place on its state: ``mind`` (B, n)
    squared distance to the nearest chosen centre (-1 once chosen), ``assign`` (B, n) that centre's step,
    ``IDX`` / ``r2`` (B, >= k) centres and squared radii by step; ``nxt`` (B,) the next centre of each head.
    Returns the next centres after step k-1.

    Bit for bit the arithmetic of the array-API loop of :func:`greedy_k_center`, with in-place operations on
    flat indices (ndarray methods, no dispatch wrappers) and no per-centre masks (the array-API loop spends most
    of its time allocating them): a chosen point's distance is held at -1, so argmax skips it (the array-API loop
    masks it with -1 the same way), and the radius after j centres is the distance of the next one (max(., 0)
    once every point is chosen). ||c||^2 is read from ``sq`` (the same float32 reduction of the same row). A
    head's steps do not depend on the other heads of the call (matmul is one product per head), so the state
    may be split by heads between calls."""
    B, n, d = Xf.shape
    base = np.arange(B, dtype=np.int64) * n
    flat = Xf.reshape(B * n, d)
    sq_flat = sq.reshape(-1)
    mind_flat, assign_flat = mind.reshape(-1), assign.reshape(-1)
    d2 = np.empty((B, n, 1), dtype=Xf.dtype)
    d2v = d2[..., 0]
    closer = np.empty((B, n), dtype=bool)
    idx = nxt + base
    for j in range(j0, k):
        IDX[:, j] = idx
        np.matmul(Xf, flat.take(idx, axis=0)[:, :, None], out=d2)
        d2v *= -2.0
        d2v += sq                                                            # sq - 2<x, c>
        d2v += sq_flat.take(idx)[:, None]                                     # + ||c||^2
        np.maximum(d2v, 0.0, out=d2v)
        np.less(d2v, mind, out=closer)
        assign[closer] = j                                                    # (faster than np.putmask)
        np.minimum(mind, d2v, out=mind)
        mind_flat.put(idx, -1.0)                                             # chosen: distance 0, never again
        assign_flat.put(idx, j)
        idx = mind.argmax(axis=-1) + base                                    # farthest point not yet chosen
        r2[:, j] = mind_flat.take(idx)
    IDX[:, j0:k] -= base[:, None]
    return idx - base


class FarthestFirst:
    """A resumable greedy k-center traversal (:func:`greedy_k_center`'s numpy loop) of numpy keys X (H, n, d),
    or of a stack of layers (L, H, n, d) whose layers are then split (:meth:`layers`): SubGen's equal-memory fit
    (:func:`kvbounds.algorithms.equal_memory.fit_to_floats`) asks the same keys for 490, 513, 509, 510 centres in turn; the
    traversal's first k centres, radii and assignment do not depend on how many follow, so one traversal answers
    every k, continuing from the nearest earlier state (checkpoints at each k asked) instead of starting again.

    :meth:`result` (k) is bit for bit ``greedy_k_center(X, k)`` (tests/algorithms/test_kcenter.py): each layer is
    scaled by
    its own power of two, as a call per layer would scale it, and the steps are :func:`_advance`'s. Claims SG.e2e
    (SubGen's clusters at equal memory)."""

    def __init__(self, X, *, start: int = 0):
        if type(X) is not np.ndarray:
            raise InputError(f"X must be a numpy array (FarthestFirst is the host loop), got {type(X).__name__}")
        check_array(X, "X", ndim=(3, 4), min_rows=1)
        n = X.shape[-2]
        if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or not 0 <= start < n:
            raise InputError(f"start must be an index in [0, {n}), got {start!r}")
        self.X, self.start = X, int(start)
        stack = X if X.ndim == 4 else X[None]
        self.exps = [pow2_exponent(np, x) for x in stack]
        self.Xf = np.stack([mul_pow2(x, -e) for x, e in zip(stack, self.exps)])     # (L, H, n, d) as per layer
        self.sq = np.sum(self.Xf * self.Xf, axis=-1)
        L, H = self.Xf.shape[:2]
        self.j = 0
        self.IDX, self.r2 = np.empty((L, H, 0), dtype=np.int64), np.empty((L, H, 0), dtype=self.Xf.dtype)
        self._state = (np.full((L, H), self.start, dtype=np.int64), np.full((L, H, n), np.inf, dtype=self.Xf.dtype),
                       np.zeros((L, H, n), dtype=np.int64))
        self._checkpoints = {0: self._copy(self._state)}

    def is_of(self, X) -> bool:
        """True when this traversal was built on exactly ``X`` (H, n, d): the same numpy memory, shape and strides
        (a layer of a stack: that layer's slice)."""
        Y = self.X
        return (type(X) is np.ndarray and Y.ndim == 3 and X.shape == Y.shape and X.strides == Y.strides
                and X.__array_interface__["data"][0] == Y.__array_interface__["data"][0])

    @staticmethod
    def _copy(state):
        return tuple(a.copy() for a in state)

    def _run(self, state, j0: int, k: int) -> None:
        """Steps j0..k-1 on ``state`` in place, heads in groups of about TRAVERSE_BYTES (as greedy_k_center)."""
        L, H, n, d = self.Xf.shape
        Xf, sq, IDX, r2 = (a.reshape((L * H,) + a.shape[2:]) for a in (self.Xf, self.sq, self.IDX, self.r2))
        nxt, mind, assign = (a.reshape((L * H,) + a.shape[2:]) for a in state)
        per = max(1, TRAVERSE_BYTES // max(1, n * d * Xf.dtype.itemsize))
        for i in range(0, L * H, per):
            g = slice(i, i + per)
            nxt[g] = _advance(Xf[g], sq[g], nxt[g], mind[g], assign[g], IDX[g], r2[g], j0, k)

    def advance(self, k: int) -> None:
        """Run the traversal on to ``k`` centres (nothing when it has them)."""
        k = _check_k(k, self.Xf.shape[-2])
        if k <= self.j:
            return
        if k > self.IDX.shape[-1]:
            grow = lambda a: np.concatenate([a, np.empty(a.shape[:2] + (k - a.shape[-1],), a.dtype)], axis=-1)
            self.IDX, self.r2 = grow(self.IDX), grow(self.r2)
        self._run(self._state, self.j, k)
        self.j = k

    def layers(self) -> list["FarthestFirst"]:
        """One traversal per layer of a (L, H, n, d) stack, each continuing from this one's state (copies)."""
        out = []
        for l in range(self.Xf.shape[0]):
            f = object.__new__(FarthestFirst)
            f.X, f.start, f.exps, f.j = self.X[l] if self.X.ndim == 4 else self.X, self.start, [self.exps[l]], self.j
            f.Xf, f.sq = self.Xf[l:l + 1], self.sq[l:l + 1]
            f.IDX, f.r2 = self.IDX[l:l + 1].copy(), self.r2[l:l + 1].copy()
            f._state = tuple(a[l:l + 1].copy() for a in self._state)
            f._checkpoints = {j: tuple(a[l:l + 1].copy() for a in s) for j, s in self._checkpoints.items()}
            f._checkpoints.setdefault(f.j, f._copy(f._state))
            out.append(f)
        return out

    def result(self, k: int) -> KCenterResult:
        """``greedy_k_center(X, k)`` of every layer (a (L, H, ...) stack, or (H, ...) for (H, n, d) input)."""
        k = _check_k(k, self.Xf.shape[-2])
        self.advance(k)
        if k == self.j:
            assign = self._state[2]
        else:                                   # replay from the last checkpoint at or before k on a copy
            j0 = max(j for j in self._checkpoints if j <= k)
            state = self._copy(self._checkpoints[j0])
            IDX, r2 = self.IDX, self.r2
            self.IDX, self.r2 = IDX[..., :k].copy(), r2[..., :k].copy()    # rewritten with the same values
            try:
                self._run(state, j0, k)
            finally:
                self.IDX, self.r2 = IDX, r2
            assign = state[2]
        self._checkpoints.setdefault(k, self._copy(self._state) if k == self.j else state)
        r = np.sqrt(np.maximum(self.r2[..., :k], 0.0))
        L, H = self.Xf.shape[:2]
        parts = [_result(self.IDX[l, :, :k].copy(), r[l], assign[l].copy(), self.exps[l], (H,), np)
                 for l in range(L)]
        if self.X.ndim == 3:
            return parts[0]
        return KCenterResult(*(np.stack([getattr(p, f) for p in parts]) for f in ("centers", "radii", "assignment",
                                                                                   "exhausted")))


def _result(C, r, assign, e: int, lead: tuple, xp) -> KCenterResult:
    k, n = C.shape[-1], assign.shape[-1]
    r = np.ldexp(r.astype(np.float64), e)                                      # one device-to-host copy, not k
    if not np.all(np.isfinite(r)):
        raise InputError("X is too large: its covering radii overflow float64")
    exhausted = (r[..., -2] == 0) if k > 1 else np.zeros(r.shape[:-1], dtype=bool)
    return KCenterResult(xp.reshape(C, lead + (k,)), r.reshape(lead + (k,)), xp.reshape(assign, lead + (n,)),
                         np.asarray(exhausted).reshape(lead))


def _set_cols(xp, A, cols, value):
    """A (B, n) with A[b, cols[b]] = value."""
    B, n = A.shape
    hit = xp.arange(n, device=_dev(A))[None, :] == cols[:, None]
    return xp.where(hit, xp.full_like(A, value), A)


def covering_radius_curve(X, k_max: int, *, start: int = 0) -> np.ndarray:
    """r(k), k = 1..k_max: the greedy k-center covering radius of the rows of an (n, d) array.

    The clusterability measure of SG.clusterability (ClusterGen Fig. 1 uses k = 16). Scale-free variants divide
    by r(1) (see :func:`normalized_radius`)."""
    check_array(X, "X", ndim=2, min_rows=1)
    return greedy_k_center(X, min(_check_k(k_max, X.shape[0], "k_max"), X.shape[0]), start=start).radii


def normalized_radius(X, k: int = 16) -> float:
    """r(k) / r(1): 1 for a structureless cloud at small k, near 0 for k >= the number of tight clusters."""
    r = covering_radius_curve(X, k)
    return float(r[-1] / r[0]) if r[0] > 0 else 0.0


_DEVICE_COUNTS = False    # True: the device path on any non-numpy array (tests exercise it on CPU tensors)


def stream_cluster_counts(X, delta: float) -> np.ndarray:
    """m'(j) for j = 1..n: clusters opened by SubGen's UpdateSoftmaxNormalizer (threshold ``delta``)
    after the first j rows of ``X`` (n, d). Same distance computation as :class:`kvbounds.algorithms.subgen.SubGen`.

    numpy and CPU tensors decide each row on the host; GPU arrays keep the count m' on the device: the
    representatives' buffer holds rows beyond m' that are masked out (+inf distance), each row is written at index
    m' whether it opens a cluster or not (a row that does not is overwritten by the next one that does), and m'
    is read only when the buffer may be full (m' <= rows seen since the last read + m' then), about twice per
    doubling of the buffer, plus once at the end."""
    check_array(X, "X", ndim=2, min_rows=1)
    check_positive(delta, "delta")
    xp = array_namespace(X)
    n, d = X.shape
    reps = xp.zeros((min(n, 64), d), dtype=X.dtype, device=_dev(X))
    if is_gpu_array(X) or _DEVICE_COUNTS:   # off a GPU host reads are free and the per-row loop is faster
        return _stream_cluster_counts_device(xp, X, float(delta), reps)
    m, out = 0, np.zeros(n, dtype=np.int64)
    for j in range(n):
        x = X[j]
        if m == 0 or float(xp.min(xp.linalg.vector_norm(reps[:m, :] - x, axis=-1))) > delta:
            if m == reps.shape[0]:
                reps = xp.concat([reps, xp.zeros(reps.shape, dtype=reps.dtype, device=_dev(reps))], axis=0)
            reps[m, :] = x
            m += 1
        out[j] = m
    return out


def _stream_cluster_counts_device(xp, X, delta: float, reps) -> np.ndarray:
    n, dev = X.shape[0], _dev(X)
    m = xp.zeros((1,), dtype=xp.int64, device=dev)              # m' on the device, shape (1,): an index array
    counts = xp.zeros((n,), dtype=xp.int64, device=dev)
    m_host, since = 0, 0                                        # m' at the last read; rows seen since then
    for j in range(n):
        if m_host + since == reps.shape[0]:                     # the buffer may be full: read m' (a host sync)
            m_host, since = int(to_numpy(m)[0]), 0
            if 2 * m_host > reps.shape[0]:
                reps = xp.concat([reps, xp.zeros(reps.shape, dtype=reps.dtype, device=dev)], axis=0)
        x = X[j]
        # rows >= m' are masked; min over no row is +inf, so the first row opens a cluster as on the host path;
        # the distance is compared in float64, as float(.) > delta compares it there
        dist = xp.linalg.vector_norm(reps - x, axis=-1)
        live = xp.arange(reps.shape[0], device=dev) < m
        near = xp.min(xp.where(live, dist, xp.full_like(dist, math.inf)))
        opens = xp.astype(near, xp.float64) > delta
        reps[m, :] = x                                          # row m' is free: harmless when the row does not open
        m = m + xp.astype(opens, xp.int64)
        counts[j:j + 1] = m
        since += 1
    return to_numpy(counts).astype(np.int64)


def recent_plus_centers(K, *, window: int, k: int, start: str = "first", traversal=None) -> tuple[Any, Any]:
    """The practical variant (ClusterGen Sec. 4.1): the last ``window`` tokens plus ``k`` greedy k-center centers
    of the keys before them. Returns ``(indices, cluster_sizes)`` of shape (..., k + window) on K's
    backend: indices sorted ascending, and for each kept token the number of tokens it represents
    (its cluster's size for a center, 1 for a window token). ``traversal``: optional :class:`FarthestFirst` of
    exactly ``K[..., :n - window, :]`` (numpy, start "first"), shared by calls at several k (the same result)."""
    check_array(K, "K", ndim=tuple(range(2, 8)), min_rows=1)
    xp = array_namespace(K)
    n = K.shape[-2]
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
        raise InputError(f"window must be an integer >= 0, got {window!r}")
    if window > n:
        raise InputError(f"window = {window} exceeds the number of tokens n = {n}")
    rest = n - int(window)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise InputError(f"k must be an integer >= 0, got {k!r}")
    k = _check_k(k, rest, "k") if k else 0
    if start not in ("first", "last"):
        raise InputError(f"start must be 'first' or 'last', got {start!r}")
    lead = tuple(K.shape[:-2])
    dev = _dev(K)
    tail = xp.broadcast_to(xp.arange(rest, n, dtype=xp.int64, device=dev), lead + (int(window),))
    ones = xp.ones(lead + (int(window),), dtype=K.dtype, device=dev)
    if k == 0:
        return xp.asarray(tail, copy=True), ones
    if traversal is None:
        res = greedy_k_center(K[..., :rest, :], k, start=0 if start == "first" else rest - 1)
    elif not isinstance(traversal, FarthestFirst) or not traversal.is_of(K[..., :rest, :]) or start != "first" \
            or traversal.start != 0:
        raise InputError("traversal must be a FarthestFirst of K[..., :n - window, :] (the same numpy memory), "
                         "started at the first token (start='first')")
    else:
        res = traversal.result(k)
    lab = to_numpy(res.assignment).reshape(-1, rest)
    B = lab.shape[0]
    counts = np.bincount((lab + (np.arange(B) * k)[:, None]).ravel(), minlength=B * k).reshape(lead + (k,))
    sizes = like(counts.astype(np.float64), K)                                         # (..., k)
    order = xp.argsort(res.centers, axis=-1)
    idx = xp.take_along_axis(res.centers, order, axis=-1)
    sizes = xp.take_along_axis(sizes, order, axis=-1)
    return xp.concat([idx, tail], axis=-1), xp.concat([sizes, ones], axis=-1)


def clusterability(X, *, k: int = 16, delta_rel: float = 0.25, checkpoints: int = 4) -> dict:
    """The clusterability measures of SG.clusterability for the rows of an (n, d) array (a key or value
    stream, synthetic or real):

    * ``radius_curve``: greedy k-center covering radius r(j), j = 1..k (ClusterGen Fig. 1 uses k = 16), and
      ``normalized_radius`` = r(k) / r(1) (near 0: k centres cover the stream tightly; near 1: no structure);
    * ``cluster_counts``: clusters m'(n_i) that SubGen's UpdateSoftmaxNormalizer opens with threshold
      delta = ``delta_rel`` r(1) after prefixes n_i = n / 2^(checkpoints-1), ..., n, and ``count_slope``, the
      log-log slope of m' against n (about 0 for (m, delta)-clusterable streams, 1 when every key opens a
      cluster; Thm 1 needs m = n^(1 - Omega(1)))."""
    check_array(X, "X", ndim=2, min_rows=2)
    n = X.shape[0]
    k = _check_k(k, 2**62)
    check_positive(delta_rel, "delta_rel")
    checkpoints = check_int(checkpoints, "checkpoints", minimum=1, maximum=62)
    r = covering_radius_curve(X, min(k, n))
    delta = float(delta_rel * r[0]) if r[0] > 0 else 1.0
    counts = stream_cluster_counts(X, delta)
    ns = sorted({max(2, n >> i) for i in range(checkpoints)})
    ms = [int(counts[j - 1]) for j in ns]
    lx, ly = np.log(ns), np.log(ms)
    slope = float(np.polyfit(lx, ly, 1)[0]) if len(ns) >= 2 else 0.0
    return {"radius_curve": r.tolist(), "normalized_radius": float(r[-1] / r[0]) if r[0] > 0 else 0.0,
            "delta": delta, "checkpoints": ns, "cluster_counts": ms, "count_slope": slope}
