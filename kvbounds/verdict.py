"""Claim-level verdicts built from records, and the shared rules for reaching them.

Statuses:
  * ``holds``                    every trial within the stated bound (constants as proven),
  * ``holds (fitted constant)``  an O(.) claim: the ratio measured/shape is bounded and does not grow
                                 along the swept parameter; the fitted constant is reported,
  * ``fails``                    some trial violates the bound; the smallest such input is a finding,
  * ``inconclusive``             a negative control passed (the check has no power), or no trials,
  * ``no check`` / ``not run``.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .records import Record

HOLDS = "holds"
HOLDS_FITTED = "holds (fitted constant)"
FAILS = "fails"
INCONCLUSIVE = "inconclusive"
NO_CHECK = "no check"
NOT_RUN = "not run"

# An O(.) claim asserts measured/shape stays bounded along the sweep. We call it growth when the
# log-log slope of that ratio against the swept parameter has a bootstrap 95% lower bound above this.
GROWTH_TOL = 0.15


@dataclasses.dataclass
class Finding:
    claim: str
    title: str
    detail: str
    smallest_input: dict = dataclasses.field(default_factory=dict)
    kind: str = "bound fails"   # "bound fails" | "versions disagree" | "erratum"


@dataclasses.dataclass
class FigureSpec:
    """Measured vs bound along one swept parameter (drawn by the report with seaborn)."""
    title: str
    x: str                      # params key on the x axis
    check: str | None = None    # restrict to records of this sub-check
    hue: str | None = None      # params key (or "check") for colour
    y: str = "measured"         # "measured" | "ratio"
    show_bound: bool = True
    logx: bool = True
    logy: bool = True
    sweep: str | None = None    # restrict to records with params["sweep"] == sweep (default: the sweep named x, if any)
    xlabel: str = ""            # axis labels with units (default: the report's label for the params key)
    ylabel: str = ""


# ------------------------------------------------------------------ verdict dimensions (issue 9)
# A claim's verdict has separate dimensions, each decided by the shared rules of this module.
STATEMENT_VALUES = ("holds", "holds-fitted", "false", "not-refuted", "inconclusive", "not-run", "no-check")
PROOF_VALUES = ("sound", "errata", "n/a")
RATE_VALUES = ("observed", "not-reached", "n/a")
REPRODUCTION_VALUES = ("reproduced", "partial", "not-reproduced", "reversed", "n/a")
POWER_VALUES = ("shown", "low", "n/a")
CLAIM_KINDS = ("theorem", "lemma", "algorithm property", "cost", "empirical")


@dataclasses.dataclass
class Erratum:
    """An error in a proof step (or in the pseudocode) that does not by itself refute the statement."""
    where: str                      # "001 Lemma C.3, step 2"
    what: str                       # what is wrong
    smallest_input: dict = dataclasses.field(default_factory=dict)
    corrected: str = ""             # the corrected step, when known


@dataclasses.dataclass
class Constant:
    """A constant of a bound: ``proven`` (the paper's, e.g. the walk's c = 30 log(n/delta)) or ``fitted``
    (max measured/shape over the sweep). ``what`` says which constant and which factors it includes."""
    value: float
    kind: str                       # "proven" | "fitted"
    what: str = ""
    spread: tuple[float, float] | None = None   # (5th percentile, median) for fitted constants


@dataclasses.dataclass
class RateInfo:
    """A stated rate (an exponent in a swept parameter) against the measured one."""
    param: str                      # the swept parameter, e.g. "t"
    tested_range: tuple[float, float]
    stated_exponent: float
    measured_exponent: float
    ci: tuple[float, float]
    sets_in: str = ""               # where the stated rate should set in, and how that was estimated


@dataclasses.dataclass
class Reproduction:
    """One empirical claim's reproduction for one variant of the method on one setup."""
    variant: str                    # "pseudocode" | "released" | ...
    status: str                     # one of REPRODUCTION_VALUES
    setup: str                      # model, layers, n, and how it differs from the paper's
    detail: str = ""


@dataclasses.dataclass
class Verdict:
    claim: str
    status: str                     # legacy single label; ``statement`` and the dimensions below replace it
    summary: str
    constant: float | None = None
    constant_spread: tuple[float, float] | None = None
    constant_kind: str | None = None   # "proven" | "fitted"
    findings: list[Finding] = dataclasses.field(default_factory=list)
    figures: list[FigureSpec] = dataclasses.field(default_factory=list)
    n_records: int = 0
    # the dimensions (issue 9); filled by the shared rules, rendered by the report
    kind: str = ""                  # CLAIM_KINDS, from the registry
    statement: str = ""             # STATEMENT_VALUES
    proof: str = "n/a"              # PROOF_VALUES
    rate: str = "n/a"               # RATE_VALUES
    reproduction: str = "n/a"       # REPRODUCTION_VALUES
    power: str = "n/a"              # POWER_VALUES
    headline: str = ""              # one short label derived from the dimensions
    counterexample: dict | None = None   # for statement == "false": params (+ measured, bound) of the smallest input
    corrected: str = ""             # for statement == "false": the corrected statement, when proven or measured
    errata: list[Erratum] = dataclasses.field(default_factory=list)
    rate_info: RateInfo | None = None
    reproductions: list[Reproduction] = dataclasses.field(default_factory=list)
    power_detail: str = ""
    proven_constant: Constant | None = None
    fitted_constant: Constant | None = None


def param_size(params: dict, keys: Sequence[str] = ("n", "d", "s", "t", "T")) -> tuple:
    """Order inputs by size so the smallest counterexample can be named."""
    return tuple(float(params.get(k, 0)) if isinstance(params.get(k, 0), (int, float)) else 0 for k in keys)


def smallest_failure(records: Iterable[Record], size: Callable[[dict], Any] = param_size) -> Record | None:
    bad = [r for r in records if not r.holds and not r.control]
    return min(bad, key=lambda r: (size(r.params), -r.ratio)) if bad else None


def controls_rejected(records: Iterable[Record]) -> tuple[int, int]:
    ctl = [r for r in records if r.control]
    return sum(not r.holds for r in ctl), len(ctl)


def loglog_slope(x: Sequence[float], y: Sequence[float], *, n_boot: int = 400, seed: int = 0) -> tuple[float, float, float]:
    """Least-squares slope of log y on log x with a bootstrap 95% interval (over points)."""
    lx, ly = np.log(np.asarray(x, float)), np.log(np.maximum(np.asarray(y, float), 1e-300))
    if len(np.unique(lx)) < 2:
        return 0.0, 0.0, 0.0
    slope = float(np.polyfit(lx, ly, 1)[0])
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot):
        idx = rng.integers(0, len(lx), len(lx))
        if len(np.unique(lx[idx])) < 2:
            continue
        boots.append(np.polyfit(lx[idx], ly[idx], 1)[0])
    lo, hi = (np.percentile(boots, [2.5, 97.5]) if boots else (slope, slope))
    return slope, float(lo), float(hi)


def standard_verdict(claim: str, records: Sequence[Record], *, figures: Sequence[FigureSpec] = (),
                     sweep: str | None = None, label: str = "") -> Verdict:
    """The default rule: controls must be rejected; a-priori/exact/certificate bounds must hold in every
    trial; ``shape`` records give a fitted constant (max ratio) and must not grow along ``sweep``."""
    figures = list(figures)
    if not records:
        return Verdict(claim, NOT_RUN, "no records", figures=figures)
    main = [r for r in records if not r.control]
    rejected, n_ctl = controls_rejected(records)
    findings: list[Finding] = []
    parts: list[str] = []
    status = HOLDS
    fail = smallest_failure(main)
    if fail is not None:
        status = FAILS
        n_bad = sum(not r.holds for r in main)
        findings.append(Finding(claim, f"{claim}{(' [' + fail.check + ']') if fail.check else ''}: bound violated "
                                f"in {n_bad}/{len(main)} trials",
                                f"measured {fail.measured:.4g} > bound {fail.bound:.4g} (ratio {fail.ratio:.3g}; "
                                f"{fail.bound_kind} bound, {fail.source})", fail.params))
    shape = [r for r in main if r.bound_kind in ("shape", "fitted")]
    const = spread = None
    if shape:
        groups: dict[str, list[Record]] = {}
        for r in shape:
            groups.setdefault(r.check, []).append(r)
        for name, rs in sorted(groups.items()):
            ratios = np.array([r.ratio for r in rs])
            tag = f"[{name}] " if len(groups) > 1 else ""
            parts.append(f"{tag}fitted constant C = max(measured/shape) = {ratios.max():.3g} "
                         f"(5%/50%: {np.percentile(ratios, 5):.3g}/{np.median(ratios):.3g})")
        if len(groups) == 1:   # one constant only when the shape records share one unit
            ratios = np.array([r.ratio for r in shape])
            const, spread = float(ratios.max()), (float(np.percentile(ratios, 5)), float(np.median(ratios)))
        if sweep:
            xs = [float(r.params[sweep]) for r in shape if sweep in r.params]
            if len(set(xs)) >= 2:
                slope, lo, hi = loglog_slope(xs, [r.ratio for r in shape if sweep in r.params])
                parts.append(f"ratio vs {sweep}: log-log slope {slope:+.3f} [95% {lo:+.3f}, {hi:+.3f}]")
                if lo > GROWTH_TOL:
                    status = FAILS
                    findings.append(Finding(claim, f"{claim}: measured/shape grows with {sweep}",
                                            f"log-log slope {slope:.3f} (95% CI {lo:.3f}..{hi:.3f}) > {GROWTH_TOL}: "
                                            f"the O(.) shape does not capture the growth in {sweep}",
                                            min(shape, key=lambda r: param_size(r.params)).params))
        if status == HOLDS:
            status = HOLDS_FITTED
    n_ok = sum(r.holds for r in main)
    bounded = [r for r in main if r.bound_kind not in ("shape", "fitted")]
    parts.insert(0, f"{n_ok}/{len(main)} trials within bound"
                 + (f"; max measured/bound {max(r.ratio for r in bounded):.3g}" if bounded else ""))
    if n_ctl:
        parts.append(f"negative controls rejected {rejected}/{n_ctl}")
        if rejected < n_ctl and status != FAILS:
            status = INCONCLUSIVE
            findings.append(Finding(claim, f"{claim}: negative control not rejected",
                                    "a deliberately broken variant passed the check, so the check lacks power",
                                    next(r.params for r in records if r.control and r.holds), kind="erratum"))
    if label:
        parts.insert(0, label)
    return Verdict(claim, status, "; ".join(parts), constant=const, constant_spread=spread,
                   constant_kind="fitted" if const is not None else "proven", findings=findings,
                   figures=figures, n_records=len(records))


def finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def reproduction_status(better: int, worse: int, cells: int) -> str:
    """The shared rule for a comparative empirical claim, per variant of the method and per setup.

    Over ``cells`` independent cells (e.g. layer x compression level), ``better`` cells show the claimed
    direction significantly (a one-sided test at the check's level) and ``worse`` cells the opposite
    direction significantly:
      * ``reproduced``      better >= 3/4 of the cells and no cell significantly the other way,
      * ``reversed``        worse >= 3/4 of the cells and no cell significantly in the claimed direction,
      * ``partial``         at least one significant cell in the claimed direction, short of ``reproduced``,
      * ``not-reproduced``  otherwise (no significant cell in the claimed direction).
    """
    if cells <= 0:
        return "n/a"
    if better >= math.ceil(0.75 * cells) and worse == 0:
        return "reproduced"
    if worse >= math.ceil(0.75 * cells) and better == 0:
        return "reversed"
    if better >= 1:
        return "partial"
    return "not-reproduced"
