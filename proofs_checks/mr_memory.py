"""MR.memory: MergeAndReduce's cells and cost (001 Thm 3.4, Alg. 4; 000 thm:MergeAndReduce).

Stated: at most log2(n/t) cells occupied, each |C^i| <= t; total memory O(d t log(n/t)); per-step time
O~(d s e^{4r^2/sqrt d}/eps^2), which with t = sqrt(s) e^{2r^2/sqrt d}/eps substituted is O~(d t^2).
Sub-checks: ``cell size`` [stated, exact], ``occupied cells`` [stated, exact], ``memory`` (floats held,
shape (d+s) t log2(n/t)) and ``step time`` (median seconds per update, shape d t^2).

The occupied-cell count is checked after every update. Just before the last carry (j = n - 1 with
n = t 2^T) the cells C^0, ..., C^T are all non-empty: T + 1 = log2(n/t) + 1 cells, one more than stated.
"""
from __future__ import annotations

import math
import time

import numpy as np

from kvbounds.algorithms.merge_and_reduce import MergeAndReduce
from kvbounds.gpu.backend import asarray
from kvbounds.verdict import FAILS, GROWTH_TOL, FigureSpec, Finding, Verdict, loglog_slope, standard_verdict
from kvbounds.theory.balancekv import merge_reduce_memory_bound

from .common import make_record, pick, unit_directions

CLAIM = "MR.memory"
SOURCE = "001 Thm 3.4, Alg. 4"


def trials(profile: str) -> list[dict]:
    small = [dict(n=4, t=2, d=2, s=1), dict(n=16, t=4, d=2, s=1)]
    ns = pick(profile, smoke=[256], quick=[512, 2048, 8192], full=[512, 2048, 8192, 32768])
    ts = pick(profile, smoke=[16], quick=[16, 32, 64], full=[16, 32, 64, 128])
    return [dict(p, sweep="small") for p in small] + [dict(n=n, t=t, d=8, s=4, sweep="n") for n in ns for t in ts]


def run_trial(params: dict, seed: int, backend: str):
    n, t, d, s = params["n"], params["t"], params["d"], params["s"]
    rng = np.random.default_rng(seed)
    K, V = asarray(unit_directions(rng, n, d), backend), asarray(rng.standard_normal((n, s)), backend)
    T = int(math.log2(n / t))
    mr = MergeAndReduce(d, s, t=t, T=T, delta=0.01, rng=np.random.default_rng(seed + 1))
    max_cell = max_occ = max_stored = 0
    occ_at = 0
    step_times = []
    for j in range(n):
        t0 = time.perf_counter()
        mr._push(K[j], V[j])
        step_times.append(time.perf_counter() - t0)
        sizes = mr.cell_sizes()
        occ = sum(x > 0 for x in sizes)
        if occ > max_occ:
            max_occ, occ_at = occ, j + 1
        max_cell = max(max_cell, max(sizes))
        max_stored = max(max_stored, sum(sizes))
    bound = merge_reduce_memory_bound(n, t, d, s)
    common = dict(T=T)
    return [
        make_record(CLAIM, params, measured=max_cell, bound=t, check="cell size", bound_kind="exact", source=SOURCE, **common),
        make_record(CLAIM, params, measured=max_occ, bound=bound["occupied_cells"], check="occupied cells",
                    bound_kind="exact", source=SOURCE, first_max_at_step=occ_at, **common),
        make_record(CLAIM, params, measured=max_stored * (d + s), bound=bound["memory"], holds=True, check="memory",
                    bound_kind="shape", source=SOURCE, max_pairs=max_stored, **common),
        make_record(CLAIM, params, measured=float(np.median(step_times)), bound=d * t**2 * 1e-9, holds=True,
                    check="step time", bound_kind="shape", source=SOURCE + " (per-step time with t substituted)",
                    mean_step_s=float(np.mean(step_times)), **common),
    ]


def summarize(records) -> Verdict:
    figs = [FigureSpec("max occupied cells vs n (bound log2(n/t))", x="n", check="occupied cells", hue="t", logy=False),
            FigureSpec("floats held / ((d+s) t log2(n/t)) vs n", x="n", check="memory", hue="t", y="ratio")]
    v = standard_verdict(CLAIM, records, figures=figs)
    parts = [v.summary]
    for check in ("memory", "step time"):
        rs = [r for r in records if r.check == check and r.params.get("sweep") == "n"]
        for key in ("n", "t"):
            slope, lo, hi = loglog_slope([r.params[key] for r in rs], [r.ratio for r in rs]) if rs else (0, 0, 0)
            parts.append(f"{check}/shape vs {key}: slope {slope:+.2f} [{lo:+.2f},{hi:+.2f}]")
            if lo > GROWTH_TOL:
                v.status = FAILS
                v.findings.append(Finding(CLAIM, f"{check} grows faster than its stated shape in {key}",
                                          f"slope {slope:.2f}", min(rs, key=lambda r: r.params[key]).params))
    occ = [r for r in records if r.check == "occupied cells" and not r.holds]
    if occ:
        r = min(occ, key=lambda r: (r.params["n"], r.params["t"]))
        for f in v.findings:
            if "[occupied cells]" in f.title:
                f.detail += (f"; smallest: n = {r.params['n']}, t = {r.params['t']}: {int(r.measured)} cells occupied "
                             f"at step {r.extra['first_max_at_step']} vs log2(n/t) = {r.bound:g}. C^0..C^T are T+1 = "
                             f"log2(n/t)+1 cells and all are non-empty just before the last carry (off by one).")
    mem = [r.ratio for r in records if r.check == "memory"]
    if mem:   # the constant in memory <= C (d+s) t log2(n/t); per-check slopes are in the summary
        v.constant, v.constant_spread, v.constant_kind = max(mem), (min(mem), float(np.median(mem))), "fitted"
    v.summary = "; ".join(parts)
    return v
