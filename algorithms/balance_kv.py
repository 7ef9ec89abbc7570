"""BalanceKV, the streaming attention estimator (BalanceKV-NeurIPS Alg. 1, Thm 3.1; BalanceKV-preprint Alg. 1, Thm 3.1).

Claims: BKV.attention, BKV.memory.

Alg. 1 (BalanceKV-NeurIPS line numbers)::

    5-6  send (k_j, v_j) to MR-Numerator_i with 2^{i-1} <= ||v_j|| <= 2^i   (bucket by value norm)
    7    vmax <- max(||v_j||, vmax)
    8    erase every MR-Numerator_i with 2^i <= eps/(2n) e^{-r^2/sqrt d} vmax
    11   send (k_j, 1) to MR-Denominator
    13   z_j = sum_l 2^l sum_{V^l} e^{<k,q>/sqrt d} v / sum_l 2^l sum_{K^l} e^{<k,q>/sqrt d}

(BalanceKV-preprint line 4 writes the bucket as 2^i <= ||v|| <= 2^{i-1}, an empty interval; BalanceKV-NeurIPS fixes it.)
The proof in BalanceKV-NeurIPS A.1 uses the threshold 2^i <= eps/sqrt(n) vmax instead of line 8's: both are
available through ``erase_rule`` so claim BKV.memory can compare them. A value of norm 0 contributes
nothing to the numerator and goes to the denominator only.

Speed (numpy streams): ``query`` reads one cached slab holding every stored token of every
MergeAndReduce, K (m, d) with W = [v, 0] for numerator tokens, [0, 1] for denominator tokens and [v, 1] for a
token still buffered in both, and log-weights i log 2: one matrix-vector product, one exp and one more
product give numerator and denominator together (the same sums as the per-instance estimates, summed in
another order). The slab is rebuilt only when a batch completes or a bucket is erased; tokens in between are
appended. Anything unusual (another backend, an empty or underflowing denominator, non-finite output, a state
changed behind the slab's back) takes the generic path, which stays the reference (tests compare them).
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms.arrays import array_namespace, device as _dev

from .host_values import host_floats
from .merge_and_reduce import MAX_BATCH, SIGNS, MergeAndReduce, check_levels
from .validation import InputError, check_array, check_positive, check_probability, check_seed, namespace

__all__ = ["ERASE_RULES", "DegenerateEstimate", "erase_threshold", "bucket_index", "BalanceKV"]

ERASE_RULES = ("alg1", "proof001", "none")


class DegenerateEstimate(RuntimeError):
    """z_j is undefined: the denominator estimate is 0 because every MR-Denominator cell is empty.

    This happens: Alg. 2 keeps the *smaller* sign class (lines 12-16), so a cell of one token, or of
    tokens that all drew the same sign, reduces to nothing, while level i keeps its weight 2^i."""


def erase_threshold(rule: str, *, eps: float, n: int, r: float, d: int, vmax: float) -> float:
    """Buckets with 2^i <= threshold are erased: Alg. 1 line 8 ("alg1"), BalanceKV-NeurIPS A.1's proof ("proof001")."""
    check_positive(eps, "eps")
    check_positive(n, "n", integer=True)
    check_positive(r, "r")
    check_positive(d, "d", integer=True)
    check_positive(vmax, "vmax", allow_zero=True)
    if not math.isfinite(float(r) * float(r)):
        raise InputError(f"r = {r!r} too large: r^2 overflows")
    if rule == "alg1":
        return eps / (2 * n) * math.exp(-r**2 / math.sqrt(d)) * vmax
    if rule == "proof001":
        return eps / math.sqrt(n) * vmax
    if rule == "none":
        return 0.0
    raise InputError(f"erase_rule must be one of {ERASE_RULES}, got {rule!r}")


def bucket_index(norm: float) -> int:
    """i with 2^{i-1} < ||v|| <= 2^i (Alg. 1 line 5; boundaries go to the lower bucket)."""
    check_positive(norm, "norm")
    return math.ceil(math.log2(norm))


class BalanceKV:
    """Streaming BalanceKV.

    ``batch_size`` (t) and ``levels`` (T) configure every MergeAndReduce; ``eps`` enters the erase rule;
    ``r`` bounds the query and key norms; ``delta`` is each SoftmaxBalance call's failure probability;
    ``n`` is the stream-length bound in the erase rule (default: tokens seen so far); ``signs``: ``"walk"``
    (Alg. 2) or ``"random"`` (every MergeAndReduce halves by fair coins: the ingredient ablation,
    :class:`~kvbounds.algorithms.merge_and_reduce.MergeAndReduce`).
    ``fast = False`` (attribute) forces the generic array-API path (the reference; tests compare the two)."""

    fast = True

    def __init__(self, d: int, *, batch_size: int, levels: int, eps: float, r: float, delta: float = 1e-3,
                 seed: int | None = 0, s: int | None = None, n: int | None = None, erase_rule: str = "alg1",
                 signs: str = "walk"):
        check_positive(d, "d", integer=True)
        check_positive(eps, "eps")
        check_positive(r, "r")
        if not math.isfinite(float(r) * float(r)):
            raise InputError(f"r = {r!r} too large: r^2 overflows")
        check_probability(delta, "delta")
        check_levels(levels)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 2 or batch_size % 2 \
                or batch_size > MAX_BATCH:
            raise InputError(f"batch_size must be an even integer in [2, {MAX_BATCH}], got {batch_size!r}")
        if n is not None:
            check_positive(n, "n", integer=True)
        if s is not None:
            check_positive(s, "s", integer=True)
        seed = check_seed(seed)
        erase_threshold(erase_rule, eps=eps, n=1, r=r, d=d, vmax=0.0)  # validates the rule
        if signs not in SIGNS:
            raise InputError(f"signs must be one of {SIGNS}, got {signs!r}")
        self.signs = signs
        self.d, self.t, self.T, self.eps, self.r, self.delta = d, batch_size, levels, eps, r, delta
        self.s, self.n_bound, self.erase_rule = s, n, erase_rule
        self.rng = np.random.default_rng(seed)
        self.scale = 1.0 / math.sqrt(d)
        self.j = 0
        self.vmax = 0.0
        self.numerators: dict[int, MergeAndReduce] = {}
        self.denominator: MergeAndReduce | None = None
        self.erased: set[int] = set()
        self.erased_tokens = 0
        self._one = None
        self._slab = None            # numpy fast path of query(): see the module docstring

    def _mr(self, s: int) -> MergeAndReduce:
        return MergeAndReduce(self.d, s, t=self.t, T=self.T, delta=self.delta, rng=self.rng,
                              r_key=self.r, scale=self.scale, signs=self.signs)

    def update(self, k, v) -> None:
        if self.fast and self._plain_numpy(k, v) and self._update_numpy(k, v):
            return
        self._slab = None
        check_array(k, "k", ndim=1, last_dim=self.d, finite=False)
        if self.s is None:
            check_array(v, "v", ndim=1, finite=False)
            self.s = int(v.shape[0])
        check_array(v, "v", ndim=1, last_dim=self.s, finite=False)
        xp = namespace(k, v, names="k and v")
        ref = self._one if self._one is not None else k
        if type(k) is not type(ref) or type(v) is not type(ref) or k.dtype != ref.dtype or v.dtype != ref.dtype:
            raise InputError(f"k and v must have the stream's array type and dtype ({type(ref).__name__} {ref.dtype}), "
                             f"got {type(k).__name__} {k.dtype} and {type(v).__name__} {v.dtype}")
        namespace(k, ref, names="k and the stream's earlier tokens")           # and its device
        # one host read per token (issue 15): the bucket of lines 5-6 is a host decision (which MergeAndReduce takes
        # the token), so ||v|| must come to the host; the finiteness checks and ||k|| travel with it
        knorm, vnorm, k_ok, v_ok = host_floats(xp, xp.linalg.vector_norm(k), xp.linalg.vector_norm(v),
                                                xp.all(xp.isfinite(k)), xp.all(xp.isfinite(v)))
        for name, ok in (("k", k_ok), ("v", v_ok)):
            if not ok:
                raise InputError(f"{name} contains NaN or Inf")
        if knorm > self.r * (1 + 1e-9):
            raise InputError(f"key norm {knorm:.6g} exceeds r = {self.r} (Thm 3.1 assumes ||k|| <= r)")
        self.j += 1
        if vnorm > 0:
            i = bucket_index(vnorm)                                    # lines 5-6
            if i not in self.numerators:
                self.numerators[i] = self._mr(self.s)
            self.numerators[i]._push(k, v)
        self.vmax = max(self.vmax, vnorm)                              # line 7
        n = self.n_bound or self.j
        thr = erase_threshold(self.erase_rule, eps=self.eps, n=n, r=self.r, d=self.d, vmax=self.vmax)
        for i in [i for i in self.numerators if 2.0**i <= thr]:        # line 8
            self.erased_tokens += self.numerators[i].j
            self.erased.add(i)
            del self.numerators[i]
        if self.denominator is None:
            self.denominator = self._mr(1)
            self._one = xp.ones((1,), dtype=k.dtype, device=_dev(k))
        self.denominator._push(k, self._one)                           # line 11

    # -- numpy fast path -------------------------------------------------------------------------------
    def _plain_numpy(self, k, v) -> bool:
        return (type(k) is np.ndarray and type(v) is np.ndarray and k.dtype == v.dtype
                and k.dtype in (np.float32, np.float64) and k.shape == (self.d,) and v.shape == (self.s,))

    def _update_numpy(self, k, v) -> bool:
        """update() for numpy k, v whose squared norms are finite (False: let the generic path check and run).
        Same state as the generic path: the norms are computed as numpy's vector_norm computes them."""
        k2, v2 = float(np.add.reduce(k * k)), float(np.add.reduce(v * v))
        if not (math.isfinite(k2) and math.isfinite(v2)):
            return False
        knorm = math.sqrt(k2)
        if knorm > self.r * (1 + 1e-9):
            return False                                               # the generic path raises
        self.j += 1
        vnorm = math.sqrt(v2)
        num = None
        if vnorm > 0:
            i = bucket_index(vnorm)                                    # lines 5-6
            if i not in self.numerators:
                self.numerators[i] = self._mr(self.s)
            num = self.numerators[i]
            num._push(k, v)
        self.vmax = max(self.vmax, vnorm)                              # line 7
        n = self.n_bound or self.j
        thr = erase_threshold(self.erase_rule, eps=self.eps, n=n, r=self.r, d=self.d, vmax=self.vmax)
        erased = [i for i in self.numerators if 2.0**i <= thr]
        for i in erased:                                               # line 8
            self.erased_tokens += self.numerators[i].j
            self.erased.add(i)
            del self.numerators[i]
        if self.denominator is None:
            self.denominator = self._mr(1)
            self._one = np.ones((1,), dtype=k.dtype)
        self.denominator._push(k, self._one)                           # line 11
        self._append_to_slab(k, v if num is not None and not erased else None, num, erased)
        return True

    def _slab_key(self):
        return tuple((i, mr.version) for i, mr in self.numerators.items()) + (self.denominator.version,)

    def _append_to_slab(self, k, v, num, erased) -> None:
        sl = self._slab
        if sl is None:
            return
        if erased or sl["n"] == sl["K"].shape[0] or sl["key"] != self._slab_key() or sl["dtype"] != k.dtype:
            self._slab = None                                          # rebuilt at the next query
            return
        r = sl["n"]
        sl["K"][r] = k
        if v is not None:
            sl["W"][r, :self.s] = v
            sl["counts"][id(num)] = sl["counts"].get(id(num), 0) + 1
        else:
            sl["W"][r, :self.s] = 0.0
        sl["W"][r, self.s] = 1.0
        sl["L"][r] = 0.0
        sl["counts"][id(self.denominator)] += 1
        sl["n"] = r + 1

    def _slab_valid(self) -> bool:
        sl = self._slab
        if sl is None or sl["key"] != self._slab_key():
            return False
        counts = sl["counts"]
        mrs = [*self.numerators.values(), self.denominator]
        return all(len(mr._buf_k) == counts.get(id(mr), 0) for mr in mrs)

    def _build_slab(self, dtype) -> None:
        Ks, Ws, Ls, counts, s = [], [], [], {}, self.s
        for mr, col in [*((mr, "num") for mr in self.numerators.values()), (self.denominator, "den")]:
            counts[id(mr)] = len(mr._buf_k)
            for lvl, (kk, vv) in enumerate(mr.cells()):
                if kk is None:
                    continue
                w = np.zeros((kk.shape[0], s + 1), dtype=dtype)
                if col == "num":
                    w[:, :s] = vv
                else:
                    w[:, s] = vv[:, 0]
                Ks.append(kk)
                Ws.append(w)
                Ls.append(np.full(kk.shape[0], lvl * math.log(2.0), dtype=dtype))
        m = sum(x.shape[0] for x in Ks)
        cap = m + 2 * self.t + 8
        K = np.empty((cap, self.d), dtype=dtype)
        W = np.empty((cap, s + 1), dtype=dtype)
        L = np.empty(cap, dtype=dtype)
        if Ks:
            np.concatenate(Ks, axis=0, out=K[:m])
            np.concatenate(Ws, axis=0, out=W[:m])
            np.concatenate(Ls, axis=0, out=L[:m])
        self._slab = dict(key=self._slab_key(), K=K, W=W, L=L, n=m, counts=counts, dtype=dtype)

    def _query_numpy(self, q):
        """query() from the slab; None when the generic path must decide (it raises or computes)."""
        if not self._slab_valid():
            self._build_slab(q.dtype)
        sl = self._slab
        n = sl["n"]
        if n == 0 or sl["dtype"] != q.dtype:
            return None
        logits = sl["K"][:n] @ q
        logits *= self.scale
        logits += sl["L"][:n]
        logits -= logits.max()
        np.exp(logits, out=logits)
        out = logits @ sl["W"][:n]
        den = float(out[self.s])
        if not (den > 0 and math.isfinite(den)) or not np.all(np.isfinite(out)):
            return None
        return out[:self.s] / den

    def num_stored(self) -> int:
        """Key/value pairs held: every numerator cell plus the denominator's keys."""
        return sum(mr.num_stored() for mr in self.numerators.values()) + (
            self.denominator.num_stored() if self.denominator else 0)

    def memory_floats(self) -> int:
        num = sum(mr.num_stored() for mr in self.numerators.values()) * (self.d + self.s)
        den = self.denominator.num_stored() * (self.d + 1) if self.denominator else 0
        return num + den

    def num_buckets(self) -> int:
        return len(self.numerators)

    def query(self, q):
        """z_j (line 13), the estimate of Attn(q, K_j, V_j) over every token seen so far."""
        if self.denominator is None:
            raise InputError("query on an empty stream: call update() first")
        if self.fast and type(q) is np.ndarray and q.shape == (self.d,) and q.dtype in (np.float32, np.float64):
            out = self._query_numpy(q)
            if out is not None:
                return out
        check_array(q, "q", ndim=1, last_dim=self.d)
        xp = array_namespace(q)
        m_den, den = self.denominator.estimate(q)
        if m_den == -math.inf or not float(den[0]) > 0:
            raise DegenerateEstimate(
                f"denominator estimate is 0 at step {self.j}: every MR-Denominator cell is empty "
                f"(cell sizes {self.denominator.cell_sizes()}); SoftmaxBalance kept the empty sign class")
        parts = [mr.estimate(q) for mr in self.numerators.values()]
        parts = [(m, u) for m, u in parts if m > -math.inf]
        if not parts:
            return xp.zeros((self.s,), dtype=q.dtype, device=_dev(q))
        # z = sum_i e^{m_i} u_i / (e^{m_den} den): shift by the denominator's m, so nothing divides by an
        # underflowed e^{m_den - m} (numerator logits may exceed the denominator's by more than 709)
        with np.errstate(over="ignore", invalid="ignore"):
            out = sum(math.exp(min(mi - m_den, 709.0)) * (u / den[0]) if mi - m_den <= 709 else u * math.inf
                      for mi, u in parts)
        if not bool(xp.all(xp.isfinite(out))):
            raise DegenerateEstimate(
                f"the estimate overflows at step {self.j}: the numerator estimate exceeds the denominator "
                f"estimate by more than the float range (largest logit gap {max(p[0] for p in parts) - m_den:.4g})")
        return out

