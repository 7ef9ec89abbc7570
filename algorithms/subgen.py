"""SubGen / ClusterGen: sublinear streaming attention by online clustering and l2 sampling.

Seeds: SubGen Alg. 1 (SubGen) = ClusterGen Alg. 1 (ClusterGen); claims SG.reservoir, SG.clusters, SG.partition,
SG.matprod, SG.attention (SubGen Lemma 1, Lemma 2, Thm 1; ClusterGen Lemma 2.2, Lemma 2.3, Thm 2.4).

Alg. 1 (SubGen line numbers; ClusterGen numbers the same lines one lower from line 11 on)::

    4  D <- UpdateSoftmaxNormalizer(D, delta, t, k_n)
    5  M <- UpdateMatrixProduct(M, s, mu, k_n, v_n)
    6  mu <- mu + ||v_n||^2
    7  z_n <- QueryStreamAttn(D, M, s, t, mu, q_n)

    UpdateSoftmaxNormalizer (lines 11-23)
    12  i* <- argmin_i ||x_i - k||                       (x_i: the first key of cluster i)
    13  if ||k - x_i*|| <= delta:
    14      n_i* <- n_i* + 1
    16-17   for each of the t slots of S_i*: with probability 1/n_i*, S_i*(j) <- k
    20-21 else: open the cluster (k, [k] * t, 1)

    UpdateMatrixProduct (lines 24-28)
    25-26 for each of the s slots of M: with probability ||v||^2 / (mu + ||v||^2), M(i) <- (k, v)

    QueryStreamAttn (lines 29-31)
    29  z   = sum_{(k,v) in M} mu / (s ||v||^2) * exp(<q,k>) * v
    30  tau = sum_{(x,S,n') in D} n'/t * sum_{k in S} exp(<q,k>)
    31  return z / tau

Vectorization: per token, the nearest-representative search is one array operation over all clusters
(``||X - k||`` row norms, the difference computed directly, not through ``||x||^2 - 2<x,k> + ||k||^2``,
so the threshold test ``<= delta`` is not spoiled by cancellation), and the coins of all slots are
one draw. The coins are uniforms drawn on the host with a numpy ``Generator`` and compared with the
probability in float64 there; only the boolean masks move to the backend, so a seed gives the same
state on numpy and torch.

Conventions: the paper writes ``exp(<q, k>)`` (no 1/sqrt(d)); ``scaled=True`` uses ``exp(<q,k>/sqrt d)``
(BalanceKV's convention, for comparisons on one trace). ``replicas=R`` runs R independent copies of
the random state (reservoirs S and M) on the same deterministic clustering in the same array operations:
each copy is distributed exactly as a separate run, which is how the checks measure failure
probabilities. ``reservoir_norm="key"`` samples M by ``||k||^2`` instead (the prose of SubGen Sec. 2.2 and
ClusterGen Sec. 2.2 says ``||k_i||^2``; the pseudocode and the lemmas use ``||v||^2``); it exists for the
check that decides between them.

Coins: per update, ``draw("cluster", (R, t))`` when the key joins a cluster (lines 16-17), then
``draw("matrix", (R, s))`` (lines 25-26). ``seed`` may be an int, a numpy Generator, or any object with a
``draw(kind, shape) -> ndarray of uniforms`` method (the exact checks script the coins that way).

The estimator (QueryStreamAttn, lines 29-31) lives in :mod:`kvbounds.algorithms.subgen_query`, a base class of
:class:`SubGen`; this module keeps the state and its updates (lines 4-6, 11-28).

Speed (numpy): the nearest-representative distances are computed as numpy's vector_norm computes them,
without its dispatch: the same clusters and coins (the same floats decide them) as the generic path.

Degenerate values: while mu = 0 (every value so far is 0), line 26's p = 0/0; we take p = 1, so M holds
copies of the latest pair (the prose's "populated with s copies of the first key and value"), and z = 0.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from kvbounds.algorithms.arrays import array_namespace, is_gpu_array, like, to_numpy, device as _dev

from .subgen_device import DeviceStream
from .subgen_query import QueryStreamAttn
from .validation import InputError, check_array, check_positive, check_seed, namespace

__all__ = ["RESERVOIR_NORMS", "SubGenState", "SubGen"]

RESERVOIR_NORMS = ("value", "key")


@dataclasses.dataclass
class SubGenState:
    """A numpy snapshot of the data structures (for checks): D = (representatives, samples, counts), M, mu."""
    representatives: np.ndarray   # (m', d)       x_i
    rep_index: np.ndarray         # (m',)         stream index of x_i (the first key of the cluster)
    counts: np.ndarray            # (m',)         n_i
    sample_index: np.ndarray      # (m', R, t)    stream index of every slot of S_i
    samples: np.ndarray           # (m', R, t, d) S_i
    matrix_index: np.ndarray      # (R, s)        stream index of every slot of M
    matrix_keys: np.ndarray       # (R, s, d)
    matrix_values: np.ndarray     # (R, s, dv)
    mu: float
    n: int


class _GeneratorCoins:
    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def draw(self, kind: str, shape: tuple[int, ...]) -> np.ndarray:
        return self.rng.random(shape)


def _coin_source(seed):
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return _GeneratorCoins(np.random.default_rng(check_seed(seed)))
    if isinstance(seed, np.random.Generator):
        return _GeneratorCoins(seed)
    if callable(getattr(seed, "draw", None)):
        return seed
    raise InputError(f"seed must be an int, a numpy Generator or a coin source with draw(kind, shape); got {seed!r}")


def _check_count(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)



class SubGen(QueryStreamAttn, DeviceStream):
    """Streaming SubGen (SubGen Alg. 1 / ClusterGen Alg. 1).

    ``d`` key/query dimension; ``delta`` > 0 the clustering threshold; ``t`` >= 1 uniform samples per
    cluster; ``s`` >= 1 l2 samples for the value product; ``seed`` the coins (see module docstring).
    The value dimension is taken from the first ``update``; state lives on the first key's backend.
    ``track=True`` also records the cluster label of every token (O(n) memory; for invariant checks).

    On torch/cupy with Generator coins the state and the update live on the device
    (:mod:`kvbounds.algorithms.subgen_device`): same results, no host read per token."""

    fast = True          # False: the generic array-API path everywhere (the reference the tests compare with)
    # the state on the device, no host read per token (subgen_device), at about five times the operations per token;
    # the host path reads and copies about six values per token. None (default): the device path for arrays on a
    # GPU (torch CUDA, CuPy), where a host read waits for the device; the host path for numpy and CPU tensors,
    # where reads are free (there it is 1.2-2x faster). True / False force one path (tests; timing both on a GPU).
    device_resident: bool | None = None

    def __init__(self, d: int, *, delta: float, s: int, t: int, seed: Any = 0, scaled: bool = False,
                 replicas: int | None = None, reservoir_norm: str = "value", track: bool = False):
        check_positive(d, "d", integer=True)
        check_positive(delta, "delta")
        self.d, self.delta = int(d), float(delta)
        self.s, self.t = _check_count(s, "s"), _check_count(t, "t")
        if replicas is not None:
            replicas = _check_count(replicas, "replicas")
        if (replicas or 1) * (self.s + self.t) * self.d > 2**31:
            raise InputError(f"state of replicas x (s + t) x d = {replicas or 1} x ({self.s} + {self.t}) x {self.d} "
                             f"floats is too large")
        if reservoir_norm not in RESERVOIR_NORMS:
            raise InputError(f"reservoir_norm must be one of {RESERVOIR_NORMS}, got {reservoir_norm!r}")
        self.replicas, self.R = replicas, replicas or 1
        self.reservoir_norm = reservoir_norm
        self.scale = 1.0 / math.sqrt(d) if scaled else 1.0
        self.scaled = bool(scaled)
        self._coins = _coin_source(seed)
        self._owns_rng = isinstance(seed, (int, np.integer))          # a Generator of our own: drawn ahead freely
        self._on_device = False
        self._flags = None        # device mode: check failures accumulated during a batched call
        self._prechecked = False  # device mode, batched call: no squared norm can overflow (checked up front)
        self.track = bool(track)
        self.n = 0            # tokens seen
        self.mu = 0.0         # line 6: sum of ||v||^2 (of ||k||^2 for reservoir_norm="key")
        self.m = 0            # clusters m'
        self.dv: int | None = None
        self._counts = np.zeros(0, dtype=np.int64)
        self._rep_index = np.zeros(0, dtype=np.int64)
        self._labels: list[int] = []
        self._X = self._S = self._Sidx = None
        self._xp = self._atype = None
        self._is_numpy = False
        self._Mk = self._Mv = self._Mlogw = self._Midx = None

    # ------------------------------------------------------------------------------------ state
    def _allocate(self, k, v) -> None:
        # numpy >= 2 is itself an array-API namespace; calling it directly skips the compat wrappers'
        # per-call overhead, which dominates a per-token loop over small arrays
        xp = np if isinstance(k, np.ndarray) and hasattr(np, "permute_dims") else array_namespace(k, v)
        self._xp, self._atype = xp, type(k)
        self._is_numpy = isinstance(k, np.ndarray)
        dev, R, cap = _dev(k), self.R, 8
        if not self._is_numpy and self._device_wanted(k) and type(self._coins) is _GeneratorCoins \
                and 64 * R * self.t * self.d <= 2**22:
            cap = 64          # on a device, m' is read when the buffer may be full: a larger first buffer, fewer reads
        self.dv = int(v.shape[0])
        self._X = xp.zeros((cap, self.d), dtype=k.dtype, device=dev)
        self._S = xp.zeros((cap, R, self.t, self.d), dtype=k.dtype, device=dev)
        self._Sidx = xp.zeros((cap, R, self.t), dtype=xp.int64, device=dev)
        self._counts = np.zeros(cap, dtype=np.int64)
        self._rep_index = np.zeros(cap, dtype=np.int64)
        self._logc = xp.zeros((cap,), dtype=k.dtype, device=dev)         # log(n_i / t), the weights of line 30
        self._Mk = xp.zeros((R, self.s, self.d), dtype=k.dtype, device=dev)
        self._Mv = xp.zeros((R, self.s, self.dv), dtype=k.dtype, device=dev)
        self._Mlogw = xp.zeros((R, self.s), dtype=k.dtype, device=dev)   # log of the slot's ||v||^2 (+inf for 0)
        self._Midx = xp.zeros((R, self.s), dtype=xp.int64, device=dev)
        self._on_device = not self._is_numpy and self._device_wanted(k) and type(self._coins) is _GeneratorCoins
        if self._on_device:
            self._device_allocate(xp, k)

    @property
    def m(self) -> int:
        """m' = |D| (read from the device when the state lives there)."""
        return self._device_m() if self._on_device else self._m

    @m.setter
    def m(self, value: int) -> None:
        self._m = value

    @property
    def mu(self) -> float:
        """Line 6's sum of ||v||^2 (of ||k||^2 for reservoir_norm="key")."""
        return self._device_mu() if self._on_device else self._mu

    @mu.setter
    def mu(self, value: float) -> None:
        self._mu = value

    def _mask(self, m: np.ndarray):
        return m if self._is_numpy else like(m, self._X)

    def _grow(self) -> None:
        xp = self._xp
        cap = self._X.shape[0]

        def double(a):
            return xp.concat([a, xp.zeros(a.shape, dtype=a.dtype, device=_dev(a))], axis=0)

        self._X, self._S, self._Sidx = double(self._X), double(self._S), double(self._Sidx)
        self._logc = double(self._logc)
        if self._on_device:
            self._counts, self._rep_index = double(self._counts), double(self._rep_index)
            self._rows = xp.arange(self._X.shape[0], device=_dev(self._X))
            return
        self._counts = np.concatenate([self._counts, np.zeros(cap, dtype=np.int64)])
        self._rep_index = np.concatenate([self._rep_index, np.zeros(cap, dtype=np.int64)])

    def _check_first(self, k, v, finite: bool = True) -> None:
        check_array(k, "k", ndim=1, last_dim=self.d, finite=finite)
        check_array(v, "v", ndim=1, finite=finite)
        if v.shape[0] < 1:
            raise InputError("v is empty (shape (0,))")
        if array_namespace(k) is not array_namespace(v) or k.dtype != v.dtype:
            raise InputError(f"k and v must share backend and dtype, got {k.dtype} and {v.dtype}")

    def _check_next(self, k, v) -> None:
        """Per-token checks without namespace look-ups; NaN/Inf is caught through the squared norms."""
        for name, x, dim in (("k", k, self.d), ("v", v, self.dv)):
            if type(x) is not self._atype:
                raise InputError(f"{name} must be a {self._atype.__name__} like the first token, got {type(x).__name__}")
            if tuple(x.shape) != (dim,):
                raise InputError(f"{name} must have shape ({dim},), got {tuple(x.shape)}")
            if x.dtype != self._X.dtype:
                raise InputError(f"{name} must have the stream's dtype {self._X.dtype}, got {x.dtype}")
            if not self._is_numpy and x.device != self._X.device:
                raise InputError(f"{name} lives on {x.device}, the stream's state on {self._X.device}")

    # ----------------------------------------------------------------------------------- update
    def update(self, k, v) -> None:
        """Process one token (k, v): Alg. 1 lines 4-6."""
        self._update(k, v, batched=False)
        if self._on_device:
            self._settle_coins()

    def _device_capable(self, k) -> bool:
        return self._on_device or (self._X is None and not isinstance(k, np.ndarray) and self._device_wanted(k)
                                   and type(self._coins) is _GeneratorCoins)

    def _device_wanted(self, k) -> bool:
        if self.device_resident is None:
            return is_gpu_array(k)
        return bool(self.device_resident)

    def _update(self, k, v, *, batched: bool) -> None:
        if self._X is None:
            self._check_first(k, v, finite=not self._device_capable(k))   # the device path checks ||k||^2, ||v||^2
        else:
            self._check_next(k, v)
        xp = self._xp or array_namespace(k)
        if self._device_capable(k):
            self._device_update(xp, k, v, batched=batched)
            return
        with np.errstate(over="ignore", invalid="ignore"):
            k2, v2 = float(k @ k), float(v @ v)
        for name, x2 in (("k", k2), ("v", v2)):
            if not math.isfinite(x2):
                raise InputError(f"{name} contains NaN or Inf (or its squared norm overflows {k.dtype})")
        if self._X is None:
            self._allocate(k, v)
        self._update_normalizer(xp, k)
        w2 = k2 if self.reservoir_norm == "key" else v2
        self._update_matrix_product(xp, k, v, w2)
        self.mu += w2                                                       # line 6
        self.n += 1

    def _update_normalizer(self, xp, k) -> None:
        """UpdateSoftmaxNormalizer (lines 11-23)."""
        j = self.n
        if self.m:
            if self._is_numpy and self.fast:                                 # numpy's vector_norm, undispatched
                diff = self._X[:self.m, :] - k
                dist = np.sqrt(np.add.reduce(diff * diff, axis=-1))
            else:
                dist = xp.linalg.vector_norm(self._X[:self.m, :] - k, axis=-1)   # line 12: all clusters at once
            i = int(xp.argmin(dist))
            if float(dist[i]) <= self.delta:                                 # line 13
                self._counts[i] += 1                                         # line 14
                self._logc[i] = math.log(self._counts[i] / self.t)
                u = self._coins.draw("cluster", (self.R, self.t))
                hit = u < 1.0 / self._counts[i]                              # lines 16-17: all t slots
                if hit.any() or not self.fast:                               # (no slot: nothing to write)
                    mask = self._mask(hit)
                    Si, Sidx = self._S[i, ...], self._Sidx[i, ...]
                    Si[mask] = k
                    Sidx[mask] = j
                if self.track:
                    self._labels.append(i)
                return
        if self.m == self._X.shape[0]:                                       # lines 20-21: open a cluster
            self._grow()
        i = self.m
        self._X[i, :] = k
        self._S[i, ...] = k
        self._Sidx[i, ...] = j
        self._counts[i], self._rep_index[i] = 1, j
        self._logc[i] = -math.log(self.t)
        self.m += 1
        if self.track:
            self._labels.append(i)

    def _update_matrix_product(self, xp, k, v, w2: float) -> None:
        """UpdateMatrixProduct (lines 24-28): every slot flips its coin in one draw."""
        total = self.mu + w2
        p = w2 / total if total > 0 else 1.0                                 # line 26 (p = 1 while mu = 0)
        u = self._coins.draw("matrix", (self.R, self.s))
        hit = u < p
        if self.fast and not hit.any():                                      # no slot flips: nothing to write
            return
        mask = self._mask(hit)
        self._Mk[mask] = k
        self._Mv[mask] = v
        self._Mlogw[mask] = math.log(w2) if w2 > 0 else math.inf
        self._Midx[mask] = self.n

    def update_many(self, K, V) -> None:
        """update() for every row of K (n, d), V (n, dv)."""
        check_array(K, "K", ndim=2, last_dim=self.d, finite=False)
        check_array(V, "V", ndim=2, finite=False)
        if K.shape[0] != V.shape[0]:
            raise InputError(f"K and V must have the same number of rows, got {K.shape[0]} and {V.shape[0]}")
        if not K.shape[0] or not self._device_capable(K):
            check_array(K, "K", ndim=2)
            check_array(V, "V", ndim=2)
            for j in range(K.shape[0]):
                self.update(K[j], V[j])
            return
        self._batch(K, V, None)

    def stream(self, K, V, Q):
        """Run Alg. 1 over a whole stream: update with (k_j, v_j), then z_j = query(q_j); returns (n, ...)."""
        check_array(K, "K", ndim=2, last_dim=self.d, min_rows=1, finite=False)
        check_array(V, "V", ndim=2, min_rows=1, finite=False)
        check_array(Q, "Q", ndim=2, last_dim=self.d, finite=False)
        if not Q.shape[0] == K.shape[0] == V.shape[0]:
            raise InputError(f"Q, K and V must have the same number of rows, got {Q.shape[0]}, {K.shape[0]} and {V.shape[0]}")
        xp = namespace(K, V, Q, names="K, V and Q")
        out = []
        if not self._device_capable(K):
            for name, X in (("K", K), ("V", V), ("Q", Q)):
                check_array(X, name, ndim=2)
            for j in range(K.shape[0]):
                self.update(K[j], V[j])
                out.append(self.query(Q[j]))
            return xp.stack(out, axis=0)
        return xp.stack(self._batch(K, V, Q), axis=0)  # on the device: one read per token, m' for the query's sums

    # ------------------------------------------------------------------------------ inspection
    def num_clusters(self) -> int:
        """m' = |D|."""
        return self.m

    def num_stored(self) -> int:
        """Vectors held: representatives and cluster samples (m' (1 + R t) keys) plus M (R s pairs)."""
        return self.m * (1 + self.R * self.t) + (self.R * self.s if self.n else 0)

    def memory_floats(self) -> int:
        """Floats of the algorithm's state: x_i, S_i, n_i per cluster; M's keys, values and weights; mu."""
        if not self.n:
            return 0
        return self.m * (self.d * (1 + self.R * self.t) + 1) + self.R * self.s * (self.d + self.dv + 1) + 1

    def kept_indices(self) -> np.ndarray:
        """Sorted stream indices of every token held somewhere in the state (representatives, S, M)."""
        if not self.n:
            return np.zeros(0, dtype=np.int64)
        parts = [to_numpy(self._rep_index[:self.m]), to_numpy(self._Sidx[:self.m]).ravel(), to_numpy(self._Midx).ravel()]
        return np.unique(np.concatenate(parts)).astype(np.int64)

    def assignments(self) -> np.ndarray:
        """Cluster label of every token so far (needs ``track=True``)."""
        if not self.track:
            raise InputError("assignments() needs SubGen(..., track=True)")
        if self._on_device:
            xp = self._xp
            return to_numpy(xp.concat(self._labels)).astype(np.int64) if self._labels else np.zeros(0, np.int64)
        return np.asarray(self._labels, dtype=np.int64)

    def state(self) -> SubGenState:
        if not self.n:
            raise InputError("state() on an empty stream")
        m = self.m
        return SubGenState(to_numpy(self._X[:m]).copy(), to_numpy(self._rep_index[:m]).copy(),
                           to_numpy(self._counts[:m]).copy(),
                           to_numpy(self._Sidx[:m]).copy(), to_numpy(self._S[:m]).copy(), to_numpy(self._Midx).copy(),
                           to_numpy(self._Mk).copy(), to_numpy(self._Mv).copy(), self.mu, self.n)
