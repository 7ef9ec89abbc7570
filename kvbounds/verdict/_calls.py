"""The one rule for "better": a method against a baseline over paired independent units, for every comparison the
package states (the battery's claims, BKV.vs-uniform, the decode claims, the end-to-end comparisons, the
practitioner's table, the leaderboard and ``kvbounds evaluate``'s card all call :func:`paired_calls`).

The unit is an independent stream: a distinct text window, a distinct generation, a distinct synthetic draw. The
caller pairs one number per unit and side (:func:`per_unit`: seeds of a randomized method are summarised by their
median within the unit, never counted as units; layers and heads of one text are one unit). Per comparison:

  * the effect per unit, on the comparison's ``scale``: ``"ratio"`` for errors (log(method / baseline)) or
    ``"difference"`` for scores where a ratio means nothing (log-likelihood, accuracy: method - baseline), rounded
    to :data:`TIE_PRECISION` (the ratio to a relative 1e-9; a difference to 1e-9 of the comparison's largest
    |metric|), so that common scaling, the order of the units or another CPU's last bits cannot make or break a
    tie (a value would have to lie within float noise, ~1e-13, of a rounding boundary);
  * the paired test: Wilcoxon's signed-rank test on the rounded effects, zero effects dropped, tied magnitudes at
    mid-ranks, its null distribution enumerated exactly (up to :data:`EXACT_MAX` units; the normal approximation
    with the tie correction above), two-sided; Holm over the stated family of comparisons (every comparison passed
    in one call);
  * the effect with its interval: the Hodges-Lehmann estimate (the median of the units' pairwise averages) and its
    95% interval (the signed-rank test inverted), as a ratio on the ratio scale;
  * the practical threshold (``threshold``: a ratio of :data:`PRACTICAL_RATIO` either way by default; a difference
    in the metric's units, stated by the caller): an effect inside it is negligible.

The call, symmetric in its two directions:

  ``better`` / ``worse``                   the Holm-adjusted p < alpha and the effect beyond the threshold that way;
  ``leaning better`` / ``leaning worse``   p < alpha before the correction (the interval excludes no effect), not
                                           after it, and the effect beyond the threshold that way;
  ``tied``                                 neither: no difference shown, or one inside the threshold
                                           (``equivalent``: the whole interval inside the threshold band);
  ``not attainable``                       with n units even n wins out of n could not reach a Holm p < alpha (the
                                           smallest attainable adjusted p, m 2^(1-n) for m tests, is >= alpha);
  ``not tested``                           no unit: the baseline did not run, the method does not compress, ...

Each call carries the effect and its interval, the wins (units where the method is better) and losses, n, the
unit, the metric, the p-values (raw and Holm-adjusted), the family's size, the smallest attainable adjusted p and
the smallest effect detectable with 80% power at this n.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Sequence

import numpy as np
from scipy import stats

from kvbounds.algorithms.validation import (InputError, check_choice, check_int, check_probability, check_real,
                                            check_values)
from ._statistics import holm_adjust

CALLS = ("better", "leaning better", "tied", "leaning worse", "worse", "not attainable", "not tested")
ALPHA = 0.05
POWER = 0.8
PRACTICAL_RATIO = 1.05          # an error changed by less than 5% either way is negligible
TIE_PRECISION = 1e-9            # effects are rounded to this (relative) precision before ranking
EXACT_MAX = 400                 # the signed-rank null distribution is enumerated exactly up to this many units
SCALES = ("ratio", "difference")
FLOOR = 1e-300                  # a zero error on the ratio scale (an exact baseline against a positive error)
# the two named metrics of the battery: the theorem's decides the bound checks, the practitioner's the calls
METRICS = {"practitioner": "the practitioner's metric (mean relative attention error over held-out later queries)",
           "theorem": "the theorem's metric (worst checkpoint, current query, the theorem's units)"}
# the battery's controls and the names of older records (read as before, shown under their own labels)
LABELS = {"zeros": "zeros", "mean": "the mean", "streaming_llm": "StreamingLLM", "uniform": "uniform",
          "ablation": "the ablation", "mean_values": "mean of values", "recent": "recent window",
          "random_signs": "random signs", "best_rank": "best rank-l", "mean_keys": "mean of keys"}
ORDER = ("streaming_llm", "uniform", "ablation", "zeros", "mean", "mean_values", "mean_keys", "recent",
         "random_signs", "best_rank")
DOING_NOTHING = ("zeros", "mean", "mean_values", "mean_keys")


def label(name: str) -> str:
    return LABELS.get(name, name)


def control_order(name: str) -> tuple:
    return (ORDER.index(name) if name in ORDER else len(ORDER), name)


def metric_words(metric: str) -> str:
    """A call's metric in words: the two named metrics of :data:`METRICS`, anything else as it is."""
    return METRICS.get(metric, metric)


@dataclasses.dataclass
class Comparison:
    """One comparison of a family: the method's and the baseline's metric over the same units (one number per
    unit and side, :func:`per_unit`). ``family``: where (a stream family, a task, a setting); ``control``: the
    baseline's name; ``reason``: why it is not tested (then the values may be empty). ``scale``,
    ``lower_is_better``, ``threshold``: this comparison's own, where a family mixes metrics (None: the family's,
    :func:`paired_calls`' arguments; :func:`rule_for` gives a metric's); ``bounded``: scores in [0, 1] (exact match,
    accuracy), whose equivalence is judged on an interval that reaches at least the Clopper-Pearson upper ends of the
    shares of units where the method scored lower and higher (the rank test's interval is too tight for that on 0/1
    scores: with every unit equal it is [0, 0], where n units only bound the share that could differ by
    1 - (alpha/2)^(1/n)); the call's own ``ci`` stays the rank test's."""
    family: str
    control: str
    method: Sequence[float]
    baseline: Sequence[float]
    fraction: float = math.nan
    reason: str = ""
    scale: str | None = None
    lower_is_better: bool | None = None
    threshold: float | None = None
    bounded: bool = False


# a metric's words -> (scale, lower is better, practical threshold, bounded in [0, 1]): the one table of how each
# metric is compared
RULES = (("nll increase", ("difference", True, 0.01, False)),   # nats per token: a ratio of two gains means nothing
         ("log-likelihood", ("difference", False, 0.1, False)),  # nats of the answer
         ("exact match", ("difference", False, 0.2, True)),     # 0/1 per instance: a tie within 20 points
         ("accuracy", ("difference", False, 0.2, True)),
         ("perplexity", ("ratio", True, PRACTICAL_RATIO, False)),
         ("error", ("ratio", True, PRACTICAL_RATIO, False)))     # every error: attention, decode, the claims' metrics


def rule_for(metric: str) -> tuple[str, bool, float, bool]:
    """(scale, lower_is_better, threshold, bounded) of a metric named in words (a leaderboard's or a task's metric,
    an error): the first of :data:`RULES` whose key the words contain (case-insensitive); InputError otherwise."""
    if not isinstance(metric, str):
        raise InputError(f"metric must be a string, got {metric!r}")
    low = metric.lower()
    for key, rule in RULES:
        if key in low:
            return rule
    raise InputError(f"no rule for the metric {metric!r}: name an error, a log-likelihood, an exact match, an "
                     f"accuracy, a perplexity or an NLL increase")


@dataclasses.dataclass
class Call:
    """One comparison's call (module docstring). ``effect``: the Hodges-Lehmann estimate (a ratio method /
    baseline on the ratio scale, a difference method - baseline on the difference scale) and ``ci`` its 95%
    interval; ``p``: the Holm-adjusted two-sided p over ``tests`` comparisons, ``p_raw`` before the correction;
    ``smallest_p``: the smallest adjusted p n units could give; ``detectable``: the smallest effect (a ratio factor
    >= 1 either way, or a difference) the test would call with 80% power at this n (NaN: none); ``equivalence_ci``:
    the interval ``equivalent`` is judged on (the whole of it within the threshold): ``ci`` itself, or for bounded
    scores (:class:`Comparison`) ``ci`` widened to the Clopper-Pearson ends of the shares of units lower and
    higher, so a call and the interval printed beside it always agree (a "worse" never sits beside an interval
    reaching past 0)."""
    family: str
    control: str
    fraction: float
    call: str
    effect: float = math.nan
    ci: tuple = (math.nan, math.nan)
    wins: int = 0
    losses: int = 0
    n: int = 0
    p: float = math.nan
    p_raw: float = math.nan
    tests: int = 0
    smallest_p: float = math.nan
    detectable: float = math.nan
    threshold: float = PRACTICAL_RATIO
    equivalent: bool = False
    scale: str = "ratio"
    unit: str = "independent streams"
    metric: str = ""
    reason: str = ""
    equivalence_ci: tuple = (math.nan, math.nan)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["ci"] = list(self.ci)
        d["equivalence_ci"] = list(self.equivalence_ci)
        return d


# ------------------------------------------------------------------ units
def per_unit(values: Iterable[tuple], how: str = "median") -> dict:
    """{unit: one number} from (unit, value) pairs: the values of one unit (the seeds of a randomized method, the
    layers and heads of one text) summarised by their median (``how="median"``) or mean, so that a unit counts
    once however many draws it holds. NaN values are refused (InputError); +inf (an undefined estimate) is kept."""
    check_choice(how, "how", ("median", "mean"))
    groups: dict = {}
    for i, pair in enumerate(values):
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise InputError(f"values[{i}] must be a (unit, value) pair, got {pair!r}"[:200])
        unit, v = pair
        groups.setdefault(unit, []).append(v)
    out = {}
    for unit, vs in groups.items():
        a = check_values(vs, f"the values of unit {unit!r}", allow_inf=True)
        out[unit] = float(np.median(a) if how == "median" else np.mean(a))
    return out


# ------------------------------------------------------------------ the effects and the test
def effects(method: Sequence[float], baseline: Sequence[float], scale: str = "ratio") -> np.ndarray:
    """The per-unit effects, rounded (module docstring): log(method / baseline) on the ratio scale (metrics >= 0,
    a zero floored at 1e-300), method - baseline on the difference scale. Finite numbers only (InputError)."""
    check_choice(scale, "scale", SCALES)
    m, b = check_values(method, "method", allow_inf=False), check_values(baseline, "baseline", allow_inf=False)
    if len(m) != len(b):
        raise InputError(f"method and baseline must be paired, got {len(m)} and {len(b)} values")
    if scale == "ratio":
        if np.any(m < 0) or np.any(b < 0):
            raise InputError("a metric on the ratio scale (an error) must be >= 0")
        x = np.log(np.maximum(m, FLOOR)) - np.log(np.maximum(b, FLOOR))
        return np.round(x / TIE_PRECISION) * TIE_PRECISION
    big = float(np.max(np.abs(np.concatenate([m, b])))) if len(m) else 0.0
    if big == 0.0:
        return np.zeros(len(m))
    step = TIE_PRECISION * big
    return np.round((m - b) / step) * step


def _ranks2(a: np.ndarray) -> np.ndarray:
    """Twice the mid-ranks of ``a`` (integers): tied values share their mean rank."""
    return np.rint(2 * stats.rankdata(a)).astype(np.int64)


def _null_cdf(r2: np.ndarray) -> np.ndarray:
    """P(T <= t) for t = 0 .. sum(r2) of the signed-rank statistic T (the sum of the doubled ranks of the
    positive effects) under the null (each sign a fair coin), exactly, by convolution over the sorted ranks."""
    dist = np.zeros(int(r2.sum()) + 1)
    dist[0] = 1.0
    top = 0
    for r in np.sort(r2):
        top += int(r)
        dist[r:top + 1] = 0.5 * (dist[r:top + 1] + dist[:top + 1 - r])
        dist[:r] *= 0.5
    return np.cumsum(dist)


def signed_rank(x: np.ndarray) -> tuple[float, float]:
    """(p_less, p_greater): the one-sided signed-rank p-values that the effects ``x`` (already rounded) lie below /
    above 0; zeros dropped, ties at mid-ranks; exact up to :data:`EXACT_MAX` non-zero effects, else normal with the
    tie correction and a continuity correction. (1, 1) without a non-zero effect."""
    x = np.asarray(x, float)
    x = x[x != 0]
    if len(x) == 0:
        return 1.0, 1.0
    r2 = _ranks2(np.abs(x))
    t = int(r2[x > 0].sum())
    if len(x) <= EXACT_MAX:
        cdf = _null_cdf(r2)
        p_less = float(cdf[t])
        p_greater = float(1.0 - cdf[t - 1]) if t > 0 else 1.0
        return min(1.0, p_less), min(1.0, max(p_greater, 0.0))
    mean, sd = r2.sum() / 2, math.sqrt(float((r2.astype(float) ** 2).sum()) / 4)
    return float(stats.norm.cdf((t + 1 - mean) / sd)), float(stats.norm.sf((t - 1 - mean) / sd))


def hodges_lehmann(x: np.ndarray, conf: float = 0.95) -> tuple[float, float, float]:
    """(estimate, low, high): the median of the Walsh averages (x_i + x_j) / 2, i <= j, of the effects ``x`` and
    the signed-rank test's inverted interval [W_(k+1), W_(N-k)] with k the largest count of Walsh averages the
    exact null leaves below at (1 - conf) / 2 (no-ties distribution of n units); (-inf, inf) when n is too small
    for any interval at ``conf``."""
    x = np.sort(np.asarray(x, float))
    n = len(x)
    if n == 0:
        return math.nan, -math.inf, math.inf
    i, j = np.triu_indices(n)
    w = np.sort((x[i] + x[j]) / 2)
    est = float(np.median(w))
    if n > EXACT_MAX:
        z = stats.norm.ppf(1 - (1 - conf) / 2)
        k = int(math.floor(n * (n + 1) / 4 - z * math.sqrt(n * (n + 1) * (2 * n + 1) / 24)))
    else:
        cdf = _null_cdf(2 * np.arange(1, n + 1))[::2]           # P(T <= t), t in rank units
        below = np.nonzero(cdf <= (1 - conf) / 2)[0]
        k = int(below[-1]) + 1 if len(below) else 0             # P(T <= k - 1) <= (1 - conf) / 2
    if k <= 0:
        return est, -math.inf, math.inf
    return est, float(w[k - 1]), float(w[len(w) - k])


def smallest_p(n: int, tests: int) -> float:
    """The smallest Holm-adjusted two-sided p that n units can give in a family of ``tests``: every unit one way,
    2^(1-n) before the correction, times ``tests`` at Holm's first step (1 for n = 0)."""
    n, tests = check_int(n, "n"), check_int(tests, "tests", minimum=1)
    return 1.0 if n == 0 else min(1.0, tests * 2.0 ** (1 - n))


def detectable(x: np.ndarray, tests: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest |effect| (on the log or difference scale) the signed-rank test, at Holm's strictest threshold
    alpha / (2 tests) one-sided, would call with probability ``power`` if the effects kept their spread (1.4826 x
    their median absolute deviation) and shifted: (z_(1-a) + z_power) sigma / sqrt(3 n / pi) (3/pi: the test's
    efficiency against the t-test for normal data). NaN when no effect is detectable at this n (2^-n above the
    threshold); 0 for a spread of 0."""
    x = np.asarray(x, float)
    n = len(x)
    a = alpha / (2 * tests)
    if n < 1 or 0.5 ** n > a:
        return math.nan
    sigma = 1.4826 * float(np.median(np.abs(x - np.median(x))))
    return float((stats.norm.ppf(1 - a) + stats.norm.ppf(power)) * sigma / math.sqrt(n * 3 / math.pi))


# ------------------------------------------------------------------ the rule
def _threshold(scale: str, threshold) -> float:
    if threshold is None:
        return PRACTICAL_RATIO if scale == "ratio" else 0.0
    if scale == "ratio":
        return check_real(threshold, "threshold", minimum=1.0)
    return check_real(threshold, "threshold", minimum=0.0)


def paired_calls(comparisons: Sequence[Comparison], *, scale: str = "ratio", lower_is_better: bool = True,
                 threshold: float | None = None, alpha: float = ALPHA, unit: str = "independent streams",
                 metric: str = "") -> list[Call]:
    """The calls of a family of comparisons (the module docstring's rule), in the order given; Holm over every
    comparison with at least one unit. ``scale``: "ratio" (errors: log-ratios) or "difference" (scores);
    ``lower_is_better``: the metric's direction; ``threshold``: the practical threshold (a ratio >= 1 on the ratio
    scale, default :data:`PRACTICAL_RATIO`; a difference >= 0 in the metric's units, default 0); ``unit``: what a
    unit is, in words ("distinct text windows", "generations from distinct prompts", ...); ``metric``: the metric's
    name (:data:`METRICS`' keys, or words)."""
    check_choice(scale, "scale", SCALES)
    check_probability(alpha, "alpha")
    if not isinstance(lower_is_better, bool):
        raise InputError(f"lower_is_better must be True or False, got {lower_is_better!r}")
    for name, s in (("unit", unit), ("metric", metric)):
        if not isinstance(s, str):
            raise InputError(f"{name} must be a string, got {s!r}")
    comps = list(comparisons) if not isinstance(comparisons, (str, bytes)) and hasattr(comparisons, "__iter__") \
        else None
    if comps is None or not all(isinstance(c, Comparison) for c in comps):
        raise InputError("comparisons must be a sequence of Comparison")
    rules = [_rule_of(c, scale, lower_is_better, threshold) for c in comps]
    xs = [effects(c.method, c.baseline, sc) if not c.reason else np.zeros(0) for c, (sc, _, _) in zip(comps, rules)]
    xs = [x if low else -x for x, (_, low, _) in zip(xs, rules)]   # from here on, below 0 is the method's better
    tested = [i for i, x in enumerate(xs) if len(x)]
    raw: dict[int, tuple[float, float]] = {i: signed_rank(xs[i]) for i in tested}
    two = {i: min(1.0, 2 * min(raw[i])) for i in tested}
    adj = dict(zip(tested, holm_adjust([two[i] for i in tested]))) if tested else {}
    m = max(len(tested), 1)
    out = []
    for i, (c, x, (scale_i, low_i, thr)) in enumerate(zip(comps, xs, rules)):
        fraction = float(c.fraction) if isinstance(c.fraction, (int, float)) else math.nan
        band = math.log(thr) if scale_i == "ratio" else thr
        base = dict(family=c.family, control=c.control, fraction=fraction, threshold=thr, scale=scale_i, unit=unit,
                    metric=metric)
        if i not in adj:
            out.append(Call(call="not tested", reason=c.reason or "no units", **base))
            continue
        n = len(x)
        est, lo, hi = hodges_lehmann(x)                # oriented: below 0 is the method's better
        floor = smallest_p(n, m)
        p_less, p_greater = raw[i]
        direction = "better" if p_less <= p_greater else "worse"
        beyond = est < -band if direction == "better" else est > band
        if floor >= alpha:
            call = "not attainable"
        elif adj[i] < alpha and beyond:
            call = direction
        elif two[i] < alpha and beyond:
            call = "leaning " + direction
        else:
            call = "tied"
        elo, ehi = lo, hi
        if c.bounded and scale_i == "difference":    # the shares of units lower / higher bound the difference
            elo = min(lo, -_cp_upper(int(np.sum(x < 0)), n, alpha))
            ehi = max(hi, _cp_upper(int(np.sum(x > 0)), n, alpha))
        equivalent = bool(-band <= elo and ehi <= band)
        if not low_i:                                  # back to the metric's orientation: method - baseline
            est, lo, hi, elo, ehi = -est, -hi, -lo, -ehi, -elo
        to_effect = (lambda v: float(math.exp(max(min(v, 700.0), -700.0)))) if scale_i == "ratio" else float
        out.append(Call(call=call, effect=to_effect(est), ci=(to_effect(lo), to_effect(hi)),
                        equivalence_ci=(to_effect(elo), to_effect(ehi)),
                        wins=int(np.sum(x < 0)), losses=int(np.sum(x > 0)), n=n, p=float(adj[i]), p_raw=two[i],
                        tests=m, smallest_p=floor, detectable=_detectable(x, m, alpha, scale_i),
                        equivalent=equivalent, **base))
    return out


def _cp_upper(k: int, n: int, alpha: float) -> float:
    """The Clopper-Pearson upper end (1 - alpha/2) of a share of k in n."""
    return 1.0 if k >= n else float(stats.beta.ppf(1 - alpha / 2, k + 1, n - k))


def _rule_of(c: Comparison, scale: str, lower_is_better: bool, threshold) -> tuple[str, bool, float]:
    sc = scale if c.scale is None else check_choice(c.scale, "a comparison's scale", SCALES)
    low = lower_is_better if c.lower_is_better is None else c.lower_is_better
    if not isinstance(low, bool):
        raise InputError(f"a comparison's lower_is_better must be True or False, got {low!r}")
    return sc, low, _threshold(sc, threshold if c.threshold is None else c.threshold)


def _detectable(x, m, alpha, scale) -> float:
    d = detectable(x, m, alpha)
    return float(math.exp(d)) if scale == "ratio" and not math.isnan(d) else d
