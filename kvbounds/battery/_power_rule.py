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

The rule (:func:`power_vs_controls`): per setting (a stream family, ...) and control, the one rule's call
(:func:`kvbounds.verdict.paired_calls`: better / leaning better / tied / leaning worse / worse / not attainable /
not tested, with the effect, its 95% interval, the wins and the smallest detectable effect) at the unit of
replication (records of one unit summarised by their median), Holm over every (setting, control) of the claim.
``shown`` when every tested call is ``better``, ``low`` otherwise, the headline naming the calls that are not.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from kvbounds.algorithms.validation import InputError, check_array, check_error, check_probability, check_real
from kvbounds.core import Record
from kvbounds.verdict import (ALPHA, Comparison, call_words, canonical_order, control_order, holm_family_words,
                              label, paired_calls, per_unit, summary_words)
from kvbounds.verdict import LABELS as CONTROL_LABELS  # noqa: F401 - the labels of every control name


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
    streams: int                               # records with a method metric
    method: float                              # median of the method's metric
    controls: dict[str, float | None]          # median of each control's metric (None: could not run)
    p_adjusted: dict[str, float]               # Holm-adjusted two-sided p per control
    best: str = ""                             # the control with the smallest median
    ratio: float = math.nan                    # the effect (method / best control) over the units
    ratio_ci: tuple[float, float] = (math.nan, math.nan)
    missing: str = ""                          # why the setting (or a control, or some streams) did not run
    fraction: float = math.nan                 # median of the method's floats / the whole stream's
    unit: str = "independent streams"          # what a unit is (distinct text windows, generations, draws)
    calls: dict[str, dict] = dataclasses.field(default_factory=dict)   # control -> Call.as_dict()
    units: int = 0                             # units of replication (the most any control was paired over)
    metric: str = ""                           # the named metric of its calls (kvbounds.verdict.METRICS)

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


def _pairs(records: Sequence[Record], name: str, value: Callable[[Record], float],
           unit_of: Callable[[Record], Any]) -> tuple[list, list, list]:
    """(units, the method's metric, the control's) with one number per unit: the records of one unit (seeds of a
    randomized method, layers or heads of one text) summarised by their median (:func:`kvbounds.verdict.per_unit`),
    units in a canonical order. A NaN on either side leaves the record out; inf (an undefined estimate) is worst."""
    ms, cs = [], []
    for r in records:
        c = _stored(r.extra.get("controls", {}).get(name))
        v = value(r)
        if c is not None and not math.isnan(float(c)) and not math.isnan(v):
            u = unit_of(r)
            ms.append((u, min(v, 1e300)))
            cs.append((u, min(float(c), 1e300)))
    m, c = per_unit(ms), per_unit(cs)
    units = sorted(m, key=repr)
    return units, [m[u] for u in units], [c[u] for u in units]


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


def _each_record(r: Record) -> tuple:
    """The default unit: a record (its params and seed), for records that are each an independent stream."""
    from kvbounds.core import canonical
    return (canonical(r.params), r.seed)


def power_vs_controls(records: Iterable[Record], *, setting: Callable[[Record], Any],
                      value: Callable[[Record], float] = lambda r: r.measured, metric: str = "error",
                      alpha: float = ALPHA, unit: str | Callable[[str], str] = "independent streams",
                      unit_of: Callable[[Record], Any] | None = None, named_metric: str = "") -> TrivialPower:
    """The one rule's calls (:func:`kvbounds.verdict.paired_calls`) of the method against each control over
    ``records`` (the method's records carrying ``extra["controls"]``, and ``extra["floats"]`` /
    ``extra["not_tested"]`` where they come from the battery), grouped by ``setting(r)``, Holm over every (setting,
    control) of the claim. ``unit_of(r)``: the record's unit of replication (records of one unit, such as the seeds
    of a randomized method or the layers of one text, are summarised by their median and count once; default: each
    record is its own unit), ``unit`` the unit in words (or a function of the setting giving them); ``metric``: the
    metric in words for the detail,
    ``named_metric`` its name on every call ("practitioner" or "theorem", :data:`kvbounds.verdict.METRICS`).
    ``power`` is ``shown`` when every tested call is ``better``, ``low`` otherwise (``note``: the headline's
    words), ``n/a`` with no tested call. Order independent: records are sorted canonically, units and settings by
    name."""
    check_probability(alpha, "alpha")
    if not callable(setting) or not callable(value) or (unit_of is not None and not callable(unit_of)):
        raise InputError("setting, value and unit_of must be functions of a record")
    unit_of = unit_of or _each_record
    unit_words = unit if callable(unit) else (lambda s, u=unit: u)
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
    comparisons, keys, info = [], [], {}
    for s, rs in sorted(groups.items()):
        ran = [r for r in rs if not r.extra.get("missing") and "controls" in r.extra]
        ran, skipped = _not_compressing(ran)
        why = sorted({str(r.extra["missing"]) for r in rs if r.extra.get("missing")})
        names = sorted({k for r in rs if "controls" in r.extra for k in r.extra["controls"]}, key=control_order)
        miss = sorted({f"{label(k)}: {v}" for r in ran for k, v in r.extra.get("controls_missing", {}).items()})
        undefined = _undefined(ran, names, value)
        missing = "; ".join(why + ([skipped] if skipped else []) + miss + ([undefined] if undefined else []))
        frac = _fraction(ran) if ran else _fraction(rs)
        info[s] = dict(ran=ran, names=names, missing=missing, fraction=frac)
        for name in names:
            units, ms, cs = _pairs(ran, name, value, unit_of)
            reason = "" if ms else (skipped or missing or "no records")
            comparisons.append(Comparison(s, name, ms, cs, frac, reason))
            keys.append((s, name, float(np.median(cs)) if cs else None))
    calls = paired_calls(comparisons, alpha=alpha, metric=named_metric)
    by_setting: dict[str, dict[str, dict]] = {}
    meds: dict[str, dict[str, float | None]] = {}
    for (s, name, med), c in zip(keys, calls):
        by_setting.setdefault(s, {})[name] = dict(c.as_dict(), unit=unit_words(s))
        meds.setdefault(s, {})[name] = med
    cells = []
    for s, inf in sorted(info.items()):
        cs = by_setting.get(s, {})
        vals = [value(r) for r in inf["ran"] if not math.isnan(value(r))]
        cell = PowerCell(s, len(vals), float(np.median(vals)) if vals else math.nan, meds.get(s, {}),
                         {n: c["p"] for n, c in cs.items() if c["call"] != "not tested"}, missing=inf["missing"],
                         fraction=inf["fraction"], unit=unit_words(s), calls=cs, metric=named_metric,
                         units=max((c["n"] for c in cs.values()), default=0))
        avail = {n: v for n, v in cell.controls.items() if v is not None}
        if avail and vals:
            cell.best = min(avail, key=lambda n: (avail[n], n))
            c = cs[cell.best]
            if c["call"] != "not tested":
                cell.ratio, cell.ratio_ci = c["effect"], tuple(c["ci"])
        cells.append(cell)
    return _decide(cells, metric, alpha)


def practitioner_view(r: Record) -> Record | None:
    """The record as the practitioner's metric sees it (``extra["practitioner"]``, :func:`kvbounds.proofs_checks.
    power_streams.held_out_errors`): its measurement and controls replaced by theirs; None without one (a record of
    a stream that did not run passes as it is)."""
    p = r.extra.get("practitioner")
    if r.extra.get("missing"):
        return r
    if not isinstance(p, dict) or not isinstance(p.get("controls"), dict):
        return None
    return dataclasses.replace(r, measured=float(_stored(p["method"])),
                               extra={**r.extra, "controls": dict(p["controls"])})


def stream_unit(r: Record) -> Any:
    """A power record's unit of replication: ``extra["unit"]`` (a distinct text, a distinct draw), else the record."""
    return r.extra.get("unit") or _each_record(r)


def unit_words(setting: str) -> str:
    """The unit of a power setting in words: a distinct text window on real keys, a distinct draw otherwise."""
    return "distinct text windows" if "real" in str(setting).lower() else "independent draws"


def power_on_both_metrics(records: Iterable[Record], *, setting: Callable[[Record], Any], metric: str,
                          alpha: float = ALPHA, unit: str | Callable[[str], str] = unit_words,
                          unit_of: Callable[[Record], Any] = stream_unit) -> TrivialPower:
    """The calls on the practitioner's metric (the records' ``extra["practitioner"]``: the mean relative error over
    held-out later queries; it decides ``power``, the note and every better / worse statement) beside those on the
    theorem's (``value`` = the record's measurement, ``metric`` its words: the worst checkpoint of the current query,
    in the theorem's units). Records without a practitioner's metric (older records, or a claim whose quantity has
    none) give the theorem's calls alone. Each call names its metric (``metric``: "practitioner" / "theorem")."""
    records = list(records) if not isinstance(records, (str, bytes)) and hasattr(records, "__iter__") else None
    if records is None or not all(isinstance(r, Record) for r in records):
        raise InputError("records must be an iterable of Record")
    theorem = power_vs_controls(records, setting=setting, metric=metric, alpha=alpha, unit=unit, unit_of=unit_of,
                                named_metric="theorem")
    views = [v for v in (practitioner_view(r) for r in records) if v is not None]
    if not any(not v.extra.get("missing") for v in views):
        return theorem
    words = next(r.extra["practitioner"].get("metric", "") for r in records
                 if isinstance(r.extra.get("practitioner"), dict))
    prac = power_vs_controls(views, setting=setting, metric=words, alpha=alpha, unit=unit, unit_of=unit_of,
                             named_metric="practitioner")
    if prac.power == "n/a":
        return theorem
    return TrivialPower(prac.power, f"practitioner's metric: {prac.detail} Theorem's metric: {theorem.detail}",
                        prac.note, prac.cells + theorem.cells)


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
        lines.append(f"{c.setting} ({c.units} units: {c.unit}; {c.streams} records{frac}): method {metric} "
                     f"{_fmt(c.method)}; {words}" + (f"; missing: {c.missing}" if c.missing else ""))
    if not tested:
        return TrivialPower("n/a", "controls: " + "; ".join(lines), "", cells)
    power = "shown" if all(c["call"] == "better" for c in tested) else "low"
    words = summary_words(calls)
    return TrivialPower(power, f"controls ({holm_family_words(calls, alpha)}): {words}. " + "; ".join(lines),
                        words if power == "low" else "", cells)


def power_table_cells(table: Sequence[dict], alpha: float = ALPHA) -> list[list[str]]:
    """A verdict's ``power_table`` as rows of strings (header first): per setting, the units, the memory (% of
    the stream's floats), the method's median metric beside each control's with its call (``*`` better, ``+``
    leaning better, ``=`` tied, ``-`` leaning worse, ``!`` worse, ``?`` not attainable), and method / best control
    (the effect with its 95% interval). Tables of older records (no calls) mark ``*`` from their adjusted p."""
    names = sorted({n for c in table for n in c["controls"]}, key=control_order)
    rows = [["setting", "units", "memory", "method"] + [label(n) for n in names] + ["method / best [95%]"]]
    marks = {"better": "*", "leaning better": "+", "tied": "=", "leaning worse": "-", "worse": "!",
             "not attainable": "?", "not tested": " (not tested)"}
    for c in table:
        calls = c.get("calls") or {}
        frac = c.get("fraction", math.nan)
        mem = "" if frac is None or math.isnan(frac) else f"{100 * frac:.0f}%"
        if not c["p_adjusted"] and not any(x["call"] != "not tested" for x in calls.values()):
            rows.append([c["setting"], str(c.get("units", c["streams"])), mem, "not tested: " + (c["missing"] or "no records")]
                        + [""] * (len(names) + 1))
            continue
        cells = [_fmt(c["controls"].get(n)) + (marks[calls[n]["call"]] if n in calls else
                                                ("*" if c["p_adjusted"].get(n, 1.0) < alpha else "")) for n in names]
        lo, hi = c["ratio_ci"]
        rows.append([c["setting"], str(c.get("units", c["streams"])), mem, _fmt(c["method"])] + cells +
                    [f"{_fmt(c['ratio'])} vs {label(c['best'])} [{_fmt(lo)}, {_fmt(hi)}]"])
    return rows


def power_table_lines(table: Sequence[dict], alpha: float = ALPHA) -> list[str]:
    """:func:`power_table_cells` as aligned plain-text lines (``kvbounds show``)."""
    rows = power_table_cells(table, alpha)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in rows]
