"""The ``vacuous`` statement of a verdict (:mod:`kvbounds.verdict`): a bound so loose that doing nothing meets it.
A statement whose bound (at constant 1, for a shape) is no smaller than the error of zeros in the claim's units in
most cells holds, and so does zeros: it is "vacuous at these norms", never "holds", and no fitted constant of it is
reported as a result. Re-exported by :mod:`kvbounds.verdict`."""
from __future__ import annotations

import math
from typing import Iterable

import numpy as np

from kvbounds.core import Record
from ._fields import Vacuity


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


VACUOUS_SHARE = 0.5       # vacuous when the bound at constant 1 is >= zeros' error in more than this share of cells
TINY_CONSTANT = 1e-6      # a fitted constant below this is never reported as "holds with fitted constant"


def trivial_error(r: Record) -> float | None:
    """The error of doing nothing on this record's input, in the claim's units: zeros' measured error when the
    record carries it (``extra["controls_eps"]["zeros"]``), else ``extra["trivial_bound"]`` (what zeros is
    guaranteed in those units, e.g. 1 for ||z - Attn|| / (||softmax|| ||V||)); None when the record has neither."""
    ctl = r.extra.get("controls_eps")
    if isinstance(ctl, dict) and _finite(ctl.get("zeros")) and ctl["zeros"] >= 0:
        return float(ctl["zeros"])
    tb = r.extra.get("trivial_bound")
    return float(tb) if _finite(tb) and tb >= 0 else None


def log_bound(r: Record) -> float:
    """The natural log of a record's bound (at constant 1 for a shape): ``extra["log_scale"]`` when the record keeps
    it (a bound beyond float range is stored as inf), else log(bound); -inf for a bound <= 0, NaN for a NaN bound."""
    ls = r.extra.get("log_scale")
    if _finite(ls):
        return float(ls)
    if isinstance(r.bound, (int, float)) and math.isnan(r.bound):
        return math.nan
    return math.log(r.bound) if r.bound > 0 else -math.inf


def _log_text(x: float) -> str:
    return f"e^{x:.0f}" if abs(x) >= 10 else f"{math.exp(x):.3g}"


def decide_vacuity(records: Iterable[Record]) -> Vacuity | None:
    """Is the statement vacuous at these inputs? Over the statement records (not controls) that carry the error of
    doing nothing (:func:`trivial_error`): a cell is vacuous when its bound at constant 1 (:func:`log_bound`) is no
    smaller than zeros' error there, so zeros meets the bound too. Vacuous when more than ``VACUOUS_SHARE`` of the
    cells are. None when no record carries a trivial error or too few cells are vacuous."""
    cells = [(r, trivial_error(r), log_bound(r)) for r in records if not r.control]
    cells = [(r, z, lb) for r, z, lb in cells if z is not None and not math.isnan(lb)]
    if not cells:
        return None
    meets = [(r, z, lb) for r, z, lb in cells if z == 0 or lb >= math.log(z)]
    if len(meets) <= VACUOUS_SHARE * len(cells):
        return None
    logs = np.array([lb for _, _, lb in cells])
    fin = logs[np.isfinite(logs)]
    med, lo, hi = (float(np.median(fin)), float(fin.min()), float(fin.max())) if fin.size else (math.inf,) * 3
    ratio = lambda x, lb: x * math.exp(-lb) if math.isfinite(lb) and lb < 700 else 0.0
    c_method = max((ratio(r.measured, lb) for r, _, lb in cells if _finite(r.measured)), default=None)
    c_zeros = max(ratio(z, lb) for _, z, lb in cells)
    spread = f", {_log_text(lo)}..{_log_text(hi)}" if fin.size and hi - lo >= 1 else ""
    reason = (f"vacuous at these norms (scale {_log_text(med)}{' median' + spread if spread else ''}; zeros meets it "
              f"in {len(meets)}/{len(cells)} cells)")
    return Vacuity(reason, len(cells), len(meets), (med, lo, hi), c_method, c_zeros)
