"""One-pass blockwise softmax across chunks with distinct bases (Subspace-FD-draft Sec. 6; claim SUB.blockwise).

The draft's aggregator, for chunks j = 1..J with logits l_j (L_j,), value coefficients D_j (L_j, r_v) and
value basis E_j (r_v, d) (or plain values V_j (L_j, s) when there is no basis)::

    m = -inf, Z = 0, N = 0
    for j: m_j = max(l_j)
           if m_j > m: Z <- Z exp(m - m_j); N <- N exp(m - m_j); m <- m_j
           w_j = exp(l_j - m); Z <- Z + sum(w_j); N <- N + (w_j^T D_j) E_j
    return N / Z

Read literally (:func:`blockwise_softmax_literal`) this breaks on masks: if every chunk so far is fully
masked (l = -inf), m stays -inf and w_j = exp(-inf - (-inf)) = NaN; an empty chunk has no max. The
implementation here (:class:`OnlineSoftmax`) is the same recurrence written branch-free, with one guard:
the reference point is max(m, m_j) when finite and 0 otherwise (all weights so far are then exactly 0),
and empty chunks are skipped. For finite logits it performs the same operations as the draft, so
``exp`` only ever sees arguments <= 0: no overflow, and no NaN for any logits in [-inf, +inf).

Logits may be batched: (L,) or (..., L) with a shared (L, s) value block per chunk.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import numpy as np
from array_api_compat import device as _device

from kvbounds.algorithms.arrays import array_namespace

from .attention import mul_pow2, pow2_exponent
from .validation import InputError, check_array, check_same_dtype, namespace

__all__ = ["OnlineSoftmax", "blockwise_softmax", "softmax_concat", "blockwise_softmax_literal"]


def _check_logits(logits, xp, name: str) -> None:
    check_array(logits, name, ndim=tuple(range(1, 8)), finite=False)
    if bool(xp.any(xp.isnan(logits))) or bool(xp.any(logits == xp.inf)):
        raise InputError(f"{name} contains NaN or +inf (a masked token is -inf; nothing else may be non-finite)")


def _check_chunk(j: int, logits, values, basis=None, mask=None):
    """Checks of chunk j (logits, values[, basis[, mask]]); returns the namespace."""
    parts = [x for x in (logits, values, basis, mask) if x is not None]
    for name, x in zip(("logits", "values", "basis", "mask"), (logits, values, basis, mask)):
        if x is not None and not hasattr(x, "shape"):
            raise InputError(f"{name} of chunk {j} must be an array, got {type(x).__name__}")
    xp = namespace(*parts, names=f"the arrays of chunk {j}")
    _check_logits(logits, xp, f"logits of chunk {j}")
    check_array(values, f"values of chunk {j}", ndim=2)
    L = logits.shape[-1]
    if values.shape[0] != L:
        raise InputError(f"chunk {j}: {L} logits but {values.shape[0]} value rows")
    check_same_dtype((f"logits of chunk {j}", logits), (f"values of chunk {j}", values))
    if basis is not None:
        check_array(basis, f"basis of chunk {j}", ndim=2)
        if basis.shape[0] != values.shape[1]:
            raise InputError(f"chunk {j}: basis has {basis.shape[0]} rows, coefficients {values.shape[1]}")
    if mask is not None:
        if not xp.isdtype(mask.dtype, "bool") or mask.ndim < 1 or mask.shape[-1] != L \
                or mask.ndim > logits.ndim or tuple(mask.shape) != tuple(logits.shape[logits.ndim - mask.ndim:]):
            raise InputError(f"mask of chunk {j} must be a boolean array of shape {tuple(logits.shape)} (or its "
                             f"trailing dimensions), got {getattr(mask, 'dtype', None)} {tuple(mask.shape)}")
    return xp


def _chunk_list(chunks) -> list:
    try:
        return list(chunks)
    except TypeError:
        raise InputError(f"chunks must be an iterable of (logits, values[, basis[, mask]]) tuples, "
                         f"got {type(chunks).__name__}") from None


def _chunk_parts(j: int, ch):
    if not isinstance(ch, (tuple, list)) or not 2 <= len(ch) <= 4:
        raise InputError(f"chunk {j} must be a tuple (logits, values[, basis[, mask]]), got {type(ch).__name__}")
    return tuple(ch) + (None,) * (4 - len(ch))


class OnlineSoftmax:
    """The running state (m, Z, N) of Subspace-FD-draft Sec. 6; ``add`` one chunk at a time, ``result`` = N / Z."""

    def __init__(self):
        self.m = self.Z = self.N = self.e = None
        self.chunks = 0

    def add(self, logits, values, basis=None, mask=None) -> "OnlineSoftmax":
        """logits (..., L); values (L, s) (coefficients D_j when ``basis`` E_j (s, d) is given);
        mask: boolean (..., L) or (L,), False = masked (the same as a logit of -inf)."""
        xp = _check_chunk(self.chunks, logits, values, basis, mask)
        L = logits.shape[-1]
        if self.m is not None and (array_namespace(self.m) is not xp or self.m.dtype != logits.dtype
                                   or _device(self.m) != _device(logits)):
            raise InputError(f"chunk {self.chunks}: backend/dtype/device {logits.dtype} on {_device(logits)} differs "
                             f"from the earlier chunks' {self.m.dtype} on {_device(self.m)}")
        if mask is not None:
            logits = xp.where(mask, logits, xp.asarray(-xp.inf, dtype=logits.dtype, device=_device(logits)))
        out_dim = basis.shape[1] if basis is not None else values.shape[1]
        if self.m is None:
            batch = tuple(logits.shape[:-1])
            self.m = xp.full(batch, -xp.inf, dtype=logits.dtype, device=_device(logits))
            self.Z = xp.zeros(batch, dtype=logits.dtype, device=_device(logits))
            self.N = xp.zeros(batch + (out_dim,), dtype=logits.dtype, device=_device(logits))
        elif tuple(logits.shape[:-1]) != tuple(self.m.shape) or self.N.shape[-1] != out_dim:
            raise InputError(f"chunk {self.chunks}: batch shape {tuple(logits.shape[:-1])} / output dim {out_dim} "
                             f"differ from the earlier chunks' {tuple(self.m.shape)} / {self.N.shape[-1]}")
        self.chunks += 1
        if L == 0:                                          # an empty chunk contributes nothing
            return self
        m_new = xp.maximum(self.m, xp.max(logits, axis=-1))
        ref = xp.where(xp.isfinite(m_new), m_new, xp.zeros_like(m_new))
        with np.errstate(over="ignore"):                    # l - ref may round to -inf (|l - ref| > 1.8e308): exp -> 0
            alpha = xp.exp(self.m - ref)                    # = exp(m - m_j) when m_j > m, else 1
            w = xp.exp(logits - ref[..., None])             # arguments <= 0
        # values (and basis) are scaled by powers of two so that w^T D (and its product with E) cannot overflow
        # (issue 24: values near float max gave inf); N is kept in units of 2^self.e, the largest scale so far
        vals, e = _unit_scaled(xp, values)
        contrib = xp.matmul(w, vals)
        if basis is not None:
            B, e_b = _unit_scaled(xp, basis)
            contrib = xp.matmul(contrib, B)                 # (w_j^T D_j) E_j
            e += e_b
        if self.e is None:
            self.e = e
        elif e > self.e:
            self.N = mul_pow2(self.N, self.e - e)
            self.e = e
        else:
            contrib = mul_pow2(contrib, e - self.e)
        self.Z = self.Z * alpha + xp.sum(w, axis=-1)
        self.N = self.N * alpha[..., None] + contrib
        self.m = m_new
        return self

    def result(self):
        if self.m is None:
            raise InputError("no chunks: the softmax over zero tokens is undefined")
        xp = array_namespace(self.Z)
        if bool(xp.any(self.Z == 0)):
            raise InputError("every token is masked (or there are none) for some query: softmax undefined")
        return _scaled_back(xp, self.N / self.Z[..., None], self.e or 0)


def blockwise_softmax(chunks: Iterable[Sequence[Any]]):
    """Aggregate chunks (logits, values[, basis[, mask]]) in one pass; returns softmax(concat logits)^T values."""
    acc = OnlineSoftmax()
    for j, ch in enumerate(_chunk_list(chunks)):
        acc.add(*_chunk_parts(j, ch))
    return acc.result()


def softmax_concat(chunks: Iterable[Sequence[Any]]):
    """Reference: the plain two-pass softmax over the concatenated logits (values reconstructed per chunk)."""
    logits, vals = [], []
    xp = None
    for j, ch in enumerate(_chunk_list(chunks)):
        l, v, b, m = _chunk_parts(j, ch)
        xp_j = _check_chunk(j, l, v, b, m)
        vj, e = _unit_scaled(xp_j, v)                         # in units of 2^e (no overflow in D E)
        if b is not None:
            B, e_b = _unit_scaled(xp_j, b)
            vj, e = xp_j.matmul(vj, B), e + e_b
        if xp is not None and (xp_j is not xp or logits[0].dtype != l.dtype or vj.shape[1] != vals[0][0].shape[1]
                               or tuple(l.shape[:-1]) != tuple(logits[0].shape[:-1])):
            raise InputError(f"chunk {j}: backend, dtype, batch shape or output dimension differs from chunk 0's")
        xp = xp_j
        if m is not None:
            l = xp.where(m, l, xp.asarray(-xp.inf, dtype=l.dtype, device=_device(l)))
        logits.append(l)
        vals.append((vj, e))
    if xp is None:
        raise InputError("no chunks")
    l = xp.concat(logits, axis=-1)
    top = max(e for _, e in vals)
    V = xp.concat([mul_pow2(v, e - top) for v, e in vals], axis=0)
    mx = xp.max(l, axis=-1, keepdims=True)
    if bool(xp.any(~xp.isfinite(mx))):
        raise InputError("every token is masked for some query: softmax undefined")
    with np.errstate(over="ignore"):
        w = xp.exp(l - mx)
    return _scaled_back(xp, xp.matmul(w / xp.sum(w, axis=-1, keepdims=True), V), top)


def _unit_scaled(xp, x):
    """(x 2^-e, e) with max|x 2^-e| < 1: exact (powers of two), so products of such factors cannot overflow."""
    e = pow2_exponent(xp, x)
    return mul_pow2(x, -e), e


def _scaled_back(xp, out, e: int):
    """out 2^e, refused when the softmax average itself lies beyond the float range."""
    out = mul_pow2(out, e)
    if not bool(xp.all(xp.isfinite(out))):
        raise InputError(f"the softmax average exceeds the range of {out.dtype} (values times basis overflow)")
    return out


def blockwise_softmax_literal(chunks: Iterable[Sequence[Any]]) -> np.ndarray:
    """The draft's pseudocode of Sec. 6, transcribed line by line (numpy, one query), for the SUB.blockwise
    check: NaN when the first non-empty chunks are fully masked, an error on an empty chunk."""
    m, Z, N = -math.inf, 0.0, None
    with np.errstate(invalid="ignore", over="ignore"):
        for ch in chunks:
            l, D = np.asarray(ch[0], float), np.asarray(ch[1], float)
            E = np.asarray(ch[2], float) if len(ch) > 2 and ch[2] is not None else None
            if len(ch) > 3 and ch[3] is not None:
                l = np.where(ch[3], l, -np.inf)
            mj = float(np.max(l))                          # raises ValueError on an empty chunk
            if N is None:
                N = np.zeros(E.shape[1] if E is not None else D.shape[1])
            if mj > m:
                Z, N, m = Z * math.exp(m - mj), N * math.exp(m - mj), mj
            w = np.exp(l - m)
            Z += float(np.sum(w))
            N = N + ((w @ D) @ E if E is not None else w @ D)
    return N / Z
