"""Frequent Directions with the 2l-row buffer (Liberty 2013; Ghashami, Liberty, Phillips, Woodruff 2016, Alg. 2).

Seed Subspace-FD-draft (Sec. 5, Sec. 8 "FD linkage") uses FD sketches of the keys and values; claims FD.covariance and
FD.residual. GLPW16 Alg. 2, for a stream of rows a_i in R^d and sketch size l::

    B <- 0^{2l x d}
    for each row a_i:
        insert a_i into a zero-valued row of B
        if B has no zero-valued row:
            [U, Sigma, V] = SVD(B);  delta = sigma_l^2            (the l-th squared singular value)
            B <- sqrt(max(Sigma^2 - delta I, 0)) V^T               (rows l..2l are now zero)

Guarantee (GLPW16 Thm 1.1 and its proof): with Delta the total shrinkage (sum of the deltas),
``0 <= A^T A - B^T B <= Delta I`` and ``Delta <= ||A - A_r||_F^2 / (l - r)`` for every r < l. The sketch's
own certificate is Delta: :meth:`FrequentDirections.certificate`.

Three places where public FD code breaks this guarantee, and how this module avoids each:
  * ``sketch()`` returns every row currently held, the buffered ones included (dropping rows inserted since
    the last shrink would under-report A^T A by their Gram matrix, which Delta does not cover);
  * the shrink never takes the square root of a possibly negative number: the new singular values are
    sigma_i sqrt(max(0, (1 - t_i)(1 + t_i))) with t_i = sigma_l / sigma_i in [0, 1] (this also cannot
    overflow where sigma_i^2 would), and rows l..2l are set to exact zeros;
  * rows are copied from the input block by explicit counts, so a stream whose length is not a multiple of
    the buffer never re-reads rows of an earlier block.

Arrays of any array-API backend; the buffer lives in the namespace, device and dtype of the first rows seen.

Speed (numpy buffers): the shrink factors B B^T (2l x 2l) by a symmetric eigendecomposition instead of
the SVD of B (2l x d): with B B^T = U diag(lambda) U^T, the rotated rows u_i^T B have norms sigma_i and
directions v_i, so the shrunk rows are sqrt(1 - delta/sigma_i^2) u_i^T B -- the same sketch, from a 2l x 2l
factorisation (:func:`shrunk_gram`). The sigma_i^2 are taken as the rotated rows' squared norms, not as the
eigenvalues: those carry an absolute error ~ eps ||B||^2 (sqrt(eps) ||B|| in singular-value units, visible on
rank-deficient streams), the row norms ~ eps ||B||, as the SVD. B is scaled by a power of two (exact) first, so
the Gram neither overflows nor underflows; it is formed in float64. Tests compare this path with the SVD path
(:func:`shrunk`, the reference, used for every other backend). numpy rows also get a
fused check: one dot product is finite and small iff there is no NaN/Inf and no squared-norm overflow; any
doubt falls through to the generic checks, which raise the same errors as before.

Host reads on a GPU: update() reads its checks (finite, no squared-norm overflow) in one copy per call; a
shrink keeps Delta on the device until certificate() reads it; ``_push`` (rows a caller has checked, as
AdaptiveSubspaceAttention does once per call) reads nothing but what the SVD itself waits for.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from array_api_compat import device as _device

from kvbounds.algorithms.arrays import array_namespace

from .host_values import host_floats
from .validation import InputError, check_array, check_positive

__all__ = ["FrequentDirections", "shrunk", "check_row_scale", "shrunk_gram"]


class FrequentDirections:
    """Streaming FD sketch of the rows of A (n x d) with sketch size ``ell`` (buffer of 2 ell rows).

    ``update(rows)``  one row (d,) or a block (m, d);
    ``sketch()``      the rows held now (buffered ones included): S^T S estimates A^T A at any moment;
    ``sketch(compact=True)``  at most ``ell`` rows (one extra shrink on a copy, by sigma_{ell+1}^2);
    ``certificate()`` Delta, with 0 <= A^T A - S^T S <= Delta I (``compact=True`` for the compact sketch);
    ``merge(other)``  absorb another sketch of the same (d, ell) (GLPW16 Sec. 3: mergeable).
    """

    fast = True          # False: the generic array-API path (SVD shrinks), the reference the tests compare with

    def __init__(self, d: int, ell: int):
        check_positive(d, "d", integer=True)
        check_positive(ell, "ell", integer=True)
        if 2 * ell * d > 2**34:
            raise InputError(f"sketch buffer 2 ell x d = 2 * {ell} x {d} is too large")
        self.d, self.ell = int(d), int(ell)
        self._buf = None          # (2 ell, d) once the first rows arrive
        self._next = 0            # rows 0.._next-1 are (possibly) non-zero, the rest are exact zeros
        self._delta = 0.0         # total shrinkage Delta
        self.n_rows = 0           # rows seen
        self.n_shrinks = 0

    # -- stream --------------------------------------------------------------------------------------
    def update(self, rows: Any) -> "FrequentDirections":
        if self.fast and _plain_numpy_rows(rows, self.d) and self._update_numpy(rows):
            return self
        check_array(rows, "rows", ndim=(1, 2), last_dim=self.d, finite=False)
        xp = array_namespace(rows)
        if rows.ndim == 1:
            rows = xp.reshape(rows, (1, self.d))
        if rows.shape[0] == 0:
            return self
        self._ensure_buffer(rows)
        finite, amax = host_floats(xp, xp.all(xp.isfinite(rows)), xp.max(xp.abs(rows)))   # one host read
        if not finite:
            raise InputError("rows contains NaN or Inf")
        check_row_scale(amax, self.d, rows.dtype, xp)
        return self._push(rows)

    def _push(self, rows) -> "FrequentDirections":
        """update() for rows (m, d) already checked (finite, not too large: :func:`check_row_scale`) by the caller,
        on the sketch's backend and device: no host read except the SVD of a shrink."""
        xp = array_namespace(rows)
        self._ensure_buffer(rows)
        rows = xp.astype(rows, self._buf.dtype) if rows.dtype != self._buf.dtype else rows
        m, i = rows.shape[0], 0
        while i < m:                                  # GLPW16 Alg. 2 lines 3-4, a block at a time
            k = min(2 * self.ell - self._next, m - i)
            self._buf[self._next:self._next + k, :] = rows[i:i + k, :]
            self._next += k
            i += k
            if self._next == 2 * self.ell:            # no zero-valued row left: shrink (lines 5-7)
                self._shrink()
        self.n_rows += m
        return self

    def _update_numpy(self, rows: np.ndarray) -> bool:
        """update() for numpy rows that pass the fused check (False: let the generic path check and run)."""
        if self._buf is not None and type(self._buf) is not np.ndarray:
            return False                               # mixed backends: the generic path raises
        flat = rows.reshape(-1)
        with np.errstate(over="ignore", invalid="ignore"):
            ss = float(np.dot(flat, flat))             # NaN/Inf in -> NaN/Inf out; >= max |entry|^2
        if not ss * self.d < 0.5 * float(np.finfo(rows.dtype).max):
            return False
        m = rows.shape[0] if rows.ndim == 2 else 1
        if m == 0:
            return True
        if rows.ndim == 1:
            rows = rows.reshape(1, self.d)
        if self._buf is None:
            self._buf = np.zeros((2 * self.ell, self.d), dtype=rows.dtype)
        elif rows.dtype != self._buf.dtype:
            rows = rows.astype(self._buf.dtype)
        i, cap = 0, 2 * self.ell
        while i < m:                                   # as in update()
            k = min(cap - self._next, m - i)
            self._buf[self._next:self._next + k, :] = rows[i:i + k, :]
            self._next += k
            i += k
            if self._next == cap:
                self._shrink()
        self.n_rows += m
        return True

    def _ensure_buffer(self, rows) -> None:
        xp = array_namespace(rows)
        if self._buf is None:
            self._buf = xp.zeros((2 * self.ell, self.d), dtype=rows.dtype, device=_device(rows))
        elif array_namespace(self._buf) is not xp:
            raise InputError("rows come from a different array backend than the sketch's earlier rows")
        elif _device(self._buf) != _device(rows):
            raise InputError(f"rows live on {_device(rows)}, the sketch's earlier rows on {_device(self._buf)}")

    def _shrink(self) -> None:
        if self.fast and _gram_ok(self._buf, self._next):
            self._buf, self._next, delta = shrunk_gram(self._buf[:self._next, :], self.ell, keep=self.ell - 1,
                                                       out_rows=2 * self.ell)
        else:                  # delta stays on the buffer's device until certificate() reads it (issue 15)
            self._buf, self._next, delta = _shrunk(self._buf[:self._next, :], self.ell, keep=self.ell - 1,
                                                   out_rows=2 * self.ell, host_delta=type(self._buf) is np.ndarray)
        self._delta = self._delta + delta
        self.n_shrinks += 1

    # -- queries -------------------------------------------------------------------------------------
    def sketch(self, compact: bool = False):
        """S: the rows held now (buffered rows included), or at most ``ell`` rows if ``compact``."""
        if self._buf is None:
            raise InputError("empty stream: the sketch has seen no rows yet")
        S = self._buf[:self._next, :]
        if compact and self._next > self.ell:
            shrink = shrunk_gram if self.fast and _gram_ok(self._buf, self._next) else shrunk
            S, _, _ = shrink(S, self.ell, keep=self.ell, out_rows=self.ell)
        return S

    def certificate(self, compact: bool = False) -> float:
        """Delta, the total shrinkage: ||A^T A - S^T S||_op <= Delta (GLPW16 Lemma 2.2/Thm 1.1)."""
        if compact and self._buf is not None and self._next > self.ell:
            shrink = shrunk_gram if self.fast and _gram_ok(self._buf, self._next) else shrunk
            return float(self._delta) + shrink(self._buf[:self._next, :], self.ell, keep=self.ell, out_rows=self.ell)[2]
        return float(self._delta)

    def merge(self, other: "FrequentDirections") -> "FrequentDirections":
        """Absorb ``other``'s sketch (same d and ell): the result sketches [A; A_other] with
        certificate Delta + Delta_other (+ the shrinks the insertion causes)."""
        if not isinstance(other, FrequentDirections) or (other.d, other.ell) != (self.d, self.ell):
            raise InputError("merge needs a FrequentDirections sketch with the same d and ell")
        n_rows = self.n_rows + other.n_rows
        if other._buf is not None and other._next:
            self.update(other._buf[:other._next, :])
        self.n_rows, self._delta = n_rows, float(self._delta) + float(other._delta)
        return self

    def __repr__(self) -> str:
        return (f"FrequentDirections(d={self.d}, ell={self.ell}, rows_seen={self.n_rows}, rows_held={self._next}, "
                f"shrinks={self.n_shrinks}, Delta={float(self._delta):.4g})")


def shrunk(B, ell: int, *, keep: int, out_rows: int):
    """FD shrink of the rows B (m x d) (GLPW16 Alg. 2 lines 5-7).

    ``keep = ell - 1``: delta = sigma_ell^2 (the 2l-buffer step; sigma_ell becomes 0, so ell - 1 rows stay);
    ``keep = ell``:     delta = sigma_{ell+1}^2 (compaction to an ell-row sketch).
    Returns (new buffer of ``out_rows`` rows, number of leading non-zero rows, delta)."""
    return _shrunk(B, ell, keep=keep, out_rows=out_rows, host_delta=True)


def _shrunk(B, ell: int, *, keep: int, out_rows: int, host_delta: bool):
    """:func:`shrunk`; ``host_delta=False`` returns delta as a 0-d float64 array on B's device (no host read)."""
    # NaN/Inf first: LAPACK's SVD never returns on them (O(m d) << SVD); the sketch's own buffer holds checked rows
    check_array(B, "B", ndim=2, finite=host_delta)
    check_positive(ell, "ell", integer=True)
    check_positive(keep, "keep", integer=True, allow_zero=True)
    check_positive(out_rows, "out_rows", integer=True)
    if out_rows < min(keep, B.shape[0]) or out_rows * B.shape[1] > 2**34:
        raise InputError(f"out_rows = {out_rows} must hold the kept rows (keep = {keep}) and fit in memory")
    xp = array_namespace(B)
    m, d = B.shape
    out = xp.zeros((out_rows, d), dtype=B.dtype, device=_device(B))
    if m == 0:
        return out, 0, 0.0
    _, s, Vt = xp.linalg.svd(B, full_matrices=False)  # s descending, length min(m, d)
    k = s.shape[0]
    if k <= keep:                                      # rank <= keep: rotate, no shrinkage needed
        out[:k, :] = s[:, None] * Vt
        return out, k, 0.0
    s_cut = s[keep]                                    # sigma_{keep+1} (1-indexed)
    top = s[:keep]
    t = xp.where(top > 0, s_cut / xp.where(top > 0, top, xp.ones_like(top)), xp.zeros_like(top))
    t = xp.clip(t, 0.0, 1.0)                           # t <= 1 by sorting; clip guards rounding
    scale = xp.sqrt(xp.clip((1.0 - t) * (1.0 + t), 0.0, 1.0))   # clamp before the square root
    out[:keep, :] = (top * scale)[:, None] * Vt[:keep, :]
    if not host_delta:
        s_cut = xp.astype(s_cut, xp.float64)            # exact; the square and the sum in float64, as on the host
        return out, keep, s_cut * s_cut
    s_cut = float(s_cut)
    return out, keep, s_cut * s_cut


def check_row_scale(amax: float, d: int, dtype, xp) -> None:
    """Rows whose largest |entry| is ``amax`` have squared norms that do not overflow ``dtype``, or an InputError."""
    if amax * math.sqrt(d) > math.sqrt(float(xp.finfo(dtype).max)):
        raise InputError(f"rows too large (max |entry| {amax:.3g}): squared row norms overflow {dtype}")


_FAST_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _plain_numpy_rows(rows, d: int) -> bool:
    """numpy float32/float64 rows of shape (d,) or (m, d): eligible for the fused check of update()."""
    return (type(rows) is np.ndarray and rows.dtype in _FAST_DTYPES and 1 <= rows.ndim <= 2
            and rows.shape[-1] == d)


def _gram_ok(buf, m: int) -> bool:
    """The eigendecomposition path applies: a numpy buffer whose held rows are no more than its columns."""
    return type(buf) is np.ndarray and m <= buf.shape[1]


def _times_pow2(X, k: int):
    """X * 2^k, exact (two factors, so that 2^k itself need not be representable)."""
    h = k // 2
    return (X * math.ldexp(1.0, h)) * math.ldexp(1.0, k - h)


def shrunk_gram(B: np.ndarray, ell: int, *, keep: int, out_rows: int):
    """:func:`shrunk` for numpy B (m x d, m <= d) through the eigendecomposition of B B^T (module docstring).

    Same contract and, up to rounding, the same result (tests compare the two paths)."""
    if not isinstance(B, np.ndarray):
        raise InputError(f"B must be a numpy array (shrunk_gram is the numpy path of shrunk), got {type(B).__name__}")
    check_array(B, "B", ndim=2)
    check_positive(ell, "ell", integer=True)
    check_positive(keep, "keep", integer=True, allow_zero=True)
    check_positive(out_rows, "out_rows", integer=True)
    if out_rows < min(keep, B.shape[0]) or out_rows * B.shape[1] > 2**34:
        raise InputError(f"out_rows = {out_rows} must hold the kept rows (keep = {keep}) and fit in memory")
    if B.shape[0] > B.shape[1]:
        raise InputError(f"shrunk_gram needs m <= d rows (B is {B.shape}); use shrunk")
    m, d = B.shape
    out = np.zeros((out_rows, d), dtype=B.dtype)
    if m == 0:
        return out, 0, 0.0
    amax = float(np.max(np.abs(B)))
    if amax == 0.0:                                    # all-zero rows: rank 0, nothing to shrink
        return out, min(m, keep), 0.0
    e = math.frexp(amax)[1]                           # B = 2^e Bs with max |Bs| in [1/2, 1): exact scaling
    Bs = _times_pow2(B.astype(np.float64, copy=False), -e)
    U = np.linalg.eigh(Bs @ Bs.T)[1][:, ::-1]        # eigenvectors, eigenvalues descending
    R = U.T @ Bs                                      # rotated rows: R R^T = U^T B B^T U (B^T B = R^T R)
    if m <= keep:                                     # rank <= keep: rotate, no shrinkage needed
        out[:m, :] = _times_pow2(R, e)
        return out, m, 0.0
    # the squared norms of the rotated rows, not the eigenvalues: an eigenvalue carries an absolute error
    # ~ eps ||B||^2, but a row's norm is accurate to ~ eps ||B|| (the eigenvectors are accurate to eps/gap),
    # so singular values far below ||B|| (rank-deficient rows) keep the accuracy of the SVD path
    n2 = np.einsum("ij,ij->i", R, R)
    cut = float(np.max(n2[keep:]))                    # sigma_{keep+1}^2 (1-indexed), in units of 4^e
    top = n2[:keep]
    t2 = np.divide(cut, top, out=np.ones_like(top), where=top > 0)
    scale = np.sqrt(np.clip(1.0 - t2, 0.0, 1.0))
    out[:keep, :] = _times_pow2(scale, e)[:, None] * R[:keep, :]
    return out, keep, math.ldexp(cut, 2 * e)
