"""Coefficient-space attention (Subspace-FD-draft Secs. 4-6, 10): static and adaptive (FD-sketched) subspaces.

Claims: SUB.logit-error, SUB.output-error, SUB.blockwise, SUB.cost.

Sec. 4 (one basis): B (r, d), E (r_v, d) with orthonormal rows; key coefficients C = K B^T, value coefficients
D = V E^T, projected query q~ = B q; projected logits l^_i = gamma_B q~ . c_i / sqrt(d) = gamma_B q^T P_B k_i / sqrt(d);
alpha^ = softmax(l^ + mask); output o^ = (alpha^T D) E.
gamma_B: the draft's default sqrt(trace(P_B)/d) = sqrt(r/d), 1, or a scalar calibrated on held-out data
(:func:`calibrate_gamma`, least squares of l on q^T P_B k / sqrt d). Only gamma_B = 1 makes the projected logits
exact when the keys lie in the subspace (see theory/subspace.py).

Sec. 5 (adaptive), per token k_t, v_t, with FD sketches S_K (ell_k rows), S_V (ell_v rows)::
    1. res_k = ||(I - P_Bj) k_t||, res_v = ||(I - P_Ej) v_t||
    2. if res_k > tau_k or res_v > tau_v or L_j = L: close chunk j, snapshot B, E = top-r / top-r_v right
       singular vectors of S_K, S_V, open chunk j+1
    3. append c_t = B_j k_t, d_t = E_j v_t
    4. update S_K, S_V with k_t, v_t
The first token opens the first chunk (bases from ``init_bases``, else the first coordinate axes: the sketch
is still empty). The sketches cover the whole stream (the draft's S_K, S_V are never reset), and the token that
triggers a snapshot is not yet in the sketch (step 4 comes after step 2), so when the sketch's top-r space
misses the incoming keys (RoPE with energy in fast-rotating pairs) every token opens a chunk (J ~ T).
Sec. 6: decode aggregates the chunks with the one-pass blockwise softmax (:mod:`kvbounds.algorithms.blockwise_softmax`).

:func:`coefficient_decode` / :func:`exact_decode` are the batched one-step kernels the SUB.cost check times and
whose operations it counts (through an :class:`OpCounter`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from array_api_compat import device as _device

from kvbounds.algorithms.arrays import array_namespace, is_gpu_array

from .blockwise_softmax import OnlineSoftmax
from .frequent_directions import FrequentDirections, check_row_scale
from .host_values import host_floats
from .attention import mul_pow2, pow2_exponent
from .subspace_decode import OpCounter, coefficient_decode, exact_decode  # noqa: F401 (re-exported: SUB.cost kernels)
from .validation import InputError, check_array, check_int, check_positive, check_real, namespace

__all__ = ["GAMMA_CHOICES", "draft_gamma", "calibrate_gamma", "resolve_gamma", "top_basis", "Chunk", "aggregate",
           "StaticSubspaceAttention", "AdaptiveSubspaceAttention"]

GAMMA_CHOICES = ("sqrt(r/d)", "1", "calibrated")


# -- gamma_B -------------------------------------------------------------------------------------------

def draft_gamma(r: int, d: int) -> float:
    """The draft's default gamma_B = sqrt(trace(P_B)/d) = sqrt(r/d) (Subspace-FD-draft Sec. 4)."""
    return math.sqrt(r / d)


def calibrate_gamma(Q, K, B) -> float:
    """The scalar gamma minimising sum_{q,k} (q.k - gamma q^T P_B k)^2 over held-out (Q, K) (Subspace-FD-draft Sec. 4)."""
    check_array(K, "K", ndim=2, min_rows=1)
    check_array(Q, "Q", ndim=2, last_dim=K.shape[1], min_rows=1)
    check_array(B, "B", ndim=2, last_dim=K.shape[1], min_rows=1)
    xp = namespace(Q, K, B, names="Q, K and B")
    # gamma is invariant under Q -> a Q, K -> b K: rescale by powers of two so q.k cannot overflow
    Q, K = mul_pow2(Q, -pow2_exponent(xp, Q)), mul_pow2(K, -pow2_exponent(xp, K))
    # and gamma(2^e B') = 2^-2e gamma(B'): B scaled too, so the denominator sum (q^T B^T B k)^2 cannot overflow
    # (issue 24: B of entries 1e150 gave den = inf and gamma = 0.0 where the exact answer is ~1e-300)
    e_b = pow2_exponent(xp, B)
    B = mul_pow2(B, -e_b)
    L = xp.matmul(Q, xp.matrix_transpose(K))
    Lp = xp.matmul(xp.matmul(Q, xp.matrix_transpose(B)), xp.matrix_transpose(xp.matmul(K, xp.matrix_transpose(B))))
    den = float(xp.sum(Lp * Lp))
    if den == 0:
        raise InputError("calibration keys/queries have no component in the subspace: gamma undefined")
    g = float(xp.sum(L * Lp)) / den
    try:
        gamma = math.ldexp(g, -2 * e_b)
    except OverflowError:
        gamma = math.inf
    if not math.isfinite(gamma) or (gamma == 0.0 and g != 0.0):
        raise InputError(f"gamma = {g:.6g} * 2^{-2 * e_b} lies outside float64's range (B's entries are too large "
                         f"or too small)")
    return gamma


def resolve_gamma(gamma: Any, r: int, d: int, calibrated: float | None = None) -> float:
    """gamma given as a number or one of GAMMA_CHOICES."""
    check_positive(r, "r", integer=True)
    check_positive(d, "d", integer=True)
    if isinstance(gamma, str):
        if gamma == "sqrt(r/d)":
            return draft_gamma(r, d)
        if gamma == "1":
            return 1.0
        if gamma == "calibrated":
            if calibrated is None:
                raise InputError("gamma='calibrated' needs a calibrated value (see calibrate_gamma)")
            return check_real(calibrated, "calibrated gamma")
        raise InputError(f"gamma must be a positive number or one of {GAMMA_CHOICES}, got {gamma!r}")
    check_positive(gamma, "gamma")
    return float(gamma)


# -- bases ---------------------------------------------------------------------------------------------

def top_basis(X, r: int):
    """(r, d) orthonormal rows: the top-r right singular vectors of X (m, d), completed with coordinate axes
    (Gram-Schmidt through QR) when X has fewer than r rows."""
    check_array(X, "X", ndim=2)                       # NaN/Inf first: LAPACK's SVD never returns on them
    return _top_basis(X, r)


def _top_basis(X, r: int):
    """top_basis for X already known finite (a sketch of checked rows): no host read for the check."""
    xp = array_namespace(X)
    d = X.shape[1]
    r = check_int(r, "rank r", minimum=1, maximum=d)
    k = 0
    if X.shape[0]:
        Vt = xp.linalg.svd(mul_pow2(X, -pow2_exponent(xp, X)), full_matrices=False)[2]   # scaled: no overflow
        k = Vt.shape[0]
        if k >= r:
            return Vt[:r, :]
    eye = xp.eye(d, dtype=X.dtype, device=_device(X))
    M = xp.concat([xp.matrix_transpose(Vt), eye], axis=1) if k else eye
    Qm = xp.linalg.qr(M)[0]                          # first k columns span Vt's rows
    return xp.matrix_transpose(Qm[:, :r])


def _check_orthonormal(B, name: str) -> None:
    xp = array_namespace(B)
    G = xp.matmul(B, xp.matrix_transpose(B))
    err = float(xp.max(xp.abs(G - xp.eye(B.shape[0], dtype=B.dtype, device=_device(B)))))
    tol = 1e-8 if B.dtype == xp.float64 else 1e-4
    if err > tol:
        raise InputError(f"{name} must have orthonormal rows ({name} {name}^T = I); max deviation {err:.3g}")


@dataclasses.dataclass
class Chunk:
    """One chunk j: bases B_j (r, d), E_j (r_v, d), coefficients C_j (L_j, r), D_j (L_j, r_v), tokens [start, stop)."""
    B: Any
    E: Any
    C: Any
    D: Any
    start: int
    stop: int
    reason: str = ""

    @property
    def length(self) -> int:
        return self.stop - self.start


def _chunk_logits(q, ch: Chunk, gamma: float, d: int):
    xp = array_namespace(q, ch.B)
    qt = xp.matmul(q, xp.matrix_transpose(ch.B))              # q~_j = B_j q
    return xp.matmul(qt, xp.matrix_transpose(ch.C)) * (gamma / math.sqrt(d))


def aggregate(q, chunks, gamma: float, d: int, mask=None):
    """o^ for q (d,) or (m, d) over chunks (Subspace-FD-draft Sec. 6); mask: boolean (..., T) over all tokens, False = masked."""
    acc = OnlineSoftmax()
    for ch in chunks:
        mk = None if mask is None else mask[..., ch.start:ch.stop]
        acc.add(_chunk_logits(q, ch, gamma, d), ch.D, ch.E, mk)
    return acc.result()


# -- static subspace (Sec. 4, Sec. 10) -------------------------------------------------------------------

class StaticSubspaceAttention:
    """Coefficient-space attention with one basis pair (B, E), e.g. from calibration traces."""

    def __init__(self, B, E, *, gamma: Any = "sqrt(r/d)", calibrated_gamma: float | None = None):
        check_array(B, "B", ndim=2, min_rows=1)
        check_array(E, "E", ndim=2, min_rows=1)
        namespace(B, E, names="B and E")
        _check_orthonormal(B, "B")
        _check_orthonormal(E, "E")
        self.B, self.E = B, E
        self.r, self.d = B.shape
        self.r_v, self.d_v = E.shape
        self.gamma = resolve_gamma(gamma, self.r, self.d, calibrated_gamma)
        self._C, self._D, self.n = [], [], 0

    @classmethod
    def from_calibration(cls, K_cal, V_cal, r: int, r_v: int, *, gamma: Any = "sqrt(r/d)", Q_cal=None):
        """Bases = top right singular vectors of calibration K, V (Subspace-FD-draft Sec. 10 "Static Subspace"); gamma
        'calibrated' is fitted on (Q_cal, K_cal)."""
        check_array(K_cal, "K_cal", ndim=2, min_rows=1)
        check_array(V_cal, "V_cal", ndim=2, min_rows=1)
        B, E = top_basis(K_cal, r), top_basis(V_cal, r_v)
        cal = None
        if gamma == "calibrated":
            if Q_cal is None:
                raise InputError("gamma='calibrated' needs calibration queries Q_cal")
            cal = calibrate_gamma(Q_cal, K_cal, B)
        return cls(B, E, gamma=gamma, calibrated_gamma=cal)

    def extend(self, K, V) -> "StaticSubspaceAttention":
        check_array(K, "K", ndim=2, last_dim=self.d)
        check_array(V, "V", ndim=2, last_dim=self.d_v)
        if K.shape[0] != V.shape[0]:
            raise InputError(f"K and V must have the same number of rows, got {K.shape[0]} and {V.shape[0]}")
        xp = namespace(K, V, self.B, names="K, V and the bases")
        self._C.append(xp.matmul(K, xp.matrix_transpose(self.B)))
        self._D.append(xp.matmul(V, xp.matrix_transpose(self.E)))
        self.n += K.shape[0]
        return self

    @property
    def chunks(self) -> list[Chunk]:
        if not self.n:
            return []
        xp = array_namespace(self._C[0])
        if len(self._C) > 1:
            self._C, self._D = [xp.concat(self._C, axis=0)], [xp.concat(self._D, axis=0)]
        return [Chunk(self.B, self.E, self._C[0], self._D[0], 0, self.n, "static")]

    def attend(self, q, mask=None):
        check_array(q, "q", ndim=(1, 2), last_dim=self.d)
        namespace(q, self.B, names="q and the bases")
        if not self.n:
            raise InputError("empty cache: no tokens to attend to")
        return aggregate(q, self.chunks, self.gamma, self.d, mask)

    def logits(self, q):
        check_array(q, "q", ndim=(1, 2), last_dim=self.d)
        namespace(q, self.B, names="q and the bases")
        if not self.n:
            raise InputError("empty cache: no tokens")
        return _chunk_logits(q, self.chunks[0], self.gamma, self.d)


# -- adaptive subspace (Sec. 5) ------------------------------------------------------------------------

class AdaptiveSubspaceAttention:
    """Residual-triggered chunking with FD-sketched bases (Subspace-FD-draft Sec. 5) and blockwise decode (Sec. 6)."""

    WINDOWED = False     # True: read residuals in windows on any backend (on a GPU always; see _advance)

    def __init__(self, d: int, r: int, r_v: int, *, ell_k: int, ell_v: int, tau_k: float, tau_v: float, L: int,
                 gamma: Any = "sqrt(r/d)", calibrated_gamma: float | None = None, d_v: int | None = None,
                 init_bases: tuple | None = None):
        for name, val in (("d", d), ("r", r), ("r_v", r_v), ("ell_k", ell_k), ("ell_v", ell_v), ("L", L)):
            check_positive(val, name, integer=True)
        d_v = d if d_v is None else d_v
        check_positive(d_v, "d_v", integer=True)
        if L * (r + r_v) > 2**31:
            raise InputError(f"chunk length L = {L} is too large for its coefficient buffers")
        if r > d or r_v > d_v:
            raise InputError(f"need r <= d and r_v <= d_v, got r={r}, d={d}, r_v={r_v}, d_v={d_v}")
        if ell_k < r or ell_v < r_v:
            raise InputError(f"sketch sizes must be at least the ranks (Subspace-FD-draft Sec. 5: ell >= r + Delta), got ell_k={ell_k}, "
                             f"r={r}, ell_v={ell_v}, r_v={r_v}")
        for name, tau in (("tau_k", tau_k), ("tau_v", tau_v)):     # math.inf: chunks end at length L only
            if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not tau >= 0:
                raise InputError(f"{name} must be a number >= 0 (inf allowed), got {tau!r}")
        self.d, self.d_v, self.r, self.r_v, self.L = d, d_v, r, r_v, L
        self.tau_k, self.tau_v = float(tau_k), float(tau_v)
        self.gamma = resolve_gamma(gamma, r, d, calibrated_gamma)
        self.fd_k, self.fd_v = FrequentDirections(d, ell_k), FrequentDirections(d_v, ell_v)
        if init_bases is not None:          # (B (r, d), E (r_v, d_v)), used until the sketches hold rows
            if not isinstance(init_bases, (tuple, list)) or len(init_bases) != 2:
                raise InputError(f"init_bases must be a pair (B, E), got {type(init_bases).__name__}")
            for name, X, rows, width in (("init_bases[0]", init_bases[0], r, d), ("init_bases[1]", init_bases[1], r_v, d_v)):
                if check_array(X, name, ndim=2, last_dim=width).shape[0] != rows:
                    raise InputError(f"{name} must have {rows} rows (the rank), got shape {tuple(X.shape)}")
            namespace(*init_bases, names="init_bases")
        self.init_bases = init_bases
        self.closed: list[Chunk] = []
        self._active: dict | None = None
        self.t = 0
        self.triggers: list[tuple[int, str, float, float]] = []   # (token, reason, res_k, res_v)
        self._window = 1          # tokens whose residuals the next host read brings (see _advance)

    # step 2's snapshot
    def _snapshot(self, like):
        xp = array_namespace(like)
        if self.fd_k.n_rows and self.fd_v.n_rows:
            B, E = _top_basis(self.fd_k.sketch(), self.r), _top_basis(self.fd_v.sketch(), self.r_v)
        elif self.init_bases is not None:
            B, E = self.init_bases
            namespace(like, B, E, names="init_bases and the tokens")   # one backend, one device (no CPU/CUDA mix)
        else:
            B = top_basis(xp.zeros((0, self.d), dtype=like.dtype, device=_device(like)), self.r)
            E = top_basis(xp.zeros((0, self.d_v), dtype=like.dtype, device=_device(like)), self.r_v)
        return B, E

    def _open(self, like, reason: str) -> None:
        xp = array_namespace(like)
        B, E = self._snapshot(like)
        z = lambda m: xp.zeros((self.L, m), dtype=like.dtype, device=_device(like))
        self._active = dict(B=B, E=E, C=z(self.r), D=z(self.r_v), start=self.t, n=0, reason=reason)

    def _close(self) -> None:
        a = self._active
        self.closed.append(Chunk(a["B"], a["E"], a["C"][:a["n"], :], a["D"][:a["n"], :], a["start"],
                                 a["start"] + a["n"], a["reason"]))
        self._active = None

    def step(self, k, v) -> "AdaptiveSubspaceAttention":
        """Steps 1-4 of Subspace-FD-draft Sec. 5 for one token (one host read on a GPU: the checks and the residuals)."""
        check_array(k, "k", ndim=1, last_dim=self.d, finite=False)
        check_array(v, "v", ndim=1, last_dim=self.d_v, finite=False)
        xp = namespace(k, v, names="k and v")
        return self._advance(xp, xp.reshape(k, (1, self.d)), xp.reshape(v, (1, self.d_v)), ("k", "v"))

    def extend(self, K, V) -> "AdaptiveSubspaceAttention":
        """step() for every row; the residuals of several tokens come to the host with one read (see _advance)."""
        check_array(K, "K", ndim=2, last_dim=self.d, finite=False)
        check_array(V, "V", ndim=2, last_dim=self.d_v, finite=False)
        if K.shape[0] != V.shape[0]:
            raise InputError(f"K and V must have the same number of rows, got {K.shape[0]} and {V.shape[0]}")
        xp = namespace(K, V, names="K and V")
        return self._advance(xp, K, V, ("K", "V")) if K.shape[0] else self

    def _advance(self, xp, K, V, names) -> "AdaptiveSubspaceAttention":
        """Steps 1-4 for the rows of K, V, with as few host reads as the trigger rule allows.

        Whether a token closes the chunk (step 2) is a host decision (it takes an SVD of the sketches), so the
        residuals must reach the host; but until a trigger the bases do not change, so the residuals of a window of
        tokens are computed against them (the same operations as one token at a time), their coefficients are written
        speculatively after the chunk's last row, and one read brings every residual of the window (and, at the first
        read, the input checks) to the host. Tokens before the first trigger are committed, the trigger is handled as
        in the one-token loop, and the window restarts at one token after a trigger and doubles up to 64 without one.
        With tau_k = tau_v = inf only the token that meets the length cap L needs its residuals. Off a GPU (numpy,
        CPU tensors) host reads are free and the window stays at one token (WINDOWED forces windows, for tests)."""
        if self._active is not None:
            namespace(K, self._active["C"], names="the tokens and the cache")      # one backend and device
        pending = [xp.all(xp.isfinite(K)), xp.all(xp.isfinite(V)), xp.max(xp.abs(K)), xp.max(xp.abs(V))]
        every_token = math.isfinite(self.tau_k) or math.isfinite(self.tau_v)
        n, i = K.shape[0], 0
        while i < n:
            a = self._active
            if a is None:                                                      # the first token opens chunk 0
                if pending:
                    pending = self._verify(xp, K, V, names, host_floats(xp, *pending))
                self._open(K[i, :], "start")
                self.triggers.append((self.t, "start", math.nan, math.nan))
                self._commit(K, V, i, i + 1)
                i += 1
                continue
            room = self.L - a["n"]                                              # tokens before the cap L
            w = min(self._window if (self.WINDOWED or is_gpu_array(K)) else 1, n - i, room + 1)
            res, at = [], {}
            for off in range(w):
                k, v = K[i + off, :], V[i + off, :]
                if every_token or off == room:
                    at[off] = len(res)
                    res += [xp.linalg.vector_norm(k - xp.matmul(xp.matmul(a["B"], k), a["B"])),      # step 1
                            xp.linalg.vector_norm(v - xp.matmul(xp.matmul(a["E"], v), a["E"]))]
                if off < room:                                                  # step 3, speculatively
                    a["C"][a["n"] + off, :] = xp.matmul(a["B"], k)
                    a["D"][a["n"] + off, :] = xp.matmul(a["E"], v)
            vals = host_floats(xp, *pending, *res) if pending or res else []  # the window's one host read
            if pending:
                pending = self._verify(xp, K, V, names, vals[:4])
                vals = vals[4:]
            trigger = None
            for off in range(w):                                                # step 2: the first trigger
                res_k, res_v = (vals[at[off]], vals[at[off] + 1]) if off in at else (math.nan, math.nan)
                reason = ("tau_k" if res_k > self.tau_k else "tau_v" if res_v > self.tau_v
                          else "L" if off == room else "")
                if reason:
                    trigger = (off, reason, res_k, res_v)
                    break
            done = w if trigger is None else trigger[0]
            a["n"] += done                                                      # commit the tokens before it
            self._push_sketches(K[i:i + done, :], V[i:i + done, :])
            self.t += done
            i += done
            if trigger is None:
                self._window = min(2 * self._window, 64)
                continue
            _, reason, res_k, res_v = trigger
            self._close()
            self._open(K[i, :], reason)
            self.triggers.append((self.t, reason, res_k, res_v))
            self._commit(K, V, i, i + 1)
            i += 1
            self._window = 1
        if pending:
            self._verify(xp, K, V, names, host_floats(xp, *pending))
        return self

    def _verify(self, xp, K, V, names, vals) -> list:
        """The input checks (finite; squared norms within range, as the FD sketches require), before any state
        changes: the speculative writes of _advance lie past the chunk's last row."""
        finite_k, finite_v, amax_k, amax_v = vals
        for name, ok in zip(names, (finite_k, finite_v)):
            if not ok:
                raise InputError(f"{name} contains NaN or Inf")
        check_row_scale(amax_k, self.d, K.dtype, xp)
        check_row_scale(amax_v, self.d_v, V.dtype, xp)
        return []

    def _commit(self, K, V, lo: int, hi: int) -> None:
        """Steps 3-4 for rows lo..hi-1 of K, V in the active chunk."""
        xp, a = array_namespace(K), self._active
        for i in range(lo, hi):
            a["C"][a["n"], :] = xp.matmul(a["B"], K[i, :])                      # step 3
            a["D"][a["n"], :] = xp.matmul(a["E"], V[i, :])
            a["n"] += 1
        self._push_sketches(K[lo:hi, :], V[lo:hi, :])
        self.t += hi - lo

    def _push_sketches(self, K, V) -> None:
        """Step 4: the same sketches as one row at a time (FD shrinks when its buffer fills, whatever the block)."""
        if K.shape[0]:
            self.fd_k._push(K)
            self.fd_v._push(V)

    @property
    def chunks(self) -> list[Chunk]:
        out = list(self.closed)
        if self._active is not None and self._active["n"]:
            a = self._active
            out.append(Chunk(a["B"], a["E"], a["C"][:a["n"], :], a["D"][:a["n"], :], a["start"], a["start"] + a["n"],
                             a["reason"]))
        return out

    def attend(self, q, mask=None):
        check_array(q, "q", ndim=(1, 2), last_dim=self.d)
        if not self.t:
            raise InputError("empty cache: no tokens to attend to")
        namespace(q, self.chunks[0].C, names="q and the cache")
        return aggregate(q, self.chunks, self.gamma, self.d, mask)

    def logits(self, q):
        check_array(q, "q", ndim=(1, 2), last_dim=self.d)
        if not self.t:
            raise InputError("empty cache: no tokens")
        xp = array_namespace(q)
        return xp.concat([_chunk_logits(q, ch, self.gamma, self.d) for ch in self.chunks], axis=-1)

    def memory_floats(self) -> dict:
        """Floats held (Subspace-FD-draft Sec. 5): coefficients T (r + r_v), bases J (r d + r_v d_v), sketches 2 ell (d + d_v)."""
        J = len(self.chunks)
        return dict(coefficients=self.t * (self.r + self.r_v), bases=J * (self.r * self.d + self.r_v * self.d_v),
                    sketches=2 * self.fd_k.ell * self.d + 2 * self.fd_v.ell * self.d_v, chunks=J)
