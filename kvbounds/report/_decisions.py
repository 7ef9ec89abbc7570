"""The decision map ("Should I use it?"), from summary.json alone: per memory budget and task where a method of the
papers ran, the best among everything that ran (the leaderboard's top: the papers' methods, StreamingLLM, uniform,
H2O, SnapKV, kvpress's presses), whether each paper method is told apart from it, and what all lose; budgets where
only baselines ran are left out. Also the markdown and html forms of the answers and the decision together.

The fields are read through the accessors of :mod:`kvbounds.report._answers` (a field renamed upstream is a
one-line change there).
"""
from __future__ import annotations

import re

from kvbounds.claims import CLAIMS

from ._answers import (PAPERS, RESULTS, _BASE, board, e2e_model, method_words, num, paper_answers, row_budget, row_is_best,
                       row_is_papers, row_method, row_metric, row_n, row_tied_with_best, row_value, run_profile)

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
        cells.setdefault((row_budget(r), row_metric(r), _table(r)), []).append(r)
    out = []
    for (budget, metric, table), rs in cells.items():
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
        out.append({"budget": budget, "task": metric, "table": table, "best": row_method(best),
                    "best_value": _as_count(metric, row_value(best), row_n(best)),
                    "papers": [(row_method(r), "best" if row_is_best(r) else "tied" if row_tied_with_best(r)
                                else "worse") for r in papers], "all_lose": lose,
                    "rivals": [row_method(r) for r in rs if not row_is_papers(r) and row_tied_with_best(r)]})
    return out


def _table(row: dict) -> str:
    """The table a row ranks in, where a claim's check adds its own (BKV.decode and SG.decode each rank their own
    generation's methods under the same metric): the claim id; "" for the end-to-end tables."""
    source = row.get("source") or ""
    return source if source in CLAIMS else ""


def _join_tasks(tasks: list[str]) -> str:
    """Tasks in words, one task's measures together: "passkey (question inside, log-likelihood)" and "passkey (question
    inside, exact match)" -> "passkey (question inside: log-likelihood, exact match)"."""
    groups: dict[tuple, list[tuple]] = {}
    for t in dict.fromkeys(tasks):
        m = re.fullmatch(r"(.+?) \((?:(.+), )?([^,()]+)\)( in .+'s run)?", t)
        key, measure = ((f"{m.group(1)}{m.group(4) or ''}", m.group(2) or ""), m.group(3)) if m else ((t, None), None)
        groups.setdefault(key, []).append((measure, t))
    out = []
    for (task, setting), got in groups.items():
        if len(got) == 1:                               # one measure: the task's words as they are
            out.append(got[0][1])
            continue
        measures = [x for x, _ in got]
        name, _, run = task.partition(" in ")
        inner = f"{setting}: {', '.join(measures)}" if setting else ", ".join(measures)
        out.append(f"{name} ({inner})" + (f" in {run}" if run else ""))
    return " and ".join(out)


def task_of(d: dict) -> str:
    """A decision's task in words, with the claim whose run it is where a claim's check ranks its own table."""
    return task_words(d["task"]) + (f" in {d['table']}'s run" if d.get("table") else "")


CALL_WORDS = {"tied": "not told apart", "best": "best", "worse": "worse"}


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
            uses.setdefault(method_words(d["best"]), []).append(task_of(d))
        use = "; ".join(f"{m} for {_join_tasks(ts)}" for m, ts in uses.items())
        paper_best = [(method_words(d["best"]), [method_words(r) for r in d["rivals"]]) for d in ds
                      if any(c == "best" for _, c in d["papers"])]
        better = "no method of the papers is best on any task"
        if paper_best:
            rivals = sorted({r for _, rs in paper_best for r in rs})
            better = (f"{', '.join(dict.fromkeys(m for m, _ in paper_best))} (a paper's method) tops some task"
                      + (f" but is not told apart from {', '.join(rivals)}" if rivals else ""))
        lose = [f"{task_of(d)}: {d['all_lose'].split(', ', 1)[-1]}" for d in ds
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
             "SmolLM2 generating. \"Use\" is the top of the leaderboard among everything that ran. \"Not told apart\" "
             "means the one rule calls it neither better nor worse than the best (tied, leaning or not attainable: a "
             "paired test at the unit, Holm over the table's comparisons with the best); \"worse\" means it calls "
             "it worse.", ""]
    lines += [f"- {s}" for s in decision_sentences(summary)] + [""]
    lines += ["| memory | task (metric) | use | the papers' methods against it | all lose? |", "|---|---|---|---|---|"]
    for d in ds:
        papers = "; ".join(f"{method_words(m)}: {CALL_WORDS.get(c, c)}" for m, c in d["papers"])
        lines.append(f"| {d['budget']} | {_escape(task_of(d))} | {method_words(d['best'])} ({d['best_value']}) "
                     f"| {papers} | {d['all_lose'] or 'no'} |")
    return lines


def _escape(text: str) -> str:
    return text.replace("|", "\\|")



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
    table = [dict(d, best_words=method_words(d["best"]), task_words=task_of(d),
                  papers_words="; ".join(f"{method_words(m)}: {CALL_WORDS.get(c, c)}" for m, c in d["papers"]))
             for d in decisions(summary)]
    bold_head = lambda h: re.sub(r"^(At [^:]+:)", r"<b>\1</b>", h)     # the memory in bold, the sentence plain
    return {"papers": papers, "decision": [bold_head(to_html(x)) for x in decision_sentences(summary)], "table": table,
            "lead": decision_lines(summary)[0]}
