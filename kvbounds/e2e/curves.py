"""Score-vs-memory curves of the end-to-end records, and the decisions read from them.

Records are those of the end-to-end trials (``BKV.e2e``, ``SG.e2e``, ``kvbounds e2e``): one per task instance x
method x memory fraction (x redraw), every method on the instance's one exact prefill. From them:

* :func:`points`: one point per (model, task, n, setting, method, memory fraction): the mean score over instances
  with its 95% interval (a randomised method's redraws averaged within the instance first: the instance is the
  unit) and the floats held. The score: exact match (every greedy answer token right) for the retrieval tasks;
  the held-out tokens' NLL increase against exact attention (nats/token, lower is better) for ``ppl``.
* :func:`exact_scores`: exact attention's score per (model, task, n, setting), and whether the task has power
  there (exact match >= :data:`POWER_FLOOR`; ``ppl`` always: exact attention is its reference). A task without
  power is reported as "no power" and no call is made on it.
* :func:`decisions`: per powered panel and method of the papers, the smallest memory at which the method is tied
  with exact attention (equivalent within :data:`MARGINS`), and at each memory its call against the strongest
  baseline there (the baseline with the best mean score among :data:`BASELINES` present at that memory: picked by
  the data, which favours the baseline). Every call goes through :func:`kvbounds.e2e._comparisons.calls`, the one
  rule for "better" (paired per instance; Holm over the panel's calls of one kind, stated as ``tests``).
* :func:`timing`: per model and length, the end-to-end job's CPU seconds per instance (the prefill, every
  method's compression and scoring) and the prefill's share.
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
from scipy import stats

from . import _comparisons as CMP

__all__ = ["CLAIMS", "POWER_FLOOR", "MARGINS", "BASELINES", "EXACT", "panel_key", "score", "units", "metric", "points",
           "exact_scores", "decisions", "timing", "decision_words"]

CLAIMS = ("BKV.e2e", "SG.e2e", "E2E")
POWER_FLOOR = 0.9
# equivalence margins of "tied" (a choice, stated with every call): 20 points of exact match (the battery's 20%
# equivalence; 20 instances equal on every one bound the difference by 0.17, Clopper-Pearson); 0.01 nats/token of
# held-out NLL (1% of the perplexity)
MARGINS = {"match": 0.2, "ppl": 0.01}
# the strongest of these present at a memory is the baseline a method of the papers is called against
BASELINES = ("streaming_llm", "uniform", "h2o", "kvpress:snapkv", "kvpress:streaming_llm", "kvpress:tova",
             "kvpress:knorm", "kvpress:expected_attention", "kvpress:pyramidkv")
EXACT = "exact"


def _rows(records):
    for r in records:
        e = getattr(r, "extra", None) or {}
        if r.claim in CLAIMS and not e.get("error") and "ll" in e and e.get("task"):
            yield r, e


def panel_key(r, e) -> tuple:
    """(model, task, n, setting): one panel; the depth sweep's fixed-depth instances are their own panels."""
    task = e["task"] + (f" @depth {float(r.params['depth']):g}" if r.params.get("depth") is not None else "")
    return (e.get("model", ""), task, int(r.params.get("n", e.get("n", 0))), e.get("setting", "after"))


def _instance(r) -> tuple:
    return (r.params.get("index"), r.params.get("depth"))


def score(e: dict) -> float:
    """An instance's score on the higher-is-better scale of the calls: exact match (0/1) for a retrieval task, minus
    the held-out tokens' mean NLL increase against exact attention for ``ppl``."""
    if e["task"] == "ppl":
        return float(np.mean(np.asarray(e["ll"], float) - np.asarray(e["exact_ll"], float)))
    return float(all(e["hit"]))


def units(records) -> dict:
    """{panel: {(method, budget): {instance: score}}}: redraws averaged within the instance; exact attention under
    (``exact``, 1.0); a trial stored twice counts once."""
    acc: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for r, e in _rows(records):
        key = (e["method"], 1.0 if e["method"] == EXACT else round(float(e["budget"]), 6))
        acc[panel_key(r, e)][key][_instance(r)][int(e.get("draw", 0))] = score(e)
    return {p: {k: {i: float(np.mean(list(d.values()))) for i, d in by.items()} for k, by in ms.items()}
            for p, ms in acc.items()}


def _floats(records) -> dict:
    out: dict = defaultdict(list)
    for r, e in _rows(records):
        if e.get("exact_floats"):
            key = (panel_key(r, e), e["method"], 1.0 if e["method"] == EXACT else round(float(e["budget"]), 6))
            out[key].append(e["memory_floats"] / e["exact_floats"])
    return {k: float(np.mean(v)) for k, v in out.items()}


def _interval(x: np.ndarray, binary: bool) -> tuple[float, float]:
    if len(x) < 2:
        return (math.nan, math.nan)
    if binary and np.all((x == 0) | (x == 1)):
        k, n = int(x.sum()), len(x)
        lo = stats.beta.ppf(0.025, k, n - k + 1) if k else 0.0
        hi = stats.beta.ppf(0.975, k + 1, n - k) if k < n else 1.0
        return float(lo), float(hi)
    if np.allclose(x, x[0]):
        return float(x[0]), float(x[0])
    lo, hi = stats.t.interval(0.95, len(x) - 1, loc=float(x.mean()), scale=float(stats.sem(x)))
    return float(lo), float(hi)


def metric(task: str) -> str:
    return "NLL increase vs exact (nats/token)" if task.startswith("ppl") else "exact match"


def points(records) -> list[dict]:
    """The curves' points (module docstring), sorted by panel, method and memory."""
    fl = _floats(records)
    out = []
    for panel, ms in sorted(units(records).items()):
        ppl = panel[1].startswith("ppl")
        for (method, budget), u in sorted(ms.items()):
            x = np.array(list(u.values()), float)
            val = -x if ppl else x
            lo, hi = _interval(val, not ppl)
            out.append(dict(model=panel[0], task=panel[1], n=panel[2], setting=panel[3], method=method,
                            budget=budget, memory=fl.get((panel, method, budget), budget), metric=metric(panel[1]),
                            value=float(val.mean()), ci=(lo, hi), instances=len(x)))
    return out


def exact_scores(records) -> list[dict]:
    """Exact attention's score per panel: k/N retrieved (retrieval tasks) or its held-out perplexity (``ppl``), and
    ``powered`` (module docstring)."""
    ppl: dict = defaultdict(list)
    for r, e in _rows(records):
        if e["method"] == EXACT and e["task"] == "ppl":
            ppl[panel_key(r, e)].append(-np.asarray(e["exact_ll"], float))
    out = []
    for panel, ms in sorted(units(records).items()):
        u = ms.get((EXACT, 1.0))
        if not u:
            continue
        if panel[1].startswith("ppl"):
            nll = np.concatenate(ppl[panel]) if ppl[panel] else np.array([math.nan])
            out.append(dict(model=panel[0], task=panel[1], n=panel[2], setting=panel[3], instances=len(u),
                            score=float(math.exp(nll.mean())), what="perplexity", powered=True))
            continue
        k = int(round(sum(u.values())))
        out.append(dict(model=panel[0], task=panel[1], n=panel[2], setting=panel[3], instances=len(u), retrieved=k,
                        score=k / len(u), what="exact match", powered=k / len(u) >= POWER_FLOOR))
    return out


def _papers_methods(methods) -> list[str]:
    from kvbounds.methods import leaderboard_family
    return [m for m in methods if m != EXACT and leaderboard_family(m) == "ours"]


def decisions(records) -> list[dict]:
    """Per powered panel and method of the papers (module docstring): ``matches_exact`` (the smallest memory
    fraction at which the call against exact attention is ``tied`` within the margin; None when none is), ``calls`` {memory: the call
    against the strongest baseline there, with ``baseline``}, ``versus_exact`` {memory: the call against exact}."""
    powered = {(s["model"], s["task"], s["n"], s["setting"]) for s in exact_scores(records) if s["powered"]}
    failed: dict = {}       # (panel, method, budget) -> why the method has no score there
    for r in records:
        e = getattr(r, "extra", None) or {}
        if r.claim in CLAIMS and e.get("error") and e.get("task") and e.get("method"):
            failed[(panel_key(r, e), e["method"], round(float(e.get("budget", 1.0)), 6))] = str(e["error"])
    out = []
    for panel, ms in sorted(units(records).items()):
        if panel not in powered:
            continue
        ppl = panel[1].startswith("ppl")
        margin = MARGINS["ppl" if ppl else "match"]
        budgets = sorted({b for m, b in ms if m != EXACT})
        ours = _papers_methods(sorted({m for m, _ in ms}))
        kw = dict(margin=margin, bounded=not ppl)
        exact = ms.get((EXACT, 1.0), {})
        strongest = {}
        for b in budgets:
            cands = [(float(np.mean(list(ms[(m, b)].values()))), m) for m in BASELINES if (m, b) in ms]
            if cands:
                strongest[b] = max(cands, key=lambda c: (c[0], -BASELINES.index(c[1])))[1]
        # two families per panel, each one Holm family of the one rule: against exact attention, and against the
        # strongest baseline
        ran = [(m, b) for m in ours for b in budgets if (m, b) in ms]
        vs_exact_all = dict(zip(ran, CMP.calls([(ms[k], exact) for k in ran], **kw)))
        against = [k for k in ran if k[1] in strongest]
        vs_base_all = dict(zip(against, CMP.calls([(ms[k], ms[(strongest[k[1]], k[1])]) for k in against], **kw)))
        for m in ours:
            vs_exact, calls = {}, {}
            for b in budgets:
                if (m, b) not in ms:
                    if (panel, m, b) in failed:
                        why = failed[(panel, m, b)]
                        calls[b] = dict(call="not attainable" if why.startswith("not attainable") else "not tested",
                                        reason=why[:160], baseline=strongest.get(b, ""), n=0, tests=len(against))
                    continue
                vs_exact[b] = vs_exact_all[(m, b)]
                if b in strongest:
                    calls[b] = dict(vs_base_all[(m, b)], baseline=strongest[b])
            tied = [b for b, c in vs_exact.items() if c["call"] == "tied" and c.get("equivalent")]
            out.append(dict(model=panel[0], task=panel[1], n=panel[2], setting=panel[3], method=m, margin=margin,
                            matches_exact=min(tied) if tied else None, versus_exact=vs_exact, calls=calls))
    return out


def timing(records) -> list[dict]:
    """Per (model, n): instances, the mean CPU seconds of an instance's whole end-to-end job (the prefill once, then
    every row's compression and scoring) and the prefill's share of it."""
    per: dict = defaultdict(lambda: dict(prefill=0.0, rest=0.0))
    for r, e in _rows(records):
        inst = (e.get("model", ""), int(r.params.get("n", 0)), e["task"], _instance(r), e.get("setting", "after"))
        per[inst]["rest"] += float(e.get("compress_s", 0.0)) + float(e.get("score_s", 0.0))
        per[inst]["prefill"] = float(e.get("prefill_s", 0.0)) + float(e.get("prefill_scores_s", 0.0))
    by: dict = defaultdict(list)
    for (model, n, *_), t in per.items():
        by[(model, n)].append((t["prefill"], t["prefill"] + t["rest"]))
    out = []
    for (model, n), v in sorted(by.items()):
        pre, tot = np.array(v).T
        out.append(dict(model=model, n=n, instances=len(v), seconds=float(tot.mean()), prefill_s=float(pre.mean()),
                        prefill_share=float(pre.sum() / tot.sum()) if tot.sum() else math.nan))
    return out


def decision_words(d: dict) -> str:
    """One line per decision: "balancekv: ties exact attention from 50% of the cache; at 25%: worse than
    StreamingLLM (-0.30 [-0.5, -0.1], n=20, Holm over 12)"."""
    head = (f"{d['method']}: ties exact attention from {100 * d['matches_exact']:.3g}% of the cache"
            if d["matches_exact"] is not None else f"{d['method']}: never tied with exact attention at the memories run")
    parts = []
    for b, c in sorted(d["calls"].items()):
        if c["call"] in ("not tested", "not attainable"):
            why = c.get("reason") or f"{c['n']} instance(s)"
            parts.append(f"at {100 * b:.3g}%: {c['call']} ({why})")
            continue
        lo, hi = c["ci"]
        mean, lo, hi = c["mean"] + 0.0, lo + 0.0, hi + 0.0        # + 0.0: -0 prints as +0
        parts.append(f"at {100 * b:.3g}%: {c['call']} vs {c['baseline']} ({mean:+.3g} [{lo:+.3g}, {hi:+.3g}], "
                     f"n={c['n']}, Holm over {c['tests']})")
    return head + ("; " + "; ".join(parts) if parts else "")
