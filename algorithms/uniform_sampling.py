"""Independent uniform sampling at equal memory: the baseline of claim BKV.vs-uniform (001 Sec 4.1, App. B.1).

001 B.1 compares BalanceKV with "sampling a 2^-T fraction of key and value embeddings ... uniformly at
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

from kvbounds.gpu.backend import array_namespace, like

from .validation import InputError, check_array


def _check_rng(rng) -> None:
    if not isinstance(rng, np.random.Generator):
        raise InputError(f"rng must be a numpy Generator (np.random.default_rng(seed)), got {type(rng).__name__}")


def _check_int(value, name: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def uniform_select(n: int, m: int, rng: np.random.Generator, *, batch: tuple[int, ...] = ()) -> np.ndarray:
    """Indices of ``m`` of ``n`` tokens drawn uniformly without replacement, sorted ascending.

    Returns an int64 numpy array of shape ``batch + (m,)``: one independent draw per batch entry
    (e.g. per head). Every m-subset is equally likely (the first m of a uniform random permutation)."""
    n = _check_int(n, "n", minimum=0)
    m = _check_int(m, "m", minimum=0)
    if m > n:
        raise InputError(f"cannot sample m = {m} of n = {n} tokens without replacement")
    _check_rng(rng)
    batch = tuple(_check_int(b, "batch entry", minimum=1) for b in batch)
    if m == n:
        return np.broadcast_to(np.arange(n, dtype=np.int64), batch + (n,)).copy()
    if not batch:
        return np.sort(rng.choice(n, size=m, replace=False)).astype(np.int64)
    perm = np.argsort(rng.random(batch + (n,)), axis=-1)[..., :m]
    return np.sort(perm, axis=-1).astype(np.int64)


def _check_qkv(q, K, V):
    check_array(K, "K", ndim=tuple(range(2, 8)), min_rows=1)
    check_array(V, "V", ndim=K.ndim)
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
    the sample, so E[num] = sum_i e^{logit_i - shift} v_i exactly (what the unbiasedness test averages)."""
    _check_qkv(q, K, V)
    xp = array_namespace(q, K, V)
    n, d = K.shape[-2], K.shape[-1]
    idx_np = np.asarray(idx)
    if idx_np.ndim < 1 or idx_np.dtype.kind not in "iu" or idx_np.size == 0 or idx_np.min() < 0 or idx_np.max() >= n:
        raise InputError(f"idx must be a non-empty integer array of indices in [0, {n}), got {idx_np!r}")
    m = idx_np.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qq, had_axis = _queries(q, K)
    shift = xp.max(xp.matmul(qq, xp.matrix_transpose(K)) * scale, axis=-1, keepdims=True)   # (..., nq, 1)
    Ks, Vs = _gather_rows(K, idx_np), _gather_rows(V, idx_np)
    w = xp.exp(xp.matmul(qq, xp.matrix_transpose(Ks)) * scale - shift) * (n / m)             # (..., nq, m)
    num, den, shift = xp.matmul(w, Vs), xp.sum(w, axis=-1), shift[..., 0]
    if not had_axis:
        num, den, shift = num[..., 0, :], den[..., 0], shift[..., 0]
    return shift, num, den


def uniform_estimate(q, K, V, m: int, rng: np.random.Generator, *, scale: float | None = None):
    """Attention estimated from m tokens sampled uniformly without replacement, weight n/m on each.

    ``q`` (..., d) or (..., nq, d), ``K`` (..., n, d), ``V`` (..., n, s); independent draws per leading
    (head) entry. Returns (..., s) or (..., nq, s), same backend as the inputs. The baseline of claim
    BKV.vs-uniform (001 Sec 4.1)."""
    _check_qkv(q, K, V)
    n = K.shape[-2]
    m = _check_int(m, "m", minimum=1)
    idx = uniform_select(n, m, rng, batch=tuple(K.shape[:-2]))
    _, num, den = uniform_parts(q, K, V, idx, scale=scale)
    return num / den[..., None]
