"""The ``vacuous`` statement of a verdict (:mod:`kvbounds.verdict`): a bound so loose that doing nothing meets it.
A statement whose bound (at constant 1, for a shape) is no smaller than the error of zeros in the claim's units in
most cells holds, and so does zeros: it is "vacuous at these norms", never "holds", and no fitted constant of it is
reported as a result. It is "vacuous at any norm" when a check states, per record, the part of its bound that no norm
can lower (``extra["norm_free"]``: ``{"terms": {term: value}, "log_scale": log of the bound with every norm at 0,
"zeros_at_most": the most zeros can err in the claim's units on any input}``) and that part alone reaches
``zeros_at_most`` in every cell: then doing nothing meets the bound on every input of those sizes, whatever the keys,
queries and values. A check may also give ``extra["vacuous_from"]``, the words for the smallest norm at which its
bound reaches ``zeros_at_most`` (where it is vacuous only at these norms). Re-exported by :mod:`kvbounds.verdict`."""
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
    scale = f"scale {_log_text(med)}{' median' + spread if spread else ''}; zeros meets it in {len(meets)}/{len(cells)} cells"
    any_norm = norm_free_term([r for r, _, _ in cells])
    if any_norm:
        return Vacuity(f"vacuous at any norm ({any_norm}; {scale})", len(cells), len(meets), (med, lo, hi), c_method,
                       c_zeros, any_norm=any_norm)
    return Vacuity(f"vacuous at these norms ({scale}{not_every_norm([r for r, _, _ in cells])})", len(cells),
                   len(meets), (med, lo, hi), c_method, c_zeros)


def _norm_free(r: Record) -> dict | None:
    nf = r.extra.get("norm_free")
    if not (isinstance(nf, dict) and _finite(nf.get("log_scale")) and _finite(nf.get("zeros_at_most"))
            and nf["zeros_at_most"] > 0 and isinstance(nf.get("terms"), dict)):
        return None
    return nf


def norm_free_term(records: Iterable[Record]) -> str:
    """The words for the part of the bound no norm can lower, when it alone reaches the most zeros can err in the
    claim's units in every record (``extra["norm_free"]``, module docstring): the first of its terms (in the check's
    order) that alone reaches it, and the others that do, in the cell with the least margin, e.g. "sqrt(d/s) = 1.79
    >= 1 alone, the most doing nothing errs in these units (d = 64, s = 20)"; the sum's words when no term alone
    does; "" otherwise (or unknown)."""
    nfs = [_norm_free(r) for r in records]
    if not nfs or any(nf is None for nf in nfs):
        return ""
    if not all(nf["log_scale"] >= math.log(nf["zeros_at_most"]) for nf in nfs):
        return ""
    worst = min(nfs, key=lambda nf: nf["log_scale"] - math.log(nf["zeros_at_most"]))
    terms = {k: v for k, v in worst["terms"].items() if _finite(v)}
    at_most = f"{worst['zeros_at_most']:.3g}"
    alone = [k for k, v in terms.items() if v >= worst["zeros_at_most"]]       # in the check's order of its terms
    top = alone[0] if alone else ""
    if top:
        also = [k for k in alone if k != top]
        return (f"{top} = {terms[top]:.3g} >= {at_most} alone, the most doing nothing errs in these units"
                + (f"; so does {', '.join(f'{k} = {terms[k]:.3g}' for k in also)}" if also else "")
                + (f" ({worst['where']})" if worst.get("where") else ""))
    return (f"with every norm at 0 the scale is {math.exp(worst['log_scale']):.3g} >= {at_most}, the most doing "
            "nothing errs in these units" + (f" ({worst['where']})" if worst.get("where") else ""))


def not_every_norm(records) -> str:
    """"; not at every norm: ..." when every record says the norm-free part of its bound stays below zeros' most, with
    the norm r from which the bound reaches it (``extra["norm_free"]["from_norm"]``) beside the records' own r
    (``extra["r"]``); "" when they do not say."""
    nfs = [_norm_free(r) for r in records]
    if not nfs or any(nf is None for nf in nfs):
        return ""
    low = max(math.exp(nf["log_scale"]) for nf in nfs)
    at_most = min(nf["zeros_at_most"] for nf in nfs)
    if low >= at_most:
        return ""
    text = (f"; not at every norm: with every norm at 0 the scale is at most {low:.3g} < {at_most:.3g}, the most "
            "doing nothing errs in these units")
    onset = [nf["from_norm"] for nf in nfs if _finite(nf.get("from_norm"))]
    rs = [r.extra["r"] for r in records if _finite(r.extra.get("r"))]
    if onset and rs:
        span = lambda x: f"{min(x):.3g}" + (f"..{max(x):.3g}" if max(x) > min(x) else "")
        text += f"; it reaches {at_most:.3g} from r = {span(onset)}, and these cells' r is {span(rs)}"
    return text
