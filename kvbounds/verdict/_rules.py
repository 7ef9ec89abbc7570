"""Claim-level verdicts built from records, and the shared rules that decide them.

A verdict has separate dimensions, each decided by one rule of this module, the same for every check:

  * ``statement``  (:func:`decide_statement`) ``false`` only from a *counterexample*: a record whose bound is
    decisive (``a-priori`` / ``exact`` / ``certificate``, the paper's own constants, not a reading of an O(.)
    with a chosen constant, not a proof step) and is violated; the smallest such input is named and is
    reproducible from the record's params and seed. O(.) claims with ``shape`` records are ``holds-fitted``;
    a statement that holds but whose bound doing nothing (zeros) meets too is ``vacuous`` (:func:`decide_vacuity`);
    growth of a fitted constant is never ``false``: it feeds ``rate``. A statement that sampling cannot refute
    (a lower bound, an unsampled quantifier) is at best ``not-refuted``. Empirical claims are decided from
    ``reproduction`` (:func:`statement_from_reproduction`).
  * ``proof``      ``errata`` when the list of :class:`Erratum` is non-empty; errata never change ``statement``.
  * ``rate``       (:func:`decide_rate`) ``not-reached`` when the fitted constant grows along the swept
    parameter (the measured exponent falls short of the stated one) while no decisive bound fails;
    :class:`RateInfo` carries the tested range, exponents with a 95% interval and where the rate should set in.
    Where the onset is derived (:func:`decide_onset_rate`), the rate is decided
    past it: ``observed``, ``false`` (the measured exponent excludes the stated one), ``not-reached`` only when
    the onset lies beyond the largest size run, ``n/a`` when the interval is too wide to tell.
  * ``power``      (:func:`decide_power`) ``low`` when a negative control is not rejected (including a
    control that also meets a bound too loose to tell it apart), ``shown`` when every control is rejected;
    for error-bound claims also against the trivial estimators (zeros, the mean of the values, a uniform sample
    and the recent window at the method's memory; :mod:`kvbounds.battery`): ``low`` with the headline
    "no better than <control> (<where>)" unless the method beats every one of them significantly.
  * ``reproduction`` (:func:`combine_reproductions`, :func:`reproduction_status`) for empirical claims.

:func:`decide` applies all rules to a check's records; :func:`finalize` derives ``headline`` and the legacy
``status`` from the dimensions (so a verdict built by hand gets the same labels). Verdicts are a function of
the *set* of records: every rule orders records canonically (:func:`canonical_order`) and the bootstrap of
:func:`loglog_slope` is seeded from its (sorted) points.

The verdict's fields live in :mod:`kvbounds.verdict`, the shared statistics in :mod:`kvbounds.verdict`,
the power rule in :mod:`kvbounds.verdict`, the vacuity rule in :mod:`kvbounds.verdict` and the
reproduction rule in :mod:`kvbounds.verdict`;
all are re-exported here, so checks import everything from this module.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from kvbounds.core import Record
from ._statistics import (GROWTH_TOL, Growth, canonical_order, data_seed, growth, holm_adjust, loglog_slope,
                          record_sort_key)
from ._fields import (CLAIM_KINDS, FAILS, HOLDS, HOLDS_FITTED, INCONCLUSIVE, LEGACY_STATUS, NO_CHECK, NOT_REFUTED,
                      NOT_RUN, POWER_VALUES, PROOF_VALUES, RATE_VALUES, REPRODUCTION_VALUES, STATEMENT_VALUES, VACUOUS,
                      Constant, Erratum, FigureSpec, Finding, RateInfo, Reproduction, Vacuity, Verdict)
from ._rate import rate_words
from ._power import Control, controls_from_records, controls_rejected, decide_power  # noqa: F401
from ._vacuity import TINY_CONSTANT, VACUOUS_SHARE, decide_vacuity, log_bound, trivial_error  # noqa: F401
from ._reproduction import (MIN_INSTANCES, MIN_REDRAWS, PARTIAL_SHARE, REPRODUCTION_KINDS, combine_reproductions,
                            reproduction_status, statement_from_reproduction)

DECISIVE_KINDS = ("a-priori", "exact", "certificate")


# ------------------------------------------------------------------ statement
def param_size(params: dict, keys: Sequence[str] = ("n", "d", "s", "t", "T")) -> tuple:
    """Order inputs by size so the smallest counterexample can be named."""
    return tuple(float(params.get(k, 0)) if isinstance(params.get(k, 0), (int, float)) else 0 for k in keys)


def is_decisive(r: Record, proof_steps: Iterable[str] = ()) -> bool:
    """Can this record refute the statement as written? Its bound must carry the paper's own constants
    (a-priori, exact, certificate), it must not be a control, not a reading of an O(.) with a chosen constant
    (``extra["reading"]``), and not a check of a proof step (``extra["proof_step"]`` or its check named in
    ``proof_steps``: those failures are errata)."""
    return (not r.control and r.bound_kind in DECISIVE_KINDS and not r.extra.get("reading")
            and not r.extra.get("proof_step") and r.check not in set(proof_steps))


def smallest_failure(records: Iterable[Record], size: Callable[[dict], Any] = param_size) -> Record | None:
    bad = [r for r in records if not r.holds and not r.control]
    return min(bad, key=lambda r: (size(r.params), -r.ratio, record_sort_key(r))) if bad else None


def counterexample(records: Iterable[Record], *, proof_steps: Iterable[str] = (),
                   size: Callable[[dict], Any] = param_size) -> dict | None:
    """The smallest decisive record that violates its bound, as a dict (params, seed, backend, measured,
    bound, ...) from which it can be re-run; None when there is none."""
    records = list(records)
    dec = [r for r in records if is_decisive(r, proof_steps)]
    r = smallest_failure(dec, size)
    if r is None:
        return None
    return dict(check=r.check, params=dict(r.params), seed=r.seed, backend=r.backend, measured=r.measured,
                bound=r.bound, ratio=r.ratio, bound_kind=r.bound_kind, source=r.source,
                violations=sum(not x.holds for x in dec), decisive_trials=len(dec))


def decide_statement(records: Sequence[Record], *, kind: str = "theorem", refutable: bool = True,
                     reproduction: str = "n/a", same_setup: bool = False,
                     proof_steps: Iterable[str] = ()) -> tuple[str, dict | None]:
    """(statement, counterexample) by the rule of the module docstring."""
    if not records:
        return "not-run", None
    if kind == "empirical":
        return statement_from_reproduction(reproduction, same_setup=same_setup), None
    cx = counterexample(records, proof_steps=proof_steps)
    if not refutable:
        return "not-refuted", None
    if cx is not None:
        return "false", cx
    main = [r for r in records if not r.control]
    if any(r.bound_kind in ("shape", "fitted") or r.extra.get("reading") for r in main):
        return "holds-fitted", None     # an O(.) statement: holds with a fitted (or read) constant
    if any(is_decisive(r, proof_steps) for r in main):
        return "holds", None
    return "not-refuted", None


# ------------------------------------------------------------------ rate, constants, errata
def rate_label(param: str, exponent: float) -> str:
    if exponent == 0:
        return "O(1)"
    e = abs(exponent)
    base = param if e == 1 else f"sqrt({param})" if e == 0.5 else f"{param}^{e:g}"
    return f"O(1/{base})" if exponent < 0 else f"O({base})"


def decide_rate(g: Growth | None, *, stated_exponent: float, sets_in: str = "",
                label: str = "") -> tuple[str, RateInfo | None]:
    """The rate of a quantity stated to scale as x^stated_exponent, from the growth ``g`` of measured/x^stated:
    ``not-reached`` when that ratio grows (95% CI lower end > GROWTH_TOL), ``observed`` when its CI upper end is
    <= GROWTH_TOL, else ``n/a`` (undetermined in the tested range; the RateInfo is still returned)."""
    if g is None:
        return "n/a", None
    info = RateInfo(g.param, g.x_range, stated_exponent, stated_exponent + g.slope,
                    (stated_exponent + g.lo, stated_exponent + g.hi), sets_in,
                    label or rate_label(g.param, stated_exponent) + " rate")
    return ("not-reached" if g.grows else "observed" if g.hi <= GROWTH_TOL else "n/a"), info


def mark(records: Iterable[Record], pred: Callable[[Record], bool], **extra) -> list[Record]:
    """Copies of the records, with ``extra`` added to those matching ``pred`` (e.g. ``reading=...`` or
    ``proof_step=...`` for records stored before a check named them so)."""
    return [dataclasses.replace(r, extra={**r.extra, **extra}) if pred(r) else r for r in records]


def fitted_constant(records: Iterable[Record], what: str = "max measured/shape",
                    value: Callable[[Record], float] = lambda r: r.ratio) -> Constant | None:
    vals = np.array([value(r) for r in records], float)
    vals = vals[np.isfinite(vals)]
    if not vals.size:
        return None
    return Constant(float(vals.max()), "fitted", what, (float(np.percentile(vals, 5)), float(np.median(vals))))


def max_ratio_words(records: Sequence[Record]) -> str:
    """"max measured/bound 2.6", or, where some ratio is not finite (a NaN or infinite output, or a zero bound),
    how many and the largest finite one instead of "inf"."""
    ratios = [r.ratio for r in records]
    fin = [x for x in ratios if math.isfinite(x)]
    if len(fin) == len(ratios):
        return f"max measured/bound {max(fin):.3g}"
    return (f"measured/bound not finite in {len(ratios) - len(fin)} trials (a NaN or infinite output, or a zero "
            "bound)" + (f"; largest finite {max(fin):.3g}" if fin else ""))


def spread_words(c: Constant) -> str:
    """"its 5th-50th percentile over trials 0.20-0.58": a fitted constant's spread in words."""
    return f"its 5th-50th percentile over trials {c.spread[0]:.2g}-{c.spread[1]:.2g}" if c.spread else "one trial"


def erratum_from_finding(f: Finding, corrected: str = "") -> Erratum:
    return Erratum(where=f.title, what=f.detail, smallest_input=dict(f.smallest_input), corrected=corrected)


# ------------------------------------------------------------------ headline and the one entry point
def _claim_kind(claim: str) -> str:
    try:
        from kvbounds.claims import CLAIMS
        return CLAIMS[claim].kind if claim in CLAIMS else ""
    except Exception:   # noqa: BLE001 - the registry is optional here
        return ""


def claim_variant(claim: str) -> str:
    """"variant measured: <words>" for a claim whose registry entry names the variant its empirical sentences are
    measured on (:data:`kvbounds.methods.VARIANT_WORDS`); "" otherwise."""
    try:
        from kvbounds.methods import variant_words
        from kvbounds.claims import CLAIMS
        key = CLAIMS[claim].variant if claim in CLAIMS else ""
    except Exception:   # noqa: BLE001 - the registries are optional here
        return ""
    if not key:
        return ""
    algorithm, _, variant = key.rpartition(":")
    return f"variant measured: {variant_words(algorithm, variant)}"


def headline(v: Verdict) -> str:
    """One short label from the dimensions, e.g. "bound holds; O(1/t) rate not reached for t <= 128"."""
    setups = ", ".join(dict.fromkeys(r.setup for r in v.reproductions if r.setup))
    parts = []
    if v.kind == "empirical" and v.reproduction != "n/a":
        word = {"reproduced": "reproduced", "partial": "partly reproduced", "not-reproduced": "not reproduced",
                "not-shown": "not shown", "reversed": "reversed"}[v.reproduction]
        notes = list(dict.fromkeys(r.bound_note for r in v.reproductions
                                   if r.bound_note and r.status == v.reproduction))
        if len(notes) == 1:
            word += f" ({notes[0]})"
        elif notes:      # each variant's own note, named
            word += " (" + "; ".join(f"{r.variant}: {r.bound_note}" for r in v.reproductions
                                     if r.bound_note and r.status == v.reproduction) + ")"
        parts.append(f"{word} on {setups}" if setups else word)
    elif v.statement == "false":
        parts.append("false as stated" + ("; corrected bound given" if v.corrected else ""))
    elif v.statement == "vacuous":
        parts.append(v.vacuity.reason if v.vacuity else VACUOUS)
    elif v.statement == "holds-fitted":
        c = v.fitted_constant
        if c is not None and c.value < TINY_CONSTANT:    # the scale dwarfs the error: not a result to report as held
            parts.append(f"fitted constant C = {c.value:.3g}, below {TINY_CONSTANT:g}: the scale is that loose "
                         "(whether doing nothing meets it too is not recorded)")
        else:
            parts.append(f"holds with fitted constant C = {c.value:.3g}" if c else "holds with a fitted constant")
    else:
        parts.append({"holds": "bound holds", "not-refuted": "not refuted", "inconclusive": "inconclusive",
                      "not-run": "not run", "no-check": "no check"}.get(v.statement, v.statement))
    if v.rate_info is not None and v.rate_info.onset is not None:
        parts.append(rate_words(v.rate, v.rate_info))
    elif v.rate_info is not None and v.rate != "n/a":
        ri = v.rate_info
        what = ri.label or "stated rate"
        parts.append(f"{what} not reached for {ri.param} <= {ri.tested_range[1]:g}" if v.rate == "not-reached"
                     else f"{what} observed")
    if v.errata:
        parts.append(f"proof has {len(v.errata)} errat{'um' if len(v.errata) == 1 else 'a'}")
    if v.power == "low":
        parts.append(v.power_note or "low power (a control is not rejected)")
    if v.variant:
        parts.append(v.variant)
    return "; ".join(parts)


def finalize(v: Verdict) -> Verdict:
    """Fill what follows from the dimensions: ``kind`` (registry), ``proof`` from the errata list,
    ``headline``, the legacy ``status``, and the legacy ``constant`` fields. Idempotent; call last."""
    v.kind = v.kind or _claim_kind(v.claim)
    v.variant = v.variant or claim_variant(v.claim)
    if not v.statement:
        v.statement = {v_: k for k, v_ in LEGACY_STATUS.items()}.get(v.status, "inconclusive")
        if v.statement == "false" and v.counterexample is None:
            v.statement = "inconclusive"   # a legacy "fails" without a counterexample is not a refutation
    if v.errata:
        v.proof = "errata"
    for name, allowed in (("statement", STATEMENT_VALUES), ("proof", PROOF_VALUES), ("rate", RATE_VALUES),
                          ("reproduction", REPRODUCTION_VALUES), ("power", POWER_VALUES)):
        if getattr(v, name) not in allowed:
            raise ValueError(f"{v.claim}: {name} = {getattr(v, name)!r} is not one of {allowed}")
    if v.statement == "false" and v.counterexample is None:
        raise ValueError(f"{v.claim}: statement 'false' needs a counterexample")
    v.headline = headline(v)
    v.status = LEGACY_STATUS[v.statement]
    if v.constant is None and (v.fitted_constant or v.proven_constant):
        c = v.fitted_constant or v.proven_constant
        v.constant, v.constant_spread, v.constant_kind = c.value, c.spread, c.kind
    return v


def decide(claim: str, records: Sequence[Record], *, summary: str = "", kind: str | None = None,
           figures: Sequence[FigureSpec] = (), findings: Sequence[Finding] = (), errata: Sequence[Erratum] = (),
           proof_checked: bool = False, refutable: bool = True, proof_steps: Iterable[str] = (),
           controls: Sequence[Control] | None = None, rate: tuple[str, RateInfo | None] = ("n/a", None),
           reproductions: Sequence[Reproduction] = (), same_setup: bool = False,
           proven: Constant | None = None, fitted: Constant | None = None, corrected: str = "",
           power_detail: str = "", trivial=None) -> Verdict:
    """Apply every rule to a check's records and return the finalized :class:`Verdict`.

    ``controls`` defaults to :func:`controls_from_records`; ``rate`` comes from :func:`decide_rate`;
    ``proof_checked`` says the check examined the proof (so no errata means ``sound``). ``trivial``: the
    :class:`kvbounds.battery.TrivialPower` of the method against the trivial estimators; power is ``low`` when
    either it or the check's own controls say so, and the headline names the trivial control that matches it."""
    records = canonical_order(records)
    kind = kind or _claim_kind(claim) or "theorem"
    repro = combine_reproductions(reproductions) if reproductions else "n/a"
    statement, cx = decide_statement(records, kind=kind, refutable=refutable, reproduction=repro,
                                     same_setup=same_setup, proof_steps=proof_steps)
    vacuity = decide_vacuity(records) if statement in ("holds", "holds-fitted") else None
    if vacuity is not None:        # zeros meets the bound too: no constant of it, nor a rate of it, is a result
        statement, fitted, rate = "vacuous", None, ("n/a", None)
    power, pdetail = decide_power(controls_from_records(records) if controls is None else controls)
    note, table, calls = "", [], []
    if trivial is not None and trivial.power != "n/a":
        power = "low" if "low" in (power, trivial.power) else "shown"
        pdetail = "; ".join(x for x in (power_detail or pdetail, trivial.detail) if x)
        power_detail, note, table = "", trivial.note, trivial.table()
    if trivial is not None:
        calls = trivial.calls
    v = Verdict(claim, "", summary, findings=list(findings), figures=list(figures), n_records=len(records),
                kind=kind, statement=statement, proof="errata" if errata else "sound" if proof_checked else "n/a",
                rate=rate[0], reproduction=repro, power=power, counterexample=cx,
                corrected=corrected if statement == "false" else "", errata=list(errata), rate_info=rate[1],
                reproductions=list(reproductions), power_detail=power_detail or pdetail,
                proven_constant=proven, fitted_constant=fitted, power_note=note, power_table=table,
                power_calls=calls, vacuity=vacuity)
    return finalize(v)


def standard_verdict(claim: str, records: Sequence[Record], *, figures: Sequence[FigureSpec] = (),
                     sweep: str | None = None, label: str = "", **rules) -> Verdict:
    """The default rule set: decisive bounds decide the statement; ``shape`` records give a fitted constant
    (max ratio) and its growth along ``sweep`` decides ``rate`` (stated: the ratio stays bounded); controls
    decide ``power``. Extra keyword arguments go to :func:`decide`."""
    records = canonical_order(records)
    if not records:
        return finalize(Verdict(claim, NOT_RUN, "no records", figures=list(figures), statement="not-run"))
    main = [r for r in records if not r.control]
    findings: list[Finding] = list(rules.pop("findings", ()))
    parts: list[str] = []
    fail = smallest_failure([r for r in main if is_decisive(r, rules.get("proof_steps", ()))])
    if fail is not None:
        n_bad = sum(not r.holds for r in main if is_decisive(r, rules.get("proof_steps", ())))
        findings.append(Finding(claim, f"{claim}{(' [' + fail.check + ']') if fail.check else ''}: bound violated "
                                f"in {n_bad}/{len(main)} trials",
                                f"measured {fail.measured:.4g} > bound {fail.bound:.4g} (ratio {fail.ratio:.3g}; "
                                f"{fail.bound_kind} bound, {fail.source})", fail.params))
    shape = [r for r in main if r.bound_kind in ("shape", "fitted")]
    fitted = None
    rate = rules.pop("rate", ("n/a", None))
    if shape:
        groups = sorted({r.check for r in shape})
        for name in groups:
            c = fitted_constant([r for r in shape if r.check == name])
            tag = f"[{name}] " if len(groups) > 1 else ""
            parts.append(f"{tag}fitted constant C = max(measured/shape) = {c.value:.3g} "
                         f"({spread_words(c)})")
        if len(groups) == 1:   # one constant only when the shape records share one unit
            fitted = fitted_constant(shape)
        if sweep:
            gs = growth(shape, sweep, group=lambda r: "shape")
            if gs:
                g = gs[0]
                parts.append(f"ratio vs {sweep}: log-log slope {g.slope:+.3f} [95% {g.lo:+.3f}, {g.hi:+.3f}]")
                if rate[0] == "n/a":
                    rate = decide_rate(g, stated_exponent=0.0, label="stated O(.) shape")
    steps = set(rules.get("proof_steps", ()))
    is_step = lambda r: bool(r.extra.get("proof_step")) or r.check in steps
    stmt = [r for r in main if not is_step(r)]
    bounded = [r for r in stmt if r.bound_kind not in ("shape", "fitted")]
    head = f"{sum(r.holds for r in stmt)}/{len(stmt)} trials within bound" + (
        f"; {max_ratio_words(bounded)}" if bounded else "")
    step_recs = [r for r in main if is_step(r)]
    if step_recs:
        head += f"; proof-step records within bound {sum(r.holds for r in step_recs)}/{len(step_recs)}"
    parts.insert(0, head)
    rejected, n_ctl = controls_rejected(records)
    if n_ctl:
        parts.append(f"negative controls rejected {rejected}/{n_ctl}")
    if label:
        parts.insert(0, label)
    v = decide(claim, records, summary="; ".join(parts), figures=figures, findings=findings,
               fitted=rules.pop("fitted", fitted), rate=rate, **rules)
    v.constant_kind = v.constant_kind or "proven"   # legacy: no fitted constant means the bounds' own constants
    return v


def finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
