"""Three-way calls of a method against each control of the battery (:mod:`kvbounds.battery`), and their words.

Per (family, control) of a claim, over n paired streams (the method's metric and the control's on the same stream):

  * ``better`` / ``worse``: two one-sided Wilcoxon signed-rank tests on the log-ratios log(method / control)
    (method below the control; method above it), the smaller p doubled (both directions are looked at), Holm over
    every (family, control) pair of the claim; a significant test at ``alpha`` calls its direction;
  * ``tied``: neither test significant, and the 95% interval of the median ratio method / control lies within
    [1 / :data:`EQUIVALENCE`, :data:`EQUIVALENCE`] (equivalent within 20%: the interval excludes a 20% difference
    either way);
  * ``not shown``: neither test significant and the interval reaches past the equivalence margin: the data do not
    tell the two apart at this n (not evidence of a tie);
  * ``not tested``: fewer than :data:`MIN_STREAMS` streams, the control did not run, or the method does not compress
    (it holds at least the whole stream's floats, where every control is exact).

Each call carries the median ratio (method / control) with its distribution-free 95% interval (binomial order
statistics, :func:`median_ci`), the win count (streams where the method's metric is below the
control's), n and the smallest detectable ratio at that n (:func:`detectable_ratio`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
from scipy import stats

from kvbounds.algorithms.validation import InputError, check_int, check_probability, check_real, check_values

CALLS = ("better", "tied", "worse", "not shown", "not tested")
EQUIVALENCE = 1.2
POWER = 0.8
ALPHA = 0.05
MIN_STREAMS = 10
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


@dataclasses.dataclass
class Call:
    """One (family, control) call. ``ci``: the 95% interval of the median ratio; ``detectable_ratio``: the
    smallest method / control ratio below 1 the test would call ``better`` with 80% power at this n (NaN: none at
    this n); ``p``: the Holm-adjusted two-sided p; ``reason``: why not tested."""
    family: str
    control: str
    fraction: float
    call: str
    ratio_median: float = math.nan
    ci: tuple = (math.nan, math.nan)
    wins: int = 0
    n: int = 0
    detectable_ratio: float = math.nan
    reason: str = ""
    p: float = math.nan
    unit: str = "independent streams"

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["ci"] = list(self.ci)
        return d


def _paired(method: Sequence[float], control: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Paired metrics: two 1-d sequences of the same length of finite numbers >= 0 (InputError otherwise)."""
    m, c = check_values(method, "method", allow_inf=False), check_values(control, "control", allow_inf=False)
    if len(m) != len(c):
        raise InputError(f"method and control must be paired, got {len(m)} and {len(c)} values")
    if np.any(m < 0) or np.any(c < 0):
        raise InputError("a metric (an error) must be >= 0")
    return m, c


def median_ci(x: Sequence[float], conf: float = 0.95) -> tuple[float, float, float]:
    """Median with a distribution-free interval from binomial order statistics (exact coverage >= conf). ``x``:
    at least one number, +-inf allowed (an undefined ratio), NaN refused (InputError), and so is a median between
    -inf and +inf (an even count whose two middle values are both infinite, of opposite signs: undefined)."""
    check_probability(conf, "conf")
    x = np.sort(check_values(x, "x", allow_inf=True))
    n = len(x)
    if n == 0:
        raise InputError("x is empty: no median")
    k = int(stats.binom.ppf((1 - conf) / 2, n, 0.5))       # lower order statistic (1-based k, clipped)
    lo, hi = x[max(k - 1, 0)], x[min(n - k, n - 1)]
    a, b = x[(n - 1) // 2], x[n // 2]
    if np.isinf(a) and np.isinf(b) and a != b:
        raise InputError("the median lies between -inf and +inf: undefined")
    return float(np.median(x)), float(lo), float(hi)


def log_ratios(method: Sequence[float], control: Sequence[float]) -> np.ndarray:
    """log(method / control) per stream; a zero side is floored at 1e-300 (an exact control against a positive
    method error is a large ratio, not an undefined one)."""
    m, c = _paired(method, control)
    return np.log(np.maximum(m, 1e-300)) - np.log(np.maximum(c, 1e-300))


def detectable_ratio(logs: Sequence[float], tests: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest method / control ratio r < 1 that the signed-rank test, at the stricter Holm threshold
    alpha / tests per direction pair (alpha / (2 tests) one-sided), would call ``better`` with probability
    ``power`` at this n, if the log-ratios kept their observed spread and shifted to log r: r = exp(-(z_{1-a} +
    z_power) sigma / sqrt(n 3/pi)), sigma = 1.4826 x the log-ratios' median absolute deviation (a robust spread),
    3/pi the signed-rank test's efficiency against the t-test for normal data. NaN when no ratio is detectable at
    this n: even n wins out of n give p = 2^-n above the threshold. A spread of 0 gives 1 (any consistent
    difference is detected)."""
    x = check_values(logs, "logs", allow_inf=False)
    n = len(x)
    tests = check_int(tests, "tests", minimum=1)
    check_probability(alpha, "alpha")
    check_probability(power, "power")
    a = alpha / (2 * tests)
    if n < 1 or 0.5 ** n > a:
        return math.nan
    sigma = 1.4826 * float(np.median(np.abs(x - np.median(x))))
    delta = (stats.norm.ppf(1 - a) + stats.norm.ppf(power)) * sigma / math.sqrt(n * 3 / math.pi)
    return float(math.exp(-delta))


def two_sided_p(method: Sequence[float], control: Sequence[float]) -> tuple[float, str]:
    """(p, direction): twice the smaller of the two one-sided signed-rank p-values (capped at 1) and the direction
    of that one ("better": method below control; "worse"); every pair tied: (1, ""). The test is on the log-ratios
    log(method / control) (:func:`log_ratios`), the scale the calls report: streams whose errors differ by orders of
    magnitude (real traces) count alike, and the test and the interval of the median ratio speak of one thing."""
    x = log_ratios(method, control)
    if not np.any(x != 0):
        return 1.0, ""
    a = np.abs(x)
    exact = len(np.unique(a)) == len(a) and np.all(a > 0) and len(a) <= 50
    kw = dict(zero_method="zsplit", method="exact" if exact else "approx")
    p_less = float(stats.wilcoxon(x, alternative="less", **kw).pvalue)
    p_more = float(stats.wilcoxon(x, alternative="greater", **kw).pvalue)
    return min(1.0, 2 * min(p_less, p_more)), ("better" if p_less <= p_more else "worse")


def decide_call(family: str, control: str, fraction: float, method: Sequence[float], control_values: Sequence[float],
                p_adjusted: float, direction: str, tests: int, alpha: float = ALPHA, reason: str = "",
                unit: str = "independent streams") -> Call:
    """The call of one (family, control) from its paired metrics and its Holm-adjusted p (module docstring)."""
    check_probability(alpha, "alpha")
    method, control_values = _paired(method, control_values)
    check_real(p_adjusted, "p_adjusted", minimum=0.0)
    tests = check_int(tests, "tests", minimum=1)
    if direction not in ("", "better", "worse"):
        raise InputError(f"direction must be '', 'better' or 'worse', got {direction!r}")
    n = len(method)
    if reason or n < MIN_STREAMS:
        return Call(family, control, fraction, "not tested", n=n,
                    reason=reason or f"{n} streams, fewer than {MIN_STREAMS}", unit=unit)
    logs = log_ratios(method, control_values)
    ratios = np.exp(np.clip(logs, -700, 700))
    med, lo, hi = median_ci(ratios)
    wins = int(np.sum(np.asarray(method, float) < np.asarray(control_values, float)))
    if p_adjusted < alpha and direction:
        call = direction
    elif 1 / EQUIVALENCE <= lo and hi <= EQUIVALENCE:
        call = "tied"
    else:
        call = "not shown"
    return Call(family, control, fraction, call, med, (lo, hi), wins, n, detectable_ratio(logs, tests, alpha),
                p=float(p_adjusted), unit=unit)


def fmt(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else "inf" if math.isinf(x) else f"{x:.3g}"


def numbers(c: dict, family: bool = True) -> str:
    """"real SmolLM2: 1.16 [1.04, 1.30], 9/30 wins" of a call dict."""
    where = f"{c['family']}: " if family else ""
    if c["call"] == "not tested":
        return where + (c.get("reason") or "not tested")
    lo, hi = c["ci"]
    return f"{where}{fmt(c['ratio_median'])} [{fmt(lo)}, {fmt(hi)}], {c['wins']}/{c['n']} wins"


def call_words(c: dict, family: bool = True) -> str:
    """The words of one call: "worse than StreamingLLM (real SmolLM2: 1.16 [1.04, 1.30], 9/30 wins)", "not shown
    better than uniform (...)" (", leaning worse" where the median ratio's interval lies above 1), "tied with the
    ablation (...)", "not tested against zeros (does not compress: ...)"."""
    name = label(c["control"])
    head = {"better": f"better than {name}", "worse": f"worse than {name}", "tied": f"tied with {name}",
            "not shown": f"not shown better than {name}", "not tested": f"not tested against {name}"}[c["call"]]
    if c["call"] == "not shown" and c.get("ci", (math.nan,))[0] > 1:
        head += ", leaning worse"       # the interval lies above 1, but neither test is significant over the claim
    return f"{head} ({numbers(c, family)})"


def summary_words(calls: Sequence[dict], most: int = 3) -> str:
    """The headline's words for a claim's calls: "better than every control" when every tested call is better;
    else one clause per (call, control), worse first, then not shown, tied, better, each with its first family's
    numbers and how many more families share it; at most ``most`` clauses (then "+k more"). "" without a tested
    call."""
    tested = [c for c in calls if c["call"] != "not tested"]
    if not tested:
        return ""
    if all(c["call"] == "better" for c in tested):
        return "better than every control"
    rank = {"worse": 0, "not shown": 1, "tied": 2, "better": 3}
    groups: dict[tuple, list[dict]] = {}
    for c in tested:
        groups.setdefault((c["call"], c["control"]), []).append(c)
    clauses = []
    for (call, ctl), cs in sorted(groups.items(), key=lambda kv: (rank[kv[0][0]], control_order(kv[0][1]))):
        first = sorted(cs, key=lambda c: (-abs(math.log(max(c["ratio_median"], 1e-300))) if c["ratio_median"] > 0
                                          else 0.0, c["family"]))[0]
        more = f"; +{len(cs) - 1} more famil{'y' if len(cs) == 2 else 'ies'}" if len(cs) > 1 else ""
        text = call_words(first)
        clauses.append(text[:-1] + more + ")")
    out = "; ".join(clauses[:most])
    return out + (f"; +{len(clauses) - most} more" if len(clauses) > most else "")


def versus_doing_nothing(calls: Sequence[dict]) -> dict | None:
    """Of a family's calls against zeros and the mean (doing nothing), the one against the stronger control (the
    smaller control metric: the larger method / control ratio); None when neither ran."""
    cs = [c for c in calls if c["control"] in DOING_NOTHING and c["call"] != "not tested"]
    if not cs:
        cs = [c for c in calls if c["control"] in DOING_NOTHING]
        return cs[0] if cs else None
    return max(cs, key=lambda c: (c["ratio_median"], c["control"]))
