"""Exact attention ``Attn(q, K, V) = softmax(K q / sqrt d)^T V`` (BalanceKV-NeurIPS eq. (1)), the reference for every estimator.

:func:`shifted_logits` is the overflow-free logit computation every softmax in the package uses: for finite
inputs of any magnitude it returns ``logits - max(logits)`` (<= 0), so huge norms give the exact hard argmax
instead of ``inf - inf = NaN``.
"""
from __future__ import annotations

import math

import numpy as np
from array_api_compat import device as _device

from .validation import InputError, check_array, check_real, check_scale, namespace

__all__ = ["mul_pow2", "pow2_exponent", "shifted_logits", "softmax_weights", "exact_attention", "attention_weights",
           "causal_attention"]

_CHUNK = 100   # multiply by 2^e in steps of at most 2^100: representable in float32 and float64


def mul_pow2(x, e: int):
    """x * 2^e without forming 2^e (which overflows float32 past e = 127, float64 past 1023)."""
    while e:
        step = max(-_CHUNK, min(_CHUNK, e))
        x = x * math.ldexp(1.0, step)
        e -= step
    return x


def pow2_exponent(xp, x) -> int:
    """e with max|x| < 2^e (0 for an all-zero or empty array)."""
    if not math.prod(x.shape):
        return 0
    amax = float(xp.max(xp.abs(x)))
    return math.frexp(amax)[1] if amax > 0 else 0


def shifted_logits(q, K, scale: float, extra=None):
    """``logits - max(logits, axis=-1)`` for ``logits = scale * q K^T (+ extra)``, never NaN for finite input.

    ``q`` (..., d) or (..., m, d), ``K`` (..., n, d) (matmul broadcasting), ``extra`` broadcastable to the logits
    (log-weights). A helper: its callers validate q, K, scale and extra (finite). The direct computation is used when its row maxima are finite (the usual case, one pass
    more than a plain softmax only over the maxima). Otherwise ``q`` and ``K`` are rescaled by powers of two
    (exact), the logits formed in units of 2^(e_q + e_k) * scale, shifted by their maximum, and scaled back:
    differences that overflow become -inf, i.e. a weight of exactly 0 (the hard argmax)."""
    xp = namespace(q, K)
    with np.errstate(over="ignore", invalid="ignore"):
        logits = xp.matmul(q, xp.matrix_transpose(K)) * scale
        if extra is not None:
            logits = logits + extra
        mx = xp.max(logits, axis=-1, keepdims=True)
        if bool(xp.all(xp.isfinite(mx))):
            return logits - mx
    if scale == 0:                                            # inf * 0 = NaN: the logits are just ``extra``
        base = xp.zeros_like(logits) if extra is None else xp.zeros_like(logits) + extra
        return base - xp.max(base, axis=-1, keepdims=True)
    eq, ek = pow2_exponent(xp, q), pow2_exponent(xp, K)
    ms, es = math.frexp(scale)
    E = eq + ek + es                                          # logits = ls * 2^E (+ extra)
    ls = xp.matmul(mul_pow2(q, -eq), xp.matrix_transpose(mul_pow2(K, -ek))) * ms   # |ls| <= d
    if extra is not None:
        ls = ls + mul_pow2(extra, -E)
    with np.errstate(over="ignore"):
        return mul_pow2(ls - xp.max(ls, axis=-1, keepdims=True), E)


def softmax_weights(q, K, scale: float, extra=None):
    """Normalized softmax weights from :func:`shifted_logits` (sum 1 along the last axis)."""
    xp = _check_qkv(q, K, qndim=tuple(range(1, 8)))
    scale = check_real(scale, "scale", minimum=0.0)
    w = xp.exp(shifted_logits(q, K, scale, extra))
    return w / xp.sum(w, axis=-1, keepdims=True)


def _check_qkv(q, K, V=None, *, qname: str = "q", qndim=(1, 2)):
    check_array(K, "K", ndim=tuple(range(2, 8)) if isinstance(qndim, tuple) and len(qndim) > 2 else 2, min_rows=1)
    check_array(q, qname, ndim=qndim, last_dim=K.shape[-1])
    if V is not None:
        check_array(V, "V", ndim=2)
        if V.shape[0] != K.shape[0]:
            raise InputError(f"K and V must have the same number of rows, got {K.shape[0]} and {V.shape[0]}")
        return namespace(q, K, V, names=f"{qname}, K and V")
    return namespace(q, K, names=f"{qname} and K")


def exact_attention(q, K, V, *, scale: float | None = None):
    """q of shape (d,) or (m, d), K (n, d), V (n, s) -> (s,) or (m, s).

    ``scale`` defaults to 1/sqrt(d) (BalanceKV's convention); SubGen's convention is ``scale=1``.
    Computed with a max-shift (:func:`shifted_logits`), so it never overflows for finite inputs: norms whose
    logits exceed the float range give the hard argmax."""
    xp = _check_qkv(q, K, V)
    w = xp.exp(shifted_logits(q, K, check_scale(scale, K.shape[1])))
    return xp.matmul(w / xp.sum(w, axis=-1, keepdims=True), V)


def attention_weights(q, K, *, scale: float | None = None):
    """softmax(K q * scale): (n,) or (m, n)."""
    xp = _check_qkv(q, K)
    w = xp.exp(shifted_logits(q, K, check_scale(scale, K.shape[1])))
    return w / xp.sum(w, axis=-1, keepdims=True)


def causal_attention(Q, K, V, *, scale: float | None = None):
    """Row j attends to keys 0..j: the per-step exact answers of a whole stream, (n, s)."""
    xp = _check_qkv(Q, K, V, qname="Q", qndim=2)
    scale = check_scale(scale, K.shape[1])
    n = K.shape[0]
    dev = _device(K)
    mask = xp.arange(n, device=dev)[None, :] > xp.arange(Q.shape[0], device=dev)[:, None]
    neg = xp.where(mask, xp.asarray(-xp.inf, dtype=K.dtype, device=dev), xp.asarray(0.0, dtype=K.dtype, device=dev))
    w = xp.exp(shifted_logits(Q, K, scale, neg))
    return xp.matmul(w / xp.sum(w, axis=-1, keepdims=True), V)
