"""SB.cost: SoftmaxBalance runs in O((d+s) n^2) time and O((d+s) n) memory (BalanceKV-NeurIPS Thm 3.3).

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
from kvbounds.algorithms.arrays import asarray
from kvbounds.verdict import Control, FigureSpec, Finding, Verdict, decide, decide_rate, fitted_constant, growth
from kvbounds.theory.balancekv import softmax_balance_cost

from .common import make_record, pick

__all__ = ["CLAIM", "SOURCE", "trials", "run_trial", "summarize"]

CLAIM = "SB.cost"
SOURCE = "BalanceKV-NeurIPS Thm 3.3"


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
    """Cost claim: ``shape`` records give fitted constants per sub-check and (d, s); growth along n of a
    ratio is a rate finding (never ``false``); the O(n^2)-memory Gram variant is the control the growth test
    must reject. Times are wall-clock (they differ between runs; memory peaks are reproducible)."""
    figs = [FigureSpec("SoftmaxBalance time / ((d+s) n^2 ns) vs n", x="n", hue="check", y="ratio"),
            FigureSpec("peak memory / (8 (d+s) n bytes) vs n", x="n", hue="check", y="ratio", check=None)]
    parts, findings, controls, worst = [], [], [], None
    for g in growth(records, "n", group=lambda r: (r.check, r.params["d"], r.params["s"])):
        check = g.key[0]
        rs = [r for r in records if (r.check, r.params["d"], r.params["s"]) == g.key]
        unit = "ns per (d+s)n^2" if check.startswith("time") else "x 8(d+s)n bytes"
        parts.append(f"{check} (d,s)=({rs[0].params['d']}, {rs[0].params['s']}): C = {max(r.ratio for r in rs):.3g} "
                     f"{unit}, ratio slope vs n {g.slope:+.2f} [{g.lo:+.2f},{g.hi:+.2f}]")
        if rs[0].control:
            controls.append(Control(f"{check} (O(n^2) memory), (d,s) = ({rs[0].params['d']}, {rs[0].params['s']})",
                                    g.grows, f"slope {g.slope:+.2f}"))
        elif g.grows:
            findings.append(Finding(CLAIM, f"{check} grows faster than the stated shape in the tested range",
                                    g.text(), g.smallest, kind="rate"))
            worst = g if worst is None or g.lo > worst.lo else worst
    rate = decide_rate(worst, stated_exponent=0.0, label="stated cost shape") if worst else ("n/a", None)
    mem = [r for r in records if r.check == "memory rows"]
    fitted = fitted_constant(mem, "max peak bytes / (8 (d+s) n) for the row-by-row walk (the O((d+s) n) memory); "
                                  "time constants per sub-check are in the summary")
    return decide(CLAIM, records, summary="; ".join(parts), figures=figs, findings=findings, controls=controls,
                  rate=rate, fitted=fitted)
