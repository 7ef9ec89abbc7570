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

The compressed-cache contract (every method, selection or not): :meth:`TokenSelector.compress`
returns a :class:`kvbounds.algorithms.compressed_kv.CompressedKV` (K', V', log_w_num, log_w_den); a selection
gathers K, V at its indices and sets a = b = its log-weights (:func:`gather_selection`). That contract,
:func:`memory_floats` and :func:`gather_selection` live in :mod:`kvbounds.algorithms.compressed_kv` and are
importable from here as before.
"""
from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any

import numpy as np

from kvbounds.algorithms.arrays import array_namespace, like, to_numpy, device as _dev

from .blockwise_balance_kv import compress_cache, weighted_attention
from .kcenter import recent_plus_centers
from .uniform_sampling import check_rng, uniform_select
from .attention import shifted_logits
from .validation import InputError, check_array, check_choice, check_int, check_scale, namespace

from .compressed_kv import (CompressedKV, check_kv, on_backend_of, take_rows, weight_floats,  # noqa: F401
                            gather_selection, memory_floats)

__all__ = ["estimate", "check_fields", "TokenSelector", "StreamingLLM", "H2O", "Uniform", "KCenter", "BalanceKV",
           "SELECTORS", "make_selector", "relative_error"]


def estimate(q, K, V, indices, log_weights, *, scale: float | None = None):
    """The weighted estimator over a selection (``weighted_attention``; scale defaults to 1/sqrt(d),
    pass ``scale=1.0`` for SubGen's convention)."""
    return weighted_attention(q, K, V, indices, log_weights, scale=scale)


def check_fields(obj, ints: tuple = (), choices: dict | None = None) -> None:
    """Dataclass fields: non-negative integers (None allowed where the default is None) and string choices."""
    defaults = {f.name: f.default for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else {}
    for name in ints:
        value = getattr(obj, name)
        if value is not None or defaults.get(name, dataclasses.MISSING) is not None:
            check_int(value, name, minimum=0)
    for name, allowed in (choices or {}).items():
        check_choice(getattr(obj, name), name, allowed)



class TokenSelector(abc.ABC):
    """``select(K, V, budget=, rng=, Q=None) -> (indices, log_weights)``; ``compress(...) -> CompressedKV``
    (the same selection in the contract's form); see the module docstring."""
    name: str = ""
    needs_queries: bool = False

    def compress(self, K, V, *, budget: int, rng: np.random.Generator | None = None, Q=None) -> CompressedKV:
        idx, lw = self.select(K, V, budget=budget, rng=rng, Q=Q)
        return gather_selection(K, V, idx, lw)

    def select(self, K, V, *, budget: int, rng: np.random.Generator | None = None, Q=None):
        check_kv(K, V)
        n = K.shape[-2]
        budget = check_int(budget, "budget", minimum=1)
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
        check_fields(self, ("sink",))

    def _select(self, K, V, budget, rng, Q):
        xp, n, lead, dev = array_namespace(K), K.shape[-2], tuple(K.shape[:-2]), _dev(K)
        sink = min(check_int(self.sink, "sink"), budget)
        idx = xp.concat([_range(xp, 0, sink, lead, dev), _range(xp, n - (budget - sink), n, lead, dev)], axis=-1)
        return idx, xp.zeros(idx.shape, dtype=K.dtype, device=dev)


@dataclasses.dataclass
class H2O(TokenSelector):
    recent: int | None = None       # default: half the budget (H2O's heavy/recent split 50/50)
    scale: float | None = None      # logit scale; default 1/sqrt(d)
    name = "h2o"
    needs_queries = True

    def __post_init__(self):
        check_fields(self, ("recent",))
        if self.scale is not None:
            check_scale(self.scale, 1)

    def _select(self, K, V, budget, rng, Q):
        xp, n, d, lead, dev = array_namespace(K), K.shape[-2], K.shape[-1], tuple(K.shape[:-2]), _dev(K)
        recent = budget // 2 if self.recent is None else check_int(self.recent, "recent")
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
        check_fields(self, ("sink", "window"))

    def _select(self, K, V, budget, rng, Q):
        xp, n, lead, dev = array_namespace(K), K.shape[-2], tuple(K.shape[:-2]), _dev(K)
        check_rng(rng)
        sink, window = check_int(self.sink, "sink"), check_int(self.window, "window")
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
        check_fields(self, ("window",), {"weights": ("none", "cluster_size")})

    def _select(self, K, V, budget, rng, Q):
        if self.weights not in ("none", "cluster_size"):
            raise InputError(f"weights must be 'none' or 'cluster_size', got {self.weights!r}")
        window = check_int(self.window, "window")
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
        check_fields(self, ("sink", "window", "block_size"), {"method": ("balance", "uniform")})

    def levels_for(self, n: int, budget: int) -> int:
        n_mid = n - self.sink - self.window
        if n_mid <= 0 or self.sink + self.window >= budget:
            raise InputError(f"budget {budget} leaves nothing to compress after sink {self.sink} + window {self.window}")
        T = 0
        while self.sink + self.window + (n_mid >> T) > budget:
            T += 1
        return T

    def _select(self, K, V, budget, rng, Q):
        check_rng(rng)
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
