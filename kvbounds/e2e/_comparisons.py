"""The paired comparisons behind the end-to-end verdicts (BKV.e2e, SG.e2e) under the stricter reproduction rule
(:func:`kvbounds.verdict.reproduction_status`).

* The unit is the task instance: a window's mean per-token log-likelihood gain over exact attention (``ppl``),
  the answer's total (``passkey``, ``lines``); tokens of one window are never separate units.
* A cell is (variant, baseline, budget, task). Per redraw of the variant's randomness (records' ``draw``; a
  deterministic method has one), a one-sided paired t-test over instances each way, Holm-adjusted over the
  variant's cells; a cell counts as better when it is significant in most of its redraws and has
  >= :data:`kvbounds.verdict.MIN_INSTANCES` instances and, for a randomised variant, >= ``MIN_REDRAWS`` redraws.
* Duplicate comparisons count once: a baseline whose scores equal another's on every instance (kvpress's
  PyramidKV falls back to SnapKV at short lengths) is merged into the first.
* Power per cell: the effect's 95% interval (pooled over redraws) and the smallest effect detectable at 80% power
  after the Holm adjustment; a variant without a significant cell is ``not-reproduced`` (effect bounded by the
  largest upper end) only when every cell is eligible and could detect the reference effect (the memory effect:
  uniform at the smallest vs the largest budget), else ``not-shown``.
"""
from __future__ import annotations

import numpy as np
from scipy import stats

ALPHA = 0.05


def effects(records, method: str, budget: float, task: str) -> dict:
    """{draw: {instance: gain}}: the method's log-likelihood gain over exact attention per instance (ppl: mean
    per token of the window; passkey/lines: the answer's total), per redraw (``draw``, 0 in older records)."""
    out: dict = {}
    for r in records:
        e = r.extra
        if e.get("method") != method or e.get("task") != task or e.get("error") or "ll" not in e:
            continue
        if method != "exact" and abs(float(e["budget"]) - budget) > 1e-9:
            continue
        d = np.asarray(e["ll"], float) - np.asarray(e["exact_ll"], float)
        inst = (r.params.get("model", "smollm2"), r.params.get("task"), r.params.get("n"), r.params.get("index"),
                r.params.get("setting", "after"))
        out.setdefault(int(e.get("draw", 0)), {})[inst] = float(d.mean() if task == "ppl" else d.sum())
    return out


def paired(ua: dict, ub: dict) -> dict | None:
    """One-sided paired t-tests over shared instances of a - b (a better: greater)."""
    keys = sorted(set(ua) & set(ub))
    if len(keys) < 2:
        return None
    diff = np.array([ua[k] - ub[k] for k in keys])
    if np.allclose(diff, 0):
        return dict(n=len(keys), mean=0.0, sd=0.0, p_better=1.0, p_worse=1.0, diff=diff)
    return dict(n=len(keys), mean=float(diff.mean()), sd=float(diff.std(ddof=1)), diff=diff,
                p_better=float(stats.ttest_1samp(diff, 0.0, alternative="greater").pvalue),
                p_worse=float(stats.ttest_1samp(diff, 0.0, alternative="less").pvalue))


def cell(records, a: str, b: str, budget: float, task: str) -> dict | None:
    """Per redraw of ``a`` (paired with the same redraw of ``b`` when ``b`` has it, else its first): the tests;
    pooled over redraws: the per-instance mean difference's mean, 95% interval and sd."""
    ea, eb = effects(records, a, budget, task), effects(records, b, budget, task)
    if not ea or not eb:
        return None
    tests = [paired(ua, eb.get(r, eb[min(eb)])) for r, ua in sorted(ea.items())]
    tests = [t for t in tests if t is not None]
    if not tests:
        return None
    n = min(t["n"] for t in tests)
    pooled = np.mean([t["diff"][:n] for t in tests], axis=0)
    sd = float(pooled.std(ddof=1)) if n > 1 else 0.0
    half = float(stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n)) if n > 1 else float("inf")
    return dict(n=n, redraws=len(tests), mean=float(pooled.mean()), sd=sd,
                ci=(float(pooled.mean()) - half, float(pooled.mean()) + half),
                p_better=[t["p_better"] for t in tests], p_worse=[t["p_worse"] for t in tests])


def duplicates(records, baselines, budgets, tasks) -> dict:
    """{baseline: the earlier baseline it equals}: equal log-likelihoods on every shared instance at every budget
    and task where both ran (a comparison against it would be the same comparison twice)."""
    out = {}
    for i, b in enumerate(baselines):
        for a in baselines[:i]:
            if a in out:
                continue
            same, seen = True, False
            for bud in budgets:
                for t in tasks:
                    ea, eb = effects(records, a, bud, t), effects(records, b, bud, t)
                    if not ea or not eb:
                        continue
                    ua, ub = ea[min(ea)], eb[min(eb)]
                    keys = set(ua) & set(ub)
                    seen = seen or bool(keys)
                    same = same and all(abs(ua[k] - ub[k]) < 1e-9 for k in keys)
            if seen and same:
                out[b] = a
                break
    return out


def detectable(sd: float, n: int, m: int, alpha: float = ALPHA, power: float = 0.8) -> float:
    """The smallest mean difference a one-sided test at alpha / m detects with the given power (normal approx.)."""
    if n < 2:
        return float("inf")
    return float((stats.norm.ppf(1 - alpha / max(m, 1)) + stats.norm.ppf(power)) * sd / np.sqrt(n))


# ------------------------------------------------------------------ the one call of the end-to-end curves

CALL_WORDS = ("better", "leaning better", "tied", "leaning worse", "worse", "not shown", "not tested", "not attainable")


def call(method_units: dict, other_units: dict, *, margin: float, tests: int = 1, alpha: float = ALPHA,
         bounded: bool = False) -> dict:
    """THE paired call of the end-to-end curves (:mod:`kvbounds.e2e.curves`): every comparison of a method with
    exact attention or with a baseline goes through here, so that the package's one rule for "better" replaces it
    in one place.

    ``method_units`` / ``other_units``: {instance: score} on the higher-is-better scale (a randomised method's
    redraws already averaged within the instance: the instance is the unit). Over the shared instances, d = method -
    other: a two-sided paired t-test (Bonferroni over ``tests``, the family's size; stated with the call) and the
    95% t interval of the mean of d. Words: ``better`` / ``worse`` (significant after the adjustment), ``leaning
    better`` / ``leaning worse`` (the unadjusted interval excludes 0, the adjusted test does not), ``tied`` (the
    interval inside [-margin, margin]: equivalent within the stated margin), ``not shown`` (none of these),
    ``not tested`` (fewer than 2 shared instances; ``not attainable``, a method that cannot hold that memory, is
    said by the caller, which knows why). Every d equal (no spread: the t interval is undefined): better / worse
    when they are not 0 and the interval below excludes 0; with ``bounded`` (scores in [0, 1], e.g. exact match)
    the interval is d +- (1 - (alpha/2)^(1/n)), the Clopper-Pearson bound on the share of instances where the two
    could differ when none did in n (at n = 20: 0.17), so a tie needs that bound inside the margin; unbounded
    scores equal on every instance (the same cache twice) are tied."""
    keys = sorted(set(method_units) & set(other_units))
    out = dict(n=len(keys), tests=int(tests), margin=float(margin), mean=float("nan"), ci=(float("nan"), float("nan")),
               p=float("nan"))
    if len(keys) < 2:
        return dict(out, call="not tested")
    d = np.array([method_units[k] - other_units[k] for k in keys], float)
    mean = float(d.mean())
    if np.allclose(d, d[0], rtol=0, atol=1e-12):
        half = 1 - (alpha / 2) ** (1 / len(d)) if bounded else 0.0
        lo, hi = mean - half, mean + half
        if lo > 0 or hi < 0:
            word = "better" if mean > 0 else "worse"
        else:
            word = "tied" if -margin <= lo and hi <= margin else "not shown"
        return dict(out, mean=mean, ci=(lo, hi), p=0.0 if lo > 0 or hi < 0 else 1.0, call=word)
    sd = float(d.std(ddof=1))
    half = float(stats.t.ppf(1 - alpha / 2, len(d) - 1) * sd / np.sqrt(len(d)))
    p = float(stats.ttest_1samp(d, 0.0).pvalue)
    lo, hi = mean - half, mean + half
    if min(1.0, p * tests) < alpha:
        word = "better" if mean > 0 else "worse"
    elif lo > 0 or hi < 0:
        word = "leaning better" if mean > 0 else "leaning worse"
    elif -margin <= lo and hi <= margin:
        word = "tied"
    else:
        word = "not shown"
    return dict(out, mean=mean, ci=(lo, hi), p=p, call=word)
