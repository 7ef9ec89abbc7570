"""One-pass blockwise softmax across chunks with distinct bases (seed 004 Sec. 6; claim SUB.blockwise).

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

from kvbounds.gpu.backend import array_namespace

from .validation import InputError, check_array


def _check_logits(logits, xp, name: str) -> None:
    if not hasattr(logits, "shape") or not xp.isdtype(logits.dtype, "real floating"):
        raise InputError(f"{name} must be a real floating array")
    if logits.ndim < 1:
        raise InputError(f"{name} must have at least one dimension (the chunk's tokens), got shape {tuple(logits.shape)}")
    if bool(xp.any(xp.isnan(logits))) or bool(xp.any(logits == xp.inf)):
        raise InputError(f"{name} contains NaN or +inf (a masked token is -inf; nothing else may be non-finite)")


class OnlineSoftmax:
    """The running state (m, Z, N) of 004 Sec. 6; ``add`` one chunk at a time, ``result`` = N / Z."""

    def __init__(self):
        self.m = self.Z = self.N = None
        self.chunks = 0

    def add(self, logits, values, basis=None, mask=None) -> "OnlineSoftmax":
        """logits (..., L); values (L, s) (coefficients D_j when ``basis`` E_j (s, d) is given);
        mask: boolean (..., L) or (L,), False = masked (the same as a logit of -inf)."""
        xp = array_namespace(logits, values)
        _check_logits(logits, xp, f"logits of chunk {self.chunks}")
        check_array(values, f"values of chunk {self.chunks}", ndim=2)
        L = logits.shape[-1]
        if values.shape[0] != L:
            raise InputError(f"chunk {self.chunks}: {L} logits but {values.shape[0]} value rows")
        if basis is not None:
            check_array(basis, f"basis of chunk {self.chunks}", ndim=2)
            if basis.shape[0] != values.shape[1]:
                raise InputError(f"chunk {self.chunks}: basis has {basis.shape[0]} rows, coefficients {values.shape[1]}")
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
        contrib = xp.matmul(w, values)
        if basis is not None:
            contrib = xp.matmul(contrib, basis)             # (w_j^T D_j) E_j
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
        return self.N / self.Z[..., None]


def blockwise_softmax(chunks: Iterable[Sequence[Any]]):
    """Aggregate chunks (logits, values[, basis[, mask]]) in one pass; returns softmax(concat logits)^T values."""
    acc = OnlineSoftmax()
    for ch in chunks:
        acc.add(*ch)
    return acc.result()


def softmax_concat(chunks: Iterable[Sequence[Any]]):
    """Reference: the plain two-pass softmax over the concatenated logits (values reconstructed per chunk)."""
    logits, vals = [], []
    xp = None
    for ch in chunks:
        l, v = ch[0], ch[1]
        xp = array_namespace(l, v)
        b = ch[2] if len(ch) > 2 else None
        m = ch[3] if len(ch) > 3 else None
        if m is not None:
            l = xp.where(m, l, xp.asarray(-xp.inf, dtype=l.dtype, device=_device(l)))
        logits.append(l)
        vals.append(xp.matmul(v, b) if b is not None else v)
    if xp is None:
        raise InputError("no chunks")
    l = xp.concat(logits, axis=-1)
    V = xp.concat(vals, axis=0)
    mx = xp.max(l, axis=-1, keepdims=True)
    if bool(xp.any(~xp.isfinite(mx))):
        raise InputError("every token is masked for some query: softmax undefined")
    with np.errstate(over="ignore"):
        w = xp.exp(l - mx)
    return xp.matmul(w / xp.sum(w, axis=-1, keepdims=True), V)


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
