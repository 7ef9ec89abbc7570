"""``kvbounds evaluate SPEC --e2e``: the method on the leaderboard's tasks inside SmolLM2, beside the papers' methods
and kvpress's baselines, at the evaluation's headline memory (1 - ratio of the cache's floats).

The tasks are those of ``kvbounds e2e`` and the report's leaderboard (:mod:`kvbounds.e2e`): perplexity windows and
passkey retrieval (the claim BKV.e2e's trials), line retrieval (SG.e2e's), passkey and lines in both settings (the
question after the compressed prompt, and inside it as in the papers), every method holding within 1% of the same
floats and sharing one exact prefill per instance. The records go to the evaluation's store (resumable, under its
lock); the result is the leaderboard's tables (:func:`kvbounds.e2e.leaderboard_rows`,
:func:`kvbounds.report.board_table`) with the method's rank in each.
"""
from __future__ import annotations

import sys
from kvbounds.core import ResultStore

__all__ = ["COMPARE", "TASKS", "e2e_trials", "run_e2e", "run_board"]

# the papers' methods (BalanceKV, SubGen, k-center, subspace), the plain baselines and kvpress's presses
COMPARE = ("balancekv", "subgen", "kcenter", "subspace", "uniform", "streaming_llm", "kvpress:streaming_llm",
           "kvpress:snapkv", "kvpress:knorm")
# per profile: claim -> task -> (context tokens, instances[, continuation tokens]); sink = window per profile
TASKS = {
    "smoke": ({"BKV.e2e": {"ppl": (256, 1, 32), "passkey": (256, 1)}, "SG.e2e": {"lines": (256, 1)}}, 16),
    "quick": ({"BKV.e2e": {"ppl": (512, 4, 32), "passkey": (512, 4)}, "SG.e2e": {"lines": (512, 4)}}, 32),
    "full": ({"BKV.e2e": {"ppl": (512, 8, 32), "passkey": (512, 8)}, "SG.e2e": {"lines": (512, 8)}}, 32),
}


def e2e_trials(method: str, profile: str, ratio: float, seed: int, tag=None):
    """The runner's trials: every task instance of the profile with the method and :data:`COMPARE` at 1 - ratio."""
    from kvbounds.e2e import profile_grid
    from kvbounds.run import Trial
    tasks, sink = TASKS[profile]
    methods = [method] + [m for m in COMPARE if m != method]
    out = []
    for claim, spec in tasks.items():
        for p in profile_grid("custom", spec, methods=methods, budgets=(round(1.0 - ratio, 6),), sink=sink,
                              window=sink, settings=("after", "inside")):
            out.append(Trial(claim, dict(p, **(tag or {})), seed, "torch:cpu"))
    return out


def run_e2e(resolved, *, profile: str, ratio: float, seed: int, out, progress: bool = True, tag=None,
            model: str = "smollm2") -> dict:
    """The RULER-style curves on ``model`` (:func:`kvbounds.evaluation._e2e_curves.run_curves`, under "curves")
    and, on SmolLM2, the leaderboard's tasks (:func:`run_board`)."""
    from kvbounds.traces import qwen
    from ._e2e_curves import run_curves
    curves = run_curves(resolved, profile=profile, ratio=ratio, seed=seed, out=out, progress=progress, tag=tag,
                        model=model)
    if model != "smollm2":
        name = qwen.NAME if qwen.is_name(model) else model
        return {"curves": curves, "headline": f"the RULER-style curves on {name} (the leaderboard's tasks run on "
                                              f"SmolLM2 only)"}
    return dict(run_board(resolved, profile=profile, ratio=ratio, seed=seed, out=out, progress=progress, tag=tag),
                curves=curves)


def run_board(resolved, *, profile: str, ratio: float, seed: int, out, progress: bool = True, tag=None) -> dict:
    """Run (or resume) the trials and return the leaderboard's tables with the method's place: {"setup",
    "headline", "rows": [{"title", "rank", "method", "text", "ci", "mark"}], "references", "collapsed"}, or
    {"skipped": why} when the model or its packages are missing here."""
    from kvbounds.e2e import leaderboard_rows
    from kvbounds.e2e import hf_missing
    from kvbounds.report import board_table
    why = hf_missing()
    if why:
        return {"skipped": f"end to end not run: {why}"}
    trials = e2e_trials(resolved.name, profile, ratio, seed, tag)
    records, errors = run_missing(
        trials, out, progress, "trial(s)",
        lambda t: f"{t.claim} {t.params['task']} #{t.params['index']}")
    board = board_table(leaderboard_rows(records))
    rows, places = [], []
    for tab in board["tables"]:
        for r in tab["rows"]:
            rows.append(dict(title=tab["title"], rank=r["rank"], method=r["method"], text=r["text"], ci=r["ci"],
                             mark=r["mark"], family=r["family"]))
            if r["method"] == resolved.name:
                places.append(f"{tab['title']}: #{r['rank']} of {len(tab['rows'])}" + (f" ({r['mark']})" if r["mark"]
                                                                                       else ""))
    mine = [r for r in records if r.extra.get("method") == resolved.name and r.check.startswith("skipped")]
    tasks, sink = TASKS[profile]
    setup = (f"SmolLM2-135M, {', '.join(f'{t} ({v[1]} x {v[0]} tokens)' for s in tasks.values() for t, v in s.items())}; "
             f"question after and inside the prompt; every method at {100 * (1 - ratio):.0f}% of the cache's floats "
             f"(within 1%), sink = window = {sink} for the methods that keep them; beside {', '.join(COMPARE)}")
    return {"setup": setup, "headline": "; ".join(places) or "no ranked row for the method",
            "rows": rows, "references": board["references"], "collapsed": board["collapsed"],
            "skipped_rows": sorted({r.extra.get("error", "") for r in mine}),
            "errors": [e.error for e in errors]}


def run_missing(trials, out, progress: bool, what: str, label) -> tuple[list, list]:
    """Run the ``trials`` the evaluate store ``out`` does not hold yet (one lock, each trial's records appended as it
    ends, a line per trial when ``progress``: ``label(trial)`` names it, ``what`` the kind counted), then return this
    run's (records, error records) read back from the store."""
    from kvbounds.run import execute_trial_or_error
    store = ResultStore(out, writer="evaluate")
    with store.lock():
        done = store.done_keys()
        todo = list({t.key: t for t in trials if t.key not in done}.values())
        if progress:
            sys.stderr.write(f"kvbounds evaluate --e2e: {len(todo)} {what} to run ({len(trials) - len(todo)} "
                             f"already in {store.path})\n")
        for i, t in enumerate(todo):
            recs = execute_trial_or_error(t)
            store.append(recs)
            if progress:
                sys.stderr.write(f"  [{i + 1}/{len(todo)}] {label(t)}"
                                 + (f" failed: {recs[0].error}" if recs and recs[0].is_error else "") + "\n")
    keys = {t.key for t in trials}
    contents = store.read()
    return [r for r in contents.records if r.key in keys], [e for e in contents.errors if e.key in keys]
