"""The ``rate`` dimension past a derived onset: a stated rate (an exponent in n or t) decided on the sizes
past where it should set in, with the exponent fitted per unit of replication.

The unit is an independent stream (its own keys, values, queries and walk coins); the sizes of one unit are nested
prefixes of its stream walked with the prefixes of its coins (common random numbers), so each unit gives one
least-squares log-log slope of measured/shape over the sizes, and the slope's 95% interval is Student's t over the
units (the units are independent; the sizes of one unit are not, and are never counted as units). The number of
units comes from :func:`units_needed`, a power calculation on a pilot's spread of the per-unit slopes.

:func:`decide_onset_rate` gives one of
  * ``observed``     past the onset the interval of the exponent lies within GROWTH_TOL of the stated one;
  * ``false``        past the onset the interval excludes the stated exponent by more than GROWTH_TOL: the rate is
                     false as stated, and the measured exponent is the one the data support;
  * ``not-reached``  the onset lies beyond the largest size run (both numbers are said), or past it the interval
                     straddles GROWTH_TOL while the measured curve still bends at the largest size run (its local
                     slope not yet flat: the regime has not set in where the derivation puts it), with the size a
                     decision needs and its cost (:func:`kvbounds.proofs_checks.scale_sweep.decide_scale`);
  * ``n/a``          past the onset, the curve flat at its end, but the interval straddles GROWTH_TOL: underpowered
                     (its width is said).
Public through :mod:`kvbounds.verdict`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable

import numpy as np
from scipy import stats

from kvbounds.core import Record
from ._statistics import GROWTH_TOL, canonical_order, record_sort_key
from ._fields import RateInfo

FIT_FROM = 0.5        # the fit past the onset takes the sizes >= FIT_FROM x onset (the walk has had half its steps)


@dataclasses.dataclass
class UnitFit:
    """The log-log slope of a value along ``param``, fitted per unit and averaged: mean, 95% t-interval over the
    units, the units' standard deviation, and the sizes the units share."""
    group: str
    param: str
    slope: float
    lo: float
    hi: float
    sd: float
    units: int
    sizes: tuple[float, ...]
    smallest: dict

    @property
    def x_range(self) -> tuple[float, float]:
        return (min(self.sizes), max(self.sizes))

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2

    @property
    def grows(self) -> bool:
        return self.lo > GROWTH_TOL

    @property
    def flat(self) -> bool:
        return self.hi <= GROWTH_TOL

    def text(self) -> str:
        return (f"{self.group} vs {self.param}: slope {self.slope:+.2f} [{self.lo:+.2f},{self.hi:+.2f}] over "
                f"{self.units} units, {self.param} = {self.x_range[0]:g}..{self.x_range[1]:g}")


def unit_fit(records: Iterable[Record], param: str, *, value: Callable[[Record], float] = lambda r: r.ratio,
             unit: Callable[[Record], Any] = lambda r: r.params["unit"], group: str = "",
             level: float = 0.95) -> UnitFit | None:
    """Each unit's least-squares slope of log value on log params[param] (units with >= 2 distinct sizes), then
    their mean with a Student-t interval over the units (>= 2 units). None when fewer than 2 units fit. A function
    of the set of records (no resampling, no seed)."""
    by_unit: dict[Any, list[Record]] = {}
    for r in canonical_order(records):
        if param in r.params:
            by_unit.setdefault(unit(r), []).append(r)
    slopes, sizes, first = [], set(), []
    for _, rs in sorted(by_unit.items(), key=lambda kv: repr(kv[0])):
        x = np.log([float(r.params[param]) for r in rs])
        if len(np.unique(x)) < 2:
            continue
        y = np.log(np.maximum([value(r) for r in rs], 1e-300))
        slopes.append(float(np.polyfit(x, y, 1)[0]))
        sizes |= {float(r.params[param]) for r in rs}
        first.append(min(rs, key=lambda r: (float(r.params[param]), record_sort_key(r))))
    if len(slopes) < 2:
        return None
    b = np.array(slopes)
    sd = float(b.std(ddof=1))
    half = float(stats.t.ppf((1 + level) / 2, len(b) - 1)) * sd / math.sqrt(len(b))
    small = min(first, key=lambda r: (float(r.params[param]), record_sort_key(r)))
    return UnitFit(group, param, float(b.mean()), float(b.mean()) - half, float(b.mean()) + half, sd, len(b),
                   tuple(sorted(sizes)), dict(small.params))


def units_needed(sd: float, half_width: float, *, level: float = 0.95, most: int = 1000) -> int:
    """The power calculation of a rate fit: the fewest units u >= 3 whose t-interval of the mean slope,
    t_{(1+level)/2, u-1} sd / sqrt(u), is at most ``half_width``, given a pilot's standard deviation ``sd`` of the
    per-unit slopes. A half-width of GROWTH_TOL - (the exponent a model predicts past the onset) decides that
    model's exponent from a growth of GROWTH_TOL on the expected interval."""
    if not (sd >= 0 and half_width > 0):
        raise ValueError(f"sd must be >= 0 and half_width > 0, got {sd!r}, {half_width!r}")
    for u in range(3, most + 1):
        if stats.t.ppf((1 + level) / 2, u - 1) * sd / math.sqrt(u) <= half_width:
            return u
    return most


def window_fits(records: Iterable[Record], param: str, *, value: Callable[[Record], float] = lambda r: r.ratio,
                unit: Callable[[Record], Any] = lambda r: r.params["unit"], window: int = 3) -> list[UnitFit | None]:
    """The per-unit fit (:func:`unit_fit`) over each run of ``window`` consecutive sizes, smallest first (None where
    fewer than two units fit): the curve's local slopes."""
    recs = list(records)
    xs = sorted({float(r.params[param]) for r in recs if param in r.params})
    fits = []
    for i in range(len(xs) - window + 1):
        lo, hi = xs[i], xs[i + window - 1]
        fits.append(unit_fit([r for r in recs if lo <= float(r.params.get(param, -1)) <= hi], param, value=value,
                             unit=unit, group=f"{param} = {lo:g}..{hi:g}"))
    return fits


def flat_from(records: Iterable[Record], param: str, *, value: Callable[[Record], float] = lambda r: r.ratio,
              unit: Callable[[Record], Any] = lambda r: r.params["unit"], window: int = 3) -> tuple[float | None, UnitFit | None]:
    """Where the measured curve bends: the smallest size x from which every window of ``window`` consecutive sizes
    has a flat per-unit slope (95% interval within GROWTH_TOL), with the fit of the window starting at x; (None,
    None) when the last window is not flat. Local windows, not one fit from x to the end: a fit over a long range
    averages the random-walk phase's ~0.3 with the plateau's ~0 and would call the curve flat too early."""
    recs = list(records)
    xs = sorted({float(r.params[param]) for r in recs if param in r.params})
    fits = window_fits(recs, param, value=value, unit=unit, window=window)
    start = None
    for i in range(len(fits) - 1, -1, -1):
        if fits[i] is None or not fits[i].flat:
            break
        start = i
    return (xs[start], fits[start]) if start is not None else (None, None)


def decide_onset_rate(fit: UnitFit | None, *, stated_exponent: float, onset: float, largest: float, param: str,
                      label: str = "", sets_in: str = "", whole=None) -> tuple[str, RateInfo]:
    """The rate past its onset (see the module doc). ``fit``: :func:`unit_fit` over the sizes >= FIT_FROM x onset
    (None when fewer than two of them were run); ``largest``: the largest size run; ``whole``: the growth over the
    whole range run (a :class:`UnitFit` or what :func:`kvbounds.verdict.growth` returns), the exponent a ``not-reached``
    rate reports. The RateInfo carries the onset, the largest size, the units and the exponent (stated + the
    fitted slope of measured/shape)."""
    label = label or "stated rate"
    if largest < onset or fit is None:
        span = whole.x_range if whole is not None else (float(largest), float(largest))
        est = (whole.slope, whole.lo, whole.hi) if whole is not None else (math.nan,) * 3
        return "not-reached", RateInfo(param, span, stated_exponent, stated_exponent + est[0],
                                       (stated_exponent + est[1], stated_exponent + est[2]), sets_in, label,
                                       onset=float(onset), largest=float(largest),
                                       units=getattr(whole, "units", 0))
    info = RateInfo(param, fit.x_range, stated_exponent, stated_exponent + fit.slope,
                    (stated_exponent + fit.lo, stated_exponent + fit.hi), sets_in, label, onset=float(onset),
                    largest=float(largest), units=fit.units)
    return ("false" if fit.grows else "observed" if fit.flat else "n/a"), info


def needed_words(ri: RateInfo) -> str:
    """"; deciding needs t ~ 1.5e+05, ~940 CPU s a unit at that size" (empty without an estimate)."""
    if ri.needed is None:
        return ""
    cost = (f", ~{float(f'{ri.needed_cpu_s:.2g}'):g} CPU s a unit at that size" if ri.needed_cpu_s is not None
            else "")
    return f"; deciding needs {ri.param} ~ {ri.needed:.2g}{cost}"


def rate_words(rate: str, ri: RateInfo) -> str:
    """The rate in the headline's words: observed / false as stated / not reached / undetermined, with the numbers."""
    p, what = ri.param, ri.label or "stated rate"
    on = f"{p}* ~ {ri.onset:.2g}" if ri.onset is not None else ""
    measured = f"{p}^{ri.measured_exponent:.2f} [{ri.ci[0]:.2f}, {ri.ci[1]:.2f}]"
    span = f"{p} = {ri.tested_range[0]:g}..{ri.tested_range[1]:g}, {ri.units} units"
    if rate == "not-reached" and ri.onset is not None and ri.largest is not None and ri.largest >= ri.onset:
        return (f"{what} not reached: past the derived onset {on} the measured curve still bends at the largest "
                f"{p} = {ri.largest:g} ({measured}, {span}){needed_words(ri)}")
    if rate == "not-reached":
        return f"{what} not reached: onset {on} beyond the largest {p} = {ri.largest:g}"
    if rate == "false":
        return f"{what} false as stated past {on}: measured {measured} ({span})"
    if rate == "observed":
        return f"{what} observed past {on}: measured {measured} ({span})"
    return f"{what} undetermined past {on}: {measured} straddles the growth tolerance ({span})"
