"""The leaderboard: records of the end-to-end checks (``BKV.e2e``, ``SG.e2e``, ``kvbounds e2e``) -> rows of
method x metric x budget, for the report (helper "report" renders exactly these keys).

Metrics (the value is a mean over units, with a 95% interval):
* ``ppl: NLL increase vs exact (nats/token)`` - paired per-token differences against exact attention on the
  same windows (t interval over tokens; tokens of one window are not independent, so read it as indicative);
* ``ppl: perplexity`` - exp(mean NLL) of the held-out tokens (no interval);
* ``<task>: exact match`` - greedy answer entirely right, per instance (Clopper-Pearson interval);
* ``<task>: answer log-likelihood (nats)`` - teacher-forced log-likelihood of the answer's tokens (t interval);
for task in passkey, lines. Skipped methods (kvpress missing, a method failing) give one row with a NaN value
and the reason in ``note``.
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
from scipy import stats

KEYS = ("method", "source", "budget", "memory_floats", "metric", "value", "ci_low", "ci_high", "n", "note")
CLAIMS = ("BKV.e2e", "SG.e2e", "E2E")


def _t_interval(x: np.ndarray) -> tuple[float | None, float | None]:
    if len(x) < 2 or np.allclose(x, x[0]):
        return (float(x.mean()), float(x.mean())) if len(x) else (None, None)
    lo, hi = stats.t.interval(0.95, len(x) - 1, loc=float(x.mean()), scale=float(stats.sem(x)))
    return float(lo), float(hi)


def _cp(k: int, n: int) -> tuple[float, float]:
    lo = 0.0 if k == 0 else float(stats.beta.ppf(0.025, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(0.975, k + 1, n - k))
    return lo, hi


def _row(method, source, budget, mem, metric, value, ci=(None, None), n=0, note=""):
    return dict(method=method, source=source, budget=float(budget), memory_floats=int(mem), metric=metric,
                value=float(value), ci_low=ci[0], ci_high=ci[1], n=int(n), note=note)


def leaderboard_rows(records) -> list[dict]:
    """One row per (method, budget, metric) over every end-to-end record; see the module docstring."""
    groups: dict = defaultdict(list)
    skipped: dict = {}
    seen = set()
    for r in records:
        e = getattr(r, "extra", {}) or {}
        if r.claim not in CLAIMS or "method" not in e:
            continue
        k = (e["method"], e.get("source", ""), float(e.get("budget", 1.0)), e.get("task", ""))
        if e.get("error"):
            skipped[k[:3]] = e["error"]
            continue
        inst = (r.claim, r.key, e.get("task"), r.params.get("n"), r.params.get("index"))
        if (k, inst) in seen:          # a trial run twice (resumed) counts once
            continue
        seen.add((k, inst))
        groups[k].append(e)
    rows = []
    for (method, source, budget, task), es in sorted(groups.items(), key=lambda kv: (kv[0][3], kv[0][2], kv[0][0])):
        mem = int(round(np.mean([e["memory_floats"] for e in es])))
        note = "exact attention (no compression)" if method == "exact" else ""
        if task == "ppl":
            d = np.concatenate([np.asarray(e["exact_ll"]) - np.asarray(e["ll"]) for e in es])
            nll = np.concatenate([-np.asarray(e["ll"]) for e in es])
            rows.append(_row(method, source, budget, mem, "ppl: NLL increase vs exact (nats/token)", d.mean(),
                             _t_interval(d), len(d), note))
            rows.append(_row(method, source, budget, mem, "ppl: perplexity", math.exp(nll.mean()), n=len(nll),
                             note=note))
        else:
            hits = [bool(all(e["hit"])) for e in es]
            lls = np.array([float(np.sum(e["ll"])) for e in es])
            rows.append(_row(method, source, budget, mem, f"{task}: exact match", np.mean(hits),
                             _cp(sum(hits), len(hits)), len(hits), note))
            rows.append(_row(method, source, budget, mem, f"{task}: answer log-likelihood (nats)", lls.mean(),
                             _t_interval(lls), len(lls), note))
    snap = {(r["metric"], r["budget"]): r["value"] for r in rows if r["method"] == "kvpress:snapkv"}
    for r in rows:
        if r["method"] == "kvpress:pyramidkv" and snap.get((r["metric"], r["budget"])) == r["value"]:
            r["note"] = ("same as kvpress:snapkv: kvpress's PyramidKV falls back to SnapKV's uniform budget when its "
                         "pyramid does not fit the context")
    for (method, source, budget), why in sorted(skipped.items()):
        if not any(r["method"] == method and r["budget"] == budget for r in rows):
            rows.append(_row(method, source, budget, 0, "skipped", float("nan"), note=why))
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
