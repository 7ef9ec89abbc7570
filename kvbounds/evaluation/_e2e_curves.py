"""``kvbounds evaluate SPEC --e2e --model M``: the tasks a kvpress user knows, on M: the RULER-style tasks and the
needle-depth x context-length sweep of :mod:`kvbounds.e2e` (:mod:`kvbounds.e2e.ruler`), score vs compression ratio.

No second harness: the trials are the e2e curves' own (:func:`kvbounds.e2e.curve_grid._params`: one exact prefill
per task instance, shared by every press and ratio; the question inside the compressed prompt, in the exact last
window), run by the check BKV.e2e's trial function, and read by :mod:`kvbounds.e2e.curves`:

* exact attention's score per task, model and length (k/N retrieved); below :data:`kvbounds.e2e.curves.POWER_FLOOR`
  the task is "no power" (the model cannot do it at that length: no call is made on it);
* per press, its score (exact match, mean over instances with its 95% interval) at each compression ratio, with the
  floats its cache holds (as a fraction of exact attention's cache: kvpress's ratio counts kept tokens, ours
  floats; a press holding more floats than another at one ratio says so, :func:`_more_floats`);
* per press, the mean CPU seconds of its compression and of scoring per instance (the prefill, shared, apart), and
  the cache's floats as its memory (the harness does not measure a per-press peak of the process's memory);
* the sweep: the single needle at fixed depths and lengths, every press at the headline ratio.

The SPEC's method is called against the strongest baseline at each ratio by :func:`call` (the e2e curves' paired
rule, :func:`kvbounds.e2e.curves` through ``kvbounds.e2e._comparisons.call``; instances are the units).
"""
from __future__ import annotations

import numpy as np

__all__ = ["SETUP", "curve_trials", "run_curves", "curves_summary", "call"]

BASELINES = ("streaming_llm", "uniform", "h2o", "kvpress:snapkv")
# per profile: context tokens, instances per task, the ratios of the curves (the headline's added), the sweep's
# lengths and depths (instances 1)
SETUP = {
    "smoke": dict(n=256, instances=1, ratios=(), lengths=(), depths=(), tasks=("niah_single",)),
    "quick": dict(n=512, instances=2, ratios=(0.5, 0.75, 0.9), lengths=(512, 1024), depths=(0.0, 0.5, 1.0),
                  tasks=None),
    "full": dict(n=2048, instances=5, ratios=(0.25, 0.5, 0.65, 0.75, 0.9), lengths=(1024, 2048, 4096),
                 depths=(0.0, 0.25, 0.5, 0.75, 1.0), tasks=None),
}


def _model_name(model: str) -> str:
    from kvbounds.traces import qwen
    return qwen.NAME if qwen.is_name(model) else model


def curve_trials(method: str, profile: str, ratio: float, seed: int, model: str = "smollm2", tag=None) -> list:
    """The runner's trials (claim BKV.e2e, the curves' params, ``curve=True``): every RULER-style task's
    instances with the method and :data:`BASELINES` at every ratio, then the sweep at the headline ratio."""
    from kvbounds.e2e import ruler
    from kvbounds.e2e.curve_grid import _params
    from kvbounds.run import Trial
    s = SETUP[profile]
    model = _model_name(model)
    methods = [method] + [m for m in BASELINES if m != method]
    head = round(1.0 - ratio, 6)
    budgets = sorted({round(1.0 - r, 6) for r in s["ratios"]} | {head})
    out = []
    for task in s["tasks"] or ruler.KINDS:
        for i in range(s["instances"]):
            out.append(Trial("BKV.e2e", dict(_params(model, task, s["n"], i, methods, budgets), **(tag or {})), seed,
                             "torch:cpu"))
    for n in s["lengths"]:
        for depth in s["depths"]:
            p = dict(_params(model, "niah_single", n, 0, [method, "streaming_llm"], (head,)), depth=depth)
            out.append(Trial("BKV.e2e", dict(p, **(tag or {})), seed, "torch:cpu"))
    return out


def call(method_units: dict, other_units: dict, *, tests: int) -> dict:
    """The one call of the SPEC's method against a baseline on a task (exact match, instances as units): the e2e
    curves' paired rule (``kvbounds.e2e._comparisons.call``, margin 0.2 of exact match, Holm over ``tests``).
    Kept behind this one function so the package's one rule for "better" replaces it in one place."""
    from kvbounds.e2e import call as paired
    from kvbounds.e2e import curves
    return paired(method_units, other_units, margin=curves.MARGINS["match"], tests=tests, bounded=True)


def _more_floats(points: list[dict], method: str) -> list[str]:
    """At each ratio, the presses whose caches hold more than 1% more floats than the method's (and fewer)."""
    out = []
    by = {}
    for p in points:
        by.setdefault((p["task"], p["budget"]), {})[p["method"]] = p["memory"]
    seen = set()
    for (_, b), ms in sorted(by.items()):
        if method not in ms:
            continue
        for m, mem in ms.items():
            if m in (method, "exact") or (m, b) in seen:
                continue
            if abs(mem - ms[method]) > 0.01 * max(ms[method], 1e-12):
                seen.add((m, b))
                out.append(f"at ratio {1 - b:.2g}: {m} holds {100 * mem:.3g}% of the exact cache's floats, "
                           f"{method} {100 * ms[method]:.3g}%")
    return out


def curves_summary(records, method: str) -> dict:
    """The curves' content for evaluation.json and the card (module docstring)."""
    from kvbounds.e2e import curves
    curve = [r for r in records if (r.params or {}).get("depth") is None]
    sweep = [r for r in records if (r.params or {}).get("depth") is not None]
    exact = curves.exact_scores(curve)
    powered = {(s["task"], s["n"]) for s in exact if s["powered"]}
    pts = [p for p in curves.points(curve) if p["method"] != "exact"]
    units = curves.units(curve)
    calls = []
    for panel, ms in sorted(units.items()):
        if (panel[1], panel[2]) not in powered:
            continue
        budgets = sorted({b for m, b in ms if m == method})
        for b in budgets:
            cands = [(float(np.mean(list(ms[(m, b)].values()))), m) for m in BASELINES if m != method and (m, b) in ms]
            if not cands:
                continue
            best = max(cands, key=lambda c: (c[0], -BASELINES.index(c[1])))[1]
            c = call(ms[(method, b)], ms[(best, b)], tests=len(budgets) * max(1, len(powered)))
            calls.append(dict(c, task=panel[1], length=panel[2], ratio=round(1 - b, 6), baseline=best))
    timing: dict = {}
    for r in curve:
        e = r.extra or {}
        if e.get("method") and not e.get("error") and "compress_s" in e:
            t = timing.setdefault(e["method"], dict(compress_s=[], score_s=[]))
            t["compress_s"].append(float(e["compress_s"]))
            t["score_s"].append(float(e["score_s"]))
    sweep_pts = []
    for r in sweep:
        e = r.extra or {}
        if "hit" in e and not e.get("error"):
            sweep_pts.append(dict(n=int(r.params["n"]), depth=float(r.params["depth"]), method=e["method"],
                                  hit=bool(all(e["hit"]))))
    words = (lambda s: (f"{s['retrieved']}/{s['instances']}" if s["what"] == "exact match" else
                        f"perplexity {s['score']:.3g}") + ("" if s["powered"] else " (no power)"))
    return dict(
        exact=[dict(s, words=words(s)) for s in exact],
        points=pts, calls=calls, more_floats=_more_floats(pts, method),
        timing={m: dict(records=len(v["compress_s"]), compress_s=float(np.mean(v["compress_s"])),
                        score_s=float(np.mean(v["score_s"]))) for m, v in sorted(timing.items())},
        prefill=curves.timing(curve), sweep=sorted(sweep_pts, key=lambda p: (p["method"], p["n"], p["depth"])))


def run_curves(resolved, *, profile: str, ratio: float, seed: int, out, progress: bool = True, tag=None,
               model: str = "smollm2") -> dict:
    """Run (or resume) the curve trials in the evaluation's store; returns :func:`curves_summary` with ``setup`` and
    ``errors``, or {"skipped": why} when the model or its packages are missing here."""
    from kvbounds.e2e import hf_missing

    from ._e2e import run_missing
    why = hf_missing(model)
    if why:
        return {"skipped": f"RULER-style curves not run: {why}"}
    trials = curve_trials(resolved.name, profile, ratio, seed, model, tag)
    records, errors = run_missing(
        trials, out, progress, f"RULER-style curve trial(s) on {_model_name(model)}",
        lambda t: f"{t.params['task']} n={t.params['n']} #{t.params['index']}"
                  + (f" depth {t.params['depth']:g}" if "depth" in t.params else ""))
    s = SETUP[profile]
    setup = (f"{_model_name(model)}; RULER-style tasks ({', '.join(s['tasks'] or ('every kind',))}) at {s['n']} "
             f"tokens, "
             f"{s['instances']} instance(s) each, question inside the compressed prompt; compression ratios "
             f"{', '.join(f'{r:g}' for r in sorted(set(s['ratios']) | {ratio}))}; beside {', '.join(BASELINES)}"
             + (f"; needle-depth sweep: lengths {', '.join(map(str, s['lengths']))} x depths "
                f"{', '.join(f'{d:g}' for d in s['depths'])} at ratio {ratio:g}" if s["lengths"] else ""))
    return dict(curves_summary(records, resolved.name), setup=setup, model=_model_name(model),
                errors=[e.error for e in errors])
