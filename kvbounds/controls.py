"""Trivial estimators ("doing nothing") as controls of every error-bound claim, and the power rule against them.

By Cauchy-Schwarz, ||softmax^T V|| <= ||softmax||_2 ||V||_op <= ||softmax||_2 ||V||_F, so the estimator that
returns zeros meets BKV.attention's scale (BalanceKV-NeurIPS Thm 3.1) and SG.attention's (SubGen Thm 1) for every
eps >= 1. A bound that a do-nothing estimator also meets is no evidence for the method; power is shown only where
the method beats *every* trivial control on the claim's own metric.

Representation (one for every check): a method record carries ``extra["controls"] = {name: value}``, each control's
value in the claim's own metric on exactly the record's stream, seed and checkpoints (``None`` when the control
could not run, with the reason in ``extra["controls_missing"][name]``). A stream family that could not run at all
(a real trace missing) is a record with ``extra["missing"]`` and a NaN measurement. Records stored before the controls
were recorded have no ``controls`` and load as before (the rule then says "no trivial controls recorded").

Controls (:data:`CONTROL_LABELS`): ``zeros``; ``mean_values`` (the running mean of the values: exact softmax
replaced by uniform weights, O(d) memory, keys ignored); ``uniform`` (a uniform sample of the prefix at the
method's memory, exact softmax over it); ``recent`` (the most recent tokens at the method's memory); ``random_signs``
(independent signs, for walks); ``best_rank`` (the best rank-l approximation, for FD).

The rule (:func:`power_vs_controls`): per setting (a stream family, ...) and control, a one-sided Wilcoxon
signed-rank test over >= ``MIN_STREAMS`` independent streams that the method's metric is below the control's;
Holm over every (setting, control) test of the claim (:func:`kvbounds.statistics.holm_adjust`, the shared rule).
``shown`` when every test is significant at 0.05, ``low`` otherwise, naming each control that matches or beats the
method and where.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable, Sequence

import numpy as np
from scipy import stats

from .algorithms.validation import (InputError, check_array, check_error, check_int, check_probability, check_real,
                                   check_rng, check_values)
from .records import Record
from .statistics import canonical_order, holm_adjust

CONTROL_LABELS = {"zeros": "zeros", "mean_values": "mean of values", "uniform": "uniform sample",
                  "recent": "recent window", "random_signs": "random signs", "best_rank": "best rank-l",
                  "mean_keys": "mean of keys"}
MIN_STREAMS = 10
ALPHA = 0.05


# ------------------------------------------------------------------ the estimators
# Inputs (docs/INPUTS.md): q (d,), K (j, d) and V (j, s) finite numpy float arrays with j >= 1 (an empty prefix has
# no estimate), scale a finite number >= 0, memory an integer >= 0 (clamped to [1, j]), rng a numpy Generator; the
# logits K q scale and every estimate must fit float64 (else an InputError naming the overflow).
def _prefix(q, K, V, scale) -> float:
    for x, name in ((q, "q"), (K, "K"), (V, "V")):
        if not isinstance(x, np.ndarray):
            raise InputError(f"{name} must be a numpy array, got {type(x).__name__}")
    check_array(q, "q", ndim=1)
    check_array(K, "K (the prefix's keys)", ndim=2, last_dim=q.shape[0], min_rows=1)
    check_array(V, "V (the prefix's values)", ndim=2, min_rows=1)
    if V.shape[0] != K.shape[0]:
        raise InputError(f"K and V must hold the same tokens, got {K.shape[0]} keys and {V.shape[0]} values")
    return check_real(scale, "scale", minimum=0.0)


def _logits(q, K, scale) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):      # an overflow is refused by name below
        x = K @ q * scale
    if not np.all(np.isfinite(x)):
        raise InputError("the logits K q * scale overflow float64 (keys or query too large for this scale)")
    return x


def _finite(x, what: str):
    if not np.all(np.isfinite(x)):
        raise InputError(f"{what} overflows float64 (values too large)")
    return x


def _attend(q, K, V, scale) -> np.ndarray:
    x = _logits(q, K, scale)
    w = np.exp(x - x.max())
    with np.errstate(over="ignore", invalid="ignore"):
        return _finite(w @ V / w.sum(), "the attention average")


def softmax_attend(q: np.ndarray, K: np.ndarray, V: np.ndarray, scale: float) -> np.ndarray:
    """softmax(K q * scale)^T V (max-shifted)."""
    return _attend(q, K, V, _prefix(q, K, V, scale))


def attention_controls(q, K, V, memory: int, rng: np.random.Generator, *, scale: float) -> dict[str, np.ndarray]:
    """The trivial estimates of Attn(q, K, V) = softmax(K q * scale)^T V on a prefix (K, V) of j tokens:
    zeros, the mean of the values, exact attention over a uniform sample of ``memory`` tokens (a reservoir sample
    of the prefix has this distribution at every step) and over the ``memory`` most recent tokens."""
    scale = _prefix(q, K, V, scale)
    memory, rng = check_int(memory, "memory", minimum=0), check_rng(rng)
    j = len(K)
    m = int(min(max(memory, 1), j))
    idx = np.sort(rng.choice(j, m, replace=False))
    return {"zeros": np.zeros(V.shape[1]), "mean_values": _finite(V.mean(0), "the mean of the values"),
            "uniform": _attend(q, K[idx], V[idx], scale), "recent": _attend(q, K[-m:], V[-m:], scale)}


def numerator_controls(q, K, V, memory: int, rng: np.random.Generator, *, scale: float) -> dict[str, tuple[float, np.ndarray]]:
    """The trivial estimates of the unnormalised numerator sum_i e^{<k_i,q> scale} v_i (MR.error), as (m, u) with
    the estimate e^m u: zeros; ``mean_values``: e^{<mean k, q> scale} sum_i v_i (O(d + s) memory, every weight
    equal); ``uniform``: (j/m) times the sum over a uniform sample of m tokens (unbiased); ``recent``: the exact
    sum over the m most recent tokens (older tokens dropped)."""
    scale = _prefix(q, K, V, scale)
    memory, rng = check_int(memory, "memory", minimum=0), check_rng(rng)
    j = len(K)
    m = int(min(max(memory, 1), j))
    idx = rng.choice(j, m, replace=False)

    def part(Ks, Vs, factor=1.0):
        x = _logits(q, Ks, scale)
        mx = float(x.max())
        return mx, _finite(factor * (np.exp(x - mx) @ Vs), "the sum of the values")

    with np.errstate(over="ignore", invalid="ignore"):      # each overflow is refused by name
        mean_logit = float(_finite(K.mean(0) @ q * scale, "the mean key's logit"))
        return {"zeros": (0.0, np.zeros(V.shape[1])),
                "mean_values": (mean_logit, _finite(V.sum(0), "the sum of the values")),
                "uniform": part(K[idx], V[idx], j / m), "recent": part(K[-m:], V[-m:])}


class WorstError:
    """The claim's metric for each control: the max over checkpoints of error / scale (as eps_hat is for the
    method). ``add(name, error)`` at each checkpoint; ``values()`` the dict to store in ``extra["controls"]``.
    An error of +inf (an undefined estimate) is the worst; a NaN one is an InputError naming the control (a maximum
    would drop it silently: max(0, nan) = 0)."""

    def __init__(self):
        self.worst: dict[str, float] = {}

    def add(self, name: str, value: float) -> None:
        if not isinstance(name, str):
            raise InputError(f"the control's name must be a string, got {name!r}")
        self.worst[name] = max(self.worst.get(name, 0.0), check_error(value, f"the error of control {name!r}"))

    def add_all(self, estimates: dict, exact: np.ndarray, scale: float) -> None:
        """``add(name, ||estimate - exact|| / scale)`` for each control's estimate (``scale`` finite > 0)."""
        scale = check_real(scale, "scale", minimum=0.0, strict=True)
        if not isinstance(estimates, dict):
            raise InputError(f"estimates must be a dict of control name -> estimate, got {type(estimates).__name__}")
        if not isinstance(exact, np.ndarray):
            raise InputError(f"exact must be a numpy array, got {type(exact).__name__}")
        check_array(exact, "exact", ndim=1)
        for name, est in estimates.items():
            if not isinstance(est, np.ndarray) or est.shape != exact.shape:
                raise InputError(f"the estimate of control {name!r} must be a numpy array of shape {exact.shape}")
            check_array(est, f"the estimate of control {name!r}", ndim=1, finite=False)   # inf: undefined, the worst
            self.add(name, float(np.linalg.norm(est - exact)) / scale)

    def values(self) -> dict[str, float]:
        return dict(sorted(self.worst.items()))


def not_applicable(reason: str) -> str:
    """The summary's sentence for a claim whose statement is no estimator's error bound (an exact identity, a
    property of the data or of softmax itself): there is no trivial estimator to beat, and the summary says why."""
    if not isinstance(reason, str) or not reason.strip():
        raise InputError(f"reason must be a non-empty string, got {reason!r}")
    return f"trivial controls: none apply ({reason})"


# ------------------------------------------------------------------ the power rule
@dataclasses.dataclass
class PowerCell:
    """One setting (stream family) of one claim: the method's and each control's metric over paired streams."""
    setting: str
    streams: int
    method: float                              # median of the method's metric
    controls: dict[str, float | None]          # median of each control's metric (None: could not run)
    p_adjusted: dict[str, float]               # Holm-adjusted one-sided p (method below control)
    best: str = ""                             # the control with the smallest median
    ratio: float = math.nan                    # median of method / best control over the streams
    ratio_ci: tuple[float, float] = (math.nan, math.nan)
    missing: str = ""                          # why the setting (or a control) did not run

    def beaten(self, name: str, alpha: float = ALPHA) -> bool:
        return self.p_adjusted.get(name, 1.0) < alpha


@dataclasses.dataclass
class TrivialPower:
    power: str                                 # "shown" | "low" | "n/a"
    detail: str
    note: str                                  # the headline's words when low, e.g. "no better than zeros (real MiniLM)"
    cells: list[PowerCell]

    def table(self) -> list[dict]:
        return [dataclasses.asdict(c) for c in self.cells]


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


def one_sided_p(method: Sequence[float], control: Sequence[float]) -> float | None:
    """p of the Wilcoxon signed-rank test that the method's metric is below the control's (paired); None when
    fewer than MIN_STREAMS pairs; 1 when every pair ties. Finite numbers only (InputError: NaN, Inf, lengths)."""
    m, c = check_values(method, "method", allow_inf=False), check_values(control, "control", allow_inf=False)
    if len(m) != len(c):
        raise InputError(f"method and control must be paired, got {len(m)} and {len(c)} values")
    if len(m) < MIN_STREAMS:
        return None
    diff = m - c
    if not np.any(diff != 0):
        return 1.0
    a = np.abs(diff)
    exact = len(np.unique(a)) == len(a) and np.all(a > 0) and len(a) <= 50   # else the normal approximation
    return float(stats.wilcoxon(m, c, alternative="less", zero_method="zsplit",
                                method="exact" if exact else "approx").pvalue)


def _real_or_nan(x, what: str) -> None:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise InputError(f"{what} must be a real number (or None for a control that could not run), got {x!r}")


def _undefined(records: Sequence[Record], names: Sequence[str], value: Callable[[Record], float]) -> str:
    """What a setting leaves out of its tests because it is undefined (NaN), said in the cell (never silently)."""
    parts = []
    nan_m = sum(1 for r in records if math.isnan(value(r)))
    if nan_m:
        parts.append(f"{nan_m} stream(s) with an undefined (NaN) method metric left out")
    for name in names:
        k = sum(1 for r in records if isinstance(c := r.extra["controls"].get(name), (int, float)) and math.isnan(c))
        if k:
            parts.append(f"{CONTROL_LABELS.get(name, name)}: {k} undefined (NaN) value(s) left out")
    return "; ".join(parts)


def _pairs(records: Sequence[Record], name: str, value: Callable[[Record], float]) -> tuple[list, list]:
    ms, cs = [], []
    for r in records:
        c = r.extra.get("controls", {}).get(name)
        v = value(r)
        if c is not None and not math.isnan(float(c)) and not math.isnan(v):   # inf (undefined estimate) is worst
            ms.append(min(v, 1e300))
            cs.append(min(float(c), 1e300))
    return ms, cs


def power_vs_controls(records: Iterable[Record], *, setting: Callable[[Record], Any],
                      value: Callable[[Record], float] = lambda r: r.measured, metric: str = "error",
                      alpha: float = ALPHA) -> TrivialPower:
    """The power rule of the module docstring over ``records`` (the method's records carrying
    ``extra["controls"]``), grouped by ``setting(r)``. Order independent: records are sorted canonically and
    the settings and controls by name."""
    check_probability(alpha, "alpha")
    if not callable(setting) or not callable(value):
        raise InputError("setting and value must be functions of a record")
    records = list(records) if not isinstance(records, (str, bytes)) and hasattr(records, "__iter__") else None
    if records is None or not all(isinstance(r, Record) for r in records):
        raise InputError("records must be an iterable of Record")
    records = canonical_order(records)
    for r in records:              # the metric and each control's value: a real number (NaN: counted as undefined)
        _real_or_nan(value(r), f"the method's metric of a record of {r.claim}")
        ctl = r.extra.get("controls", {})
        if not isinstance(ctl, dict):
            raise InputError(f"extra['controls'] of a record of {r.claim} must be a dict, got {type(ctl).__name__}")
        for name, c in ctl.items():
            if c is not None:
                _real_or_nan(c, f"control {name!r} of a record of {r.claim}")
    groups: dict[str, list[Record]] = {}
    for r in records:
        groups.setdefault(str(setting(r)), []).append(r)
    if not groups:
        return TrivialPower("n/a", "no trivial controls recorded", "", [])
    tests: list[tuple[str, str]] = []
    pvals: list[float | None] = []
    raw: dict[str, dict] = {}
    for s, rs in sorted(groups.items()):
        ran = [r for r in rs if not r.extra.get("missing") and "controls" in r.extra]
        why = sorted({str(r.extra["missing"]) for r in rs if r.extra.get("missing")})
        names = sorted({k for r in ran for k in r.extra["controls"]})
        miss = sorted({f"{k}: {v}" for r in ran for k, v in r.extra.get("controls_missing", {}).items()})
        undefined = _undefined(ran, names, value)
        raw[s] = dict(ran=ran, names=names, missing="; ".join(why + miss + ([undefined] if undefined else [])))
        for name in names:
            ms, cs = _pairs(ran, name, value)
            tests.append((s, name))
            pvals.append(one_sided_p(ms, cs))
    adj = dict(zip(tests, holm_adjust(pvals))) if tests else {}
    cells = []
    for s, info in sorted(raw.items()):
        ran, names = info["ran"], info["names"]
        meds = {}
        for name in names:
            _, cs = _pairs(ran, name, value)
            meds[name] = float(np.median(cs)) if cs else None
        vals = [value(r) for r in ran if not math.isnan(value(r))]
        cell = PowerCell(s, len(vals), float(np.median(vals)) if vals else math.nan, meds,
                         {n: adj[(s, n)] for n in names}, missing=info["missing"])
        avail = {n: v for n, v in meds.items() if v is not None}
        if avail and vals:
            cell.best = min(avail, key=lambda n: (avail[n], n))
            ms, cs = _pairs(ran, cell.best, value)
            # a control at the method's memory can be exact (the method holds as much as the whole prefix): inf
            ratios = [m / c if c > 1e-12 * abs(m) else (math.inf if m > 0 else 1.0) for m, c in zip(ms, cs)]
            med, lo, hi = median_ci(ratios)
            cell.ratio, cell.ratio_ci = med, (lo, hi)
        cells.append(cell)
    return _decide(cells, metric, alpha)


def _fmt(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else "inf" if math.isinf(x) else f"{x:.3g}"


def _decide(cells: list[PowerCell], metric: str, alpha: float) -> TrivialPower:
    tested = [c for c in cells if c.p_adjusted]
    lines, losers = [], {}
    for c in cells:
        if not c.p_adjusted:
            lines.append(f"{c.setting}: not run ({c.missing or 'no records'})")
            continue
        ctl = ", ".join(f"{CONTROL_LABELS.get(n, n)} {_fmt(v)}" + ("" if c.beaten(n, alpha) else " (not beaten)")
                        for n, v in sorted(c.controls.items()))
        under = " [fewer than %d streams: untested]" % MIN_STREAMS if c.streams < MIN_STREAMS else ""
        lines.append(f"{c.setting} ({c.streams} streams{under}): method {metric} {_fmt(c.method)} vs {ctl}; "
                     f"method / {CONTROL_LABELS.get(c.best, c.best)} = {_fmt(c.ratio)} "
                     f"[95% {_fmt(c.ratio_ci[0])}, {_fmt(c.ratio_ci[1])}]" + (f"; missing: {c.missing}" if c.missing else ""))
        for n in sorted(c.p_adjusted):
            if not c.beaten(n, alpha):
                losers.setdefault(n, []).append(c.setting)
    if not tested:
        return TrivialPower("n/a", "trivial controls: " + "; ".join(lines), "", cells)
    power = "low" if losers else "shown"
    rule = (f"one-sided Wilcoxon signed-rank per setting and control, Holm over {sum(len(c.p_adjusted) for c in cells)} "
            f"tests at {alpha:g}")
    note = ""
    if losers:
        order = list(CONTROL_LABELS)
        groups: dict[tuple, list[str]] = {}
        for n, ss in losers.items():
            groups.setdefault(tuple(ss), []).append(n)
        clauses = []
        for ss, names in sorted(groups.items(), key=lambda kv: (-len(kv[0]), min(order.index(n) if n in order else 99
                                                                                  for n in kv[1]))):
            labels = ", ".join(CONTROL_LABELS.get(n, n) for n in sorted(names, key=lambda n: (order.index(n)
                                                                                               if n in order else 99, n)))
            where = "every setting" if len(ss) == len(tested) and len(ss) > 1 else ", ".join(ss)
            clauses.append(f"{labels} ({where})")
        note = "no better than " + "; ".join(clauses[:2]) + (f"; {len(clauses) - 2} more" if len(clauses) > 2 else "")
    head = ("beats every trivial control in every setting" if power == "shown" else note)
    return TrivialPower(power, f"trivial controls ({rule}): {head}. " + "; ".join(lines), note, cells)


def power_table_cells(table: Sequence[dict], alpha: float = ALPHA) -> list[list[str]]:
    """A verdict's ``power_table`` as rows of strings (header first): per setting, the method's metric beside each
    control's (``*``: the method is significantly below it, after Holm), and method / best control [95%]."""
    names = sorted({n for c in table for n in c["controls"]}, key=lambda n: (list(CONTROL_LABELS).index(n)
                                                                             if n in CONTROL_LABELS else 99, n))
    rows = [["setting", "streams", "method"] + [CONTROL_LABELS.get(n, n) for n in names] + ["method / best [95%]"]]
    for c in table:
        if not c["p_adjusted"]:
            rows.append([c["setting"], "0", "not run: " + (c["missing"] or "no records")] + [""] * (len(names) + 1))
            continue
        cells = [_fmt(c["controls"].get(n)) + ("*" if c["p_adjusted"].get(n, 1.0) < alpha else "") for n in names]
        lo, hi = c["ratio_ci"]
        rows.append([c["setting"], str(c["streams"]), _fmt(c["method"])] + cells +
                    [f"{_fmt(c['ratio'])} vs {CONTROL_LABELS.get(c['best'], c['best'])} [{_fmt(lo)}, {_fmt(hi)}]"])
    return rows


def power_table_lines(table: Sequence[dict], alpha: float = ALPHA) -> list[str]:
    """:func:`power_table_cells` as aligned plain-text lines (``kvbounds show``)."""
    rows = power_table_cells(table, alpha)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in rows]


# ------------------------------------------------------------------ the report's "does it beat doing nothing" table
def beat_nothing_table(verdicts: dict) -> dict | None:
    """Rows = algorithms (the claims whose verdict has a power table; a setting "family | variant" gives one row
    per variant), columns = settings (stream families), cell =
    median ratio of the method's error to the best trivial control with its 95% interval; tone ``good`` when the
    method beats every control there (significantly, Holm), ``bad`` when the interval lies at or above 1."""
    from kvbounds.registry import CLAIMS
    rows, cols = [], []
    for cid, v in verdicts.items():
        table = getattr(v, "power_table", None) or []
        if not table:
            continue
        by_row: dict[str, dict] = {}
        for c in table:
            # "family | variant": one row per variant of the claim (BKV.vs-uniform's BalanceKV variants)
            col, _, variant = c["setting"].partition(" | ")
            cols.append(col)
            cells = by_row.setdefault(variant, {})
            if not c["p_adjusted"]:
                cells[col] = dict(text="not run", title=c["missing"], tone="none")
                continue
            lo, hi = c["ratio_ci"]
            beats = all(p < ALPHA for p in c["p_adjusted"].values())
            tone = "good" if beats else "bad" if lo >= 1 else "warn"
            cells[col] = dict(text=f"{_fmt(c['ratio'])} [{_fmt(lo)}, {_fmt(hi)}]", tone=tone,
                              title=f"vs {CONTROL_LABELS.get(c['best'], c['best'])}, {c['streams']} streams")
        for variant, cells in sorted(by_row.items()):
            name = CLAIMS[cid].algorithm if cid in CLAIMS and CLAIMS[cid].algorithm else cid
            rows.append(dict(algorithm=f"{name}: {variant}" if variant else name, claim=cid, cells=cells))
    if not rows:
        return None
    # the four families first (the columns most rows share), then each claim's own streams
    main = ("synthetic benign", "concentrated", "real SmolLM2", "real MiniLM")
    cols = sorted(set(cols), key=lambda s: (main.index(s) if s in main else len(main), s))
    return dict(columns=cols, rows=[dict(r, cells=[r["cells"].get(c, dict(text="-", title="", tone="none"))
                                                   for c in cols]) for r in rows])
