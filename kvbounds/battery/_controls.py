"""The battery: the controls every error-bound claim, decode claim and compression method is compared with, at
equal memory, counted the same way on both sides.

A control is a cache at the same float budget as the method's, built by a function with the method registry's
contract (:mod:`kvbounds.methods`)::

    compress(K, V, floats, rng, *, sink, window, block_size=64, Q=None) -> CompressedKV

K (..., n, d), V (..., n, dv) numpy arrays (heads leading, or one head); ``floats`` per head. The controls:

  * doing nothing: :func:`zeros` (the estimate 0; no float) and :func:`mean` (one token: the mean key and the mean
    value, weight n; for attention the mean of the values, for logits the mean key's);
  * the field's standard baselines: :func:`streaming_llm` (the first ``sink`` tokens, 4 when the method keeps none
    (:data:`N_SINK`, kvpress's StreamingLLMPress default), and the most recent ones, weights 1) and :func:`uniform`
    (the method's sink and window exact, the middle sampled uniformly without replacement, weight n_mid / kept);
  * the ingredient ablation: the method with its core ingredient replaced by chance at the same memory (BalanceKV
    and MergeAndReduce: fair coins for the walk; SubGen: uniform samples for its clusters and its l2 samples;
    Frequent Directions: a Gaussian random-projection sketch with as many rows as its 2l-row buffer; the subspace
    method: bases from a Gaussian random projection of its middle; the streaming presses: random halving). It
    is the method's own: a registered method names it in its ``ablation`` field (:func:`ablation_of`; the package's
    are in :mod:`kvbounds.battery`, with the pieces the claims' checks use: ``split_uniform``,
    ``random_projection_sketch``, ``random_basis``), the claims' streaming algorithms take a switch
    (``BalanceKV(signs="random")``, ...).

Memory (:func:`cache_floats`, the one count for method and control): a key for every token used on either side, a
value for every token in the numerator, each at its own width; log-weights: none for exact tokens (positional), one
per head and side when constant, else one per token; plus the cache's ``extra_floats`` (a basis). The claims'
streaming algorithms hold state that is not a cache; :func:`method_floats` counts it in the same units, weights,
counts and working buffers included (a MergeAndReduce's unreduced batch, Frequent Directions' 2l-row buffer). A
control gets the floats the method holds: token controls keep ``floats // (d + dv)`` tokens (less one float for
uniform's weight), never more than the prefix.

Not compressing is not a test: a method that holds at least the whole stream's floats (:func:`stream_floats`) is
"not tested" (:func:`compression_problem`), since every control at that memory is exact.

Estimates of a control's cache (also of a method's :class:`CompressedKV`): :func:`attention` (softmax attention),
:func:`numerator` (the unnormalised sum sum_i e^{<q, k_i> scale + a_i} v_i as (m, u) with the sum e^m u),
:func:`log_partition` (log sum_i e^{<q, k_i> scale + b_i}); an empty cache (zeros) gives 0, (-inf, 0) and -inf.
:func:`run` compresses with a method and builds every control at the floats it holds. :func:`sketch_controls` is
the battery for a row sketch of a matrix A (Frequent Directions' covariance and subspace claims).

The power rule that turns each claim's metric for the method and the controls into calls (the one rule of
:mod:`kvbounds.verdict`: better / leaning better / tied / leaning worse / worse / not attainable / not tested) is
:func:`kvbounds.battery.power_vs_controls`.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from kvbounds.algorithms.arrays import to_numpy
from kvbounds.algorithms.compressed_kv import CompressedKV, memory_floats
from kvbounds.algorithms.validation import InputError, check_array, check_int, check_rng, check_scale

__all__ = ["N_SINK", "CONTROLS", "DOING_NOTHING", "LABELS", "zeros", "mean", "streaming_llm", "uniform",
           "CONTROL_FUNCTIONS", "controls", "run", "streaming_llm_indices", "uniform_indices", "ablation_of", "cache_floats", "method_floats", "stream_floats",
           "tokens_for",
           "compression_problem", "attention", "numerator", "log_partition", "relative_error", "sketch_controls",
           "floats_record"]

N_SINK = 4
CONTROLS = ("zeros", "mean", "streaming_llm", "uniform", "ablation")
DOING_NOTHING = ("zeros", "mean")
LABELS = {"zeros": "zeros", "mean": "the mean", "streaming_llm": "StreamingLLM", "uniform": "uniform",
          "ablation": "the ablation"}


# ------------------------------------------------------------------ inputs
def check_kv(K, V) -> tuple[np.ndarray, np.ndarray]:
    """K (..., n, d), V (..., n, dv): finite numpy float arrays of the same heads and tokens, n >= 1."""
    for x, name in ((K, "K"), (V, "V")):
        if not isinstance(x, np.ndarray):
            raise InputError(f"{name} must be a numpy array (..., n, width), got {type(x).__name__}")
    check_array(K, "K", ndim=tuple(range(2, 8)), min_rows=1)
    check_array(V, "V", ndim=K.ndim)
    if K.shape[:-1] != V.shape[:-1]:
        raise InputError(f"K and V must hold the same heads and tokens, got {K.shape} and {V.shape}")
    return K, V


def _sizes(floats, sink, window) -> tuple[int, int, int]:
    return (check_int(floats, "floats"), check_int(sink, "sink"), check_int(window, "window"))


def _cache(K, V, idx, logw) -> CompressedKV:
    """The selection ``idx`` (m,) of every head with log-weights ``logw`` (m,) (a = b)."""
    lead = K.shape[:-2]
    lw = np.broadcast_to(np.asarray(logw, np.float64), lead + (len(idx),)).copy()
    return CompressedKV(K[..., idx, :], V[..., idx, :], lw, lw.copy())


# ------------------------------------------------------------------ the controls (the method contract)
def zeros(K, V, floats: int = 0, rng=None, *, sink: int = 0, window: int = 0, block_size: int = 64, Q=None):
    """Doing nothing: an empty cache, whose estimate is 0 (attention, numerator and partition function alike).
    Memory: 0 floats."""
    K, V = check_kv(K, V)
    _sizes(floats, sink, window)
    lead = K.shape[:-2]
    empty = np.zeros(lead + (0,))
    return CompressedKV(K[..., :0, :], V[..., :0, :], empty, empty.copy())


def mean(K, V, floats: int = 0, rng=None, *, sink: int = 0, window: int = 0, block_size: int = 64, Q=None):
    """Doing nothing beyond one summary: one token, the mean key and the mean value, with weight n (log-weight
    log n on both sides), so its attention output is the mean of the values, its logit the mean key's and its
    numerator n e^{<mean k, q> scale} times the mean value. Memory: d + dv + 1 floats (one token and its weight)."""
    K, V = check_kv(K, V)
    _sizes(floats, sink, window)
    n = K.shape[-2]
    lw = np.full(K.shape[:-2] + (1,), math.log(n))
    with np.errstate(over="ignore", invalid="ignore"):
        Km, Vm = K.mean(-2, keepdims=True), V.mean(-2, keepdims=True)
    if not (np.all(np.isfinite(Km)) and np.all(np.isfinite(Vm))):
        raise InputError("the mean of the keys or values overflows float64")
    return CompressedKV(Km, Vm, lw, lw.copy())


def tokens_for(floats: int, d: int, dv: int, weights: int = 0) -> int:
    """Tokens (a key of width d and a value of width dv each) that ``floats`` hold besides ``weights`` floats."""
    return max(int(floats) - int(weights), 0) // (int(d) + int(dv))


def streaming_llm_indices(n: int, tokens: int, sink: int = 0) -> np.ndarray:
    """The tokens StreamingLLM keeps of n: the first ``sink`` (:data:`N_SINK` when 0) and the most recent ones,
    ``tokens`` in all (every token when tokens >= n)."""
    n, tokens, sink = check_int(n, "n"), check_int(tokens, "tokens"), check_int(sink, "sink")
    m = min(tokens, n)
    s = min(sink or N_SINK, m)
    return np.concatenate([np.arange(s), np.arange(n - (m - s), n)]) if m < n else np.arange(n)


def uniform_indices(n: int, tokens: int, rng, sink: int = 0, window: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(indices, log-weights) of :func:`uniform`'s cache of ``tokens`` tokens of n: the first ``sink`` and last
    ``window`` exact (log-weight 0), the middle sampled uniformly without replacement with log-weight
    log(n_mid / kept); every token exact when tokens >= n; when the sink and window fill ``tokens``, the first
    tokens and the most recent ones (no middle sample)."""
    n, tokens, sink, window = (check_int(x, name) for x, name in ((n, "n"), (tokens, "tokens"), (sink, "sink"),
                                                                  (window, "window")))
    check_rng(rng)
    if tokens >= n:
        return np.arange(n), np.zeros(n)
    s, w = min(sink, n), min(window, max(n - sink, 0))
    n_mid = n - s - w
    if tokens <= s + w or n_mid <= 0:
        s = min(s, tokens)
        idx = np.concatenate([np.arange(s), np.arange(n - (tokens - s), n)])
        return idx, np.zeros(len(idx))
    k = tokens - s - w
    mid = s + np.sort(rng.choice(n_mid, k, replace=False))
    idx = np.concatenate([np.arange(s), mid, np.arange(n - w, n)])
    return idx, np.concatenate([np.zeros(s), np.full(k, math.log(n_mid / k)), np.zeros(w)])


def streaming_llm(K, V, floats: int, rng=None, *, sink: int = 0, window: int = 0, block_size: int = 64, Q=None):
    """StreamingLLM (Xiao et al. 2023; kvpress's StreamingLLMPress): the first ``sink`` tokens (:data:`N_SINK` = 4
    when the method keeps no sink of its own, ``sink`` = 0) and the most recent ones, as many as ``floats`` hold
    (``floats // (d + dv)`` tokens), weights 1. Memory: tokens x (d + dv) floats (no weight: positional)."""
    K, V = check_kv(K, V)
    floats, sink, window = _sizes(floats, sink, window)
    idx = streaming_llm_indices(K.shape[-2], tokens_for(floats, K.shape[-1], V.shape[-1]), sink)
    return _cache(K, V, idx, np.zeros(len(idx)))


def uniform(K, V, floats: int, rng, *, sink: int = 0, window: int = 0, block_size: int = 64, Q=None):
    """A weighted uniform sample: the method's first ``sink`` and last ``window`` tokens exact, the middle sampled
    uniformly without replacement (the same draw for every head), each kept middle token weighted n_mid / kept
    (unbiased for every sum over the middle). Memory: tokens x (d + dv) + 1 floats (one weight); all n tokens
    exact when ``floats`` hold them; when the sink and window alone fill the budget, the first tokens and the most
    recent ones (no middle sample, as :func:`streaming_llm` with the method's sink)."""
    K, V = check_kv(K, V)
    floats, sink, window = _sizes(floats, sink, window)
    check_rng(rng)
    n, d, dv = K.shape[-2], K.shape[-1], V.shape[-1]
    if floats >= n * (d + dv):
        return _cache(K, V, np.arange(n), np.zeros(n))
    tokens = tokens_for(floats, d, dv, weights=1)
    if tokens <= min(sink, n) + min(window, max(n - sink, 0)):
        # no room for a weighted middle sample: the first tokens and the most recent ones, no weight float, so
        # never more floats than the method's (a weighted token would be the method's floats + 1)
        m = min(tokens_for(floats, d, dv), n)
        first = min(sink, m)
        idx = np.concatenate([np.arange(first), np.arange(n - (m - first), n)]).astype(np.int64)
        return _cache(K, V, idx, np.zeros(len(idx)))
    idx, logw = uniform_indices(n, tokens, rng, sink, window)
    return _cache(K, V, idx, logw)


CONTROL_FUNCTIONS: dict[str, Callable] = {"zeros": zeros, "mean": mean, "streaming_llm": streaming_llm,
                                          "uniform": uniform}


def ablation_of(method: str) -> Callable | None:
    """The contract function of a registered method's ablation (the registry's ``ablation`` field), or None when
    the method names none."""
    from kvbounds.methods import get_method
    m = get_method(method)
    return get_method(m.ablation).function() if m.ablation else None


def _as_function(method) -> Callable:
    if isinstance(method, str):
        from kvbounds.methods import get_method
        fn = get_method(method).function()
        if fn is None:
            raise InputError(f"method {method!r} runs only on a model's prefill (no compress function)")
        return fn
    if not callable(method):
        raise InputError(f"a method must be a registered name or a compress function, got {type(method).__name__}")
    return method


def controls(K, V, floats: int, rng, *, sink: int = 0, window: int = 0, ablation=None, block_size: int = 64,
             Q=None, names=None) -> dict[str, CompressedKV]:
    """Every control's cache of (K, V) at ``floats`` per head: zeros, the mean, StreamingLLM, uniform, and the
    ablation when one is given (a compress function or a registered method's name, run at the same floats, sink
    and window). ``names``: a subset of :data:`CONTROLS`. Each draws from ``rng`` in this order."""
    check_rng(rng)
    names = CONTROLS if names is None else tuple(names)
    unknown = [n for n in names if n not in CONTROLS]
    if unknown:
        raise InputError(f"unknown control(s) {unknown}; the battery's are {CONTROLS}")
    out = {}
    for name in names:
        if name == "ablation":
            if ablation is not None:
                out[name] = _as_function(ablation)(K, V, floats, rng, sink=sink, window=window,
                                                   block_size=block_size, Q=Q)
        else:
            out[name] = CONTROL_FUNCTIONS[name](K, V, floats, rng, sink=sink, window=window, block_size=block_size,
                                                Q=Q)
    return out


def run(method, K, V, floats: int, rng, *, sink: int = 0, window: int = 0, block_size: int = 64, Q=None,
        ablation=None) -> dict[str, CompressedKV]:
    """The method's cache (key ``"method"``) and every control's at the floats the method's cache holds
    (:func:`cache_floats`, not the budget asked: a method below its budget is compared at what it holds).
    ``method``: a compress function or a registered method's name; ``ablation``: a compress function, a registered
    name, or None (a registered method's own ``ablation``, if it names one). Every argument is checked before the
    method runs (InputError naming it: K, V, ``floats``, ``sink``, ``window``, ``block_size``, ``rng``, Q, the
    method and the ablation), and the method's answer after (a :class:`CompressedKV`)."""
    K, V = check_kv(K, V)
    floats, sink, window = _sizes(floats, sink, window)
    check_int(block_size, "block_size", minimum=1)
    check_rng(rng)
    if Q is not None:
        if not isinstance(Q, np.ndarray):
            raise InputError(f"Q must be None or a numpy array (..., m, d) of K's heads, got {type(Q).__name__}")
        check_array(Q, "Q", ndim=K.ndim, last_dim=K.shape[-1])
        if Q.shape[:-2] != K.shape[:-2]:
            raise InputError(f"Q must hold K's heads {K.shape[:-2]}, got shape {Q.shape}")
    fn = _as_function(method)
    if ablation is None and isinstance(method, str):
        ablation = ablation_of(method)
    elif ablation is not None:
        _as_function(ablation)
    c = fn(K, V, floats, rng, sink=sink, window=window, block_size=block_size, Q=Q)
    if not isinstance(c, CompressedKV):
        raise InputError(f"the method returned {type(c).__name__}, not a CompressedKV (the method contract: "
                         "kvbounds.methods)")
    held = cache_floats(c) // max(int(np.prod(K.shape[:-2], dtype=np.int64)), 1)
    return {"method": c, **controls(K, V, held, rng, sink=sink, window=window, ablation=ablation,
                                    block_size=block_size, Q=Q)}


# ------------------------------------------------------------------ memory
def cache_floats(c: CompressedKV) -> int:
    """Floats a cache holds, over all its heads (:func:`kvbounds.algorithms.compressed_kv.memory_floats`: keys,
    values at their own widths, log-weights, extra floats)."""
    return memory_floats(c)


def stream_floats(n: int, d: int, dv: int = 0) -> int:
    """Floats of the whole stream of ``n`` tokens: n (d + dv), keys and values (dv = 0: keys or rows only)."""
    return check_int(n, "n") * (check_int(d, "d") + check_int(dv, "dv"))


def compression_problem(method: float, stream: float) -> str:
    """"" when the method holds fewer floats than the whole stream, else the reason it is not tested
    ("does not compress: X floats for Y")."""
    if not (isinstance(method, (int, float, np.integer, np.floating)) and isinstance(stream, (int, float, np.integer,
                                                                                            np.floating))):
        raise InputError(f"method and stream floats must be numbers, got {method!r} and {stream!r}")
    return "" if method < stream else f"does not compress: {int(method)} floats for {int(stream)}"


def floats_record(method: int, stream: int, controls_floats: dict | None = None) -> dict:
    """The memory fields every battery record carries: the method's floats, the whole stream's, their ratio
    (``fraction``) and each control's floats."""
    return dict(method=int(method), stream=int(stream), fraction=float(method) / float(stream) if stream else math.nan,
                controls={k: int(v) for k, v in sorted((controls_floats or {}).items())})


def _cells_floats(mr) -> int:
    """A MergeAndReduce's state: every held token (key and value; its unreduced batch included) and one weight
    (2^i) per non-empty cell."""
    sizes = mr.cell_sizes()
    return sum(sizes) * (mr.d + mr.s) + sum(1 for k in sizes if k)


def method_floats(obj) -> int:
    """Floats a method's state holds, in the battery's units (:func:`cache_floats` for a cache):

      * :class:`CompressedKV`: :func:`cache_floats`;
      * MergeAndReduce: its held tokens (key d + value s each, the unreduced batch C^0 included) and one weight per
        non-empty cell;
      * BalanceKV: each value-norm bucket's MergeAndReduce as above, the denominator's keys (d each: its values are
        the constant 1, not stored) and one weight per non-empty cell, plus vmax (1);
      * SubGen: its own ``memory_floats()`` (representatives, per-cluster samples, counts, value samples with their
        weights, mu);
      * Frequent Directions: the buffer it streams with, 2l rows of d, and Delta (1);
      * anything with ``memory_floats()``: that count."""
    from kvbounds.algorithms.balance_kv import BalanceKV
    from kvbounds.algorithms.frequent_directions import FrequentDirections
    from kvbounds.algorithms.merge_and_reduce import MergeAndReduce
    if isinstance(obj, CompressedKV):
        return cache_floats(obj)
    if isinstance(obj, MergeAndReduce):
        return _cells_floats(obj)
    if isinstance(obj, BalanceKV):
        num = sum(_cells_floats(mr) for mr in obj.numerators.values())
        den = obj.denominator
        den_f = 0 if den is None else sum(den.cell_sizes()) * obj.d + sum(1 for k in den.cell_sizes() if k)
        return num + den_f + (1 if obj.j else 0)
    if isinstance(obj, FrequentDirections):
        return 2 * obj.ell * obj.d + 1 if obj.n_rows else 0
    if hasattr(obj, "memory_floats"):
        return int(obj.memory_floats())
    raise InputError(f"no float count for {type(obj).__name__}: give it a memory_floats() method")


# ------------------------------------------------------------------ estimates from a cache
def _logits(c: CompressedKV, q, scale):
    if not isinstance(c, CompressedKV):
        raise InputError(f"the cache must be a CompressedKV, got {type(c).__name__}")
    if not isinstance(q, np.ndarray):
        raise InputError(f"q must be a numpy array (..., d), got {type(q).__name__}")
    keys = np.asarray(to_numpy(c.keys), np.float64)
    check_array(q, "q", ndim=tuple(range(1, 8)), last_dim=keys.shape[-1])
    q = q.astype(np.float64)
    scale = check_scale(scale, keys.shape[-1])
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.einsum("...md,...d->...m", keys, q) * scale
    if not np.all(np.isfinite(x)):
        raise InputError("the logits <q, k> * scale overflow float64")
    return x


def numerator(c: CompressedKV, q, scale: float | None = None):
    """(m, u) with sum_i e^{<q, k_i> scale + a_i} v_i = e^m u, per head (m = -inf, u = 0 for an empty numerator:
    zeros). ``q`` (..., d) broadcasting against the heads; ``scale`` default 1/sqrt(d)."""
    return _numerator(c, _logits(c, q, scale))


def _numerator(c: CompressedKV, logits):
    x = logits + np.asarray(to_numpy(c.log_w_num), np.float64)
    V = np.asarray(to_numpy(c.values), np.float64)
    if x.shape[-1] == 0 or not np.any(np.isfinite(x)):
        return np.full(x.shape[:-1], -math.inf)[()], np.zeros(x.shape[:-1] + V.shape[-1:])
    m = x.max(-1)
    w = np.exp(x - m[..., None])
    return m[()], np.einsum("...m,...me->...e", w, V)


def log_partition(c: CompressedKV, q, scale: float | None = None):
    """log sum_i e^{<q, k_i> scale + b_i} per head (-inf for an empty cache: zeros)."""
    return _log_partition(c, _logits(c, q, scale))


def _log_partition(c: CompressedKV, logits):
    x = logits + np.asarray(to_numpy(c.log_w_den), np.float64)
    if x.shape[-1] == 0 or not np.any(np.isfinite(x)):
        return np.full(x.shape[:-1], -math.inf)[()]
    m = x.max(-1)
    return (m + np.log(np.exp(x - m[..., None]).sum(-1)))[()]


def attention(c: CompressedKV, q, scale: float | None = None) -> np.ndarray:
    """The cache's attention output sum_i e^{l_i + a_i} v_i / sum_i e^{l_i + b_i}, l_i = <q, k_i> scale, per head;
    0 for an empty cache (zeros)."""
    x = _logits(c, q, scale)
    (m, u), lz = _numerator(c, x), _log_partition(c, x)
    m, lz = np.asarray(m, np.float64), np.asarray(lz, np.float64)
    if u.size == 0 or np.all(m == -math.inf):
        return np.zeros_like(u)
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.exp(np.where(m == -math.inf, -math.inf, m - lz))[..., None] * u
    if not np.all(np.isfinite(out)):
        raise InputError("the attention estimate overflows float64 (a numerator without a matching denominator)")
    return out


def relative_error(est: np.ndarray, exact: np.ndarray) -> float:
    """The practitioner's metric: mean over queries of ||est - exact|| / ||exact|| (rows of (m, dv) arrays, or one
    (dv,) row), in float64; inf where an estimate is not finite (undefined: the worst), or where exact attention is 0
    and the estimate is not. Refused (InputError): arrays that are not real numpy arrays of one shape (>= 1
    dimension), a non-finite exact."""
    for x, name in ((est, "est"), (exact, "exact")):
        if not isinstance(x, np.ndarray) or x.dtype.kind not in "fiu" or x.ndim < 1:
            raise InputError(f"{name} must be a real numpy array (queries, dv) or (dv,), got "
                             f"{getattr(x, 'dtype', type(x).__name__)} of shape {getattr(x, 'shape', None)}")
    check_array(exact, "exact", ndim=exact.ndim)
    if est.shape != exact.shape:
        raise InputError(f"est {est.shape} and exact {exact.shape} must have one shape")
    est, exact = est.astype(np.float64), exact.astype(np.float64)
    if not np.all(np.isfinite(est)):
        return math.inf
    with np.errstate(over="ignore", invalid="ignore"):
        num = np.linalg.norm(est - exact, axis=-1)
    den = np.linalg.norm(exact, axis=-1)
    return float(np.mean(np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num > 0, math.inf, 0.0))))


# ------------------------------------------------------------------ the battery for a row sketch (FD)
def sketch_controls(A, floats: int, rng, *, ablation: Callable | None = None) -> dict[str, np.ndarray]:
    """The battery for a sketch S (rows of width d) of A (n, d), at ``floats`` (rows x d, plus one weight where
    scaled): ``zeros`` (no row), ``mean`` (one row sqrt(n) mean(A): S^T S = n mean mean^T), ``streaming_llm``
    (the first 4 rows and the most recent ones), ``uniform`` (a uniform sample of rows without replacement, each
    scaled by sqrt(n / kept): unbiased for A^T A; one float for the scale) and the ``ablation`` when given
    (``ablation(A, floats, rng) -> rows``). Each is a (rows, d) array; the caller counts their floats as rows x d
    (+ 1 for a scale)."""
    if not isinstance(A, np.ndarray):
        raise InputError(f"A must be a numpy array (n, d), got {type(A).__name__}")
    check_array(A, "A", ndim=2, min_rows=1)
    floats = check_int(floats, "floats")
    check_rng(rng)
    n, d = A.shape
    m = min(floats // d, n)
    s = min(N_SINK, m)
    out = {"zeros": A[:0].copy(), "mean": math.sqrt(n) * A.mean(0, keepdims=True),
           "streaming_llm": np.concatenate([A[:s], A[n - (m - s):]]) if m < n else A.copy()}
    k = min(max(floats - 1, 0) // d, n)
    if floats >= n * d:
        out["uniform"] = A.copy()
    else:
        idx = np.sort(rng.choice(n, k, replace=False))
        out["uniform"] = A[idx] * math.sqrt(n / k) if k else A[:0].copy()
    if ablation is not None:
        out["ablation"] = np.asarray(ablation(A, floats, rng), np.float64)
    return out
