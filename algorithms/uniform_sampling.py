"""Independent uniform sampling at equal memory: the baseline of claim BKV.vs-uniform (BalanceKV-NeurIPS Sec 4.1, App. B.1).

BalanceKV-NeurIPS B.1 compares BalanceKV with "sampling a 2^-T fraction of key and value embeddings ... uniformly at
random". With m of the n tokens drawn without replacement (S, |S| = m), every token is kept with
probability m/n, so weighting each kept token by n/m gives unbiased estimates of both

    numerator    sum_i e^{<k_i, q>/sqrt d} v_i   ~   (n/m) sum_{i in S} e^{<k_i, q>/sqrt d} v_i
    denominator  sum_i e^{<k_i, q>/sqrt d}       ~   (n/m) sum_{i in S} e^{<k_i, q>/sqrt d}

and the attention estimate is their ratio (the weight n/m cancels: softmax over the sampled keys).
The ratio itself is not unbiased; its two parts are (see :func:`uniform_parts`).

Randomness is a numpy ``Generator``; indices are numpy int64 arrays, moved to the backend where used.
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms.arrays import array_namespace, like, to_numpy

from .attention import shifted_logits
from .validation import InputError, check_array, check_int, check_rng, check_scale, namespace

__all__ = ["uniform_select", "uniform_parts", "uniform_estimate"]



def uniform_select(n: int, m: int, rng: np.random.Generator, *, batch: tuple[int, ...] = ()) -> np.ndarray:
    """Indices of ``m`` of ``n`` tokens drawn uniformly without replacement, sorted ascending.

    Returns an int64 numpy array of shape ``batch + (m,)``: one independent draw per batch entry
    (e.g. per head). Every m-subset is equally likely (the first m of a uniform random permutation)."""
    n = check_int(n, "n", minimum=0)
    m = check_int(m, "m", minimum=0)
    if m > n:
        raise InputError(f"cannot sample m = {m} of n = {n} tokens without replacement")
    check_rng(rng)
    if not isinstance(batch, tuple):
        raise InputError(f"batch must be a tuple of integers, got {batch!r}")
    batch = tuple(check_int(b, "batch entry", minimum=1) for b in batch)
    if n > 2**40 or math.prod(batch + (n,)) > 2**31:
        raise InputError(f"n = {n} with batch {batch} is too large to sample here")
    if m == n:
        return np.broadcast_to(np.arange(n, dtype=np.int64), batch + (n,)).copy()
    if not batch:
        return np.sort(rng.choice(n, size=m, replace=False)).astype(np.int64)
    perm = np.argsort(rng.random(batch + (n,)), axis=-1)[..., :m]
    return np.sort(perm, axis=-1).astype(np.int64)


def _check_qkv(q, K, V):
    check_array(K, "K", ndim=tuple(range(2, 8)), min_rows=1)
    check_array(V, "V", ndim=K.ndim)
    namespace(q, K, V, names="q, K and V")
    if tuple(V.shape[:-1]) != tuple(K.shape[:-1]):
        raise InputError(f"K and V must agree in all but the last dimension, got {tuple(K.shape)} and {tuple(V.shape)}")
    check_array(q, "q", ndim=(K.ndim - 1, K.ndim), last_dim=K.shape[-1])
    lead = tuple(K.shape[:-2])
    qlead = tuple(q.shape[:len(lead)])
    if qlead != lead:
        raise InputError(f"q's leading dimensions {tuple(q.shape)} must match K's {tuple(K.shape)}")


def _gather_rows(X, idx_np):
    """X (..., n, e), idx (..., m) numpy ints (same leading dims, or 1-D shared) -> (..., m, e)."""
    xp = array_namespace(X)
    lead = tuple(X.shape[:-2])
    n, e = X.shape[-2], X.shape[-1]
    idx_np = np.broadcast_to(idx_np, lead + (idx_np.shape[-1],))
    B = int(np.prod(lead, dtype=np.int64)) if lead else 1
    flat = (idx_np.reshape(B, -1) + (np.arange(B, dtype=np.int64) * n)[:, None]).reshape(-1)
    out = xp.take(xp.reshape(X, (B * n, e)), like(flat, X), axis=0)
    return xp.reshape(out, lead + (idx_np.shape[-1], e))


def _queries(q, K):
    """(q as (..., nq, d), whether q had a query axis)."""
    xp = array_namespace(q)
    if q.ndim == K.ndim:
        return q, True
    return xp.expand_dims(q, axis=-2), False


def uniform_parts(q, K, V, idx, *, scale: float | None = None):
    """Unbiased numerator and denominator estimates from the sampled indices ``idx`` (numpy, (..., m)).

    Returns ``(shift, num, den)`` with numerator ~ e^shift * num (..., [nq,] s) and denominator
    ~ e^shift * den (..., [nq]). The shift is the max logit over *all* n keys: it does not depend on
    the sample, so E[num] = sum_i e^{logit_i - shift} v_i exactly (what the unbiasedness test averages).
    Sampled keys far below the shift underflow: num and den are then 0 (exact to e^shift's precision) and
    their ratio undefined; :func:`uniform_estimate` shifts by the sampled keys' maximum instead."""
    _check_qkv(q, K, V)
    xp = array_namespace(q, K, V)
    n, d = K.shape[-2], K.shape[-1]
    if not hasattr(idx, "shape") or isinstance(idx, (list, tuple)):
        raise InputError(f"idx must be an integer array, got {type(idx).__name__}")
    idx_np = to_numpy(idx)
    lead = tuple(K.shape[:-2])
    if idx_np.ndim < 1 or idx_np.dtype.kind not in "iu" or idx_np.size == 0 or idx_np.min() < 0 or idx_np.max() >= n:
        raise InputError(f"idx must be a non-empty integer array of indices in [0, {n}), got {idx_np!r}")
    if idx_np.ndim > 1 and tuple(idx_np.shape[:-1]) != lead:
        raise InputError(f"idx must have shape (m,) or {lead + ('m',)}, got {idx_np.shape}")
    m = idx_np.shape[-1]
    scale = check_scale(scale, d)
    qq, had_axis = _queries(q, K)
    with np.errstate(over="ignore", invalid="ignore"):
        shift = xp.max(xp.matmul(qq, xp.matrix_transpose(K)) * scale, axis=-1, keepdims=True)   # (..., nq, 1)
    if not bool(xp.all(xp.isfinite(shift))):
        raise InputError("the largest logit overflows the float range: the parts e^shift * num are not "
                         "representable (uniform_estimate, which needs only their ratio, is)")
    Ks, Vs = _gather_rows(K, idx_np), _gather_rows(V, idx_np)
    # logit - shift <= 0 in exact arithmetic; recomputed on the sampled rows its rounding (~eps |logit|) can
    # make it positive, and at |logit| ~ 1e60 that is e^{1e44} = Inf: clipped at 0
    z = xp.matmul(qq, xp.matrix_transpose(Ks)) * scale - shift
    w = xp.exp(xp.where(z > 0, xp.zeros_like(z), z)) * (n / m)                               # (..., nq, m)
    num, den, shift = xp.matmul(w, Vs), xp.sum(w, axis=-1), shift[..., 0]
    if not had_axis:
        num, den, shift = num[..., 0, :], den[..., 0], shift[..., 0]
    return shift, num, den


def uniform_estimate(q, K, V, m: int, rng: np.random.Generator, *, scale: float | None = None):
    """Attention estimated from m tokens sampled uniformly without replacement, weight n/m on each.

    ``q`` (..., d) or (..., nq, d), ``K`` (..., n, d), ``V`` (..., n, s); independent draws per leading
    (head) entry. Returns (..., s) or (..., nq, s), same backend as the inputs. The baseline of claim
    BKV.vs-uniform (BalanceKV-NeurIPS Sec 4.1)."""
    _check_qkv(q, K, V)
    xp = array_namespace(q, K, V)
    n = K.shape[-2]
    m = check_int(m, "m", minimum=1)
    scale = check_scale(scale, K.shape[-1])
    idx = uniform_select(n, m, rng, batch=tuple(K.shape[:-2]))
    # the weight n/m cancels: a softmax over the sampled keys, shifted by *their* maximum (no 0/0)
    Ks, Vs = _gather_rows(K, idx), _gather_rows(V, idx)
    qq, had_axis = _queries(q, K)
    w = xp.exp(shifted_logits(qq, Ks, scale))
    out = xp.matmul(w / xp.sum(w, axis=-1, keepdims=True), Vs)
    return out if had_axis else out[..., 0, :]
