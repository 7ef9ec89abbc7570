"""The leaderboard for choosing a method: records of the end-to-end checks (``BKV.e2e``, ``SG.e2e``,
``kvbounds e2e``) -> rows of method x metric x budget, ranked per (metric, budget), for the report
(:mod:`kvbounds.report` renders exactly these keys).

Metrics (the value is a mean over instances, with a 95% interval; a randomised method's redraws are averaged
per instance first):
* ``ppl: NLL increase vs exact (nats/token)`` - per window, the mean per-token NLL increase against exact
  attention on the same window (t interval over windows: the window is the unit);
* ``ppl: perplexity`` - exp(mean NLL) of the held-out tokens (no interval);
* ``<task>: exact match`` - greedy answer entirely right, per instance (Clopper-Pearson interval);
* ``<task>: answer log-likelihood (nats)`` - teacher-forced log-likelihood of the answer's tokens (t interval);
for task in passkey, lines, and "passkey, question inside" / "lines, question inside" for the papers' setting
(:func:`task_label`; never pooled with ours). Per (metric, budget): ``rank`` by the mean (lower NLL / perplexity is better,
higher match / likelihood), ``best`` the first, ``tied`` those the one rule does not call worse or better than it
(:func:`kvbounds.verdict.paired_calls` over the shared instances, Holm over the table's comparisons with the
best; exact attention is a reference, not ranked); ``units`` each row's per-instance scores (instance -> score, a
randomised method's redraws averaged within the instance), which the practitioner's table pairs; ``family`` groups
methods (ours, kvpress, baselines); ``budget_label`` reads "25% of the cache". A (metric, budget) table in
which every method scores 0 or 1 (no information) is collapsed into one row of method ``all methods`` saying
so. Skipped methods (kvpress missing, a method failing) give one row with a NaN value and the reason in ``note``.
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
from scipy import stats

KEYS = ("method", "source", "budget", "memory_floats", "metric", "value", "ci_low", "ci_high", "n", "note",
        "family", "budget_label", "rank", "best", "tied", "units")
CLAIMS = ("BKV.e2e", "SG.e2e", "E2E")
LOWER_IS_BETTER = ("NLL increase", "perplexity")
# why a task's exact match carries no information at this scale (measured, issue 21: exact attention, 8 instances
# of n = 512, SmolLM2-135M-Instruct); the teacher-forced answer log-likelihood stays the graded score
NO_POWER = {"lines": "; SmolLM2-135M cannot do line retrieval here: exact attention retrieves 0/8 with the ~20 lines "
                     "that fill 512 tokens, 3/8 with 6 lines, 6/8 with 3, 4/8 with 2 (measured; never the 90% a "
                     "task with power needs), so the answer's log-likelihood is the graded score"}


def family(method: str) -> str:
    """ours (the papers' methods as implemented here), kvpress (NVIDIA kvpress presses), baselines (ours:
    uniform, StreamingLLM, H2O, the null control; exact attention): :func:`kvbounds.methods.leaderboard_family`."""
    from kvbounds.methods import leaderboard_family
    return leaderboard_family(method)


def budget_label(budget: float) -> str:
    return "exact (100% of the cache)" if budget >= 1.0 else f"{100 * budget:.3g}% of the cache"


def t_interval(x: np.ndarray) -> tuple[float | None, float | None]:
    if len(x) < 2 or np.allclose(x, x[0]):
        return (float(x.mean()), float(x.mean())) if len(x) else (None, None)
    lo, hi = stats.t.interval(0.95, len(x) - 1, loc=float(x.mean()), scale=float(stats.sem(x)))
    return float(lo), float(hi)


def _cp(k: int, n: int) -> tuple[float, float]:
    lo = 0.0 if k == 0 else float(stats.beta.ppf(0.025, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(0.975, k + 1, n - k))
    return lo, hi


def row(method, source, budget, mem, metric, value, ci=(None, None), n=0, note="", units=None):
    value = None if value is None or math.isnan(float(value)) else float(value)     # a skipped cell: no value (null)
    return dict(method=method, source=source, budget=float(budget), memory_floats=int(mem), metric=metric,
                value=value, ci_low=ci[0], ci_high=ci[1], n=int(n), note=note, family=family(method),
                budget_label=budget_label(float(budget)), rank=None, best=False, tied=False,
                units={str(k): float(v) for k, v in (units or {}).items()})


def task_label(record) -> str:
    """The task as the tables name it: the papers' setting (question inside the compressed prompt) is its own
    table, never pooled with ours (question after it)."""
    task = (getattr(record, "extra", {}) or {}).get("task", "")
    model = record.params.get("model", "smollm2")
    task = task if model == "smollm2" else f"{task} [{model}]"       # another model's table is its own too
    return task if record.params.get("setting", "after") == "after" else f"{task}, question inside"


def leaderboard_rows(records) -> list[dict]:
    """One row per (method, budget, metric) over every end-to-end record; see the module docstring."""
    from .curve_grid import claim_records
    groups: dict = defaultdict(dict)
    skipped: dict = {}
    seen = set()
    by_claim: dict = defaultdict(list)
    for r in records:
        by_claim[r.claim].append(r)
    # each claim's own trials (quick), else its curves (full); the depth sweep never (kvbounds.e2e.curve_grid)
    records = [r for c, rs in by_claim.items() for r in (claim_records(rs) if c in CLAIMS else rs)]
    for r in records:
        e = getattr(r, "extra", {}) or {}
        if r.claim not in CLAIMS or "method" not in e:
            continue
        k = (e["method"], e.get("source", ""), float(e.get("budget", 1.0)), task_label(r))
        if e.get("error"):
            skipped[k[:3]] = e["error"]
            continue
        inst = (r.claim, r.params.get("model", "smollm2"), e.get("task"), r.params.get("n"), r.params.get("index"),
                r.params.get("setting", "after"))
        draw = int(e.get("draw", 0))
        if (k, inst, draw) in seen:          # a trial run twice (resumed) counts once
            continue
        seen.add((k, inst, draw))
        groups[k].setdefault(inst, []).append(e)
    rows = []
    for (method, source, budget, task), by_inst in sorted(groups.items(), key=lambda kv: (kv[0][3], kv[0][2], kv[0][0])):
        insts = sorted(by_inst)
        es = [e for i in insts for e in by_inst[i]]
        mem = int(round(np.mean([e["memory_floats"] for e in es])))
        note = "exact attention (no compression)" if method == "exact" else ""
        mean = lambda f: {i: float(np.mean([f(e) for e in by_inst[i]])) for i in insts}   # over redraws
        if task == "ppl":
            d = mean(lambda e: float(np.mean(np.asarray(e["exact_ll"]) - np.asarray(e["ll"]))))
            x = np.array(list(d.values()))
            nll = np.concatenate([-np.asarray(e["ll"]) for e in es])
            rows.append(row(method, source, budget, mem, "ppl: NLL increase vs exact (nats/token)", x.mean(),
                             t_interval(x), len(x), note, units=d))
            rows.append(row(method, source, budget, mem, "ppl: perplexity", math.exp(nll.mean()), n=len(x),
                             note=note))
        else:
            hits = mean(lambda e: float(all(e["hit"])))
            lls = mean(lambda e: float(np.sum(e["ll"])))
            h, l = np.array(list(hits.values())), np.array(list(lls.values()))
            k_hit = int(round(h.sum()))
            rows.append(row(method, source, budget, mem, f"{task}: exact match", h.mean(), _cp(k_hit, len(h)),
                             len(h), note, units=hits))
            rows.append(row(method, source, budget, mem, f"{task}: answer log-likelihood (nats)", l.mean(),
                             t_interval(l), len(l), note, units=lls))
    rows = _ranked(rows)
    snap = {(r["metric"], r["budget"]): r["value"] for r in rows if r["method"] == "kvpress:snapkv"}
    for r in rows:
        if r["method"] == "kvpress:pyramidkv" and snap.get((r["metric"], r["budget"])) == r["value"]:
            r["note"] = ("same as kvpress:snapkv: kvpress's PyramidKV falls back to SnapKV's uniform budget when its "
                         "pyramid does not fit the context")
    for (method, source, budget), why in sorted(skipped.items()):
        if not any(r["method"] == method and r["budget"] == budget for r in rows):
            rows.append(row(method, source, budget, 0, "skipped", None, note=why))
    return rows + check_rows(records)


def check_rows(records) -> list[dict]:
    """The rows a claim's check module adds to the leaderboard (its optional ``leaderboard_rows(records)``, e.g. the
    decode-time claims' tables), claim by claim in registry order, each given only that claim's records."""
    from kvbounds.claims import CLAIMS
    out = []
    for cid in [c for c in CLAIMS if any(r.claim == c for r in records)]:
        fn = getattr(CLAIMS[cid].check_module(), "leaderboard_rows", None)
        if fn is not None:
            out += fn([r for r in records if r.claim == cid])
    return out


def _ranked(rows: list[dict]) -> list[dict]:
    """Rank each (metric, budget) table, mark the best and those tied with it; collapse tables without
    information (every method 0 or 1) into one row."""
    tables: dict = defaultdict(list)
    for r in rows:
        tables[(r["metric"], r["budget"] if r["method"] != "exact" else None)].append(r)
    out = [r for r in rows if r["method"] == "exact"]
    for (metric, budget), rs in sorted(tables.items(), key=lambda kv: (kv[0][0], kv[0][1] or 2.0)):
        if budget is None:
            continue
        if "exact match" in metric and all(r["value"] in (0.0, 1.0) for r in rs):
            vals = sorted({r["value"] for r in rs})
            exact = [r for r in tables.get((metric, None), [])]
            ref = f"; exact attention {exact[0]['value']:.3g}" if exact else ""
            ref += NO_POWER.get(metric.split(":")[0].split(",")[0], "")
            out.append(row("all methods", "", budget, rs[0]["memory_floats"], metric, float(vals[0]) if len(vals) == 1
                            else float("nan"), n=rs[0]["n"], note=f"no information: every one of {len(rs)} methods at "
                            f"{' or '.join(f'{v:g}' for v in vals)} ({', '.join(r['method'] for r in rs if r['value'] == 1.0) or 'none'} at 1){ref}"))
            continue
        sign = 1.0 if any(w in metric for w in LOWER_IS_BETTER) else -1.0
        rs = sorted(rs, key=lambda r: (sign * r["value"], r["method"]))
        out += tied(rs)
    return out


def tied(rows: list[dict]) -> list[dict]:
    """A ranked table (best first, one metric): ``rank``, ``best`` and ``tied`` (the one rule, on the rows' shared
    ``units``, calls the row neither better nor worse than the best: tied, leaning or not attainable; Holm over
    the table's comparisons with the best; rows without shared units are not tied). Returns the rows."""
    from kvbounds.verdict import Comparison, paired_calls, rule_for
    for i, r in enumerate(rows):
        r["rank"], r["best"], r["tied"] = i + 1, i == 0, False
    if len(rows) < 2:
        return rows
    best = rows[0].get("units") or {}
    scale, lower, thr, bounded = rule_for(rows[0]["metric"])
    comps = []
    for r in rows[1:]:
        u = r.get("units") or {}
        keys = sorted(set(u) & set(best))
        comps.append(Comparison(r["metric"], rows[0]["method"], [u[k] for k in keys], [best[k] for k in keys],
                                reason="" if keys else "no shared instance", scale=scale, lower_is_better=lower,
                                threshold=thr, bounded=bounded))
    for r, c in zip(rows[1:], paired_calls(comps)):
        r["tied"] = c.call in ("tied", "leaning better", "leaning worse", "not attainable")
    return rows


def timing_rows(records) -> list[dict]:
    """CPU seconds per method per window (compress, score; mean over instances) and per-instance prefill."""
    t: dict = defaultdict(list)
    for r in records:
        e = getattr(r, "extra", {}) or {}
        if r.claim in CLAIMS and "compress_s" in e:
            t[(e["method"], int(e.get("n", 0)))].append((e["compress_s"], e["score_s"], e.get("prefill_s", 0.0)))
    return [dict(method=m, n=n, compress_s=float(np.mean([x[0] for x in v])), score_s=float(np.mean([x[1] for x in v])),
                 prefill_s=float(np.mean([x[2] for x in v])), count=len(v)) for (m, n), v in sorted(t.items())]


def first_retrieval(records) -> dict:
    """task -> {method: the smallest budget at which it retrieves the answer on some instance (every greedy answer
    token right), or None when it never does at the budgets run} (full's sweep goes up to 0.75 of the cache)."""
    got: dict = defaultdict(lambda: defaultdict(dict))
    for r in records:
        e = getattr(r, "extra", {}) or {}
        if r.claim not in CLAIMS or e.get("error") or "hit" not in e or e.get("task") == "ppl" \
                or e.get("method") == "exact":
            continue
        b = float(e["budget"])
        t = task_label(r)
        got[t][e["method"]][b] = got[t][e["method"]].get(b, False) or bool(all(e["hit"]))
    return {t: {m: min((b for b, ok in by.items() if ok), default=None) for m, by in sorted(ms.items())}
            for t, ms in got.items()}
