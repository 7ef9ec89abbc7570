"""MR.error: MergeAndReduce's error at every step j (BalanceKV-NeurIPS Thm 3.4; BalanceKV-preprint Thm 3.3).

Stated (BalanceKV-NeurIPS "BalanceKV", arXiv 2502.07861 v2, Thm 3.4; BalanceKV-preprint = v1): with t = O~(sqrt(s) e^{2r^2/sqrt d}/eps) (BalanceKV-NeurIPS)
or O*(e^{2r^2/sqrt d}/eps) (BalanceKV-preprint) and T = log2(n/t),
    || sum_{i<=j} e^{<k_i,q_j>/sqrt d} v_i - z_j || <= eps j e^{-r^2/sqrt d} max||v||   for every j.

We stream n tokens with ||q||, ||k|| = r, run MergeAndReduce for a given t, and measure the smallest
eps for which the bound holds at every checkpoint j (``eps_hat``). Solving each version's t-formula
for eps gives its shape eps ~ sqrt(s) e^{2r^2/sqrt d}/t (BalanceKV-NeurIPS) or e^{2r^2/sqrt d}/t (BalanceKV-preprint); the
record's ratio eps_hat/shape is the hidden constant (records of kind ``shape``). Sub-checks:
  * ``BalanceKV-NeurIPS paper c`` / ``BalanceKV-preprint paper c``  the walk's c = 30 log(t/delta) (as in the paper),
  * ``BalanceKV-NeurIPS c=log``                      c = log(t/delta): the practical walk, shown for comparison.

Verdict (shared rules of kvbounds.verdict): the bound is an O~(.), so the statement is ``holds-fitted``; the
proven-constant reading (the walk's c = 30 log(ts/delta) in Thm 3.3's discrepancy, the proof's other factors with
constant 1) is reported next to the fitted constant. eps_hat falling like t^-1/2 instead of t^-1 is a ``rate``
``not-reached``: below t* (theory.balancekv.merge_reduce_rate_onset) the walk is in its random-sign phase.
The scale sweep (``t-scale``; :mod:`.scale_sweep`) decides the rate past the walk's onset t*
(theory.balancekv.merge_reduce_rate_onset): each trial one unit (a stream of 4 max(t) tokens; at every batch size t,
SCALE_RUNS runs of MergeAndReduce in lockstep on its first n = 4t tokens, T = 2, the walks on Gram panels shared by
the runs: algorithms.merge_reduce_lockstep), with the runs on fair coins (signs="random", the ingredient's ablation,
eps_hat ~ t^-1/2) against the same test. The full profile runs d = 2, s = 1, r = 1 (t* ~ 1.9e4) on a CPU to
t = 2 t* = 3.8e4. At the small sweep's d = 8, s = 4 (t* ~ 2.5e5) one unit at 2 t* = 5e5 forms ~1.5e12 Gram entries
(four batches of 5e5 tokens, two level-1 spans of 1e6: ~2 CPU hours per unit): the ``gpu`` profile
(``--backend torch:cuda``) runs it, its units beyond CPU_T_MAX deferred on a CPU backend.
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms.merge_and_reduce import MergeAndReduce
from kvbounds.algorithms.merge_reduce_lockstep import merge_and_reduce_lockstep
from kvbounds.algorithms.arrays import asarray, to_numpy
from kvbounds.verdict import (Constant, FigureSpec, Finding, Verdict, decide, decide_onset_rate, decide_rate,
                              fitted_constant, growth, units_needed)
from kvbounds.theory.balancekv import merge_reduce_eps_implied, merge_reduce_rate_onset, rate_onset, walk_constant

from kvbounds.battery import method_floats, stream_floats
from kvbounds.battery import power_on_both_metrics

from .common import (dispatch, in_words, make_record, pick, unit_directions,
                     words_in_findings)
from .scale_sweep import ScaleRate, Timer, combine, decide_scale, deferred_unit, onset_sizes, scale_findings, size_params
from kvbounds.streams import POWER_CHECK, StreamBattery, battery_record, held_out_errors, missing_record, power_trials
from kvbounds.streams import stream as power_stream

__all__ = ["run_trial", "CLAIM", "SOURCE", "CPU_T_MAX", "trials", "stream", "checkpoints", "exact_numerator_log",
           "statement_trial", "CHECK_WORDS", "summarize", "POWER_T", "power_trial", "SCALE_SIZES", "SCALE_PILOT_SD",
           "SCALE_UNITS", "LONG_SWEEPS", "scale_trials", "worst_eps", "lockstep_eps", "scale_trial", "RATE_LABEL"]

CLAIM = "MR.error"
SOURCE = {"BalanceKV-NeurIPS": "BalanceKV-NeurIPS Thm 3.4", "BalanceKV-preprint": "BalanceKV-preprint Thm 3.3"}
CPU_T_MAX = 1 << 16                 # largest t of a scale-sweep unit on a CPU backend (2^16: ~65 CPU s)
# the scale sweep: sizes per (d, s) and profile (powers of two up to t*/2, then t*/2, t* and 2 t*), runs and queries
# per size, and units. Runs: one run's eps_hat is about one batch's discrepancy over t, as noisy as one walk (per-unit
# slopes over t = 1024..8192 from one run per size: sd 0.16-0.5); over 64 runs x 32 queries, sd 0.076 (3 units,
# t = 1024..4096). Units: a power calculation (kvbounds.verdict.units_needed) on that spread, taken as 0.1 past the
# onset (SCALE_PILOT_SD), for a 95% half-width of 0.09: the spectral model's slope past t*/2 and a growth of
# GROWTH_TOL fall on either side
_T_STAR = {(d, s): rate_onset(d, s, 1.0, 0.01) for d, s in ((2, 1), (8, 4))}
# d = 2 on the gpu profile runs to 8 t*: on the full profile's t*/2..2 t* the exponent was -0.82 [-0.87, -0.77] over 8
# units (undetermined: it straddles -1 + GROWTH_TOL), the per-unit local slope of eps_hat t per doubling falling 0.22,
# 0.14 past t*/2 (this machine, loaded); at that pace the fit from t*/2 comes within GROWTH_TOL of -1 only with 8 t* in
# it. One unit at 8 t* = 1.5e5 forms 16 x the Gram entries of one at 2 t* (~1200 CPU s): beyond CPU_T_MAX, deferred
SCALE_SIZES = {"full": {(2, 1): onset_sizes(_T_STAR[2, 1])},
               "gpu": {(2, 1): onset_sizes(_T_STAR[2, 1], factors=(0.5, 1, 2, 4, 8)),
                       (8, 4): onset_sizes(_T_STAR[8, 4], first=1 << 12)}}
SCALE_PILOT_SD = 0.1
SCALE_RUNS, SCALE_DIRS = 64, 32     # runs (lockstep, shared Grams) and queries of norm r per size
SCALE_UNITS = {"full": units_needed(SCALE_PILOT_SD, 0.09), "gpu": 24}
LONG_SWEEPS = ("t-scale",)        # its units are long trials: the runner submits them first


def scale_trials(profile: str) -> list[dict]:
    """One trial per unit and (d, s) (:mod:`.scale_sweep`); none on smoke and quick."""
    if profile not in SCALE_SIZES:
        return []
    return [dict(d=d, s=s, r=1.0, delta=0.01, c="paper", sweep="t-scale", runs=SCALE_RUNS, dirs=SCALE_DIRS,
                 sizes=sizes, unit=u)
            for (d, s), sizes in SCALE_SIZES[profile].items() for u in range(SCALE_UNITS[profile])]


def trials(profile: str) -> list[dict]:
    if profile == "gpu":
        return scale_trials(profile)
    base = dict(n=pick(profile, smoke=256, quick=2048, full=8192), d=8, s=4, r=1.0, t=32, delta=0.01)
    power = power_trials(profile, dict(base, n=pick(profile, smoke=128, quick=256, full=512), t=POWER_T, c="paper"))
    if profile == "smoke":
        return [dict(base, t=t, sweep="t", c="paper") for t in (16, 32)] + power
    sweeps = {"t": [16, 32, 64, 128], "s": [1, 4, 16], "r": [0.5, 1.0, 1.5, 2.0],
              "n": pick(profile, smoke=[], quick=[512, 1024, 2048, 4096], full=[1024, 4096, 16384])}
    out = []
    for key, vals in sweeps.items():
        for val in vals:
            for c in ("paper", "log"):
                out.append(dict(base, **{key: val}, sweep=key, c=c))
    return out + power + scale_trials(profile)


def stream(seed: int, n: int, d: int, s: int, r: float):
    rng = np.random.default_rng(seed)
    return unit_directions(rng, n, d) * r, unit_directions(rng, n, d) * r, rng.standard_normal((n, s)) / math.sqrt(s)


def checkpoints(n: int, t: int, rng: np.random.Generator, k: int = 24) -> list[int]:
    """Steps j (1-based) at which the bound is evaluated: around every power-of-two multiple of t, plus random."""
    js = {min(n, t * 2**i + o) for i in range(int(math.log2(max(n // t, 1))) + 1) for o in (-1, 0, 1)}
    js |= set(rng.integers(1, n + 1, k).tolist()) | {n}
    return sorted(j for j in js if j >= 1)


def exact_numerator_log(K, V, q, j):
    """(m, u): sum_{i<=j} e^{<k_i,q>/sqrt d} v_i = e^m u."""
    logits = K[:j] @ q / math.sqrt(K.shape[1])
    m = logits.max()
    return float(m), (np.exp(logits - m)[:, None] * V[:j]).sum(0)


def worst_eps(Q, K, V, mr: MergeAndReduce, backend: str, rng: np.random.Generator):
    """Stream K, V through ``mr``; at the checkpoints (:func:`checkpoints`) the eps at which the stated bound holds
    with equality, eps_j = ||sum_{i<=j} e^{<k_i,q_j>/sqrt d} v_i - z_j|| / (j e^{-r^2/sqrt d} max||v||).
    Returns (max eps_j, its j, [(j, eps_j)])."""
    n, d = K.shape
    r = float(np.linalg.norm(K, axis=1).max())
    Kb, Vb, Qb = asarray(K, backend), asarray(V, backend), asarray(Q, backend)
    cps = set(checkpoints(n, mr.t, rng))
    vmax = float(np.linalg.norm(V, axis=1).max())
    worst, worst_j, series = 0.0, 0, []
    for j in range(1, n + 1):
        mr._push(Kb[j - 1], Vb[j - 1])
        if j not in cps:
            continue
        m_z, u_z = mr.estimate(Qb[j - 1])
        m_x, u_x = exact_numerator_log(K, V, Q[j - 1], j)
        err = float(np.linalg.norm(np.exp(m_z - m_x) * to_numpy(u_z) - u_x)) * math.exp(m_x)
        eps_j = merge_reduce_eps_implied(err, j, r, d, vmax)
        series.append((j, eps_j))
        if eps_j >= worst:
            worst, worst_j = eps_j, j
    return worst, worst_j, series


def lockstep_eps(K, V, Qs, levels: dict) -> np.ndarray:
    """eps_hat of each lockstep run (algorithms.merge_reduce_lockstep) and query: the largest over the steps j of
    ||sum_{i<=j} e^{<k_i,q>/sqrt d} v_i - z_j(q)|| / (j e^{-r^2/sqrt d} max_{i<=j}||v_i||), (runs, queries). For a
    fixed query the error changes only at the steps j = t, 2t, ... (a new token enters C^0 with weight 1, exactly)
    while the denominator grows, so the largest over every step is the largest over those steps: exact."""
    d = K.shape[1]
    r = float(np.linalg.norm(K, axis=1).max())
    vnorm = np.linalg.norm(V, axis=1)
    out = None
    for j, L in sorted(levels.items()):
        coef = 1.0 - np.where(L >= 0, np.exp2(np.maximum(L, 0)), 0.0)               # 1 - weight, (runs, j)
        logits = Qs @ K[:j].T / math.sqrt(d)                                         # (queries, j)
        shift = logits.max(axis=1, keepdims=True)
        D = np.einsum("rj,mj,js->rms", coef, np.exp(logits - shift), V[:j])         # e^{-shift} x the error
        err = np.log(np.maximum(np.linalg.norm(D, axis=-1), 1e-300)) + shift[:, 0]
        eps = np.exp(err + math.log(merge_reduce_eps_implied(1.0, j, r, d, float(vnorm[:j].max()))))
        out = eps if out is None else np.maximum(out, eps)
    return out


def _shape(version: str, t: int, s: int, r: float, d: int) -> float:
    """eps's shape solved from each version's t-formula: sqrt(s) e^{2r^2/sqrt d}/t (NeurIPS) or e^{2r^2/sqrt d}/t."""
    return math.exp(2 * r**2 / math.sqrt(d)) / t * (math.sqrt(s) if version == "BalanceKV-NeurIPS" else 1.0)


def statement_trial(params: dict, seed: int, backend: str):
    n, d, s, r, t, delta = (params[k] for k in ("n", "d", "s", "r", "t", "delta"))
    Q, K, V = stream(seed, n, d, s, r)
    T = max(int(math.log2(n / t)), 0)
    c = None if params["c"] == "paper" else math.log(t / delta)
    mr = MergeAndReduce(d, s, t=t, T=T, delta=delta, rng=np.random.default_rng(seed + 7), r_key=r, c=c)
    worst, worst_j, series = worst_eps(Q, K, V, mr, backend, np.random.default_rng(seed + 3))
    recs = []
    for version in ("BalanceKV-NeurIPS", "BalanceKV-preprint"):
        if params["c"] == "log" and version == "BalanceKV-preprint":
            continue
        recs.append(make_record(CLAIM, params, measured=worst, bound=_shape(version, t, s, r, d), holds=True,
                                bound_kind="shape", check=f"{version} {'paper c' if params['c'] == 'paper' else 'c=log'}",
                                source=SOURCE[version], worst_j=worst_j, T=T, fails=mr.fail_count,
                                series_j=[a for a, _ in series], series_eps=[b for _, b in series]))
    return recs


def scale_trial(params: dict, seed: int, backend: str):
    """One unit of the scale sweep: a stream of 4 max(t) tokens drawn once; at each batch size t, SCALE_RUNS runs of
    MergeAndReduce (T = 2, the walk at the paper's c; algorithms.merge_reduce_lockstep: the runs' Grams shared) on
    its first n = 4t tokens, each with its own coins, and the same runs on fair coins (the ablation). The record's
    eps_hat: the (1 - delta)-quantile over runs x ``dirs`` queries of norm r of each run's eps_hat for that query (as
    SB.discrepancy's over walks x queries), with the walks' CPU and wall seconds."""
    d, s, r, delta, sizes, runs = (params[k] for k in ("d", "s", "r", "delta", "sizes", "runs"))
    late = deferred_unit(CLAIM, params, "t", CPU_T_MAX, backend, source=SOURCE["BalanceKV-NeurIPS"], n=4 * max(sizes),
                         reason=(f"{runs} runs on 4t tokens balanced in batches of t (t^2/2 Gram entries per batch) "
                                 f"beyond CPU_T_MAX = {CPU_T_MAX}: run with --backend torch:cuda"))
    if late:
        return late
    _, K, V = stream(seed, 4 * max(sizes), d, s, r)
    Qs = unit_directions(np.random.default_rng([seed, 1]), params["dirs"], d) * r
    Kb, Vb = asarray(K, backend), asarray(V, backend)
    recs = []
    for k, t in enumerate(sorted(sizes)):
        n, p = 4 * t, dict(size_params(params, "t", t), n=4 * t)
        for signs, check in (("walk", "BalanceKV-NeurIPS paper c"), ("random", "random-signs")):
            rngs = [np.random.default_rng([seed, k, u]) for u in range(runs)]
            with Timer() as tm:
                levels = merge_and_reduce_lockstep(Kb[:n], Vb[:n], t=t, T=2, delta=delta, rngs=rngs,
                                                   r_key=r * (1 + 1e-9), signs=signs)
            eps = lockstep_eps(K[:n], V[:n], Qs, levels)
            recs.append(make_record(CLAIM, p, measured=float(np.quantile(eps, 1 - delta)),
                                    bound=_shape("BalanceKV-NeurIPS", t, s, r, d), holds=True, bound_kind="shape",
                                    check=check, control=signs == "random", source=SOURCE["BalanceKV-NeurIPS"],
                                    T=2, trials=eps.size, median_eps=float(np.median(eps)), cpu_s=tm.cpu_s,
                                    wall_s=tm.wall_s, statistic=f"(1 - delta)-quantile over {runs} runs x "
                                                                f"{params['dirs']} queries"))
    return recs


def _proven_eps(p: dict) -> float:
    """eps the proof's chain gives with the walk's c: 30 log(ts/delta) sqrt(s) e^{2r^2/sqrt d}/t (Thm 3.3's
    discrepancy with c = 30 log(n s/delta) at n = t, summed over the j/t reductions of each level; the proof's
    other factors taken with constant 1: a reading, not a proven constant in every factor)."""
    t, s, r, d, delta = p["t"], p["s"], p["r"], p["d"], p["delta"]
    return walk_constant(t * s, delta) * math.sqrt(s) * math.exp(2 * r * r / math.sqrt(d)) / t


RATE_LABEL = "O(1/t) rate"


def _onset(r) -> float:
    return rate_onset(r.params["d"], r.params["s"], r.params["r"], r.params["delta"])


def _top(r) -> float:
    return merge_reduce_rate_onset(r.params["d"], r.params["s"], r.params["r"], r.params["delta"])["t_top_direction"]


def _scale(records, parts, figs, controls, findings):
    """The scale sweep (t-scale): per (d, s) the O(1/t) rate past t*/2 on eps_hat's exponent fitted per unit, the
    bend, the time per size, and the fair-coin ablation against the same test. Returns the decisions."""
    large = [r for r in records if r.params.get("sweep") == "t-scale"]
    if not large:
        return []
    keys = sorted({(r.params["d"], r.params["s"]) for r in large})
    figs[:0] = [FigureSpec(f"eps_hat / shape vs t (the walk, fair coins), scale sweep, d = {d}, s = {s}", x="t",
                           hue="check", y="ratio", sweep="t-scale", where={"d": d, "s": s}) for d, s in keys]
    decisions, ctl, texts = decide_scale(large, "t", main="BalanceKV-NeurIPS paper c", control="random-signs",
                                         group=lambda r: f"{r.params['d']}, s = {r.params['s']}", onset=_onset,
                                         top=_top, value=lambda r: r.ratio, stated_exponent=-1.0, label=RATE_LABEL,
                                         words="d = ")
    parts.extend(t for t in texts if t)
    controls.extend(ctl)
    findings.extend(scale_findings(CLAIM, decisions, large, "BalanceKV-NeurIPS paper c", "MergeAndReduce's O(1/t) rate"))
    return decisions


# the sub-checks' labels in the verdict's sentences: what each walk constant is
CHECK_WORDS = {"paper c": "(c as the paper states it)", "c=log": "(c = log(t/delta))",
               "paper-c": "paper's-c"}


def summarize(records) -> Verdict:
    n_all = len(records)
    trivial = power_on_both_metrics([r for r in records if r.check == POWER_CHECK],
                                    setting=lambda r: r.params["family"], metric="eps_hat")
    records = [r for r in records if r.check != POWER_CHECK]
    figs = [FigureSpec("eps_hat / shape vs t", x="t", hue="check", y="ratio", sweep="t"),
            FigureSpec("eps_hat / shape vs s (BalanceKV-NeurIPS has sqrt(s), BalanceKV-preprint does not)", x="s", hue="check", y="ratio"),
            FigureSpec("eps_hat / shape vs r", x="r", hue="check", y="ratio")]
    findings, parts, controls = [], [], []
    swept = lambda key: (lambda r: r.params.get("sweep") == key)
    gs = {}
    small = [r for r in records if r.params.get("sweep") != "t-scale"]
    for check in sorted({r.check for r in small}):
        rs = [r for r in small if r.check == check]
        parts.append(f"{check}: C = {max(r.ratio for r in rs):.3g} (median {np.median([r.ratio for r in rs]):.3g})")
        for key in ("t", "s", "r", "n"):
            for g in growth(rs, key, where=swept(key)):
                gs[(check, key)] = g
                parts.append(g.text())
                if g.grows and key != "t":
                    kind = "versions disagree" if (key == "s" and check.startswith("BalanceKV-preprint")) else "rate"
                    findings.append(Finding(CLAIM, f"[{check}] the fitted constant grows with {key}",
                                            f"eps_hat * t / shape has log-log slope {g.slope:.2f} (95% CI {g.lo:.2f}.."
                                            f"{g.hi:.2f}) in {key}: the stated t = O(.../eps) does not capture the "
                                            f"measured dependence on {key} in the tested range", g.smallest, kind=kind))
    s_fit = {c: gs[(c, "s")].slope for c in ("BalanceKV-NeurIPS paper c", "BalanceKV-preprint paper c") if (c, "s") in gs}
    if len(s_fit) == 2:
        better = min(s_fit, key=lambda c: abs(s_fit[c]))
        findings.append(Finding(
            CLAIM, "BalanceKV-preprint and BalanceKV-NeurIPS state different t: sqrt(s) e^{2r^2/sqrt d}/eps (BalanceKV-NeurIPS) vs e^{2r^2/sqrt d}/eps (BalanceKV-preprint)",
            f"slope of the fitted constant in s: BalanceKV-NeurIPS {s_fit['BalanceKV-NeurIPS paper c']:+.2f}, BalanceKV-preprint {s_fit['BalanceKV-preprint paper c']:+.2f}; "
            f"the {better.removesuffix(' paper c')} statement tracks the measured s-dependence better", {"sweep": "s"},
            kind="versions disagree"))
    paper = [r for r in records if r.check == "BalanceKV-NeurIPS paper c"]
    rate, proven, fitted = ("n/a", None), None, None
    if paper:
        fitted = fitted_constant(paper, "max eps_hat / (sqrt(s) e^{2r^2/sqrt d}/t) over the BalanceKV-NeurIPS paper-c trials "
                                        "(the O~ of Thm 3.4 with its polylog factors in the constant)")
        prov = max(r.measured / _proven_eps(r.params) for r in paper)
        proven = Constant(30.0, "proven", "the walk's c = 30 log(ts/delta) (BalanceKV-NeurIPS Alg. 2 line 3) in Thm 3.3's discrepancy, "
                          "the proof's other factors with constant 1: eps_c = 30 log(ts/delta) sqrt(s) e^{2r^2/sqrt d}/t; "
                          f"measured eps_hat at most {prov:.2g} x eps_c ({100 * prov:.2g}% of the bound)")
        parts.insert(0, f"with the walk's c as the paper states it (30 log(t/delta)): eps_hat <= {prov:.2g} x "
                        "BalanceKV-NeurIPS's bound with that c (all trials)")
        g = gs.get(("BalanceKV-NeurIPS paper c", "t"))
        p0 = next((r.params for r in paper if r.params.get("sweep") == "t"), paper[0].params)
        onset = merge_reduce_rate_onset(p0["d"], p0["s"], p0["r"], p0["delta"])
        sets_in = (f"t* ~ {onset['t_star']:.2g} at d = {p0['d']}, s = {p0['s']}, r = {p0['r']:g}: the batch size at "
                   f"which the walk has saturated the {onset['directions']} directions of E[y y^T] (y = phi(k) (x) v) "
                   f"holding 90% of E||y||^2, t = c R^2/(2 lam) with lam = {onset['eigenvalue']:.3g}, "
                   f"c = 30 log(t/delta) = {onset['c']:.3g}, R^2 = e^(r^2/sqrt d) max||v||^2 = {onset['R2']:.3g} "
                   f"(theory.balancekv.merge_reduce_rate_onset; the top direction saturates at t ~ "
                   f"{onset['t_top_direction']:.2g}). Below t* the walk acts like random signs, eps_hat ~ t^-1/2. "
                   f"The full profile's scale sweep runs d = 2, s = 1 past its t*; at this d the gpu profile does")
        if g is not None:
            if g.x_range[1] < onset["t_star"]:
                rate = decide_onset_rate(None, stated_exponent=-1.0, onset=onset["t_star"], largest=g.x_range[1],
                                         param="t", label=RATE_LABEL, sets_in=sets_in, whole=g)
            else:
                rate = decide_rate(g, stated_exponent=-1.0, sets_in=sets_in)
            if rate[0] == "not-reached":
                findings.append(Finding(CLAIM, f"O(1/t) rate not reached at d = {p0['d']} for t <= {g.x_range[1]:g}",
                                        f"eps_hat ~ t^{rate[1].measured_exponent:.2f} (95% CI "
                                        f"{rate[1].ci[0]:.2f}..{rate[1].ci[1]:.2f}), not t^-1; independent random signs "
                                        f"give t^-0.5. {sets_in}", g.smallest, kind="rate"))
            small_key = f"{p0['d']}, s = {p0['s']} (the t sweep)"
            decisions_small = [ScaleRate(small_key, onset["t_star"], onset["t_top_direction"], rate[0], rate[1], "", None)]
        else:
            decisions_small = []
    decisions = _scale(records, parts, figs, controls, findings)
    if decisions:
        rate = combine(decisions + (decisions_small if paper else []))
    parts.append(trivial.detail)
    v = decide(CLAIM, records, summary=in_words("; ".join(parts), CHECK_WORDS), figures=figs,
               findings=words_in_findings(findings, CHECK_WORDS), rate=rate, proven=proven, fitted=fitted,
               trivial=trivial, controls=controls)
    v.n_records = n_all
    return v


# ------------------------------------------------------------------ power against the battery of controls
# t = 64, T = log2(n/t) = 2 at n = 256: MergeAndReduce holds ~20% of the stream's floats (t = 32, T = 3: 7-9%)
POWER_T = 64


def power_trial(params: dict, seed: int, backend: str):
    """eps_hat of MergeAndReduce (the walk's paper c) and of each control of the battery (kvbounds.battery) for the
    numerator sum_i e^{<k_i,q_j>/sqrt d} v_i on one stream of a family, at the same checkpoints and in the theorem's
    units err / (j e^{-r^2/sqrt d} max||v||); every control holds the floats MergeAndReduce holds at that step
    (kvbounds.battery.method_floats: keys, values, one weight per cell, the unreduced batch). The ablation:
    MergeAndReduce with fair coins for the walk (signs="random", the same seed: the walk's own uniforms)."""
    n, t, delta = params["n"], params["t"], params["delta"]
    try:
        ps = power_stream(params, seed, scale_of_d=lambda d: 1 / math.sqrt(d), dv=params["s"])
    except LookupError as e:
        return [missing_record(CLAIM, params, SOURCE["BalanceKV-NeurIPS"], e)]
    Q, K, V, r = ps.Q, ps.K, ps.V, ps.r
    d, s = K.shape[1], V.shape[1]
    T = max(int(math.log2(n / t)), 0)
    make = lambda signs: MergeAndReduce(d, s, t=t, T=T, delta=delta, rng=np.random.default_rng(seed + 7),
                                        r_key=r * (1 + 1e-9), signs=signs)
    mr, coin = make("walk"), make("random")
    Kb, Vb, Qb = asarray(K, backend), asarray(V, backend), asarray(Q, backend)
    cps = set(checkpoints(n, t, np.random.default_rng(seed + 3)))
    vmax = float(np.linalg.norm(V, axis=1).max())
    bat, worst = StreamBattery(np.random.default_rng(seed + 4)), 0.0
    for j in range(1, n + 1):
        mr._push(Kb[j - 1], Vb[j - 1])
        coin._push(Kb[j - 1], Vb[j - 1])
        if j not in cps:
            continue
        q = Q[j - 1]
        m_x, u_x = exact_numerator_log(K, V, q, j)
        # the error (in units of e^{m_x}) that is one eps of the theorem: e^{-m_x} j e^{-r^2/sqrt d} max||v||
        unit = math.exp(-m_x - math.log(merge_reduce_eps_implied(1.0, j, r, d, vmax)))
        bat.numerator(q, K[:j], V[:j], method_floats(mr), 1 / math.sqrt(d), m_x, u_x, unit)
        for est, name in ((mr, "method"), (coin, "ablation")):
            m_z, u_z = est.estimate(Qb[j - 1])
            e = float(np.linalg.norm(np.exp(m_z - m_x) * to_numpy(u_z) - u_x)) / unit
            if name == "method":
                worst = max(worst, e)
            else:
                bat.add(name, e)
    numerators = lambda est: lambda qs: _numerators(est, qs, backend)
    practitioner = held_out_errors("numerator", numerators(mr), K, V, ps.later, method_floats(mr),
                                   np.random.default_rng(seed + 5), scale=1 / math.sqrt(d),
                                   ablation_estimate=numerators(coin))
    return [battery_record(CLAIM, params, SOURCE["BalanceKV-NeurIPS"], worst, bat.values(),
                           method_floats=method_floats(mr), stream_floats=stream_floats(n, d, s),
                           controls_floats=dict(bat.floats, ablation=method_floats(coin)), stream=ps.note,
                           stored=mr.num_stored(), r_stream=r, unit=ps.unit, practitioner=practitioner)]


def _numerators(est, qs, backend) -> tuple[np.ndarray, np.ndarray]:
    """The estimator's numerator sum for each query of ``qs`` (m, d) as (log-scales (m,), vectors (m, s))."""
    out = [est.estimate(asarray(np.ascontiguousarray(q), backend)) for q in qs]
    return np.array([float(m) for m, _ in out]), np.stack([np.asarray(to_numpy(u), np.float64) for _, u in out])


run_trial = dispatch("sweep", {"power": power_trial, "t-scale": scale_trial}, default=statement_trial)
