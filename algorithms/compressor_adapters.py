"""KV-cache compressors as INDEX-game players (claim LB.index, BalanceKV-NeurIPS Thm 3.2, App. C.1).

Alice streams U (:meth:`kvbounds.algorithms.index_reduction.IndexInstance.stream`) into a compressor; its state is
the message; Bob queries q_i = k_i and decodes with :func:`kvbounds.algorithms.index_reduction.bob_decode`.
Every adapter exposes ``consume(K, V)``, ``query(q) -> (d,)``, ``num_stored()`` (key/value pairs held)
and ``state_bits(n)``: an upper bound on the bits its state can carry about Alice's x, which the
Fano ceiling (:func:`kvbounds.theory.lower_bound.fano_success_ceiling`) turns into a bound on Bob's success.
A stored pair (k_i, v_i) names its slot pi(i), i.e. bit i, given the public coins: log2 n bits.

* :class:`UniformSampling`   M pairs of U uniformly without replacement (algorithms/uniform_sampling.py);
* :class:`StreamingBalanceKV` BalanceKV-NeurIPS Alg. 1 (algorithms/balance_kv.py), batch size t and T levels;
* :class:`BlockwiseBalanceKV` BalanceKV-NeurIPS App. B (algorithms/blockwise_balance_kv.py), |U| // 2^T pairs kept;
* :class:`SubGenSketch`      SubGen Alg. 1 (algorithms/subgen.py), only when that module imports;
* :class:`Clairvoyant`        a negative control: it is told Bob's index and keeps that pair only.
"""
from __future__ import annotations

import importlib
import math

import numpy as np

from kvbounds.algorithms.arrays import array_namespace, like, to_numpy

from .attention import exact_attention
from .balance_kv import BalanceKV, DegenerateEstimate
from .blockwise_balance_kv import compress_cache, weighted_attention
from .index_reduction import DECODERS, IndexInstance, bob_decode, log2_binomial, random_instance
from .uniform_sampling import uniform_select
from .validation import InputError, check_array, check_int, check_positive, check_rng, check_seed, namespace

__all__ = ["COMPRESSORS", "subgen_class", "UniformSampling", "StreamingBalanceKV", "BlockwiseBalanceKV", "SubGenSketch",
           "Clairvoyant", "make_compressor", "play"]

COMPRESSORS = ("uniform", "balancekv", "blockwise", "subgen")


def subgen_class():
    """SubGen if algorithms/subgen.py imports (another engineer's module), else None."""
    try:
        return importlib.import_module("kvbounds.algorithms.subgen").SubGen
    except (ImportError, AttributeError):
        return None


def _check_stream(K, V) -> None:
    check_array(K, "K", ndim=2, min_rows=1)
    check_array(V, "V", ndim=2)
    if K.shape[0] != V.shape[0]:
        raise InputError(f"K and V must have the same number of rows, got {K.shape[0]} and {V.shape[0]}")
    namespace(K, V, names="K and V")


def _check_consumed(comp) -> None:
    if getattr(comp, "K", True) is None:
        raise InputError(f"{type(comp).__name__}.query before consume(K, V)")


def _log2(x: float) -> float:
    return math.log2(max(x, 1))


class UniformSampling:
    """Keep M pairs of U uniformly at random; the estimate is softmax attention over them (weights n/M cancel)."""
    name = "uniform"

    def __init__(self, M: int, seed: int):
        if isinstance(M, bool) or not isinstance(M, (int, np.integer)) or M < 1:
            raise InputError(f"M must be an integer >= 1, got {M!r}")
        self.M, self.rng = int(M), np.random.default_rng(check_seed(seed))
        self.K = self.V = None

    def consume(self, K, V) -> None:
        _check_stream(K, V)
        xp, idx = array_namespace(K), like(uniform_select(K.shape[0], min(self.M, K.shape[0]), self.rng), K)
        self.K, self.V = xp.take(K, idx, axis=0), xp.take(V, idx, axis=0)

    def query(self, q):
        _check_consumed(self)
        return exact_attention(q, self.K, self.V)

    def num_stored(self) -> int:
        return int(self.K.shape[0])

    def state_bits(self, n: int) -> float:
        return log2_binomial(n, self.num_stored()) + _log2(n + 1)


class StreamingBalanceKV:
    """BalanceKV-NeurIPS Alg. 1 fed pair by pair. All values have norm 1 (one bucket, nothing erased). When SoftmaxBalance
    leaves the denominator empty (:class:`DegenerateEstimate`) the estimate is 0: Bob then answers 0."""
    name = "balancekv"

    def __init__(self, d: int, r: float, *, batch_size: int, levels: int, seed: int, eps: float = 0.5,
                 delta: float = 0.01):
        check_positive(r, "r")
        self.bkv = BalanceKV(d, batch_size=batch_size, levels=levels, eps=eps, r=r * (1 + 1e-9), delta=delta,
                             seed=seed)
        self.d, self.levels, self.degenerate = d, levels, 0

    def consume(self, K, V) -> None:
        _check_stream(K, V)
        for k, v in zip(K, V):
            self.bkv.update(k, v)

    def query(self, q):
        try:
            return self.bkv.query(q)
        except DegenerateEstimate:
            self.degenerate += 1
            return np.zeros(self.d, dtype=getattr(q, "dtype", np.float64)) if isinstance(q, np.ndarray) else q * 0

    def num_stored(self) -> int:
        return self.bkv.num_stored()

    def state_bits(self, n: int) -> float:
        # every stored item: its slot (log2 n) and its cell level (log2(T + 1)); plus |U|
        return self.num_stored() * (_log2(n) + _log2(self.levels + 1)) + _log2(n + 1)


class BlockwiseBalanceKV:
    """BalanceKV-NeurIPS App. B: T rounds of blockwise balancing + strict halving over the whole of U (no sink/window)."""
    name = "blockwise"

    def __init__(self, *, levels: int, block_size: int, seed: int):
        self.levels, self.block_size, self.rng = levels, block_size, np.random.default_rng(check_seed(seed))
        self.K = self.V = self.idx = self.logw = None

    def consume(self, K, V) -> None:
        self.K, self.V = K, V
        self.idx, self.logw = compress_cache(K, V, sink=0, window=0, levels=self.levels,
                                             block_size=self.block_size, rng=self.rng)

    def query(self, q):
        _check_consumed(self)
        return weighted_attention(q, self.K, self.V, self.idx, self.logw)

    def num_stored(self) -> int:
        return int(self.idx.shape[-1])

    def state_bits(self, n: int) -> float:
        return log2_binomial(n, self.num_stored()) + _log2(n + 1)


class SubGenSketch:
    """SubGen (SubGen Alg. 1) with keys and queries scaled by d^{-1/4}, so its exp(<q,k>) is this paper's
    exp(<q,k>/sqrt d). ``delta`` (scaled units) far below the distance between distinct keys: every group
    key is its own cluster."""
    name = "subgen"

    def __init__(self, d: int, *, s: int, t: int, seed: int, delta: float = 1e-6):
        cls = subgen_class()
        if cls is None:
            raise InputError("SubGen is not available (algorithms/subgen.py does not import)")
        self.sg, self.scale = cls(d, delta=delta, s=s, t=t, seed=seed), d ** -0.25

    def consume(self, K, V) -> None:
        _check_stream(K, V)
        self.sg.update_many(K * self.scale, V)

    def query(self, q):
        check_array(q, "q", ndim=1)
        return self.sg.query(q * self.scale)

    def num_stored(self) -> int:
        return int(self.sg.num_stored())

    def state_bits(self, n: int) -> float:
        # every stored vector names a slot or a group (<= log2 n); clusters carry a count; plus mu = |U|
        return self.num_stored() * _log2(n) + self.sg.num_clusters() * _log2(n + 1) + _log2(n + 1)


class Clairvoyant:
    """Negative control: told Bob's index i, it stores (k_i, v_i) when x_i = 1 and nothing else. Its one
    pair beats every honest compressor, and the Fano ceiling must reject it."""
    name = "clairvoyant"

    def __init__(self, target: int, d: int):
        self.target, self.d, self.kept = target, d, None

    def consume_instance(self, inst: IndexInstance) -> None:
        self.kept = inst.values[self.target] if inst.bits[self.target] else None

    def query(self, q):
        return np.zeros(self.d) if self.kept is None else self.kept.copy()

    def num_stored(self) -> int:
        return 0 if self.kept is None else 1

    def state_bits(self, n: int) -> float:
        return 1.0     # whether x_i = 1 (i itself is Bob's, not Alice's)


def make_compressor(name: str, setting: int, *, d: int, r: float, u_size: int, seed: int):
    """A compressor of family ``name`` at memory setting ``setting`` (an integer >= 0, larger = more memory):
    uniform M = ceil(|U| / 2^(5-setting)); balancekv batch size 16, T = max(1, 5 - setting) levels (T >= 1:
    with T = 0, MergeAndReduce.cells() drops C^0 whenever a partial batch is buffered); blockwise
    T = 5 - setting (block 32); subgen s = |U| / 2^(5-setting), t = 1."""
    setting = check_int(setting, "setting", minimum=0, maximum=60)
    u_size = check_int(u_size, "u_size", minimum=0)
    check_positive(d, "d", integer=True)
    check_seed(seed, allow_none=False)
    if name == "uniform":
        return UniformSampling(max(1, math.ceil(u_size / 2 ** (5 - setting))), seed)
    if name == "balancekv":
        return StreamingBalanceKV(d, r, batch_size=16, levels=max(1, 5 - setting), seed=seed)
    if name == "blockwise":
        T = max(0, 5 - setting)
        while T and u_size >> T < 1:
            T -= 1
        return BlockwiseBalanceKV(levels=T, block_size=32, seed=seed)
    if name == "subgen":
        return SubGenSketch(d, s=max(1, u_size // 2 ** (5 - setting)), t=1, seed=seed)
    raise InputError(f"compressor must be one of {COMPRESSORS}, got {name!r}")


def play(name: str, setting: int, n: int, d: int, r: float, reps: int, rng: np.random.Generator, *,
         rule: str = "abs") -> dict:
    """``reps`` independent INDEX games against compressor ``name``. Per game: a fresh instance, Bob's i
    uniform, one query q_i; Bob decodes bit i (``correct``) and, from the same answer, every bit of i's
    group (``group_accuracy``). Returns numpy arrays per game plus the memory held."""
    if not isinstance(name, str) or name not in COMPRESSORS + ("clairvoyant",):
        raise InputError(f"name must be one of {COMPRESSORS + ('clairvoyant',)}, got {name!r}")
    check_int(reps, "reps", minimum=1)
    check_rng(rng)
    if not isinstance(rule, str) or rule not in DECODERS:
        raise InputError(f"rule must be one of {DECODERS}, got {rule!r}")
    correct, group_acc, stored, bits = [], [], [], []
    for _ in range(reps):
        inst = random_instance(n, d, r, rng)
        i = int(rng.integers(n))
        seed = int(rng.integers(2**31))
        if name == "clairvoyant":
            comp = Clairvoyant(i, d)
            comp.consume_instance(inst)
        else:
            comp = make_compressor(name, setting, d=d, r=r, u_size=inst.u_size, seed=seed)
            _, K, V = inst.stream()
            if K.shape[0]:
                comp.consume(K, V)
        group = np.flatnonzero(inst.coins.partition[:, 0] == inst.coins.partition[i, 0])
        if inst.u_size == 0:        # nothing streamed: Bob knows |U| = 0 and answers 0
            guesses = {j: 0 for j in group}
            stored.append(0)
            bits.append(math.log2(n + 1))
        else:
            z = to_numpy(comp.query(inst.query(i)))
            guesses = {j: bob_decode(z, j, inst, rule) for j in group}
            stored.append(comp.num_stored())
            bits.append(comp.state_bits(n))
        correct.append(guesses[i] == int(inst.bits[i]))
        group_acc.append(np.mean([guesses[j] == int(inst.bits[j]) for j in group]))
    return dict(correct=np.array(correct), group_accuracy=np.array(group_acc), stored=np.array(stored),
                state_bits=np.array(bits))


# The whole-cache compressors (the end-to-end harness's contract) live in cache_compressors; imported from here too.
from .cache_compressors import (F32_MAX, PROJECT_BYTES, SubGenCompressor, SubspaceCompressor,  # noqa: E402,F401
                                bincount, check_cache, check_traversal, cluster_counts, exact_part, l2_draws,
                                split_budget, unique_counts, with_exact_ends, concat_compressed, released_balancekv)
