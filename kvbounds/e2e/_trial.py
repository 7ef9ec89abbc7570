"""One end-to-end trial (BKV.e2e, SG.e2e, ``kvbounds e2e``): load the model once per process, build the task
instance, run every (method, budget) through the harness (:func:`kvbounds.e2e._harness.run_cell`) and turn the rows
into records (see :mod:`kvbounds.e2e` for what a record holds). A trial with ``setting="both"`` prefills the
papers' prompt (question inside) once and cuts the question-after prompt, its prefix, from it
(:func:`kvbounds.e2e._harness.slice_prefill`); each record carries its own setting's params.
"""
from __future__ import annotations

import functools
import importlib.util

import numpy as np

from kvbounds.core import Record

from . import _methods as M


def hf_missing(model: str = "smollm2") -> str | None:
    """Why the harness cannot run ``model`` here (one line), or None."""
    for mod, pip in (("transformers", "transformers"), ("torch", "torch")):
        if importlib.util.find_spec(mod) is None:
            return f"{pip} is not installed (pip install 'kvbounds[hf]')"
    from kvbounds.traces import qwen
    if qwen.is_name(model):
        return qwen.available()
    if model != "smollm2":
        return None
    try:
        from kvbounds.traces.smollm2 import model_file
        model_file()
    except Exception as e:   # noqa: BLE001 - the model package missing skips the check with its reason
        return str(e)
    return None


@functools.lru_cache(maxsize=2)
def trial_model(spec: str, device: str):
    from ._model import DEFAULT_MODEL, load_model, load_smollm2
    if spec == DEFAULT_MODEL:
        # one GGUF read per worker (~16 s), shared with the trace checks' reader (SUB.lowrank's falsifier 1)
        from kvbounds.traces.real import load_real_model
        return load_smollm2(device, load_real_model("smollm2"))
    return load_model(spec, device)


def make_task(lm, params: dict):
    from . import _tasks as tasks
    kind, n, i = params["task"], int(params["n"]), int(params["index"])
    if kind == "ppl":
        return tasks.ppl_task(lm, n, int(params.get("cont", 64)) + 1, i)
    setting = params.get("setting", "after")
    if kind == "passkey":
        return tasks.passkey_task(lm, n, 1000 + i, setting)
    if kind == "lines":
        return tasks.lines_task(lm, n, 2000 + i, setting, n_lines=params.get("n_lines"))
    from . import ruler
    if kind in ruler.KINDS:         # the RULER-style tasks; a fixed "depth": the needle-depth sweep
        depth = params.get("depth")
        return ruler.make(kind, lm, n, 3000 + i, setting, None if depth is None else float(depth))
    raise ValueError(f"unknown task {kind!r}")


def setting_params(params: dict, setting: str) -> dict:
    """The params a record of ``setting`` carries: a trial with ``setting="both"`` (one prefill for both settings)
    gives each record the params a trial of that setting alone would have (comparisons group by them)."""
    if params.get("setting") != "both":
        return dict(params)
    p = {k: v for k, v in params.items() if k not in ("setting", "block_size")}
    return dict(p, setting="inside", block_size=int(params.get("block_size", 128))) if setting == "inside" else p


def run_cell_trial(claim: str, source: str, params: dict, seed: int, measure=None) -> list[Record]:
    """The records of one task instance (every method and budget of ``params``, in each of its settings).
    ``measure(params, lm, state)``: a measurement of a setting's exact prefill ``state`` for the claim's own records,
    ``{(method, budget): value}`` stored as ``extra["walk_cause"]`` of that method's first draw at that budget (None:
    nothing); the prefill is then made here (the same call :func:`kvbounds.e2e._harness.run_cell` would make)."""
    why = hf_missing(params.get("model", "smollm2"))
    if why:
        return [Record(claim=claim, params=dict(params), seed=0, backend="", measured=0.0, bound=0.0, holds=True,
                       bound_kind="exact", check="unavailable", source=source, extra=dict(skipped=why))]
    import torch
    from ._harness import prefill, run_cell, slice_prefill
    settings = SETTINGS_OF.get(params.get("setting", "after"), (params.get("setting", "after"),))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)       # the runner's workers share the cores: one thread each
    try:
        lm = trial_model(params.get("model", "smollm2"), params.get("device", "cpu"))
        tasks = {s: make_task(lm, setting_params(params, s)) for s in settings}
        states = {}
        if len(settings) > 1:          # the papers' prompt ends with the question: ours is its prefix
            inside, after = tasks["inside"].context, tasks["after"].context
            if not np.array_equal(inside[:len(after)], after):
                raise RuntimeError("the question-after prompt is not a prefix of the question-inside prompt")
            states["inside"] = prefill(lm, inside, capture_inputs=any(
                M.needs_inputs(m) for m in params["methods"]),
                received=any(m in M.NEEDS_SCORES for m in params["methods"]), prefixes=(len(after),))
            states["after"] = slice_prefill(states["inside"], len(after))
        recs = []
        for s in settings:
            p = setting_params(params, s)
            measured = None
            if measure is not None:
                if s not in states:
                    states[s] = prefill(lm, tasks[s].context, capture_inputs=any(
                        m.startswith("kvpress:") or m in M.NEEDS_INPUTS for m in p["methods"]),
                        received=any(m in M.NEEDS_SCORES for m in p["methods"]))
                measured = measure(p, lm, states[s])
            rows = run_cell(lm, tasks[s], p["methods"], p["budgets"], seed=seed % (2**31), sink=int(p["sink"]),
                            window=int(p["window"]), where=p.get("where", "host"), state=states.get(s),
                            redraws=int(p.get("redraws", 1)), redraw=tuple(p.get("redraw", ())),
                            extra_budgets=p.get("extra_budgets"), block_size=int(p.get("block_size", 64)))
            cell = _cell_records(claim, source, p, lm, tasks[s], rows)
            for r in cell if measured else ():
                key = (r.extra.get("method"), r.extra.get("budget"))
                if key in measured and not r.extra.get("draw") and not r.extra.get("error"):
                    r.extra["walk_cause"] = measured[key]
            recs += cell
    finally:
        torch.set_num_threads(threads)
    return recs


SETTINGS_OF = {"both": ("after", "inside")}


def _cell_records(claim: str, source: str, params: dict, lm, task, rows) -> list[Record]:
    from ._harness import EXACT
    exact = rows[0]
    ex_ll, ex_hit = np.asarray(exact["ll"]), np.asarray(exact["hit"], bool)

    def loss(row):
        d = ex_ll - np.asarray(row["ll"])
        return float(d.mean() if params["task"] == "ppl" else d.sum())

    unif = {r["budget"]: loss(r) for r in rows if r["method"] == "uniform" and not r["error"] and not r.get("draw")}
    common = dict(task=params["task"], setting=params.get("setting", "after"),
                  block_size=int(params.get("block_size", 64)), n=int(len(task.context)), model=lm.name, exact_ll=ex_ll.tolist(),
                  exact_hit=ex_hit.tolist(), exact_floats=int(exact["memory_floats"]), prefill_s=exact["prefill_s"],
                  prefill_scores_s=float(exact.get("prefill_scores_s", 0.0)),
                  answer=task.answer, task_meta=task.meta)
    recs = []
    for r in rows:
        extra = dict(common, method=r["method"], source=r["source"], budget=r["budget"], error=r["error"],
                     draw=int(r.get("draw", 0)))
        if r["error"]:
            recs.append(Record(claim=claim, params=dict(params), seed=0, backend="", measured=0.0, bound=0.0,
                               holds=True, bound_kind="exact", check=f"skipped {r['method']} @{r['budget']:g}",
                               source=source, extra=extra))
            continue
        m = loss(r)
        b = unif.get(r["budget"], 0.0) if r["method"] != EXACT else 0.0
        extra.update(memory_floats=int(r["memory_floats"]), ll=list(map(float, r["ll"])),
                     hit=list(map(bool, r["hit"])), compress_s=float(r["compress_s"]), score_s=float(r["score_s"]))
        recs.append(Record(claim=claim, params=dict(params), seed=0, backend="", measured=m, bound=b,
                           holds=bool(m <= b + 1e-12), bound_kind="exact",
                           check=f"{params['task']} {r['method']} @{r['budget']:g}"
                                 + (f" draw {r['draw']}" if r.get("draw") else ""), source=source,
                           time_s=float(r["compress_s"]) + float(r["score_s"]), extra=extra))
    return recs
