"""MergeAndReduce (BalanceKV-NeurIPS Alg. 4, Thm 3.4; BalanceKV-preprint Alg. 3, Thm 3.3).

Claims: MR.error, MR.memory.

The binary-counter tree over batches of t tokens: cell C^0 collects tokens; every t tokens the
carry propagates (Alg. 4 lines 11-17)::

    p <- j/t, i <- 0
    while p is an integer and i < T:
        C^{i+1} <- C^{i+1} u SoftmaxBalance(C^i);  C^i <- {};  i <- i+1;  p <- p/2

and the estimate at step j is z_j = sum_i 2^i sum_{(k,v) in C^i} exp(<k, q_j>/sqrt d) v.
(Alg. 4 line 6 tests "p is not a multiple of t" before p is defined; the intent, and what we do,
is "j is not a multiple of t".) C^T is never reduced: it keeps what survived T halvings.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from kvbounds.algorithms.arrays import array_namespace, like, device as _dev

from .host_values import host_floats
from .self_balancing_walk import smaller_side
from .softmax_balance import softmax_balance
from .validation import (InputError, check_array, check_positive, check_probability, check_rng, check_scale,
                         namespace)

__all__ = ["MAX_LEVELS", "PANEL_FROM", "MAX_BATCH", "SIGNS", "check_levels", "MergeAndReduce"]

MAX_LEVELS = 48
PANEL_FROM = 512     # memory="auto": batches above this size are balanced on Gram panels
MAX_BATCH = 2**26    # t rows are buffered before each reduction: larger t cannot be held
SIGNS = ("walk", "random")


def check_levels(T: int) -> None:
    if isinstance(T, bool) or not isinstance(T, int) or T < 0:
        raise InputError(f"levels T must be a non-negative integer, got {T!r}")
    if T > MAX_LEVELS:
        raise InputError(f"levels T = {T} is too large (2^T would exceed any stream; at most {MAX_LEVELS})")


class MergeAndReduce:
    """Streaming MergeAndReduce on pairs (k in R^d, v in R^s).

    ``t``: batch size (even, >= 2); ``T``: number of levels (compression 2^-T); ``delta``: failure
    probability of each SoftmaxBalance call (c = 30 log(t/delta)); ``r_key``/``r_value``: radii passed
    to SoftmaxBalance (default: the largest norms in the cell being reduced); ``c``: the walk constant
    (default 30 log(t/delta), the paper's); ``memory``: SoftmaxBalance's Gram layout ("gram", "panel", or
    "auto": the full Gram for t <= PANEL_FROM, column panels above, O(t (d + s + 64)) memory per reduction;
    the signs are the same up to the summation order); ``signs``: ``"walk"`` (Alg. 2's self-balancing walk) or
    ``"random"`` (the ingredient ablation: each sign a fair coin drawn from the same uniforms the walk would use,
    the same smaller side kept, so the walk's only effect is what differs from this)."""

    def __init__(self, d: int, s: int, *, t: int, T: int, delta: float, rng: np.random.Generator,
                 r_key: float | None = None, r_value: float | None = None, scale: float | None = None,
                 c: float | None = None, memory: str = "auto", signs: str = "walk"):
        check_positive(d, "d", integer=True)
        check_positive(s, "s", integer=True)
        check_positive(t, "batch size t", integer=True)
        if t < 2 or t % 2 or t > MAX_BATCH:
            raise InputError(f"batch size t must be an even integer in [2, {MAX_BATCH}], got {t}")
        check_levels(T)
        check_probability(delta, "delta")
        check_rng(rng)
        for name, r in (("r_key", r_key), ("r_value", r_value)):
            if r is not None:
                check_positive(r, name, allow_zero=name == "r_key")
                if not math.isfinite(float(r) * float(r)):
                    raise InputError(f"{name} = {r!r} too large: r^2 overflows")
        if c is not None:
            check_positive(c, "c")
        if memory not in ("auto", "gram", "panel"):
            raise InputError(f"memory must be 'auto', 'gram' or 'panel', got {memory!r}")
        if signs not in SIGNS:
            raise InputError(f"signs must be one of {SIGNS}, got {signs!r}")
        self.signs = signs
        self.memory = memory if memory != "auto" else ("gram" if t <= PANEL_FROM else "panel")
        scale = check_scale(scale, d)
        self.d, self.s, self.t, self.T, self.delta = d, s, t, T, delta
        self.rng, self.r_key, self.r_value, self.c = rng, r_key, r_value, c
        self.scale = 1.0 / math.sqrt(d) if scale is None else scale
        self.j = 0
        self.cells_k: list[Any] = [None] * (T + 1)   # C^i keys (m_i, d) or None when empty
        self.cells_v: list[Any] = [None] * (T + 1)
        self._buf_k: list[Any] = []                   # C^0 rows, concatenated when reduced
        self._buf_v: list[Any] = []
        self.fail_count = 0
        self.balance_calls = 0
        self.version = 0                              # bumped whenever a batch completes (the cells C^i change)
        self._wt_cache = None                         # ((version, buffered tokens), weighted_tokens())
        self._ref = None                              # the first token: fixes the stream's backend and dtype

    # -- streaming -------------------------------------------------------------------------------
    def update(self, k, v) -> None:
        check_array(k, "k", ndim=1, last_dim=self.d, finite=False)
        check_array(v, "v", ndim=1, last_dim=self.s, finite=False)
        self._check_like_stream(k, v)
        xp = array_namespace(k)
        for ok, name in zip(host_floats(xp, xp.all(xp.isfinite(k)), xp.all(xp.isfinite(v))), "kv"):  # one read
            if not ok:
                raise InputError(f"{name} contains NaN or Inf")
        self._push(k, v)

    def _check_like_stream(self, k, v) -> None:
        """k and v share a backend and dtype with each other and with the tokens before them."""
        ref = self._ref if self._ref is not None else k
        if type(k) is not type(ref) or type(v) is not type(ref) or k.dtype != ref.dtype or v.dtype != ref.dtype:
            raise InputError(f"k and v must have the stream's array type and dtype ({type(ref).__name__} {ref.dtype}), "
                             f"got {type(k).__name__} {k.dtype} and {type(v).__name__} {v.dtype}")
        if not (_dev(k) == _dev(ref) and _dev(v) == _dev(ref)):
            raise InputError(f"k and v must live on the stream's device {_dev(ref)}, got {_dev(k)} and {_dev(v)}")
        self._ref = ref

    def _push(self, k, v) -> None:
        self.j += 1
        self._buf_k.append(k)
        self._buf_v.append(v)
        if self.j % self.t:                       # line 6: not a multiple of t
            return
        xp = array_namespace(k)
        Kb, Vb = xp.stack(self._buf_k), xp.stack(self._buf_v)
        self._buf_k, self._buf_v = [], []
        if self.cells_k[0] is None:
            self.cells_k[0], self.cells_v[0] = Kb, Vb
        else:                                     # T = 0: C^0 is the top cell and accumulates
            self.cells_k[0] = xp.concat([self.cells_k[0], Kb])
            self.cells_v[0] = xp.concat([self.cells_v[0], Vb])
        p, i = self.j // self.t, 0
        while i < self.T:                         # lines 11-17
            self._reduce_into_next(i)
            i += 1
            if p % 2:
                break
            p //= 2
        self.version += 1

    def _reduce_into_next(self, i: int) -> None:
        K, V = self.cells_k[i], self.cells_v[i]
        if K is None or K.shape[0] == 0:    # an empty cell reduces to nothing (SoftmaxBalance may keep 0 of a cell)
            self.cells_k[i] = self.cells_v[i] = None
            return
        xp = array_namespace(K)
        if self.signs == "random":            # the ablation: the walk's uniforms, each a fair coin (p = 1/2)
            u = like(self.rng.random(tuple(K.shape[:-1])), K)
            keep = xp.nonzero(smaller_side(xp.where(u < 0.5, xp.ones_like(u), -xp.ones_like(u))))[0]
        else:
            res = softmax_balance(K, V, delta=self.delta, rng=self.rng, r_key=self.r_key, r_value=self.r_value,
                                  n=max(self.t, K.shape[0]), scale=self.scale, on_fail="continue", c=self.c,
                                  memory=self.memory)
            self.fail_count += int(np.asarray(res.walk.failed).any())
            keep = xp.nonzero(res.keep)[0]
        self.balance_calls += 1
        Kk, Vk = xp.take(K, keep, axis=0), xp.take(V, keep, axis=0)
        if self.cells_k[i + 1] is None:
            self.cells_k[i + 1], self.cells_v[i + 1] = Kk, Vk
        else:
            self.cells_k[i + 1] = xp.concat([self.cells_k[i + 1], Kk])
            self.cells_v[i + 1] = xp.concat([self.cells_v[i + 1], Vk])
        self.cells_k[i] = self.cells_v[i] = None

    # -- state -----------------------------------------------------------------------------------
    def cells(self) -> list[tuple[Any, Any]]:
        """[(K_i, V_i)] for i = 0..T (C^0 includes the tokens not yet reduced); empty cells are None."""
        out = [(self.cells_k[i], self.cells_v[i]) for i in range(self.T + 1)]
        if self._buf_k:   # tokens of the batch in progress belong to C^0 (which holds more when T = 0)
            xp = array_namespace(self._buf_k[0])
            bk, bv = xp.stack(self._buf_k), xp.stack(self._buf_v)
            k0, v0 = out[0]
            out[0] = (bk, bv) if k0 is None else (xp.concat([k0, bk]), xp.concat([v0, bv]))
        return [(k, v) if k is not None and k.shape[0] > 0 else (None, None) for k, v in out]

    def cell_sizes(self) -> list[int]:
        sizes = [0 if k is None else int(k.shape[0]) for k in self.cells_k]
        sizes[0] += len(self._buf_k)
        return sizes

    def num_stored(self) -> int:
        return sum(self.cell_sizes())

    def weighted_tokens(self):
        """(K, V, log-weights) of every stored token: weight 2^i for C^i; None when empty.
        Cached until the next update (the concatenation dominated a query's time)."""
        key = (self.version, len(self._buf_k))
        if self._wt_cache is None or self._wt_cache[0] != key:
            self._wt_cache = (key, self._weighted_tokens())
        return self._wt_cache[1]

    def _weighted_tokens(self):
        Ks, Vs, Ws = [], [], []
        for i, (k, v) in enumerate(self.cells()):
            if k is None:
                continue
            xp = array_namespace(k)
            Ks.append(k)
            Vs.append(v)
            Ws.append(xp.full((k.shape[0],), i * math.log(2.0), dtype=k.dtype, device=_dev(k)))
        if not Ks:
            return None
        xp = array_namespace(Ks[0])
        return xp.concat(Ks), xp.concat(Vs), xp.concat(Ws)

    def estimate(self, q):
        """z_j of Thm 3.4 as (m, u) with z_j = e^m u (finite for any norms); m = -inf when empty."""
        check_array(q, "q", ndim=1, last_dim=self.d)
        wt = self.weighted_tokens()
        xp = array_namespace(q)
        if wt is None:
            return -math.inf, xp.zeros((self.s,), dtype=q.dtype, device=_dev(q))
        K, V, logw = wt
        xp = namespace(K, q, names="q and the stream's keys")
        with np.errstate(over="ignore", invalid="ignore"):
            logits = xp.matmul(K, q) * self.scale + logw
            m = xp.max(logits)
        if not math.isfinite(float(m)):
            raise InputError("the largest logit <k, q> * scale overflows the float range: e^m u is not representable")
        return float(m), xp.sum(xp.exp(logits - m)[:, None] * V, axis=0)

