"""The scale sweeps of SB.discrepancy and MR.error: a stated rate measured past the walk's onset on a CPU.

A trial is one *unit*: an independent stream (its keys, values and queries, and the walk's coins) of the largest
size, run at every size of ``params["sizes"]`` on the stream's nested prefixes; each size gives its records, with
``params["n"]`` (or ``"t"``) that size and the walk's CPU and wall seconds at it (``extra["cpu_s"]``,
``extra["wall_s"]``). Units are spread over processes (``--workers``) or a cluster (``--scheduler``) like any
trial. The rate is decided past the onset (theory.balancekv.merge_reduce_rate_onset) by
:func:`kvbounds.verdict.decide_onset_rate` on the exponent fitted per unit, one decision per onset (per d), and
checked against where the measured curve turns flat (:func:`kvbounds.verdict.flat_from`).

The number of units is a power calculation (:func:`kvbounds.verdict.units_needed`) on a pilot's spread of the
per-unit slopes (see each check's ``SCALE_UNITS``).
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Sequence

import numpy as np

from kvbounds.core import Record
from .common import deferred_record, on_gpu
from kvbounds.verdict import (FIT_FROM, Control, FigureSpec, Finding, RateInfo, decide_onset_rate, flat_from,
                              unit_fit, window_fits)

__all__ = ["ScaleRate", "Timer", "onset_sizes", "size_params", "deferred_unit", "decide_scale", "local_slopes", "needed_size", "cpu_at",
           "time_text", "combine", "scale_findings", "scale_figures"]


@dataclasses.dataclass
class ScaleRate:
    """One onset's decision: the dimension d (or what groups it), the onset, the rate and its words."""
    key: object
    onset: float
    top: float
    rate: str
    info: RateInfo
    text: str
    bend: float | None


class Timer:
    """CPU (this process) and wall seconds of a block: ``with Timer() as t: ...; t.cpu_s, t.wall_s``."""

    def __enter__(self):
        self._c, self._w = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.cpu_s, self.wall_s = time.process_time() - self._c, time.perf_counter() - self._w
        return False


def onset_sizes(onset: float, *, factors=(0.5, 1, 2), first: int = 1 << 10, multiple: int = 64) -> list[int]:
    """A scale sweep's sizes: powers of two from ``first`` below FIT_FROM x onset (the curve before the regime),
    then onset x each factor rounded up to a multiple of ``multiple`` (the fit past the onset: n*/2, n*, 2 n* by
    default, so the largest size is at least twice the onset)."""
    past = [int(multiple * math.ceil(onset * f / multiple)) for f in factors]
    below, x = [], first
    while x < 0.75 * min(past):
        below.append(x)
        x *= 2
    return below + past


def size_params(params: dict, key: str, size: int) -> dict:
    """A record's params: the unit trial's (its ``sizes`` included, so that a deferred trial is matched by the
    record of its largest size measured elsewhere) with ``key`` = this size."""
    return dict(params, **{key: int(size)})


def deferred_unit(claim: str, params: dict, key: str, limit: int, backend: str, *, source: str, reason: str,
                  **extra) -> list[Record]:
    """A scale-sweep unit too large for a CPU backend: [its one deferred record] (params: the unit's, ``key`` = its
    largest size, plus ``extra``) when its largest size exceeds ``limit`` and the backend is not a GPU; [] when it
    runs here. The three sweeps' units (SB.discrepancy, MR.error, BKV.memory) defer alike."""
    top = max(params["sizes"])
    if top <= limit or on_gpu(backend):
        return []
    return [deferred_record(claim, dict(size_params(params, key, top), **extra), source=source, reason=reason)]


def decide_scale(records: Sequence[Record], param: str, *, main: str, control: str | None, group: Callable,
                 onset: Callable[[Record], float], top: Callable[[Record], float], value: Callable[[Record], float],
                 stated_exponent: float, label: str, words: str = "",
                 model: Callable[[float, float, Record], float] | None = None) -> tuple[list[ScaleRate], list[Control], list[str]]:
    """Per group (one onset each; ``words`` + the group key names it, "d = 4"): the rate past FIT_FROM x onset on the
    ``main`` check's records (value: measured/shape, so the exponent is the stated one + its slope), the bend of its
    curve, the time per size, and the ``control`` check (random signs) against the same test, which must find growth
    there. ``model(lo, hi, record)``: the exponent a model predicts over the fit range (said beside the measured one).
    Returns (decisions, controls, summary parts)."""
    out, controls, parts = [], [], []
    groups: dict = {}
    for r in records:
        groups.setdefault(group(r), []).append(r)
    for key in sorted(groups, key=repr):
        recs = groups[key]
        mains = [r for r in recs if r.check == main]
        if not mains:
            continue
        on, tp = float(onset(mains[0])), float(top(mains[0]))
        largest = max(float(r.params[param]) for r in mains)
        tail = [r for r in mains if float(r.params[param]) >= FIT_FROM * on]
        name = f"{words}{key}"
        fit = unit_fit(tail, param, value=value, group=name) if largest >= on else None
        whole = unit_fit(mains, param, value=value, group=name)
        sets_in = (f"{param}* ~ {on:.2g} at {words}{key} (theory.balancekv.merge_reduce_rate_onset; the top direction "
                   f"at {tp:.2g}); decided on {param} >= {FIT_FROM:g} {param}*")
        rate, info = decide_onset_rate(fit, stated_exponent=stated_exponent, onset=on, largest=largest, param=param,
                                       label=label, sets_in=sets_in, whole=whole)
        bend, bfit = flat_from(mains, param, value=value)
        still = ""
        if rate == "n/a" and bend is None:
            # past the derived onset the curve still bends at its end, its local slope falling: the regime has not
            # set in by the largest size; not reached, with the size a decision needs and what reaching it costs
            # (a local slope that is not falling names no such size: undetermined stays)
            local = local_slopes(mains, param, value=value)
            needed = needed_size(local, largest)
            cost = cpu_at(mains, param, needed) if needed is not None else None
            if needed is not None:
                rate, info = "not-reached", dataclasses.replace(info, needed=needed, needed_cpu_s=cost)
            still = ("; its local slope per pair of sizes "
                     + ", ".join(f"{s:+.2f} ({param} = {a:g}..{b:g})" for a, b, s in local[-3:])
                     + (f" falls toward flat near {param} ~ {needed:.2g} ({needed / on:.2g} {param}*"
                        + (f", ~{float(f'{cost:.2g}'):g} CPU s a unit at that size, from the measured time per size"
                           if cost else "")
                        + ")" if needed is not None else ": not falling, so no size can be named where it sets in"))
        ex = f"exponent {info.measured_exponent:.2f} [{info.ci[0]:.2f}, {info.ci[1]:.2f}] (stated {stated_exponent:g}"
        if model is not None and fit is not None:
            ex += f"; the mean-field model's {stated_exponent + model(*fit.x_range, mains[0]):+.2f} over the same range"
        ex += ")"
        text = (f"{name}: {main} past {FIT_FROM:g} {param}* ({param} = {fit.x_range[0]:g}..{fit.x_range[1]:g}, "
                f"{fit.units} units): {ex}" if fit is not None else
                f"{name}: onset {param}* ~ {on:.2g} beyond the largest {param} = {largest:g}; {ex} over "
                f"{param} <= {largest:g}")
        bend_text = (f"the measured curve is flat from {param} = {bend:g} on ({bfit.text()}), "
                     + ("at or before" if bend <= on else "after") + f" the derived onset {on:.2g} "
                     f"(top direction {tp:.2g})") if bend is not None else \
            f"the measured curve does not turn flat within {param} <= {largest:g} (derived onset {on:.2g}){still}"
        parts += [text, bend_text, time_text(mains, param)]
        rand = [r for r in recs if control is not None and r.check == control and float(r.params[param]) >= FIT_FROM * on]
        rfit = unit_fit(rand, param, value=value, group=f"{control}, {name}") if fit is not None else None
        if rfit is not None:
            controls.append(Control(f"{control} vs the rate test past {FIT_FROM:g} {param}* ({name})", rfit.grows,
                                    f"exponent {stated_exponent + rfit.slope:.2f} [{stated_exponent + rfit.lo:.2f}, "
                                    f"{stated_exponent + rfit.hi:.2f}] over {rfit.units} units"))
        out.append(ScaleRate(key, on, tp, rate, info, text, bend))
    return out, controls, parts


def local_slopes(records: Sequence[Record], param: str, *, value: Callable[[Record], float]) -> list[tuple]:
    """[(a, b, slope)]: the per-unit log-log slope over each pair of consecutive sizes a < b (mean over units)."""
    return [(*f.x_range, f.slope) for f in window_fits(records, param, value=value, window=2) if f is not None]


def needed_size(local: Sequence[tuple], largest: float) -> float | None:
    """Where a curve still bending at ``largest`` turns flat, at the pace its local slope falls: the last two local
    slopes give the fall per doubling of the size, and the size is ``largest`` doubled until the slope, so
    continued, reaches 0. None when the slope is not falling (or fewer than two local slopes)."""
    if len(local) < 2:
        return None
    (a0, b0, s0), (a1, b1, s1) = local[-2], local[-1]
    fall = (s0 - s1) / max(math.log2(math.sqrt(a1 * b1) / math.sqrt(a0 * b0)), 1e-9)
    if not fall > 0:
        return None
    return float(largest * 2 ** max(1, math.ceil(s1 / fall)))


def cpu_at(records: Sequence[Record], param: str, size: float) -> float | None:
    """A unit's CPU seconds at ``size``, extrapolated from the median time of the two largest sizes measured (their
    growth per doubling, continued); None without two timed sizes."""
    by = _times(records, param)
    if len(by) < 2:
        return None
    (xp, tp), (xl, tl) = [(x, float(np.median([c for c, _ in by[x]]))) for x in sorted(by)[-2:]]
    if not (tp > 0 and tl > 0):
        return None
    growth = (tl / tp) ** (1 / math.log2(xl / xp))
    return float(tl * growth ** math.log2(size / xl))


def _times(records: Sequence[Record], param: str) -> dict[float, list[tuple[float, float]]]:
    """{size: [(CPU s, wall s) of each unit's record there]} from the records' extra."""
    by: dict[float, list] = {}
    for r in records:
        if "cpu_s" in r.extra:
            by.setdefault(float(r.params[param]), []).append((float(r.extra["cpu_s"]), float(r.extra["wall_s"])))
    return by


def time_text(records: Sequence[Record], param: str) -> str:
    """'time per size (median over units; CPU s / wall s): n = 1024 0.1/0.2, ...' from the records' extra."""
    by = _times(records, param)
    if not by:
        return ""
    cells = [f"{x:g} {np.median([c for c, _ in v]):.3g}/{np.median([w for _, w in v]):.3g}" for x, v in sorted(by.items())]
    return f"time per size (median over units; CPU s / wall s, one thread): {param} = " + ", ".join(cells)


def combine(decisions: Sequence[ScaleRate]) -> tuple[str, RateInfo | None]:
    """One rate from the groups' decisions: false if any group's is (its RateInfo); observed if some group observed it
    past its onset and none found it false (the RateInfo of the last group observed, the largest onset; a group
    undetermined or not reached is named in its sets_in); undetermined (n/a) if a group past its onset could not tell
    and none decided; not-reached if no group reached its onset (the group nearest to it)."""
    if not decisions:
        return "n/a", None
    for x in decisions:
        if x.rate == "false":
            return "false", x.info
    seen = [x for x in decisions if x.rate == "observed"]
    if seen:
        rest = [x for x in decisions if x.rate != "observed"]
        info = seen[-1].info
        if rest:
            info = dataclasses.replace(info, sets_in=info.sets_in + "; elsewhere: " + "; ".join(
                f"d = {x.key}: {'undetermined' if x.rate == 'n/a' else x.rate}"
                + (f", exponent {x.info.measured_exponent:.2f} [{x.info.ci[0]:.2f}, {x.info.ci[1]:.2f}]"
                   if x.info is not None else "") for x in rest))
        return "observed", info
    undecided = [x for x in decisions if x.rate == "n/a"]
    if undecided:
        return "n/a", undecided[0].info
    near = max(decisions, key=lambda x: x.info.largest / x.onset)
    return "not-reached", near.info


def scale_findings(claim: str, decisions: Sequence[ScaleRate], records: Sequence[Record], main: str,
                   what: str) -> list[Finding]:
    """A finding per decided group: the rate observed or false past its onset, with the measured exponent, or not
    reached past it (the measured curve still bending at the largest size: the derived onset is too early)."""
    out = []
    for x in decisions:
        ri = x.info
        past = ri is not None and ri.largest is not None and ri.largest >= x.onset
        if x.rate not in ("observed", "false") and not (x.rate == "not-reached" and past):
            continue
        first = min((r for r in records if r.check == main), key=lambda r: float(r.params[ri.param]))
        upto = f"{ri.param} up to {ri.largest:g} = {ri.largest / x.onset:.2g} {ri.param}*"
        title = (f"{what} {'holds' if x.rate == 'observed' else 'is false as stated'} past the onset ({upto})"
                 if x.rate != "not-reached" else
                 f"{what} has not set in by {ri.param} = {ri.largest:g} = {ri.largest / x.onset:.2g} {ri.param}*, past "
                 f"the derived onset: the measured curve still bends there")
        out.append(Finding(claim, title, f"{x.text}; {ri.sets_in}", dict(first.params), kind="rate"))
    return out


def scale_figures(groups: Sequence, title: str, param: str, sweep: str, where_key: str) -> list[FigureSpec]:
    """One figure per group of the scale sweep (the regime's evidence: drawn first)."""
    return [FigureSpec(f"{title}, {where_key} = {g}", x=param, hue="check", y="ratio", sweep=sweep,
                       where={where_key: g}) for g in groups]
