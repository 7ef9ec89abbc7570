"""The paired comparisons behind the end-to-end verdicts (BKV.e2e, SG.e2e) under the stricter reproduction rule
(:func:`kvbounds.verdict.reproduction_status`). The call of each cell is the one rule's
(:func:`kvbounds.verdict.paired_calls`, :func:`comparison`): per instance the method's gain over exact attention
averaged over its redraws (the unit is the instance; redraws are never units) against the baseline's, the
signed-rank test on the differences, Holm over the variant's cells; the per-redraw t-tests below remain for the
power estimate (the smallest detectable effect against the memory effect) and the details.

* The unit is the task instance: a window's mean per-token log-likelihood gain over exact attention (``ppl``),
  the answer's total (``passkey``, ``lines``); tokens of one window are never separate units.
* A cell is (variant, baseline, budget, task): the one rule's call over its instances (redraws of the variant's
  randomness, records' ``draw``, averaged within each), Holm over the variant's cells; it is eligible for the
  reproduction rule with >= :data:`kvbounds.verdict.MIN_INSTANCES` instances and, for a randomised variant,
  >= ``MIN_REDRAWS`` redraws.
* Duplicate comparisons count once: a baseline whose scores equal another's on every instance (kvpress's
  PyramidKV falls back to SnapKV at short lengths) is merged into the first.
* Power per cell: the effect's 95% interval (Hodges-Lehmann) and the smallest effect detectable at 80% power
  after the Holm adjustment (:func:`kvbounds.verdict.detectable`); a variant without a significant cell is ``not-reproduced`` (effect bounded by the
  largest upper end) only when every cell is eligible and could detect the reference effect (the memory effect:
  uniform at the smallest vs the largest budget), else ``not-shown``.
"""
from __future__ import annotations

import numpy as np

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


def unit_comparison(ua: dict, ub: dict, where: str, control: str, task: str):
    """The one rule's comparison (:class:`kvbounds.verdict.Comparison`) of two {instance: gain} maps on their shared
    instances (higher is better; the difference scale, the task's threshold); its reason says when none is shared."""
    from kvbounds.verdict import Comparison, rule_for
    keys = sorted(set(ua) & set(ub), key=repr)
    _, _, threshold, _ = rule_for(TASK_METRICS.get(task, "answer log-likelihood"))
    return Comparison(where, control, [ua[k] for k in keys], [ub[k] for k in keys],
                      reason="" if len(keys) >= 2 else "fewer than 2 shared instances", scale="difference",
                      lower_is_better=False, threshold=threshold)


def cell(records, a: str, b: str, budget: float, task: str) -> dict | None:
    """What a cell holds beside its call: the shared instances ``n`` (the fewest over ``a``'s redraws, each paired
    with the same redraw of ``b`` when ``b`` has it, else its first) and the redraws. None without records."""
    ea, eb = effects(records, a, budget, task), effects(records, b, budget, task)
    if not ea or not eb:
        return None
    ns = [len(set(ua) & set(eb.get(r, eb[min(eb)]))) for r, ua in sorted(ea.items())]
    ns = [n for n in ns if n >= 2]
    return dict(n=min(ns), redraws=len(ns)) if ns else None


# the practical threshold of each task's gain (the one rule's, kvbounds.verdict.rule_for): nats per token for the
# ppl windows' mean gain, nats of the answer's log-likelihood for the retrieval tasks
TASK_METRICS = {"ppl": "ppl: NLL increase vs exact (nats/token)", "passkey": "passkey: answer log-likelihood (nats)",
                "lines": "lines: answer log-likelihood (nats)"}


def comparison(records, a: str, b: str, budget: float, task: str, where: str):
    """The one rule's comparison of method ``a`` against baseline ``b`` on their shared instances: each side's gain
    over exact attention per instance, a randomised method's redraws averaged within the instance (higher is
    better; the difference scale, the task's threshold). None when either has no record."""
    from kvbounds.verdict import Comparison, rule_for
    ea, eb = effects(records, a, budget, task), effects(records, b, budget, task)
    if not ea or not eb:
        return None
    mean = lambda e: {k: float(np.mean([d[k] for d in e.values() if k in d])) for k in set().union(*e.values())}
    ua, ub = mean(ea), mean(eb)
    keys = sorted(set(ua) & set(ub), key=repr)
    _, _, threshold, _ = rule_for(TASK_METRICS.get(task, "answer log-likelihood"))
    return Comparison(where, b, [ua[k] for k in keys], [ub[k] for k in keys], budget,
                      reason="" if keys else "no shared instance", scale="difference", lower_is_better=False,
                      threshold=threshold)


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


# ------------------------------------------------------------------ the one call of the end-to-end curves

CALL_WORDS = ("better", "leaning better", "tied", "leaning worse", "worse", "not tested", "not attainable")


def calls(pairs, *, margin: float, alpha: float = ALPHA, bounded: bool = False) -> list[dict]:
    """The paired calls of the end-to-end curves (:mod:`kvbounds.e2e.curves`): the package's one rule for "better"
    (:func:`kvbounds.verdict.paired_calls`) over a family of comparisons, Holm over the family.

    ``pairs``: [(method_units, other_units)], each {instance: score} on the higher-is-better scale (a randomised
    method's redraws already averaged within the instance: the instance is the unit). Over the shared instances,
    the signed-rank test on the differences method - other, the Hodges-Lehmann effect with its 95% interval, the
    practical threshold ``margin``; the one rule's words (better / leaning better / tied / leaning worse / worse /
    not attainable; ``not tested`` with fewer than 2 shared instances) and ``equivalent`` (a tie within the margin:
    the whole interval inside it). With ``bounded`` (scores in [0, 1], e.g. exact match) the interval reaches at
    least the Clopper-Pearson upper ends of the shares of instances where the method scored lower (and higher): with
    none in n, 1 - (alpha/2)^(1/n) (0.17 at n = 20), so a tie of 0/1 scores is an equivalence only when that bound
    lies inside the margin. Each dict:
    the call's fields and ``mean`` (the effect), ``tests`` (the family's size), ``margin``."""
    from kvbounds.verdict import Comparison, paired_calls
    comps = []
    for mu, ou in pairs:
        keys = sorted(set(mu) & set(ou), key=repr)
        a, b = [float(mu[k]) for k in keys], [float(ou[k]) for k in keys]
        comps.append(Comparison("", "", a, b, reason="" if len(keys) >= 2 else "fewer than 2 shared instances",
                                scale="difference", lower_is_better=False, threshold=float(margin), bounded=bounded))
    return [dict(c.as_dict(), mean=c.effect, margin=float(margin))
            for c in paired_calls(comps, alpha=alpha, unit="an instance (a distinct prompt or text window)",
                                  metric="practitioner")]


def call(method_units: dict, other_units: dict, *, margin: float, alpha: float = ALPHA, bounded: bool = False) -> dict:
    """One comparison alone (a family of one): :func:`calls`."""
    return calls([(method_units, other_units)], margin=margin, alpha=alpha, bounded=bounded)[0]
