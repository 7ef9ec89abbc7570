"""The statistics the verdict rules share (:mod:`kvbounds.verdict`): canonical record order, log-log slopes
with a bootstrap interval seeded from the data, growth of a fitted constant along a sweep, and the Holm
adjustment of per-cell tests. Every function depends only on the set of its inputs, not their order."""
from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from kvbounds.core import Record, canonical

# An O(.) claim asserts measured/shape stays bounded along the sweep. We call it growth when the
# log-log slope of that ratio against the swept parameter has a bootstrap 95% lower bound above this.
GROWTH_TOL = 0.15


# ------------------------------------------------------------------ order independence
def record_sort_key(r: Record) -> tuple:
    return (r.claim, r.check, canonical(r.params), r.seed, r.backend, r.control, r.bound_kind,
            repr(r.measured), repr(r.bound), canonical(r.extra))


def canonical_order(records: Iterable[Record]) -> list[Record]:
    """Records in a canonical order (claim, check, params, seed, ...), so rules see a set, not a sequence."""
    return sorted(records, key=record_sort_key)


def data_seed(*arrays: Sequence[float]) -> int:
    """A bootstrap seed computed from the data themselves (same points, same seed)."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(np.asarray(a, float)).tobytes())
    return int.from_bytes(h.digest()[:8], "little")


def loglog_slope(x: Sequence[float], y: Sequence[float], *, n_boot: int = 400,
                 seed: int | None = None) -> tuple[float, float, float]:
    """Least-squares slope of log y on log x with a bootstrap 95% interval (over points).

    The points are sorted first and, unless ``seed`` is given, the bootstrap is seeded from them, so the
    result depends only on the set of points. Two points give a slope but no interval (every resample with two
    distinct x is the same line): (slope, -inf, inf), so no growth test decides on them."""
    lx, ly = np.log(np.asarray(x, float)), np.log(np.maximum(np.asarray(y, float), 1e-300))
    if len(np.unique(lx)) < 2:
        return 0.0, 0.0, 0.0
    if len(lx) < 3:
        return float(np.polyfit(lx, ly, 1)[0]), -math.inf, math.inf
    order = np.lexsort((ly, lx))
    lx, ly = lx[order], ly[order]
    slope = float(np.polyfit(lx, ly, 1)[0])
    rng = np.random.default_rng(data_seed(lx, ly) if seed is None else seed)
    boots = []
    for _ in range(n_boot):
        idx = rng.integers(0, len(lx), len(lx))
        if len(np.unique(lx[idx])) < 2:
            continue
        boots.append(np.polyfit(lx[idx], ly[idx], 1)[0])
    lo, hi = (np.percentile(boots, [2.5, 97.5]) if boots else (slope, slope))
    return slope, float(lo), float(hi)


# ------------------------------------------------------------------ growth (one helper for every O(.) check)
@dataclasses.dataclass
class Growth:
    """Log-log slope of a fitted constant (measured/shape by default) along one swept parameter."""
    group: str                      # the sub-check (or group label) the points belong to
    param: str
    slope: float
    lo: float
    hi: float
    x_range: tuple[float, float]
    n_points: int
    smallest: dict                  # params of the record with the smallest x
    key: Any = None                 # the raw group key (``group`` is its str)

    @property
    def grows(self) -> bool:
        return self.lo > GROWTH_TOL

    def text(self) -> str:
        return f"{self.group} vs {self.param}: slope {self.slope:+.2f} [{self.lo:+.2f},{self.hi:+.2f}]"


def growth(records: Iterable[Record], param: str, *, value: Callable[[Record], float] = lambda r: r.ratio,
           group: Callable[[Record], Any] = lambda r: r.check, where: Callable[[Record], bool] | None = None,
           swept_only: bool = False) -> list[Growth]:
    """One :class:`Growth` per group with >= 2 distinct values of ``params[param]``.

    ``swept_only``: keep records whose ``params["sweep"] == param`` (checks that sweep one key at a time)."""
    groups: dict[Any, list[Record]] = {}
    for r in canonical_order(records):
        if param not in r.params or (where is not None and not where(r)):
            continue
        if swept_only and r.params.get("sweep") != param:
            continue
        groups.setdefault(group(r), []).append(r)
    out = []
    for g, rs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        xs = [float(r.params[param]) for r in rs]
        if len(set(xs)) < 2:
            continue
        slope, lo, hi = loglog_slope(xs, [value(r) for r in rs])
        small = min(rs, key=lambda r: (float(r.params[param]), record_sort_key(r)))
        out.append(Growth(str(g), param, slope, lo, hi, (min(xs), max(xs)), len(rs), dict(small.params), g))
    return out


# ------------------------------------------------------------------ multiple testing
def holm_adjust(pvalues: Sequence[float | None]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (a missing test counts as p = 1). The family is every cell of one
    variant on one setup, so a variant with many cells is not called significant by chance in one of them."""
    ps = np.array([1.0 if p is None else float(p) for p in pvalues])
    adj, running = np.empty(len(ps)), 0.0
    for rank, i in enumerate(np.argsort(ps, kind="stable")):
        running = max(running, (len(ps) - rank) * ps[i])
        adj[i] = min(1.0, running)
    return adj.tolist()
