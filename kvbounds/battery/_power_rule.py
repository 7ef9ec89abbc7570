"""The power rule: each error-bound claim's method against the battery of controls at equal memory
(:mod:`kvbounds.battery`: zeros and the mean, StreamingLLM, uniform, the method's ablation).

By Cauchy-Schwarz, ||softmax^T V|| <= ||softmax||_2 ||V||_op <= ||softmax||_2 ||V||_F, so the estimator that
returns zeros meets BKV.attention's scale (BalanceKV-NeurIPS Thm 3.1) and SG.attention's (SubGen Thm 1) for every
eps >= 1. A bound that a do-nothing estimator also meets is no evidence for the method, and a method that loses to
the field's standard baselines at the same memory is no improvement: each claim's verdict carries a call per
(family, control).

Representation (one for every check): a method record carries ``extra["controls"] = {name: value}``, each control's
value in the claim's own metric on exactly the record's stream, seed and checkpoints (``None`` when the control
could not run, with the reason in ``extra["controls_missing"][name]``), ``extra["floats"]`` (the method's floats,
the whole stream's, their ratio and each control's: :func:`kvbounds.battery.floats_record`) and, where the method
holds at least the whole stream's floats, ``extra["not_tested"]`` (the stream is no test: every control is exact).
A stream family that could not run at all (a real trace missing) is a record with ``extra["missing"]`` and a NaN
measurement. Records stored before the battery (control names ``mean_values``, ``recent``, ...) load and are
called under their own labels.

The rule (:func:`power_vs_controls`): per setting (a stream family, ...) and control, the three-way call of
:mod:`kvbounds.battery` (better / tied / worse / not shown / not tested, with the median ratio, its 95%
interval, the wins and the smallest detectable ratio), Holm over every (setting, control) of the claim
(:func:`kvbounds.verdict.holm_adjust`, the shared rule). ``shown`` when every tested call is ``better``,
``low`` otherwise, the headline naming the calls that are not.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable, Sequence

import numpy as np
from scipy import stats

from kvbounds.algorithms.validation import (InputError, check_array, check_error, check_probability, check_real,
                                            check_values)
from ._power_calls import (EQUIVALENCE, MIN_STREAMS, call_words, control_order, decide_call, label, summary_words,
                           two_sided_p)
from kvbounds.core import Record
from kvbounds.verdict import canonical_order, holm_adjust

from ._power_calls import LABELS as CONTROL_LABELS  # noqa: E402,F401 - the labels of every control name
ALPHA = 0.05


# ------------------------------------------------------------------ the worst error over checkpoints
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
    """One setting (stream family, memory) of one claim: the method's and each control's metric over paired
    streams, and the call against each control (:mod:`kvbounds.battery`)."""
    setting: str
    streams: int
    method: float                              # median of the method's metric
    controls: dict[str, float | None]          # median of each control's metric (None: could not run)
    p_adjusted: dict[str, float]               # Holm-adjusted two-sided p per control
    best: str = ""                             # the control with the smallest median
    ratio: float = math.nan                    # median of method / best control over the streams
    ratio_ci: tuple[float, float] = (math.nan, math.nan)
    missing: str = ""                          # why the setting (or a control, or some streams) did not run
    fraction: float = math.nan                 # median of the method's floats / the whole stream's
    unit: str = "independent streams"          # what the paired samples are (layers of one generation, ...)
    calls: dict[str, dict] = dataclasses.field(default_factory=dict)   # control -> Call.as_dict()

    def beaten(self, name: str, alpha: float = ALPHA) -> bool:
        c = self.calls.get(name)
        return c["call"] == "better" if c else self.p_adjusted.get(name, 1.0) < alpha


@dataclasses.dataclass
class TrivialPower:
    power: str                                 # "shown" | "low" | "n/a"
    detail: str
    note: str                                  # the headline's words when low (kvbounds.battery.summary_words)
    cells: list[PowerCell]

    def table(self) -> list[dict]:
        return [dataclasses.asdict(c) for c in self.cells]

    @property
    def calls(self) -> list[dict]:
        """Every (setting, control) call of the claim, in setting then battery order."""
        return [cell.calls[n] for cell in self.cells for n in sorted(cell.calls, key=control_order)]


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


def _stored(x):
    """A control's value as stored: a non-finite float comes back from JSON as 'inf' / 'nan' (records.jsonable)."""
    return float(x) if isinstance(x, str) and x in ("inf", "-inf", "nan") else x


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
        k = sum(1 for r in records if isinstance(c := _stored(r.extra["controls"].get(name)), (int, float))
                and math.isnan(c))
        if k:
            parts.append(f"{label(name)}: {k} undefined (NaN) value(s) left out")
    return "; ".join(parts)


def _pairs(records: Sequence[Record], name: str, value: Callable[[Record], float]) -> tuple[list, list]:
    ms, cs = [], []
    for r in records:
        c = _stored(r.extra.get("controls", {}).get(name))
        v = value(r)
        if c is not None and not math.isnan(float(c)) and not math.isnan(v):   # inf (undefined estimate) is worst
            ms.append(min(v, 1e300))
            cs.append(min(float(c), 1e300))
    return ms, cs


def _fraction(records: Sequence[Record]) -> float:
    fr = [r.extra["floats"]["fraction"] for r in records if isinstance(r.extra.get("floats"), dict)
          and isinstance(r.extra["floats"].get("fraction"), (int, float))]
    return float(np.median(fr)) if fr else math.nan


def _not_compressing(records: Sequence[Record]) -> tuple[list[Record], str]:
    """(the streams where the method compresses, why the others are not tested)."""
    out = [r for r in records if not r.extra.get("not_tested")]
    skipped = [r for r in records if r.extra.get("not_tested")]
    if not skipped:
        return out, ""
    worst = max(skipped, key=lambda r: (r.extra.get("floats", {}).get("fraction", 0.0), r.seed))
    return out, (f"{len(skipped)}/{len(records)} stream(s) not tested ({worst.extra['not_tested']})")


def power_vs_controls(records: Iterable[Record], *, setting: Callable[[Record], Any],
                      value: Callable[[Record], float] = lambda r: r.measured, metric: str = "error",
                      alpha: float = ALPHA, unit: str = "independent streams") -> TrivialPower:
    """The calls of :mod:`kvbounds.battery` over ``records`` (the method's records carrying
    ``extra["controls"]``, and ``extra["floats"]`` / ``extra["not_tested"]`` where they come from the battery),
    grouped by ``setting(r)``; ``power`` is ``shown`` when every tested call is ``better``, ``low`` otherwise
    (``note``: the headline's words), ``n/a`` with no tested call. ``unit``: what the paired samples are
    ("independent streams", "layers of one generation", ...), carried by every cell and call. Order independent:
    records are sorted canonically and the settings and controls by name."""
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
                _real_or_nan(_stored(c), f"control {name!r} of a record of {r.claim}")
    groups: dict[str, list[Record]] = {}
    for r in records:
        groups.setdefault(str(setting(r)), []).append(r)
    if not groups:
        return TrivialPower("n/a", "no trivial controls recorded", "", [])
    tests: list[tuple[str, str]] = []
    pvals: list[float | None] = []
    direction: dict[tuple, str] = {}
    raw: dict[str, dict] = {}
    for s, rs in sorted(groups.items()):
        ran = [r for r in rs if not r.extra.get("missing") and "controls" in r.extra]
        ran, skipped = _not_compressing(ran)
        why = sorted({str(r.extra["missing"]) for r in rs if r.extra.get("missing")})
        names = sorted({k for r in rs if "controls" in r.extra for k in r.extra["controls"]}, key=control_order)
        miss = sorted({f"{label(k)}: {v}" for r in ran for k, v in r.extra.get("controls_missing", {}).items()})
        undefined = _undefined(ran, names, value)
        raw[s] = dict(ran=ran, names=names, skipped=skipped, all=rs,
                      missing="; ".join(why + ([skipped] if skipped else []) + miss + ([undefined] if undefined else [])))
        for name in names:
            ms, cs = _pairs(ran, name, value)
            if len(ms) >= MIN_STREAMS:
                tests.append((s, name))
                p, direction[(s, name)] = two_sided_p(ms, cs)
                pvals.append(p)
    adj = dict(zip(tests, holm_adjust(pvals))) if tests else {}
    cells = []
    for s, info in sorted(raw.items()):
        ran, names = info["ran"], info["names"]
        meds, calls = {}, {}
        frac = _fraction(ran) if ran else _fraction(info["all"])
        for name in names:
            ms, cs = _pairs(ran, name, value)
            meds[name] = float(np.median(cs)) if cs else None
            reason = "" if ms else (info["skipped"] or info["missing"] or "no records")
            calls[name] = decide_call(s, name, frac, ms, cs, adj.get((s, name), 1.0), direction.get((s, name), ""),
                                      max(len(tests), 1), alpha, reason=reason, unit=unit).as_dict()
        vals = [value(r) for r in ran if not math.isnan(value(r))]
        cell = PowerCell(s, len(vals), float(np.median(vals)) if vals else math.nan, meds,
                         {n: adj[(s, n)] for n in names if (s, n) in adj}, missing=info["missing"], fraction=frac,
                         unit=unit, calls=calls)
        avail = {n: v for n, v in meds.items() if v is not None}
        if avail and vals:
            cell.best = min(avail, key=lambda n: (avail[n], n))
            c = calls[cell.best]
            if c["call"] != "not tested":
                cell.ratio, cell.ratio_ci = c["ratio_median"], tuple(c["ci"])
        cells.append(cell)
    return _decide(cells, metric, alpha)


def _fmt(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else "inf" if math.isinf(x) else f"{x:.3g}"


def _decide(cells: list[PowerCell], metric: str, alpha: float) -> TrivialPower:
    calls = [c for cell in cells for c in cell.calls.values()]
    tested = [c for c in calls if c["call"] != "not tested"]
    lines = []
    for c in cells:
        frac = f", {100 * c.fraction:.0f}% of the stream's floats" if not math.isnan(c.fraction) else ""
        if not any(x["call"] != "not tested" for x in c.calls.values()):
            why = c.missing or next((x["reason"] for x in c.calls.values() if x.get("reason")), "no records")
            lines.append(f"{c.setting}: not tested ({why})")
            continue
        words = "; ".join(call_words(c.calls[n], family=False) for n in sorted(c.calls, key=control_order))
        lines.append(f"{c.setting} ({c.streams} streams{frac}): method {metric} {_fmt(c.method)}; {words}"
                     + (f"; missing: {c.missing}" if c.missing else ""))
    if not tested:
        return TrivialPower("n/a", "controls: " + "; ".join(lines), "", cells)
    power = "shown" if all(c["call"] == "better" for c in tested) else "low"
    rule = (f"two one-sided Wilcoxon signed-rank tests per (setting, control), Holm over {len(tested)} at {alpha:g}; "
            f"tied: the 95% interval of the median ratio within [1/{EQUIVALENCE:g}, {EQUIVALENCE:g}]")
    words = summary_words(calls)
    return TrivialPower(power, f"controls ({rule}): {words}. " + "; ".join(lines), words if power == "low" else "",
                        cells)


def power_table_cells(table: Sequence[dict], alpha: float = ALPHA) -> list[list[str]]:
    """A verdict's ``power_table`` as rows of strings (header first): per setting, the streams, the memory (% of
    the stream's floats), the method's median metric beside each control's with its call (``*`` better: the method
    significantly below it, Holm; ``!`` worse; ``=`` tied; no mark: not shown), and method / best control [95%].
    Tables of older records (no calls) mark ``*`` from their adjusted p."""
    names = sorted({n for c in table for n in c["controls"]}, key=control_order)
    rows = [["setting", "streams", "memory", "method"] + [label(n) for n in names] + ["method / best [95%]"]]
    marks = {"better": "*", "worse": "!", "tied": "=", "not shown": "", "not tested": " (not tested)"}
    for c in table:
        calls = c.get("calls") or {}
        frac = c.get("fraction", math.nan)
        mem = "" if frac is None or math.isnan(frac) else f"{100 * frac:.0f}%"
        if not c["p_adjusted"] and not any(x["call"] != "not tested" for x in calls.values()):
            rows.append([c["setting"], str(c["streams"]), mem, "not tested: " + (c["missing"] or "no records")]
                        + [""] * (len(names) + 1))
            continue
        cells = [_fmt(c["controls"].get(n)) + (marks[calls[n]["call"]] if n in calls else
                                                ("*" if c["p_adjusted"].get(n, 1.0) < alpha else "")) for n in names]
        lo, hi = c["ratio_ci"]
        rows.append([c["setting"], str(c["streams"]), mem, _fmt(c["method"])] + cells +
                    [f"{_fmt(c['ratio'])} vs {label(c['best'])} [{_fmt(lo)}, {_fmt(hi)}]"])
    return rows


def power_table_lines(table: Sequence[dict], alpha: float = ALPHA) -> list[str]:
    """:func:`power_table_cells` as aligned plain-text lines (``kvbounds show``)."""
    rows = power_table_cells(table, alpha)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in rows]
