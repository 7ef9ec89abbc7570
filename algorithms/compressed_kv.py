"""The compressed-cache contract shared by every KV-cache compression method of the end-to-end harness
(claims BKV.e2e, SG.e2e, SUB.lowrank): :class:`CompressedKV`, the floats it holds (:func:`memory_floats`) and
a token selection in its form (:func:`gather_selection`).

The contract (every method, selection or not):
:meth:`kvbounds.algorithms.token_selection.TokenSelector.compress` returns a :class:`CompressedKV`
``(K', V', log_w_num, log_w_den)`` with

    Attn_hat(q) = sum_i exp(l_i + a_i) v'_i / sum_i exp(l_i + b_i),   l_i = <q, k'_i> scale,

a = log_w_num, b = log_w_den (-inf drops a token from one side; both -inf is padding). Selection methods
gather K, V at their indices and set a = b = their log-weights. Methods that are not selections
(:mod:`kvbounds.algorithms.cache_compressors`: BalanceKV's released walk, SubGen's estimator, subspace
projection) build a :class:`CompressedKV` directly. :func:`memory_floats` counts the floats it holds.

Formerly part of :mod:`kvbounds.algorithms.token_selection`, which re-exports every name.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from kvbounds.algorithms.arrays import array_namespace, like, to_numpy, device as _dev

from .validation import InputError, check_array, check_indices, check_int, check_scale, namespace

__all__ = ["check_kv", "CompressedKV", "weight_floats", "memory_floats", "on_backend_of", "gather_selection",
           "take_rows"]


def check_kv(K, V):
    check_array(K, "K", ndim=tuple(range(2, 8)), min_rows=1)
    check_array(V, "V", ndim=K.ndim)
    if tuple(V.shape[:-1]) != tuple(K.shape[:-1]):
        raise InputError(f"K and V must agree in all but the last dimension, got {tuple(K.shape)} and {tuple(V.shape)}")
    namespace(K, V, names="K and V")


@dataclasses.dataclass
class CompressedKV:
    """One layer's compressed cache per KV head: keys/values (..., m, d), log-weights (..., m), all four arrays of
    one backend on one device (numpy on the harness's host path; the model's torch tensors on its device path).
    ``extra_floats``: floats held besides these arrays (e.g. a subspace basis); ``rank``: the stored
    coordinates per key/value of the ``projected`` tokens (per head) that live in a subspace (the arrays hold
    them back in d dimensions for attention)."""
    keys: Any
    values: Any
    log_w_num: Any
    log_w_den: Any
    extra_floats: int = 0
    rank: int | None = None
    projected: int = 0

    def __post_init__(self):
        for name, arr in (("keys", self.keys), ("values", self.values), ("log_w_num", self.log_w_num),
                          ("log_w_den", self.log_w_den)):
            if not (hasattr(arr, "shape") and hasattr(arr, "dtype") and hasattr(arr, "ndim")) \
                    or isinstance(arr, np.generic):
                raise InputError(f"CompressedKV holds arrays (numpy, torch or cupy); {name} is {type(arr).__name__}")
        xp = namespace(self.keys, self.values, self.log_w_num, self.log_w_den,
                       names="CompressedKV's keys, values, log_w_num and log_w_den")
        check_array(self.keys, "keys", ndim=tuple(range(2, 8)))
        check_array(self.values, "values", ndim=self.keys.ndim)
        for name in ("log_w_num", "log_w_den"):      # -inf is a flag (that side does not use the token)
            lw = check_array(getattr(self, name), name, ndim=self.keys.ndim - 1, finite=False)
            if not bool(xp.all(xp.isfinite(lw) | (lw == -math.inf))):
                raise InputError(f"{name} contains NaN or +Inf (only -inf, 'not used on this side', is allowed)")
        check_int(self.extra_floats, "extra_floats")
        check_int(self.projected, "projected")
        if self.rank is not None:
            check_int(self.rank, "rank", minimum=1, maximum=self.keys.shape[-1])
        if self.keys.shape[:-1] != self.values.shape[:-1] or self.log_w_num.shape != self.keys.shape[:-1] \
                or self.log_w_den.shape != self.keys.shape[:-1]:
            raise InputError(f"CompressedKV shapes disagree: K {tuple(self.keys.shape)}, V {tuple(self.values.shape)}, "
                             f"a {tuple(self.log_w_num.shape)}, b {tuple(self.log_w_den.shape)}")

    def head_groups(self, groups: int) -> list["CompressedKV"]:
        """The cache's first axis (heads) cut into ``groups`` equal consecutive parts, each a CompressedKV of views
        (e.g. the layers of a (layers x heads) stack, :mod:`kvbounds.e2e`), ``extra_floats`` shared
        equally. Views of this validated cache: built without checking them again (30 layers' checks
        cost ~10% of a stacked compression)."""
        H = self.keys.shape[0] if self.keys.ndim > 2 else 0
        groups = check_int(groups, "groups", minimum=1)
        if self.keys.ndim < 3 or H % groups or self.extra_floats % groups:
            raise InputError(f"a cache of shape {tuple(self.keys.shape)} with {self.extra_floats} extra floats does "
                             f"not split into {groups} equal groups of heads")
        h = H // groups
        out = []
        for g in range(groups):
            part = object.__new__(CompressedKV)          # the fields set directly: no __post_init__ checks
            part.keys, part.values, part.log_w_num, part.log_w_den = (
                x[g * h:(g + 1) * h] for x in (self.keys, self.values, self.log_w_num, self.log_w_den))
            part.extra_floats, part.rank, part.projected = self.extra_floats // groups, self.rank, self.projected
            out.append(part)
        return out

    def estimate(self, q, *, scale: float | None = None) -> np.ndarray:
        """Attn_hat(q) for queries q (..., L, d) (or (d,)) of any backend (no causal mask: every stored token is
        visible), numpy float64. Computed in the log domain: log|num| - log den, so a numerator whose largest logit
        exceeds the denominator's by more than 709 (SubGen's representatives vs. its samples at key norms ~1e3) is
        still exact; a numerator with no token gives 0. Refused (InputError): a q that is not a finite float array of
        width d or whose leading shape does not broadcast with the heads', a bad scale, a head whose denominator
        has no token (log_w_den all -inf, or no tokens at all: Attn_hat undefined), and an estimate beyond float64's
        range."""
        d = self.keys.shape[-1]
        check_array(q, "q", ndim=tuple(range(1, 8)), last_dim=d)
        scale = check_scale(scale, d)
        q = np.asarray(to_numpy(q), dtype=np.float64)
        keys, values = to_numpy(self.keys), to_numpy(self.values)
        a = np.asarray(to_numpy(self.log_w_num), np.float64)
        b = np.asarray(to_numpy(self.log_w_den), np.float64)
        if q.ndim >= 2:
            try:
                np.broadcast_shapes(q.shape[:-2], keys.shape[:-2])
            except ValueError:
                raise InputError(f"q's leading shape {q.shape[:-2]} does not broadcast with the cache's heads "
                                 f"{tuple(keys.shape[:-2])} (q is (..., L, d))") from None
        if b.shape[-1] == 0 or not bool(np.all(np.any(b > -math.inf, axis=-1))):
            raise InputError("log_w_den is -inf for every token of a head (or the cache is empty): the denominator "
                             "has no token, so Attn_hat is undefined")
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            lg = q @ np.swapaxes(keys.astype(np.float64), -1, -2) * scale
            if not bool(np.all(np.isfinite(lg))):
                raise InputError("the logits <q, k> scale overflow float64")
            ln, ld = lg + a[..., None, :], lg + b[..., None, :]
            mn, md = ln.max(-1, keepdims=True), ld.max(-1, keepdims=True)
            empty = mn == -math.inf                                   # no numerator token: the sum is 0
            num = np.exp(ln - np.where(empty, 0.0, mn)) @ values.astype(np.float64)
            log_den = np.log(np.exp(ld - md).sum(-1, keepdims=True)) + md
            mag = np.abs(num)
            log_out = np.log(mag) + np.where(empty, 0.0, mn) - log_den       # log|Attn_hat|, -inf where it is 0
            out = np.sign(num) * np.exp(log_out)
        if not bool(np.all(np.isfinite(out))):
            raise InputError(f"the estimate exceeds float64's range (log|Attn_hat| up to {float(np.nanmax(log_out)):.4g}): "
                             f"the numerator's logits exceed the denominator's by more than the float range")
        return out


def weight_floats(x: np.ndarray) -> int:
    """Floats to store one head's weights on one side: none, one if they are all equal, else one per token."""
    return 0 if x.size == 0 else (1 if np.all(x == x[0]) else int(x.size))


def memory_floats(c: CompressedKV) -> int:
    """Floats a compressed layer holds: a key for every token used on either side, a value for every token in
    the numerator (each at its own width), and the log-weights: none for exact tokens (a = b = 0: the first/last windows, positional),
    per head and side one float when the weights are constant (uniform sampling, BalanceKV's 2^T), else one per
    token; a side of -inf is a flag, not a float; a = b is stored once. Subspace methods store ``rank``
    coordinates per projected key/value plus ``extra_floats`` (their bases). Reads the log-weights on the host
    (a copy of a device cache's weights: accounting, not part of compressing)."""
    if not isinstance(c, CompressedKV):
        raise InputError(f"memory_floats takes a CompressedKV, got {type(c).__name__}")
    a, b = to_numpy(c.log_w_num), to_numpy(c.log_w_den)
    fa, fb = np.isfinite(a), np.isfinite(b)
    used = fa | fb
    width, vwidth = c.keys.shape[-1], c.values.shape[-1]
    floats = int(used.sum()) * width + int(fa.sum()) * vwidth
    if c.rank is not None:     # projected tokens: rank coordinates for the key and the value instead of d
        heads = int(np.prod(a.shape[:-1], dtype=np.int64))
        floats -= heads * c.projected * ((width - c.rank) + (vwidth - min(c.rank, vwidth)))
    rows = int(np.prod(a.shape[:-1], dtype=np.int64))     # (not -1: an empty cache has no row length to infer)
    A, B = a.reshape(rows, a.shape[-1]), b.reshape(rows, b.shape[-1])
    FA, FB, U = fa.reshape(A.shape), fb.reshape(B.shape), used.reshape(A.shape)
    for h in range(A.shape[0]):
        w = U[h] & ~((A[h] == 0) & (B[h] == 0))
        if not w.any():
            continue
        if np.array_equal(A[h][w], B[h][w]):
            floats += weight_floats(A[h][w])
        else:
            floats += weight_floats(A[h][w & FA[h]]) + weight_floats(B[h][w & FB[h]])
    return floats + int(c.extra_floats)


def on_backend_of(x, ref):
    """``x`` (an array or a number) as an array of ``ref``'s backend and device: numpy moves with ``like`` (host to
    device), an array of another backend comes back with ``to_numpy`` when ``ref`` is numpy."""
    if not hasattr(x, "shape"):
        x = np.asarray(x)
    if isinstance(ref, np.ndarray):
        return np.asarray(to_numpy(x))
    if isinstance(x, np.ndarray):
        return like(x, ref)
    xp = array_namespace(ref)
    return x if _dev(x) == _dev(ref) else xp.asarray(x, device=_dev(ref))


def gather_selection(K, V, indices, log_weights) -> CompressedKV:
    """The contract's form of a selection ``(indices, log_weights)``: a = b = the log-weights, float32, on K's
    backend and device (the host path gathers numpy, the device path torch tensors where they are).

    K (..., n, d), V (..., n, s); indices (..., m) (or (m,) shared by the heads) integers in [0, n);
    log_weights finite, broadcastable to the indices' shape."""
    check_kv(K, V)
    xp = array_namespace(K, V)
    n = K.shape[-2]
    lead = tuple(K.shape[:-2])
    if not hasattr(indices, "shape"):
        raise InputError(f"indices must be an integer array, got {type(indices).__name__}")
    idx = on_backend_of(check_indices(indices, "indices", lead=lead, n=n, allow_empty=True), K)
    idx = xp.broadcast_to(xp.astype(idx, xp.int64), lead + tuple(idx.shape[-1:]))
    if not hasattr(log_weights, "shape") and not isinstance(log_weights, (int, float, np.number)) \
            or isinstance(log_weights, (bool, np.bool_)):
        raise InputError(f"log_weights must be a float array or number, got {type(log_weights).__name__}")
    lw_in = on_backend_of(log_weights, K)
    if not xp.isdtype(lw_in.dtype, ("integral", "real floating")) or not bool(xp.all(xp.isfinite(lw_in))):
        raise InputError(f"log_weights must be finite real numbers (dtype {lw_in.dtype})")
    try:
        lw = xp.astype(xp.broadcast_to(lw_in, tuple(idx.shape)), xp.float32, copy=True)
    except (ValueError, RuntimeError) as e:
        raise InputError(f"log_weights of shape {tuple(lw_in.shape)} do not broadcast to the indices' "
                         f"{tuple(idx.shape)}") from e
    if not isinstance(lw, np.ndarray):
        lw = xp.asarray(lw, copy=True)                   # a broadcast view made contiguous
    return CompressedKV(take_rows(xp, K, idx), take_rows(xp, V, idx), lw, xp.asarray(lw, copy=True))


def take_rows(xp, X, idx):
    """X[..., idx[..., j], :]: rows of X (..., n, e) at idx (...,  m). numpy: one flat ``take`` (take_along_axis
    broadcasts the index over e, ~20x slower at the e2e harness's shapes); other backends: take_along_axis."""
    if type(X) is not np.ndarray:
        return xp.take_along_axis(X, idx[..., None], axis=-2)
    n, e = X.shape[-2], X.shape[-1]
    B = math.prod(X.shape[:-2])
    flat = (idx.reshape(B, -1) + np.arange(B, dtype=np.int64)[:, None] * n).reshape(-1)
    return X.reshape(B * n, e).take(flat, axis=0).reshape(tuple(idx.shape) + (e,))
