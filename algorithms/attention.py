"""Exact attention ``Attn(q, K, V) = softmax(K q / sqrt d)^T V`` (001 eq. (1)), the reference for every estimator."""
from __future__ import annotations

import math

from array_api_compat import device as _device

from kvbounds.gpu.backend import array_namespace

from .validation import InputError, check_array


def exact_attention(q, K, V, *, scale: float | None = None):
    """q of shape (d,) or (m, d), K (n, d), V (n, s) -> (s,) or (m, s).

    ``scale`` defaults to 1/sqrt(d) (BalanceKV's convention); SubGen's convention is ``scale=1``.
    Computed with a max-shift, so it never overflows for finite inputs."""
    check_array(K, "K", ndim=2, min_rows=1)
    d = K.shape[1]
    check_array(q, "q", ndim=(1, 2), last_dim=d)
    check_array(V, "V", ndim=2)
    if V.shape[0] != K.shape[0]:
        raise InputError(f"K and V must have the same number of rows, got {K.shape[0]} and {V.shape[0]}")
    xp = array_namespace(q, K, V)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    logits = xp.matmul(q, xp.matrix_transpose(K)) * scale   # (n,) or (m, n)
    w = xp.exp(logits - xp.max(logits, axis=-1, keepdims=True))
    w = w / xp.sum(w, axis=-1, keepdims=True)
    return xp.matmul(w, V)


def attention_weights(q, K, *, scale: float | None = None):
    """softmax(K q * scale): (n,) or (m, n)."""
    check_array(K, "K", ndim=2, min_rows=1)
    check_array(q, "q", ndim=(1, 2), last_dim=K.shape[1])
    xp = array_namespace(q, K)
    scale = 1.0 / math.sqrt(K.shape[1]) if scale is None else scale
    logits = xp.matmul(q, xp.matrix_transpose(K)) * scale
    w = xp.exp(logits - xp.max(logits, axis=-1, keepdims=True))
    return w / xp.sum(w, axis=-1, keepdims=True)


def causal_attention(Q, K, V, *, scale: float | None = None):
    """Row j attends to keys 0..j: the per-step exact answers of a whole stream, (n, s)."""
    check_array(K, "K", ndim=2, min_rows=1)
    check_array(Q, "Q", ndim=2, last_dim=K.shape[1])
    check_array(V, "V", ndim=2)
    xp = array_namespace(Q, K, V)
    n = K.shape[0]
    scale = 1.0 / math.sqrt(K.shape[1]) if scale is None else scale
    logits = xp.matmul(Q, xp.matrix_transpose(K)) * scale
    dev = _device(K)
    mask = xp.arange(n, device=dev)[None, :] > xp.arange(Q.shape[0], device=dev)[:, None]
    logits = xp.where(mask, -xp.inf, logits)
    w = xp.exp(logits - xp.max(logits, axis=-1, keepdims=True))
    return xp.matmul(w / xp.sum(w, axis=-1, keepdims=True), V)
