"""Assertions for a compressor's tests, with messages that say what was measured against what.

:func:`assert_attention_error` checks one estimate against an error bound at a named scale and, on failure,
prints the error, the bound, the constant the estimate achieves, the stream's family and the call that rebuilds
the stream. :func:`assert_beats` runs the battery's comparison of a method with one control at equal memory on
streams and fails unless the method is significantly better, printing the median ratio, its interval, the win
count and the smallest stream on which the method lost.
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms.validation import InputError, check_array, check_real

from kvbounds.streams import KVStream

__all__ = ["SCALES", "attention_error", "assert_attention_error", "assert_beats"]

# the error scales a bound may be stated in (eps times this quantity)
SCALES = {
    "softmax_V_F": "||softmax||_2 ||V||_F (BalanceKV-NeurIPS Thm 3.1)",
    "softmax_V_op": "||softmax||_2 ||V||_op",
    "relative": "||exact attention||",
    "absolute": "1",
}


def _estimate_of(estimate, query):
    from kvbounds.algorithms.compressed_kv import CompressedKV
    if isinstance(estimate, CompressedKV):
        est = estimate.estimate(np.asarray(query, np.float64))
        what = "the CompressedKV's estimate"
    elif callable(estimate):
        est, what = estimate(query), "the estimate function's answer"
    else:
        est, what = estimate, "estimate"
    try:
        return np.asarray(est, np.float64).reshape(-1)
    except (TypeError, ValueError) as e:
        raise InputError(f"{what} must be real numbers (the attention output, shape (dv,)), got "
                         f"{type(est).__name__}: {' '.join(str(e).split())[:100]}") from None


def attention_error(estimate, stream: KVStream, query, *, scale: str = "softmax_V_F", upto: int | None = None
                    ) -> tuple[float, float, float]:
    """(error, scale value, zeros' error): ``||estimate - exact||``, the scale's value on this stream and query,
    and the error of returning zeros. ``estimate``: the estimated attention output (dv,), a
    :class:`~kvbounds.algorithms.compressed_kv.CompressedKV` (its estimate for ``query``, with 1/sqrt(d) as the
    logit factor and the cache's heads flattened), or a function of the query. ``upto``: the prefix the exact
    attention reads (default the whole stream)."""
    if not isinstance(stream, KVStream):
        raise InputError(f"stream must be a KVStream (kvbounds.streams.make_stream), got {type(stream).__name__}")
    if scale not in SCALES:
        raise InputError(f"scale must be one of {tuple(SCALES)}, got {scale!r}")
    q = check_array(np.asarray(query, np.float64), "query", ndim=1, last_dim=stream.d)
    est = _estimate_of(estimate, q)
    j = stream.n if upto is None else upto
    exact = stream.attention(q, j)
    if est.shape != exact.shape:
        raise InputError(f"the estimate has {est.size} entries; the attention output has {exact.size} (dv)")
    V = stream.V[:j]
    value = {"softmax_V_F": lambda: np.linalg.norm(stream.weights(q, j)) * np.linalg.norm(V),
             "softmax_V_op": lambda: np.linalg.norm(stream.weights(q, j)) * np.linalg.norm(V, 2),
             "relative": lambda: np.linalg.norm(exact), "absolute": lambda: 1.0}[scale]()
    err = float(np.linalg.norm(est - exact)) if np.all(np.isfinite(est)) else math.inf
    return err, float(value), float(np.linalg.norm(exact))


def assert_attention_error(estimate, stream: KVStream, query, eps: float, scale: str = "softmax_V_F", *,
                           upto: int | None = None, informative: bool = False) -> float:
    """Assert ``||estimate - exact attention|| <= eps * scale`` for ``query`` on ``stream`` (``scale``: one of
    :data:`SCALES`); returns the constant achieved, error / scale. ``informative=True`` also fails when returning
    zeros meets the bound (a bound that doing nothing meets is no evidence for the estimate: vacuous on this
    stream). The message gives the error and the bound, the constant (proven bound: eps; achieved: error / scale),
    zeros' error, the stream's family and the ``make_stream(...)`` call that rebuilds it."""
    eps = check_real(eps, "eps", minimum=0.0)
    if not isinstance(informative, (bool, np.bool_)):
        raise InputError(f"informative must be True or False, got {informative!r}")
    err, value, zeros = attention_error(estimate, stream, query, scale=scale, upto=upto)
    bound = eps * value
    achieved = err / value if value > 0 else (0.0 if err == 0 else math.inf)
    where = (f"on the {stream.family} stream {stream.describe()}, query of norm "
             f"{float(np.linalg.norm(query)):.4g}" + ("" if upto is None else f", prefix of {upto} tokens"))
    if not err <= bound:
        raise AssertionError(
            f"attention error {err:.6g} > bound {bound:.6g} = eps {eps:g} x {SCALES[scale]} ({value:.6g}); "
            f"constant achieved {achieved:.4g} (error / scale; the bound asks <= {eps:g}); returning zeros: error "
            f"{zeros:.6g} ({zeros / value if value else math.inf:.4g} x scale) {where}")
    if informative and zeros <= bound:
        raise AssertionError(
            f"vacuous on this stream: returning zeros (error {zeros:.6g}) meets the bound {bound:.6g} = eps {eps:g} "
            f"x {SCALES[scale]} ({value:.6g}) too; the estimate's error is {err:.6g} (constant {achieved:.4g}) {where}")
    return achieved


def assert_beats(method, control: str, streams, *, fraction: float = 0.25, queries: int | None = None,
                 alpha: float = 0.05) -> dict:
    """Assert that ``method`` (a SPEC as ``kvbounds evaluate`` reads it: a registered name, ``kvpress:NAME``,
    ``module:NAME``, or a press / compressor object) is better than the battery's ``control`` at equal memory
    (``fraction`` of the stream's floats) on ``streams`` (KVStreams, at least the battery's minimum count):
    the one rule's call (:func:`kvbounds.verdict.paired_calls`) must be "better". Returns the comparison
    (call, effect, interval, wins). The message gives the call, the effect (method error / control error, the
    Hodges-Lehmann estimate) with its 95% interval, the win count, the smallest detectable ratio, the families and
    the smallest stream on which the method lost."""
    from kvbounds.evaluation import compare_on_streams
    from kvbounds.verdict import call_words, fmt
    res = compare_on_streams(method, control, streams, fraction=fraction, queries=queries, alpha=alpha)
    if res["call"] != "better":
        lost = res.get("smallest_loss")
        raise AssertionError(
            f"{res['method']} is not better than {control} at {fraction:.0%} of the cache's floats: "
            f"{call_words(res, family=False)} (method error / control error [95% interval], streams "
            f"won); smallest detectable ratio at n = {res['streams']}: beyond {fmt(res['detectable'])} either way; "
            f"families "
            f"{', '.join(res['families'])}" + (f"; smallest stream it lost on: {lost}" if lost else ""))
    return res
