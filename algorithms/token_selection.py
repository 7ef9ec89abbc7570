"""One interface for every token-selection method: which cached tokens are kept, with what weights.

A selection is ``(indices, log_weights)``, both (..., m) on K's backend: indices int64 sorted ascending,
log-weights the log of each kept token's multiplicity in the estimator

    Attn_hat(q) = sum_i w_i e^{<k_i,q> scale} v_i / sum_i w_i e^{<k_i,q> scale}     (i over kept tokens)

- the form of :func:`kvbounds.algorithms.blockwise_balance_kv.compress_cache`, so every method is evaluated by
the same :func:`kvbounds.algorithms.blockwise_balance_kv.weighted_attention` (re-exported as :func:`estimate`) on
the same trace at the same budget. Leading dimensions (heads) are independent.

Methods (``SELECTORS``):

* ``streaming_llm``  StreamingLLM / Attention Sink (Xiao et al. 2023; SubGen/ClusterGen "Sink"): the first ``sink``
  tokens and the most recent budget - sink; weights 1.
* ``h2o``  H2O (Zhang et al. 2023; SubGen/ClusterGen baseline): greedy streaming eviction by accumulated attention.
  Token j enters the cache; q_j attends over the cache; every cached token's score grows by its
  attention weight; while the cache exceeds the budget, the token with the smallest accumulated score
  outside the ``recent`` most recent tokens is evicted. Needs the queries; weights 1.
* ``uniform``  the first ``sink`` and last ``window`` tokens exactly, the rest of the budget drawn
  uniformly without replacement from the middle, weight n_mid / kept (unbiased numerator/denominator).
* ``kcenter``  the practical SubGen/ClusterGen variant (ClusterGen Sec. 4.1): the last ``window`` tokens plus
  budget - window greedy k-center centers of the keys before them; weights 1 (what the papers keep)
  or, with ``weights="cluster_size"``, each center weighted by the number of tokens it covers.
* ``balancekv``  adapter to blockwise BalanceKV (BalanceKV-NeurIPS App. B.1, :func:`compress_cache`): sink and window
  exact, the middle halved T times; T is the smallest level count whose cache fits the budget (so the
  selection can be smaller than the budget: only sink + window + n_mid // 2^T sizes are reachable).

The compressed-cache contract (issue 14; every method, selection or not): :meth:`TokenSelector.compress`
returns a :class:`CompressedKV` ``(K', V', log_w_num, log_w_den)`` with

    Attn_hat(q) = sum_i exp(l_i + a_i) v'_i / sum_i exp(l_i + b_i),   l_i = <q, k'_i> scale,

a = log_w_num, b = log_w_den (-inf drops a token from one side; both -inf is padding). Selection methods
gather K, V at their indices and set a = b = their log-weights. Methods that are not selections
(:mod:`kvbounds.algorithms.compressor_adapters`: BalanceKV's released walk, SubGen's estimator, subspace
projection) build a :class:`CompressedKV` directly. :func:`memory_floats` counts the floats it holds.
"""
from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any

import numpy as np

from kvbounds.gpu.backend import array_namespace, like, to_numpy, device as _dev

from .blockwise_balance_kv import compress_cache, weighted_attention
from .kcenter import recent_plus_centers
from .uniform_sampling import _check_int, _check_rng, uniform_select
from .attention import shifted_logits
from .validation import InputError, check_array, check_choice, check_indices, check_int, check_scale, namespace


def estimate(q, K, V, indices, log_weights, *, scale: float | None = None):
    """The weighted estimator over a selection (``weighted_attention``; scale defaults to 1/sqrt(d),
    pass ``scale=1.0`` for SubGen's convention)."""
    return weighted_attention(q, K, V, indices, log_weights, scale=scale)


def _check_kv(K, V):
    check_array(K, "K", ndim=tuple(range(2, 8)), min_rows=1)
    check_array(V, "V", ndim=K.ndim)
    if tuple(V.shape[:-1]) != tuple(K.shape[:-1]):
        raise InputError(f"K and V must agree in all but the last dimension, got {tuple(K.shape)} and {tuple(V.shape)}")
    namespace(K, V, names="K and V")


def _check_fields(obj, ints: tuple = (), choices: dict | None = None) -> None:
    """Dataclass fields: non-negative integers (None allowed where the default is None) and string choices."""
    for name in ints:
        value = getattr(obj, name)
        if value is not None:
            check_int(value, name, minimum=0)
    for name, allowed in (choices or {}).items():
        check_choice(getattr(obj, name), name, allowed)



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


def _weight_floats(x: np.ndarray) -> int:
    """Floats to store one head's weights on one side: none, one if they are all equal, else one per token."""
    return 0 if x.size == 0 else (1 if np.all(x == x[0]) else int(x.size))


def memory_floats(c: CompressedKV) -> int:
    """Floats a compressed layer holds: a key for every token used on either side, a value for every token in
    the numerator, and the log-weights: none for exact tokens (a = b = 0: the first/last windows, positional),
    per head and side one float when the weights are constant (uniform sampling, BalanceKV's 2^T), else one per
    token; a side of -inf is a flag, not a float; a = b is stored once. Subspace methods store ``rank``
    coordinates per projected key/value plus ``extra_floats`` (their bases). Reads the log-weights on the host
    (a copy of a device cache's weights: accounting, not part of compressing)."""
    if not isinstance(c, CompressedKV):
        raise InputError(f"memory_floats takes a CompressedKV, got {type(c).__name__}")
    a, b = to_numpy(c.log_w_num), to_numpy(c.log_w_den)
    fa, fb = np.isfinite(a), np.isfinite(b)
    used = fa | fb
    width = c.keys.shape[-1]
    floats = int(used.sum()) * width + int(fa.sum()) * width
    if c.rank is not None:     # projected tokens: rank coordinates for the key and the value instead of d
        heads = int(np.prod(a.shape[:-1], dtype=np.int64))
        floats -= 2 * heads * c.projected * (width - c.rank)
    A, B = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    FA, FB, U = fa.reshape(A.shape), fb.reshape(B.shape), used.reshape(A.shape)
    for h in range(A.shape[0]):
        w = U[h] & ~((A[h] == 0) & (B[h] == 0))
        if not w.any():
            continue
        if np.array_equal(A[h][w], B[h][w]):
            floats += _weight_floats(A[h][w])
        else:
            floats += _weight_floats(A[h][w & FA[h]]) + _weight_floats(B[h][w & FB[h]])
    return floats + int(c.extra_floats)


def _on_backend_of(x, ref):
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
    _check_kv(K, V)
    xp = array_namespace(K, V)
    n = K.shape[-2]
    lead = tuple(K.shape[:-2])
    if not hasattr(indices, "shape"):
        raise InputError(f"indices must be an integer array, got {type(indices).__name__}")
    idx = _on_backend_of(check_indices(indices, "indices", lead=lead, n=n, allow_empty=True), K)
    idx = xp.broadcast_to(xp.astype(idx, xp.int64), lead + tuple(idx.shape[-1:]))
    if not hasattr(log_weights, "shape") and not isinstance(log_weights, (int, float, np.number)) \
            or isinstance(log_weights, (bool, np.bool_)):
        raise InputError(f"log_weights must be a float array or number, got {type(log_weights).__name__}")
    lw_in = _on_backend_of(log_weights, K)
    if not xp.isdtype(lw_in.dtype, ("integral", "real floating")) or not bool(xp.all(xp.isfinite(lw_in))):
        raise InputError(f"log_weights must be finite real numbers (dtype {lw_in.dtype})")
    try:
        lw = xp.astype(xp.broadcast_to(lw_in, tuple(idx.shape)), xp.float32, copy=True)
    except (ValueError, RuntimeError) as e:
        raise InputError(f"log_weights of shape {tuple(lw_in.shape)} do not broadcast to the indices' "
                         f"{tuple(idx.shape)}") from e
    if not isinstance(lw, np.ndarray):
        lw = xp.asarray(lw, copy=True)                   # a broadcast view made contiguous
    return CompressedKV(_take_rows(xp, K, idx), _take_rows(xp, V, idx), lw, xp.asarray(lw, copy=True))


def _take_rows(xp, X, idx):
    """X[..., idx[..., j], :]: rows of X (..., n, e) at idx (...,  m). numpy: one flat ``take`` (take_along_axis
    broadcasts the index over e, ~20x slower at the e2e harness's shapes); other backends: take_along_axis."""
    if type(X) is not np.ndarray:
        return xp.take_along_axis(X, idx[..., None], axis=-2)
    n, e = X.shape[-2], X.shape[-1]
    B = math.prod(X.shape[:-2])
    flat = (idx.reshape(B, -1) + np.arange(B, dtype=np.int64)[:, None] * n).reshape(-1)
    return X.reshape(B * n, e).take(flat, axis=0).reshape(tuple(idx.shape) + (e,))


class TokenSelector(abc.ABC):
    """``select(K, V, budget=, rng=, Q=None) -> (indices, log_weights)``; ``compress(...) -> CompressedKV``
    (the same selection in the contract's form); see the module docstring."""
    name: str = ""
    needs_queries: bool = False

    def compress(self, K, V, *, budget: int, rng: np.random.Generator | None = None, Q=None) -> CompressedKV:
        idx, lw = self.select(K, V, budget=budget, rng=rng, Q=Q)
        return gather_selection(K, V, idx, lw)

    def select(self, K, V, *, budget: int, rng: np.random.Generator | None = None, Q=None):
        _check_kv(K, V)
        n = K.shape[-2]
        budget = _check_int(budget, "budget", minimum=1)
        if self.needs_queries:
            if Q is None:
                raise InputError(f"{self.name} needs the queries Q (..., n, d)")
            check_array(Q, "Q", ndim=K.ndim)
            if tuple(Q.shape) != tuple(K.shape):
                raise InputError(f"Q must have K's shape {tuple(K.shape)}, got {tuple(Q.shape)}")
            namespace(K, Q, names="K and Q")
        if budget >= n:
            xp = array_namespace(K)
            lead = tuple(K.shape[:-2])
            idx = xp.broadcast_to(xp.arange(n, dtype=xp.int64, device=_dev(K)), lead + (n,))
            return xp.asarray(idx, copy=True), xp.zeros(lead + (n,), dtype=K.dtype, device=_dev(K))
        return self._select(K, V, budget, rng, Q)

    @abc.abstractmethod
    def _select(self, K, V, budget, rng, Q): ...


def _range(xp, lo, hi, lead, dev):
    return xp.broadcast_to(xp.arange(lo, hi, dtype=xp.int64, device=dev), lead + (hi - lo,))


@dataclasses.dataclass
class StreamingLLM(TokenSelector):
    sink: int = 4
    name = "streaming_llm"

    def __post_init__(self):
        _check_fields(self, ("sink",))

    def _select(self, K, V, budget, rng, Q):
        xp, n, lead, dev = array_namespace(K), K.shape[-2], tuple(K.shape[:-2]), _dev(K)
        sink = min(_check_int(self.sink, "sink"), budget)
        idx = xp.concat([_range(xp, 0, sink, lead, dev), _range(xp, n - (budget - sink), n, lead, dev)], axis=-1)
        return idx, xp.zeros(idx.shape, dtype=K.dtype, device=dev)


@dataclasses.dataclass
class H2O(TokenSelector):
    recent: int | None = None       # default: half the budget (H2O's heavy/recent split 50/50)
    scale: float | None = None      # logit scale; default 1/sqrt(d)
    name = "h2o"
    needs_queries = True

    def __post_init__(self):
        _check_fields(self, ("recent",))
        if self.scale is not None:
            check_scale(self.scale, 1)

    def _select(self, K, V, budget, rng, Q):
        xp, n, d, lead, dev = array_namespace(K), K.shape[-2], K.shape[-1], tuple(K.shape[:-2]), _dev(K)
        recent = budget // 2 if self.recent is None else _check_int(self.recent, "recent")
        if recent >= budget:
            raise InputError(f"recent = {recent} leaves no heavy-hitter slot in budget {budget}")
        scale = 1.0 / math.sqrt(d) if self.scale is None else float(self.scale)
        B = int(np.prod(lead, dtype=np.int64)) if lead else 1
        Kf, Qf = xp.reshape(K, (B, n, d)), xp.reshape(Q, (B, n, d))
        # slots 0..budget-1 hold the cache, slot `budget` the incoming token
        cache = xp.zeros((B, budget + 1), dtype=xp.int64, device=dev)   # token index per slot
        ck = xp.zeros((B, budget + 1, d), dtype=K.dtype, device=dev)     # its key
        score = xp.zeros((B, budget + 1), dtype=K.dtype, device=dev)     # accumulated attention
        pos = xp.arange(budget + 1, device=dev)[None, :]
        zeros = xp.zeros((1, budget + 1), dtype=K.dtype, device=dev)
        masked = xp.full((1, budget + 1), -math.inf, dtype=K.dtype, device=dev)
        for j in range(n):
            slot = min(j, budget)
            cache[:, slot], ck[:, slot, :], score[:, slot] = j, Kf[:, j, :], 0.0
            live = pos <= slot
            w = xp.exp(shifted_logits(Qf[:, j, None, :], ck, scale, xp.where(live, zeros, masked)[:, None, :]))[:, 0, :]
            score = score + w / xp.sum(w, axis=-1, keepdims=True)
            if j >= budget:      # evict the lowest score outside the recent window; the newcomer takes its slot
                old = cache <= j - recent
                victim = xp.argmin(xp.where(old, score, math.inf), axis=-1)[:, None]      # (B, 1)
                hit = pos == victim
                cache = xp.where(hit, cache[:, budget:], cache)
                score = xp.where(hit, score[:, budget:], score)
                ck = xp.where(hit[..., None], ck[:, budget:, :], ck)
        keep = xp.reshape(xp.sort(cache[:, :budget], axis=-1), lead + (budget,))
        return keep, xp.zeros(keep.shape, dtype=K.dtype, device=dev)


@dataclasses.dataclass
class Uniform(TokenSelector):
    sink: int = 0
    window: int = 0
    name = "uniform"

    def __post_init__(self):
        _check_fields(self, ("sink", "window"))

    def _select(self, K, V, budget, rng, Q):
        xp, n, lead, dev = array_namespace(K), K.shape[-2], tuple(K.shape[:-2]), _dev(K)
        _check_rng(rng)
        sink, window = _check_int(self.sink, "sink"), _check_int(self.window, "window")
        if sink + window > budget:
            raise InputError(f"sink + window = {sink + window} exceeds the budget {budget}")
        n_mid, m = n - sink - window, budget - sink - window
        mid = like(uniform_select(n_mid, m, rng, batch=lead) + sink, K)
        idx = xp.concat([_range(xp, 0, sink, lead, dev), xp.astype(mid, xp.int64),
                         _range(xp, n - window, n, lead, dev)], axis=-1)
        lw = np.concatenate([np.zeros(sink), np.full(m, math.log(n_mid / m) if m else 0.0), np.zeros(window)])
        return idx, xp.broadcast_to(like(lw, K), idx.shape)


@dataclasses.dataclass
class KCenter(TokenSelector):
    window: int = 0
    weights: str = "none"           # "none" (what SubGen/ClusterGen keep) | "cluster_size"
    # optional kcenter.FarthestFirst of K[..., :n - window, :], shared by calls at several budgets (the same result)
    traversal: Any = dataclasses.field(default=None, repr=False, compare=False)
    name = "kcenter"

    def __post_init__(self):
        _check_fields(self, ("window",), {"weights": ("none", "cluster_size")})

    def _select(self, K, V, budget, rng, Q):
        if self.weights not in ("none", "cluster_size"):
            raise InputError(f"weights must be 'none' or 'cluster_size', got {self.weights!r}")
        window = _check_int(self.window, "window")
        if window >= budget:
            raise InputError(f"window = {window} leaves no center in budget {budget}")
        xp = array_namespace(K)
        idx, sizes = recent_plus_centers(K, window=window, k=budget - window, traversal=self.traversal)
        lw = xp.log(sizes) if self.weights == "cluster_size" else xp.zeros(sizes.shape, dtype=K.dtype, device=_dev(K))
        return idx, lw


@dataclasses.dataclass
class BalanceKV(TokenSelector):
    sink: int = 16
    window: int = 16
    block_size: int = 64
    method: str = "balance"          # compress_cache's "balance" | "uniform"
    name = "balancekv"

    def __post_init__(self):
        _check_fields(self, ("sink", "window", "block_size"), {"method": ("balance", "uniform")})

    def levels_for(self, n: int, budget: int) -> int:
        n_mid = n - self.sink - self.window
        if n_mid <= 0 or self.sink + self.window >= budget:
            raise InputError(f"budget {budget} leaves nothing to compress after sink {self.sink} + window {self.window}")
        T = 0
        while self.sink + self.window + (n_mid >> T) > budget:
            T += 1
        return T

    def _select(self, K, V, budget, rng, Q):
        _check_rng(rng)
        T = self.levels_for(K.shape[-2], budget)
        return compress_cache(K, V, sink=self.sink, window=self.window, levels=T, block_size=self.block_size,
                              rng=rng, method=self.method)


SELECTORS: dict[str, type[TokenSelector]] = {
    "streaming_llm": StreamingLLM, "h2o": H2O, "uniform": Uniform, "kcenter": KCenter, "balancekv": BalanceKV,
}


def make_selector(name: str, **kw) -> TokenSelector:
    if not isinstance(name, str) or name not in SELECTORS:
        raise InputError(f"unknown selector {name!r}; choose one of {', '.join(SELECTORS)}")
    fields = {f.name for f in dataclasses.fields(SELECTORS[name])}
    unknown = sorted(set(kw) - fields)
    if unknown:
        raise InputError(f"selector {name!r} has no option(s) {unknown}; its options are {sorted(fields)}")
    return SELECTORS[name](**kw)


def relative_error(q, K, V, indices, log_weights, *, scale: float | None = None) -> np.ndarray:
    """||Attn_hat(q) - Attn(q)|| / ||Attn(q)|| per query (and head), numpy."""
    from .attention import exact_attention
    est = to_numpy(estimate(q, K, V, indices, log_weights, scale=scale))
    Kn, Vn, qn = to_numpy(K), to_numpy(V), to_numpy(q)
    if Kn.ndim != 2:
        raise InputError("relative_error takes a single head: K (n, d)")
    ex = to_numpy(exact_attention(qn, Kn, Vn, scale=scale))
    den = np.linalg.norm(ex, axis=-1)
    if np.any(den == 0):
        raise InputError("the exact attention output is 0 for some query: its relative error is undefined")
    return np.linalg.norm(est - ex, axis=-1) / den
