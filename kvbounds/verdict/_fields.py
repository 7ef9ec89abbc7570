"""What a verdict is made of: the :class:`Verdict` record with its dimensions and their allowed values, and the
parts it carries (findings, errata, constants, rate, reproductions, figure specs). The rules that fill them
live in :mod:`kvbounds.verdict`, which re-exports every name here."""
from __future__ import annotations

import dataclasses

# legacy single labels (``Verdict.status``), derived from ``statement`` by :func:`finalize`
HOLDS = "holds"
HOLDS_FITTED = "holds (fitted constant)"
FAILS = "fails"
NOT_REFUTED = "not refuted"
INCONCLUSIVE = "inconclusive"
NO_CHECK = "no check"
NOT_RUN = "not run"
VACUOUS = "vacuous at these norms"

@dataclasses.dataclass
class Finding:
    claim: str
    title: str
    detail: str
    smallest_input: dict = dataclasses.field(default_factory=dict)
    kind: str = "bound fails"   # "bound fails" | "versions disagree" | "erratum" | "rate" | "power" | "finding"


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
    where: dict | None = None   # restrict to records whose params have these values (e.g. {"d": 2})


# ------------------------------------------------------------------ verdict dimensions (issue 9)
# vacuous: the statement's bound (its scale at constant 1) is no smaller than the error of doing nothing (zeros) in
# most cells: it holds, and so does zeros; never reported as "holds" (kvbounds.verdict.decide_vacuity)
STATEMENT_VALUES = ("holds", "holds-fitted", "vacuous", "false", "not-refuted", "inconclusive", "not-run", "no-check")
PROOF_VALUES = ("sound", "errata", "n/a")
RATE_VALUES = ("observed", "false", "not-reached", "n/a")
# not-reproduced: no qualifying cell and the cells had the power to see the effect (evidence against, the effect
# bounded); not-shown: no qualifying cell, but the cells were underpowered (too few instances or redraws, or the
# smallest detectable effect above the reference) - inconclusive, not evidence against (issue 21)
REPRODUCTION_VALUES = ("reproduced", "partial", "not-reproduced", "not-shown", "reversed", "n/a")
POWER_VALUES = ("shown", "low", "n/a")
CLAIM_KINDS = ("theorem", "lemma", "algorithm property", "cost", "empirical")
LEGACY_STATUS = {"holds": HOLDS, "holds-fitted": HOLDS_FITTED, "vacuous": VACUOUS, "false": FAILS, "not-refuted": NOT_REFUTED,
                 "inconclusive": INCONCLUSIVE, "not-run": NOT_RUN, "no-check": NO_CHECK}


@dataclasses.dataclass
class Erratum:
    """An error in a proof step (or in the pseudocode) that does not by itself refute the statement."""
    where: str                      # "BalanceKV-NeurIPS Lemma C.3, step 2"
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
class Vacuity:
    """Why a statement is ``vacuous``: in ``zeros_meets`` of its ``cells`` (statement records that carry the error of
    doing nothing, zeros, in the claim's units) the bound at constant 1 is no smaller than that error; at any norm
    when ``any_norm`` names a term of the bound that alone reaches the most zeros can err there. ``log_scale``:
    (median, min, max) of the bound's natural log; ``method_constant`` / ``zeros_constant``: the largest
    measured / bound of the method and of zeros (what a fitted constant would be: not a result when vacuous)."""
    reason: str                     # "vacuous at these norms (scale e^103; zeros meets it in 90/90 cells)"
    cells: int
    zeros_meets: int
    log_scale: tuple[float, float, float]
    method_constant: float | None = None
    zeros_constant: float | None = None
    # "" or the term of the bound that alone is no smaller than the most doing nothing can err in the claim's units,
    # whatever the norms ("sqrt(d/s) = 1.79 (d = 64, s = 20)"): then the statement is vacuous at any norm
    any_norm: str = ""


@dataclasses.dataclass
class RateInfo:
    """A stated rate (an exponent in a swept parameter) against the measured one."""
    param: str                      # the swept parameter, e.g. "t"
    tested_range: tuple[float, float]
    stated_exponent: float
    measured_exponent: float
    ci: tuple[float, float]
    sets_in: str = ""               # where the stated rate should set in, and how that was estimated
    label: str = ""                 # e.g. "O(1/t) rate"; default from the stated exponent
    onset: float | None = None      # the derived size past which the rate is decided (kvbounds.verdict, issue 47)
    largest: float | None = None    # the largest size run
    units: int = 0                  # independent streams the exponent's interval is over (0: points, bootstrap)
    # not reached past the derived onset (the measured curve still bends at the largest size): the size a decision
    # needs (where the curve's falling local slope reaches flat) and a unit's CPU seconds to reach it, extrapolated
    # from the measured time per size
    needed: float | None = None
    needed_cpu_s: float | None = None


@dataclasses.dataclass
class Reproduction:
    """One empirical claim's reproduction for one variant of the method on one setup."""
    variant: str                    # "pseudocode" | "released" | ...
    status: str                     # one of REPRODUCTION_VALUES
    setup: str                      # model, layers, n, and how it differs from the paper's
    detail: str = ""
    bound_note: str = ""            # not-reproduced: "effect bounded by X"; not-shown: "smallest detectable effect X"


@dataclasses.dataclass
class Verdict:
    claim: str
    status: str                     # legacy single label, derived from ``statement`` by finalize()
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
    power_note: str = ""            # the headline's words when power is low against trivial estimators (issue 20)
    power_table: list = dataclasses.field(default_factory=list)   # per setting: method vs trivial controls (dicts)
    # per (family, control): the three-way call against the battery (kvbounds.battery._power_calls.Call.as_dict)
    power_calls: list = dataclasses.field(default_factory=list)
    proven_constant: Constant | None = None
    fitted_constant: Constant | None = None
    deferred: str = ""              # trials not run on the backends recorded (too large for them), by size
    vacuity: Vacuity | None = None  # for statement == "vacuous": why (kvbounds.verdict.decide_vacuity)
    # the variant(s) the empirical sentences speak of, in words (the headline's last part): from the claim's
    # registry entry ("variant measured: ..."), or set by a check that names each variant itself
    variant: str = ""
