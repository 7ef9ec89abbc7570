"""The end-to-end verdicts' sentences (BKV.e2e, SG.e2e; :mod:`kvbounds.e2e`): which budgets each method
ran at, methods and variants named as a reader is told them (the method registry's words), the evidence that makes a
miss "not reproduced" rather than "not shown", and per variant which baseline it beats, is not shown to beat, or is
worse than, in which task and setting."""
from __future__ import annotations

import re

# a miss that is evidence against, as evidence_against words it, and the pattern its readers (the per-paper answers)
# parse it back by: task, the counts, the memories, exact attention's count
MISS_PHRASE = re.compile(r"retrieves the (.+?) answer in ([\d/, ]+) at ([\d., ]+)% of the cache \(95% CI up to \d+%\) "
                         r"where exact attention retrieves (\d+)/(\d+)")


def budgets_line(records) -> str:
    """The budgets run, each with the methods that ran at it: "budget 0.25 of the cache's floats (every method);
    0.5 for uniform only" (a budget listed is one every method listed ran at, or the line says which did)."""
    ran: dict = {}
    for r in records:
        b, m = r.extra.get("budget"), r.extra.get("method")
        if b is None or float(b) == 1.0 or m in (None, "exact") or "ll" not in r.extra:
            continue
        ran.setdefault(float(b), set()).add(m)
    if not ran:
        return "no budget run"
    every = set().union(*ran.values())
    full = [b for b in sorted(ran) if ran[b] == every]
    part = [b for b in sorted(ran) if ran[b] != every]
    out = (f"budget{'s' if len(full) > 1 else ''} {', '.join(f'{b:g}' for b in full)} of the cache's floats "
           "(every method)") if full else "no budget run by every method"
    for b in part:
        ms = sorted(ran[b])
        out += f"; {b:g} for {', '.join(short_name(m) for m in ms)} only" + (
            " (the sensitivity control: uniform with more floats)" if ms == ["uniform"] else "")
    return out


def short_name(method: str) -> str:
    """A method's name as a sentence says it: "StreamingLLM", "H2O", "SnapKV", "uniform sampling", "BalanceKV
    (pseudocode)"; from the method registry."""
    from kvbounds.methods import get_method
    if method == "uniform":
        return "uniform sampling"
    try:
        m = get_method(method)
    except Exception:   # noqa: BLE001 - a name the registry does not know stays as it is
        return method
    if m.source == "kvpress":
        return m.press.removesuffix("Press")
    if m.algorithm:
        return f"{m.algorithm.split('/')[0]} ({m.variant})"
    return m.label.split(":")[0] if ":" in m.label else m.name


def retrieval_counts(records, method: str, task: str, budget: float | None) -> tuple[int, int]:
    """(retrieved, tried) over a method's records of a retrieval task at a budget (every setting and redraw; None:
    exact attention's, one per instance): retrieved = every greedy answer token right."""
    k = n = 0
    seen = set()
    for r in records:
        e = r.extra
        if e.get("task") != task or e.get("error") or "hit" not in e:
            continue
        if method == "exact":
            key = (r.params.get("index"), r.params.get("setting", "after"))
            if key in seen or "exact_hit" not in e:
                continue
            seen.add(key)
            k, n = k + bool(all(e["exact_hit"])), n + 1
        elif e.get("method") == method and abs(float(e["budget"]) - budget) < 1e-9:
            k, n = k + bool(all(e["hit"])), n + 1
    return k, n


def evidence_against(records, method: str, tasks, budgets, calls) -> list[str]:
    """Why a miss is evidence against the claim rather than a lack of power, in words (empty: none):
      * retrieval: exact attention retrieves the answer and the method does not, the two exact-match rates' 95%
        intervals (Clopper-Pearson, instances x redraws pooled over settings) apart;
      * the cells: in more than half of them the effect's 95% interval lies wholly below zero (the method worse
        than the baseline)."""
    from scipy.stats import binomtest

    def clopper_pearson(k: int, n: int) -> tuple[float, float]:
        ci = binomtest(k, n).proportion_ci(0.95, method="exact")
        return float(ci.low), float(ci.high)
    out = []
    for task in tasks:
        if task == "ppl":
            continue
        ke, ne = retrieval_counts(records, "exact", task, None)
        apart = []                  # (budget, k, n, the upper end of the method's 95% interval)
        for b in sorted(budgets):
            km, nm = retrieval_counts(records, method, task, b)
            if ne and nm and clopper_pearson(ke, ne)[0] > clopper_pearson(km, nm)[1]:
                apart.append((b, km, nm, clopper_pearson(km, nm)[1]))
        if apart:                   # one phrase per task, each memory named: "in 0/20, 6/20 at 10, 50% of the cache"
            out.append(f"retrieves the {task} answer in {', '.join(f'{k}/{n}' for _, k, n, _ in apart)} at "
                       f"{', '.join(f'{100 * b:.3g}' for b, *_ in apart)}% of the cache (95% CI up to "
                       f"{max(h for *_, h in apart):.0%}) where exact attention retrieves {ke}/{ne}")
    worse = [c for c in calls if c[4] == "worse"]
    if calls and len(worse) > len(calls) / 2:
        lo, hi = min(-c[5] for c in worse), max(-c[5] for c in worse)
        out.append(f"worse than the baseline, its 95% interval below zero, in {len(worse)}/{len(calls)} cells "
                   f"({lo:.2g}-{hi:.2g} nats)")
    return out


HEADS = {"better": "better than", "leaning better": "leaning better than", "tied": "tied with",
         "not told apart": "not told apart from", "not attainable": "not attainable against",
         "leaning worse": "leaning worse than"}


def calls_text(calls) -> str:
    """"better than H2O, SnapKV (lines, papers' setting); not told apart from uniform sampling (everywhere); worse
    than ... (95% interval below zero ...)" from a variant's cells (setting, task, baseline, budget, call, effect):
    the one rule's calls (:func:`kvbounds.verdict.paired_calls`; "not told apart": a tie that is no
    equivalence)."""
    cells = sorted({(task, setting) for setting, task, *_ in calls})
    label = lambda task, setting: task if sum(t == task for t, _ in cells) == 1 else \
        f"{task}, {SHORT_SETTING.get(setting, setting)}"
    groups: dict = {}
    for setting, task, base, b, call, mean in calls:
        groups.setdefault((call, base), []).append((task, setting, mean))
    parts = []
    for call in ("better", "leaning better", "tied", "not told apart", "not attainable", "leaning worse", "worse"):
        by_where: dict = {}
        for (c, base), got in groups.items():
            if c != call:
                continue
            where = sorted({(t, x) for t, x, _ in got})
            key = "everywhere" if where == cells and len(cells) > 1 else "; ".join(label(t, x) for t, x in where)
            by_where.setdefault(key, []).append((short_name(base), [m for *_, m in got]))
        for key, bases in sorted(by_where.items()):
            names = ", ".join(sorted(b for b, _ in bases))
            if call == "worse":
                ms = [-m for _, got in bases for m in got]
                size = f"{min(ms):.2g}-{max(ms):.2g}" if f"{min(ms):.2g}" != f"{max(ms):.2g}" else f"{ms[0]:.2g}"
                parts.append(f"worse than {names} ({key}; 95% interval below zero, {size} nats lower "
                             "log-likelihood)")
            else:
                parts.append(f"{HEADS[call]} {names} ({key})")
    return "; ".join(parts)


SHORT_SETTING = {"after": "question after the prompt", "inside": "papers' setting"}


def variant_label(method: str) -> str:
    """"pseudocode walk at the theorem's c (= random halving)": the registry's words for a method's variant."""
    from kvbounds.methods import get_method, variant_words
    try:
        m = get_method(method)
    except Exception:   # noqa: BLE001 - an unknown name stays as it is
        return method
    return variant_words(m.algorithm, m.variant) if m.algorithm else short_name(method)
