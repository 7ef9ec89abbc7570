"""SB.cost: SoftmaxBalance runs in O((d+s) n^2) time and O((d+s) n) memory (001 Thm 3.3).

Sub-checks (records of kind "shape": the fitted constant is measured / shape, and it must not grow
with n):
  * ``time rows`` / ``time gram``  median wall time of one call, shape (d+s) n^2, for the literal
                                   row-by-row walk and for the materialised-Gram variant;
  * ``memory rows``                peak bytes allocated during the row-by-row call (tracemalloc sees
                                   numpy buffers), shape 8 (d+s) n;
  * ``memory gram``                the same for the Gram variant: O(n^2), so its ratio grows with n.
                                   It is the negative control: the growth test must reject it.
"""
from __future__ import annotations

import math
import time
import tracemalloc

import numpy as np

from kvbounds.algorithms.softmax_balance import softmax_balance
from kvbounds.gpu.backend import asarray
from kvbounds.verdict import FigureSpec, Verdict, standard_verdict, loglog_slope, GROWTH_TOL, INCONCLUSIVE, FAILS
from kvbounds.theory.balancekv import softmax_balance_cost

from .common import make_record, pick

CLAIM = "SB.cost"
SOURCE = "001 Thm 3.3"


def trials(profile: str) -> list[dict]:
    ns = pick(profile, smoke=[64, 128], quick=[128, 256, 512, 1024], full=[128, 256, 512, 1024, 2048, 4096])
    ds = pick(profile, smoke=[(8, 4)], quick=[(16, 4), (64, 64)], full=[(16, 4), (64, 64), (128, 128)])
    return [dict(n=n, d=d, s=s, mode=m) for n in ns for d, s in ds for m in ("rows", "gram")]


def _call(K, V, mode, seed):
    return softmax_balance(K, V, delta=0.01, rng=np.random.default_rng(seed), memory=mode, on_fail="continue")


def run_trial(params: dict, seed: int, backend: str):
    n, d, s, mode = params["n"], params["d"], params["s"], params["mode"]
    rng = np.random.default_rng(seed)
    K = asarray(rng.standard_normal((n, d)) / math.sqrt(d), backend)
    V = asarray(rng.standard_normal((n, s)), backend)
    times = []
    for rep in range(3):
        t0 = time.perf_counter()
        _call(K, V, mode, seed + rep)
        times.append(time.perf_counter() - t0)
    shape = softmax_balance_cost(n, d, s)
    recs = [make_record(CLAIM, params, measured=float(np.median(times)), bound=shape["time"] * 1e-9,
                        holds=True, bound_kind="shape", check=f"time {mode}", source=SOURCE, trials=3,
                        shape=shape["time"], times=times)]
    if backend == "numpy":
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        _call(K, V, mode, seed)
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        recs.append(make_record(CLAIM, params, measured=peak, bound=8 * shape["memory"], holds=True,
                                bound_kind="shape", check=f"memory {mode}", control=(mode == "gram"),
                                source=SOURCE, shape=8 * shape["memory"]))
    return recs


def summarize(records) -> Verdict:
    figs = [FigureSpec("SoftmaxBalance time / ((d+s) n^2 ns) vs n", x="n", hue="check", y="ratio"),
            FigureSpec("peak memory / (8 (d+s) n bytes) vs n", x="n", hue="check", y="ratio", check=None)]
    parts, findings, status = [], [], None
    main = [r for r in records if not r.control]
    v = standard_verdict(CLAIM, main, figures=figs)
    for check in sorted({r.check for r in records}):
        rs = [r for r in records if r.check == check]
        for ds in sorted({(r.params["d"], r.params["s"]) for r in rs}):
            sub = [r for r in rs if (r.params["d"], r.params["s"]) == ds]
            if len({r.params["n"] for r in sub}) < 2:
                continue
            slope, lo, hi = loglog_slope([r.params["n"] for r in sub], [r.ratio for r in sub])
            grows = lo > GROWTH_TOL
            unit = "ns per (d+s)n^2" if check.startswith("time") else "x 8(d+s)n bytes"
            parts.append(f"{check} (d,s)={ds}: C = {max(r.ratio for r in sub):.3g} {unit}, "
                         f"ratio slope vs n {slope:+.2f} [{lo:+.2f},{hi:+.2f}]")
            control = sub[0].control
            if grows and not control:
                status = FAILS
                from kvbounds.verdict import Finding
                v.findings.append(Finding(CLAIM, f"{check} grows faster than the stated shape",
                                          f"(d,s)={ds}: slope {slope:.2f}", min(sub, key=lambda r: r.params['n']).params))
            if control and not grows and status != FAILS:
                status = INCONCLUSIVE
    if status:
        v.status = status
    v.constant = v.constant_spread = v.constant_kind = None   # per sub-check constants are in the summary
    v.summary = v.summary + "; " + "; ".join(parts)
    v.n_records = len(records)
    return v
