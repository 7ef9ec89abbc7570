"""Answers a reader can read: per paper its main theorems in plain sentences, named as the paper numbers
them, and the decision map ("Should I use it?"), both from summary.json alone.

Every number and every call in a sentence is a field of summary.json, read through the accessors at the top of this
module (a field renamed upstream is a one-line change there); the sentences' skeletons (which theorem is the main
one, which setup a sentence speaks of) are written by hand in :data:`PAPERS` and hold no number.
:func:`sentence_numbers` lists the numbers a sentence quotes, so a test can hold each against the records.

The decision map reads the leaderboard (summary.json's "leaderboard": the end-to-end tasks and the decode checks,
each method's value with its 95% interval, the best and those tied with it marked), per memory budget and task where a
method of the papers ran; budgets where only baselines ran are left out.
"""
from __future__ import annotations

import re

# ------------------------------------------------------------------------------------------------------------------
# accessors: the only places that know summary.json's field names
# ------------------------------------------------------------------------------------------------------------------


def claim(summary: dict, cid: str) -> dict:
    return summary.get(cid) or {}


def statement(summary: dict, cid: str) -> str:
    return claim(summary, cid).get("statement") or "not-run"


def fitted_value(summary: dict, cid: str) -> float | None:
    c = claim(summary, cid).get("fitted_constant") or {}
    return c.get("value") if isinstance(c, dict) else None


def rate(summary: dict, cid: str) -> tuple[str, dict]:
    v = claim(summary, cid)
    return v.get("rate") or "n/a", v.get("rate_info") or {}


def vacuity(summary: dict, cid: str) -> dict:
    return claim(summary, cid).get("vacuity") or {}


def errata(summary: dict, cid: str) -> list:
    return claim(summary, cid).get("errata") or []


def reproduction(summary: dict, cid: str) -> str:
    return claim(summary, cid).get("reproduction") or "n/a"


def reproductions(summary: dict, cid: str) -> list[dict]:
    return claim(summary, cid).get("reproductions") or []


def power_calls(summary: dict, cid: str) -> list[dict]:
    return claim(summary, cid).get("power_calls") or []


def call_word(call: dict) -> str:
    return call.get("call") or ""


def call_effect(call: dict) -> float | None:
    """The method's error over the control's (the battery's ratio)."""
    x = call.get("effect", call.get("ratio_median"))
    return float(x) if isinstance(x, (int, float)) else None


def call_family(call: dict) -> str:
    return call.get("family") or ""


def call_n(call: dict):
    return call.get("n")


def call_metric(call: dict, default: str) -> str:
    """The metric a call was made on, in words: the practitioner's when the call says so, else the claim's own."""
    return PRACTITIONER_METRIC if call.get("metric") == "practitioner" else default


def board(summary: dict) -> list[dict]:
    return summary.get("leaderboard") or []


def row_method(row: dict) -> str:
    return row.get("method") or ""


def row_value(row: dict) -> float | None:
    x = row.get("value")
    return float(x) if isinstance(x, (int, float)) else None


def row_n(row: dict):
    return row.get("n")


def row_budget(row: dict) -> str:
    return row.get("budget_label") or ""


def row_metric(row: dict) -> str:
    return row.get("metric") or ""


def row_is_best(row: dict) -> bool:
    return bool(row.get("best"))


def row_tied_with_best(row: dict) -> bool:
    """Not told apart from the best under the leaderboard's rule (its ``tied`` mark)."""
    return bool(row.get("tied"))


def row_is_papers(row: dict) -> bool:
    return row.get("family") == "ours"


def run_profile(summary: dict) -> str:
    return (summary.get("run") or {}).get("profile") or "unknown"


def e2e_model(summary: dict) -> str:
    setups = [r.get("setup") or "" for r in reproductions(summary, "BKV.e2e") + reproductions(summary, "SG.e2e")]
    return next((s.split(" (")[0].split(",")[0] for s in setups if s), "")


# ------------------------------------------------------------------------------------------------------------------
# words
# ------------------------------------------------------------------------------------------------------------------

PRACTITIONER_METRIC = "mean error on held-out later queries"
CONTROL_WORDS = {"streaming_llm": "StreamingLLM", "recent": "the recent window", "uniform": "uniform sampling",
                 "ablation": "its ablation", "zeros": "returning zeros", "mean": "the mean of the values"}
# the strongest baseline is chosen among these (zeros and the mean are sanity controls, named only when they win)
BASELINES = ("streaming_llm", "recent", "uniform", "ablation")
RESULTS = "docs/RESULTS.md"

# Per paper: its main results as the paper numbers them (claim ids of kvbounds.claims), the setup of the sentence on
# the algorithm as written, the authors' released variant, the checks inside a model. No numbers here.
PAPERS = {
    "BalanceKV": {
        "title": "BalanceKV (BalanceKV-NeurIPS numbering)",
        "theorems": (("Thm 3.1", "BKV.attention"), ("Thm 3.3", "SB.discrepancy"), ("Thm 3.4", "MR.error"),
                     ("Thm 3.2", "LB.index"), ("Thm 3.1 streamed in generation", "BKV.decode")),
        "as_written": ("Alg. 1 as written", "BKV.attention", "real SmolLM2",
                       "worst-case attention error"),
        "released": ("The authors' released walk", "BKV.vs-uniform", "real SmolLM2 | released walk at temp 1",
                     "relative attention error (Fig. 1)"),
        "inside": ("BKV.e2e", ("balancekv", "balancekv_released")),
    },
    "SubGen and ClusterGen": {
        "title": "SubGen and ClusterGen (SubGen numbering; its Thm 1 is ClusterGen Thm 2.4)",
        "theorems": (("Thm 1", "SG.attention"), ("Lemma 1", "SG.reservoir"),
                     ("Lemma 2", "SG.clusters"), ("Thm 1 streamed in generation", "SG.decode")),
        "as_written": ("Alg. 1 as written", "SG.attention", "real SmolLM2",
                       "worst-case attention error"),
        "released": None,
        "inside": ("SG.e2e", ("subgen", "kcenter", "kcenter_sized")),
    },
    "Subspace-FD-draft": {
        "title": "Subspace-FD-draft",
        "theorems": (("Sec. 8's FD linkage", "FD.residual"), ("Sec. 8's logit bound", "SUB.logit-error"),
                     ("Sec. 8's output bound", "SUB.output-error"), ("Sec. 6's blockwise lemma", "SUB.blockwise"),
                     ("Sec. 8's FD covariance bound", "FD.covariance")),
        "as_written": ("The static subspace as written", "SUB.output-error", "real SmolLM2",
                       "worst-case output error"),
        "released": None,
        "inside": ("SUB.lowrank", ()),
    },
}


_BASE = {"base": RESULTS}


def link(cid: str, base: str | None = None) -> str:
    """A claim id linked to its section (on :data:`RESULTS`, or on the page being written when its base is "")."""
    from .markdown import anchor
    return f"[{cid}]({_BASE['base'] if base is None else base}#{anchor(cid)})"


def num(x: float) -> str:
    """A number as a sentence quotes it (3 significant digits, no exponent below 1e6)."""
    if x is None:
        return "?"
    if abs(x) >= 100 or float(x).is_integer():
        return f"{x:.0f}"
    return f"{x:.3g}"


def _ratio(x: float) -> str:
    return f"{num(x)}x"


def _theorem_phrase(summary: dict, cid: str) -> tuple[str, str]:
    """(the statement's outcome, its detail): what the statement does, from its verdict fields."""
    st = statement(summary, cid)
    if st == "holds":
        return "holds as stated", ""
    if st == "holds-fitted":
        c = fitted_value(summary, cid)
        return "holds only with a fitted constant (the largest measured ratio)", f"C = {num(c)}" if c is not None \
            else ""
    if st == "vacuous":
        vac = vacuity(summary, cid)
        if vac.get("zeros_meets") is not None:
            scale = (vac.get("log_scale") or [None])[0]
            return (f"is vacuous: returning zeros meets it in {vac['zeros_meets']}/{vac.get('cells')} cells "
                    f"(bound scale e^{scale:.0f})", "")
        return "is vacuous: returning zeros meets it", ""
    if st == "false":
        return "is false as stated; the corrected forms are linked", ""
    if st == "not-refuted":
        return "is not refuted (a lower bound)", ""
    if st in ("not-run", "no-check"):
        return "was not run", ""
    return f"is {st}", ""


_PLURAL = {"holds": "hold", "is": "are", "was": "were"}


def _theorem_sentences(summary: dict, theorems) -> list[str]:
    """One sentence per outcome: the theorems with that outcome, each with its detail."""
    by: dict[str, list[str]] = {}
    for name, cid in theorems:
        if cid not in summary or statement(summary, cid) in ("not-run", "no-check"):
            continue
        phrase, detail = _theorem_phrase(summary, cid)
        by.setdefault(phrase, []).append(f"{name} ({link(cid)}{'; ' + detail if detail else ''})")
    out = []
    for phrase, names in by.items():
        subject = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        if len(names) > 1:
            first, _, rest = phrase.partition(" ")
            phrase = (_PLURAL.get(first, first) + " " + rest).replace("a fitted constant (the largest measured ratio)",
                                                                      "fitted constants (largest measured ratios)")
        out.append(f"{subject} {phrase}.")
    slow = [(cid, rate(summary, cid)[1]) for _, cid in theorems if rate(summary, cid)[0] == "not-reached"]
    slow = [f"{link(cid)} ({info.get('param', 'n')} <= {num(info['tested_range'][1])})" for cid, info in slow
            if info.get("tested_range")]
    if slow:
        out.append("Rates not reached: " + ", ".join(slow) + ".")
    return out


def _calls_of(summary: dict, cid: str, family: str) -> dict[str, dict]:
    return {c.get("control"): c for c in power_calls(summary, cid) if call_family(c) == family}


def _strongest(calls: dict[str, dict]) -> tuple[str, dict] | None:
    """The baseline with the lowest error (the largest ratio of the method's error to its)."""
    scored = [(k, c) for k, c in calls.items() if k in BASELINES and call_effect(c) is not None]
    return max(scored, key=lambda kc: call_effect(kc[1])) if scored else None


def _versus(summary: dict, spec) -> str:
    if not spec:
        return ""
    who, cid, family, metric = spec
    calls = _calls_of(summary, cid, family)
    best = _strongest(calls)
    if best is None:
        return ""
    control, c = best
    text = (f"{who}, on {family.split(' | ')[0]} keys at equal memory: {_ratio(call_effect(c))} the "
            f"{call_metric(c, metric)} of {CONTROL_WORDS.get(control, control)}, the strongest baseline "
            f"({call_word(c)}, {call_n(c)} streams)")
    z = calls.get("zeros")
    if z is not None and call_word(z) == "worse":
        text += f"; zeros do better ({_ratio(call_effect(z))})"
    return text + "."


VARIANT_NAMES = {"pseudocode": "the pseudocode walk", "released": "the released walk", "subgen": "SubGen's estimator",
                 "kcenter": "k-center", "kcenter_sized": "size-weighted k-center"}
REPRO_WORDS = {"reproduced": "reproduced", "partial": "partly reproduced", "not-reproduced": "not reproduced",
               "not-shown": "not shown", "n/a": "not run"}


def _inside(summary: dict, spec, rows: list[dict]) -> str:
    cid, methods = spec
    reps = reproductions(summary, cid)
    if cid not in summary or not reps:
        return ""
    status = REPRO_WORDS.get(reproduction(summary, cid), reproduction(summary, cid))
    models = []
    for r in reps:
        m = (r.get("setup") or "").split(" (")[0].split(",")[0]
        if m and m not in models:
            models.append(m)
    text = f"Inside {' and '.join(models[:2]) or 'a model'} ({link(cid)}, {status})"
    notes: dict[str, list[str]] = {}
    for r in reps:
        note = r.get("bound_note") or ""
        if note.startswith("evidence against"):
            notes.setdefault(re.sub(r" \([^()]*\)", "", note.split(": ", 1)[1]), []).append(
                VARIANT_NAMES.get(r.get("variant"), r.get("variant") or ""))
    if notes:
        text += ", " + "; ".join(
            f"both walks {re.sub(r'^retrieves', 'retrieve', note)}" if len(vs) == 2 and "walk" in vs[0]
            else f"{' and '.join(vs)}: {note}" for note, vs in notes.items())
    elif not methods:
        k = sum(r.get("status") == "reproduced" for r in reps)
        text += f", {k} of {len(reps)} parts reproduced"
    return text + "."


def _errata_sentence(summary: dict, cids: list[str]) -> str:
    with_errata = [(cid, len(errata(summary, cid))) for cid in cids if errata(summary, cid)]
    if not with_errata:
        return "No proof step was found in error."
    n = sum(k for _, k in with_errata)
    names = ", ".join(f"{link(cid)} {k}" for cid, k in with_errata)
    return f"Proof errata: {n} ({names}); the statements stand."


def paper_claims(name: str) -> list[str]:
    from kvbounds import claims as registry
    fam = {"BalanceKV": "BalanceKV", "SubGen and ClusterGen": "SubGen/ClusterGen", "Subspace-FD-draft": "Subspace/FD"}
    return [cid for cid, c in registry.CLAIMS.items() if c.family == fam[name]]


def paper_sentences(summary: dict, name: str) -> list[str]:
    """The answer for one paper of :data:`PAPERS`, as a list of sentences."""
    spec = PAPERS[name]
    rows = board(summary)
    if all(statement(summary, cid) in ("not-run", "no-check") for cid in paper_claims(name)):
        return ["None of its claims has records in this run; `make report` checks them all."]
    out = _theorem_sentences(summary, spec["theorems"])
    out += [s for s in (_versus(summary, spec["as_written"]), _versus(summary, spec["released"]),
                        _inside(summary, spec["inside"], rows),
                        _errata_sentence(summary, [c for c in paper_claims(name) if c in summary])) if s]
    return out


def paper_answers(summary: dict) -> dict[str, list[str]]:
    """{paper: [sentences]} for the three papers."""
    return {name: paper_sentences(summary, name) for name in PAPERS}


# ------------------------------------------------------------------------------------------------------------------
# the decision map
# ------------------------------------------------------------------------------------------------------------------

def _higher_is_better(metric: str) -> bool:
    return bool(re.search(r"exact match|log-likelihood", metric))


def _as_count(metric: str, value: float | None, n) -> str:
    if value is not None and "exact match" in metric and isinstance(n, int):
        return f"{round(value * n)}/{n}"
    return num(value)


def decisions(summary: dict) -> list[dict]:
    """Per (budget, task) where a method of the papers ran: {"budget", "task", "best", "best_value", "papers":
    [(method, "tied" | "worse")], "all_lose": text or "", "exact": text}."""
    rows = board(summary)
    exact = {row_metric(r): r for r in rows if row_method(r) == "exact"}
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        if row_method(r) in ("exact", "all methods") or row_value(r) is None:
            continue
        cells.setdefault((row_budget(r), row_metric(r)), []).append(r)
    out = []
    for (budget, metric), rs in cells.items():
        papers = [r for r in rs if row_is_papers(r)]
        best = next((r for r in rs if row_is_best(r)), None)
        if not papers or best is None:
            continue
        up = _higher_is_better(metric)
        ex = exact.get(metric)
        lose = ""
        if ex is not None and row_value(ex) is not None:
            ev = row_value(ex)
            top = max(row_value(r) for r in rs) if up else min(row_value(r) for r in rs)
            if (top < ev) if up else (top > ev):
                lose = (f"yes, {'at most' if up else 'at best'} "
                        f"{_as_count(metric, top, row_n(best))} against {_as_count(metric, ev, row_n(ex))} uncompressed")
        out.append({"budget": budget, "task": metric, "best": row_method(best),
                    "best_value": _as_count(metric, row_value(best), row_n(best)),
                    "papers": [(row_method(r), "best" if row_is_best(r) else "tied" if row_tied_with_best(r)
                                else "worse") for r in papers], "all_lose": lose,
                    "rivals": [row_method(r) for r in rs if not row_is_papers(r) and row_tied_with_best(r)]})
    return out


METHOD_WORDS = {"balancekv": "BalanceKV (pseudocode walk)", "balancekv_released": "BalanceKV (released walk)",
                "kcenter": "ClusterGen's k-center", "kcenter_sized": "size-weighted k-center", "subgen": "SubGen",
                "h2o": "H2O", "streaming_llm": "StreamingLLM", "uniform": "uniform sampling",
                "uniform_control": "uniform sampling (sensitivity control)", "kvpress:snapkv": "SnapKV (kvpress)",
                "kvpress:pyramidkv": "PyramidKV (kvpress)"}


def method_words(method: str) -> str:
    m = re.sub(r"^control: ", "", method)
    m = re.sub(r" \(the press's[^)]*\)", "", m)
    return METHOD_WORDS.get(m, {"uniform sample": "uniform sampling", "the press's ablation": "the press's ablation"
                                }.get(m, m))


def _task(metric: str) -> str:
    return metric.split(", SmolLM2 generating")[0]


TASK_WORDS = {"lines": "line retrieval", "passkey": "passkey", "ppl": "perplexity", "decode": "decode"}


def task_words(metric: str) -> str:
    """"passkey, question inside: exact match" -> "passkey (question inside, exact match)"."""
    task, _, measure = metric.partition(": ")
    name, _, setting = task.partition(", ")
    measure = re.sub(r"answer |vs exact |\s*\(.*$|/.*$", "", measure).strip()
    return f"{TASK_WORDS.get(name, name)} ({', '.join(x for x in (setting, measure) if x)})"


def decision_sentences(summary: dict) -> list[str]:
    """Per budget: what to use per task, whether a paper method is told apart from it, what all lose."""
    by: dict[str, list[dict]] = {}
    for d in decisions(summary):
        by.setdefault(d["budget"], []).append(d)
    out = []
    for budget, ds in by.items():
        uses: dict[str, list[str]] = {}
        for d in ds:
            uses.setdefault(method_words(d["best"]), []).append(task_words(d["task"]))
        use = "; ".join(f"{m} for {' and '.join(dict.fromkeys(ts))}" for m, ts in uses.items())
        paper_best = [(method_words(d["best"]), [method_words(r) for r in d["rivals"]]) for d in ds
                      if any(c == "best" for _, c in d["papers"])]
        better = "no method of the papers is best on any task"
        if paper_best:
            rivals = sorted({r for _, rs in paper_best for r in rs})
            better = (f"{', '.join(dict.fromkeys(m for m, _ in paper_best))} (a paper's method) tops some task"
                      + (f" but is not told apart from {', '.join(rivals)}" if rivals else ""))
        lose = [f"{task_words(d['task'])}: {d['all_lose'].split(', ', 1)[-1]}" for d in ds
                if d["all_lose"] and "exact match" in d["task"]]
        text = f"At {budget}: use {use}; {better}"
        if lose:
            text += "; every method loses " + ", ".join(lose)
        out.append(text + ".")
    return out


def decision_lines(summary: dict) -> list[str]:
    """The decision map as markdown: a lead (profile, model, rule), one sentence per budget, one table row per
    (budget, task)."""
    ds = decisions(summary)
    model = e2e_model(summary) or "the model"
    lines = [f"From the {run_profile(summary)} profile's records: end-to-end tasks inside {model}, decode error with "
             "SmolLM2 generating. \"Use\" is the top of the leaderboard among everything that ran. \"Tied\" means "
             "its 95% interval overlaps the best's; \"worse\" means the intervals are apart.", ""]
    lines += [f"- {s}" for s in decision_sentences(summary)] + [""]
    lines += ["| memory | task (metric) | use | the papers' methods against it | all lose? |", "|---|---|---|---|---|"]
    for d in ds:
        papers = "; ".join(f"{method_words(m)}: {c}" for m, c in d["papers"])
        lines.append(f"| {d['budget']} | {_escape(task_words(d['task']))} | {method_words(d['best'])} ({d['best_value']}) "
                     f"| {papers} | {d['all_lose'] or 'no'} |")
    return lines


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


# ------------------------------------------------------------------------------------------------------------------
# checking sentences
# ------------------------------------------------------------------------------------------------------------------

_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")


def plain(text: str) -> str:
    """A sentence as a reader sees it: links as their text."""
    return _LINK.sub(r"\1", text)


def words(text: str) -> int:
    return len(plain(text).split())


def sentence_numbers(text: str) -> list[str]:
    """The numbers a sentence quotes (theorem and section numbers, claim ids and setups' names left out)."""
    t = plain(text)
    t = re.sub(r"\b(?:Thm|Lemma|Sec\.|Alg\.|Fig\.)\s*[\d.]+", "", t)
    t = re.sub(r"\b[A-Z]{2,4}\.[\w-]+", "", t)            # claim ids
    t = re.sub(r"SmolLM2[-\w.]*|MiniLM[-\w]*|Q4_1", "", t)
    return re.findall(r"(?<![\w.])-?\d+(?:\.\d+)?(?:/\d+)?", t)


def markdown_lines(summary: dict, level: str = "###", base: str = RESULTS) -> list[str]:
    """The per-paper answers, then the decision map; claim ids linked to their sections on ``base``."""
    lines = [f"{level} What each paper's main theorems come to", ""]
    _BASE["base"], old = base, _BASE["base"]
    try:
        answers = paper_answers(summary)
    finally:
        _BASE["base"] = old
    for name, sentences in answers.items():
        lines += [f"**{PAPERS[name]['title']}.** " + " ".join(sentences), ""]
    lines += [f"{level} Should I use it?", ""] + decision_lines(summary) + [""]
    return lines


def html_answers(summary: dict) -> dict:
    """The answers and the decision for the html report: {"papers": [(title, html)], "decision": [html],
    "table": [decision dicts with words]}; claim ids link to their cards (``#claim-`` and the id, every character
    but letters, digits, - and _ as _)."""
    import html as _html

    def to_html(text: str) -> str:
        def card(m):
            cid = m.group(1)
            return f'<a href="#claim-{re.sub(r"[^A-Za-z0-9_-]", "_", cid)}">{cid}</a>'
        return re.sub(r"\[([^\]]+)\]\(#claim-[^)]*\)", card, _html.escape(text, quote=False))
    _BASE["base"], old = "", _BASE["base"]
    try:
        papers = [(PAPERS[name]["title"], to_html(" ".join(ss))) for name, ss in paper_answers(summary).items()]
    finally:
        _BASE["base"] = old
    table = [dict(d, best_words=method_words(d["best"]), task_words=task_words(d["task"]),
                  papers_words="; ".join(f"{method_words(m)}: {c}" for m, c in d["papers"]))
             for d in decisions(summary)]
    return {"papers": papers, "decision": [to_html(x) for x in decision_sentences(summary)], "table": table,
            "lead": decision_lines(summary)[0]}
