"""The walk's discrepancy as held-out queries see it: what a blockwise compression's attention error is made of.

Keeping one sign class of a block with weight 2 (BalanceKV-NeurIPS Alg. 2, App. B) changes the block's contribution
to query q's unnormalised attention sums by exactly the signed sums

    numerator    D_num(q) = sum_i eta_i w_i e^{<k_i, q> scale} v_i,
    denominator  D_den(q) = sum_i eta_i w_i e^{<k_i, q> scale}

(up to the sign of the kept class), with the model's own kernel: the keys as cached (no centring, no walk
temperature), scale 1/sqrt(d). Independent random signs have E ||D_num(q)||^2 = sum_i w_i^2 e^{2 <k_i, q> scale}
||v_i||^2 exactly, for every q (and the same without v for D_den), so the module reports, per block,

    query_num = mean over held-out queries q of ||D_num(q)||^2 / sum_i ||w_i e^{<k_i, q> scale} v_i||^2,
    query_den = mean over held-out queries q of  D_den(q)^2    / sum_i (w_i e^{<k_i, q> scale})^2,

both 1 in expectation for random signs (one draw of random signs shows the spread), below 1 where the signs balance
what those queries see. Each query counts alike (a ratio per query, as the relative attention error weighs them);
a query whose expected sum is 0 (every v_i = 0 for the numerator) is left out of that mean (none: 1).

This is the Gram yardstick eta^T G eta / tr G (:mod:`kvbounds.algorithms.walk_diagnostics`) with the kernel's
integral over all of feature space replaced by the held-out queries: the yardstick's diagonal holds the
self-similarities e^{temp ||k_i||^2 scale}, which a real query never reaches, and can read 1 where the queries see
the signs balance (or below 1 where they do not).

Centring the keys by any vector mu multiplies every term of query q by the same e^{-<mu, q> scale}: the ratios are
unchanged (a test checks it), so "with centring" speaks of the signs a walk draws on centred keys, not of another
measure.
"""
from __future__ import annotations

import numpy as np

from kvbounds.algorithms.arrays import to_numpy

from .validation import InputError, check_array, check_scale


def _host(x, name, ndim):
    check_array(x, name, ndim=ndim)
    return np.asarray(to_numpy(x), dtype=np.float64)


def query_terms(K, Q, *, scale: float | None = None, weights=None) -> np.ndarray:
    """a_i(q) = w_i e^{<k_i, q> scale - m_q}, (..., m, n), of keys K (..., n, d) and queries Q (..., m, d) (leading
    shapes broadcast), each query's largest logit m_q divided out (every ratio of this module is unchanged by it).
    ``weights`` (..., n) >= 0: w_i (None: 1), divided by their largest (a common factor). Numpy float64."""
    ranks = tuple(range(2, 9))
    Kn, Qn = _host(K, "K", ranks), _host(Q, "Q", ranks)
    if Kn.shape[-1] != Qn.shape[-1]:
        raise InputError(f"K (..., n, d) and Q (..., m, d) must agree in d, got {Kn.shape} and {Qn.shape}")
    scale = check_scale(scale, Kn.shape[-1])
    with np.errstate(over="ignore", invalid="ignore"):
        logits = np.matmul(Qn, np.swapaxes(Kn, -1, -2)) * scale              # (..., m, n)
    if not np.all(np.isfinite(logits)):
        raise InputError("the logits <k, q> * scale overflow float64")
    A = np.exp(logits - logits.max(axis=-1, keepdims=True))
    if weights is not None:
        W = _host(weights, "weights", tuple(range(1, 8)))
        if np.any(W < 0):
            raise InputError("weights must be >= 0")
        top = W.max() if W.size else 0.0
        A = A * (W / top if top > 0 else W)[..., None, :]          # one common factor: every ratio is unchanged
    return A


def _ratio(signed: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Mean over the query axis (-1) of signed / expected, queries with expected == 0 left out (none: 1)."""
    ok = expected > 0
    r = np.where(ok, signed / np.where(ok, expected, 1.0), 0.0)
    count = ok.sum(axis=-1)
    return np.where(count > 0, r.sum(axis=-1) / np.maximum(count, 1), 1.0)


def query_discrepancy(signs, K, V, Q, *, scale: float | None = None, weights=None) -> dict:
    """``{"query_num": (...,), "query_den": (...,)}`` (module docstring) for signs (..., n) of +-1 on keys K
    (..., n, d), values V (..., n, dv), held-out queries Q (..., m, d), leading shapes broadcasting (e.g. K and V
    (heads, blocks, n, .) and Q (heads, 1, m, d): every block against its head's queries). Numpy float64."""
    S = _host(signs, "signs", tuple(range(1, 8)))
    if not np.all(np.abs(S) == 1.0):
        raise InputError("signs must be +1 or -1")
    Vn = _host(V, "V", tuple(range(2, 9)))
    top = float(np.abs(Vn).max()) if Vn.size else 0.0
    Vn = Vn / top if top > 0 else Vn                                          # one common factor, as the weights'
    A = query_terms(K, Q, scale=scale, weights=weights)                       # (..., m, n)
    if S.shape[-1] != A.shape[-1] or Vn.shape[-2] != A.shape[-1]:
        raise InputError(f"signs {S.shape} and V {Vn.shape} must have one entry per key ({A.shape[-1]})")
    try:
        np.broadcast_shapes(S.shape[:-1], A.shape[:-2], Vn.shape[:-2])
    except ValueError:
        raise InputError(f"the leading shapes of signs {S.shape}, of K and Q (terms {A.shape}) and of V {Vn.shape} "
                         "must broadcast") from None
    SA = S[..., None, :] * A
    num = np.matmul(SA, Vn)                                                   # (..., m, dv): D_num(q) / e^{m_q}
    den = SA.sum(-1)
    vv = (Vn * Vn).sum(-1)[..., None, :]                                      # (..., 1, n), entries <= dv
    return dict(query_num=_ratio((num * num).sum(-1), (A * A * vv).sum(-1)),
                query_den=_ratio(den * den, (A * A).sum(-1)))


def held_out_queries(Q, group: int, window: int) -> np.ndarray:
    """The last ``window`` queries of every query head of Q (H, n, d), stacked per KV head (the ``group`` query
    heads that read it, GQA): (H // group, group * window, d), numpy float64."""
    Qn = _host(Q, "Q", 3)
    H, n, d = Qn.shape
    if not isinstance(group, int) or isinstance(group, bool) or group < 1 or H % group:
        raise InputError(f"group must be an integer >= 1 dividing the {H} query heads, got {group!r}")
    if not isinstance(window, int) or isinstance(window, bool) or not 1 <= window <= n:
        raise InputError(f"window must be an integer in [1, {n}], got {window!r}")
    return np.ascontiguousarray(Qn[:, n - window:].reshape(H // group, group * window, d))


__all__ = ["query_terms", "query_discrepancy", "held_out_queries"]
