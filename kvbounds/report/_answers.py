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

from kvbounds.e2e import MISS_PHRASE
from kvbounds.e2e.curve_grid import CURVE_BUDGETS

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


def call_units(call: dict) -> str:
    """The call's count with its unit, short: "20 texts" (distinct text windows, each a unit), "20 draws", "20
    streams"; "80 cells of one text" where the cells are not independent (as the call's unit says)."""
    unit, n = call.get("unit") or "", call_n(call)
    if "one text" in unit:
        return f"{n} cells of one text"
    for word in ("text", "draw", "stream", "generation"):
        if word in unit:
            return f"{n} {word}s"
    return f"{n} {unit or 'units'}"


def call_metric_key(call: dict) -> str:
    return call.get("metric") or "theorem"


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
    """The models the end-to-end claims ran inside, in words: "SmolLM2-135M-Instruct and Qwen2.5-Coder-0.5B-Instruct"."""
    setups = [r.get("setup") or "" for r in reproductions(summary, "BKV.e2e") + reproductions(summary, "SG.e2e")]
    models = list(dict.fromkeys(s.split(" (")[0].split(",")[0] for s in setups if s))
    return " and ".join(models)


# ------------------------------------------------------------------------------------------------------------------
# words
# ------------------------------------------------------------------------------------------------------------------

PRACTITIONER_METRIC = "mean error on held-out later queries"
PRACTITIONER_SHORT = "mean error on later queries"
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
                     ("Thm 3.2", "LB.index"), ("Thm 3.1 in generation", "BKV.decode")),
        "as_written": ("Alg. 1 as written", "BKV.attention", "real SmolLM2",
                       "worst-case attention error"),
        "released": ("The authors' released walk", "BKV.vs-uniform", "real SmolLM2 | released walk at temp 1",
                     "relative error (Fig. 1)"),
        "inside": ("BKV.e2e", True),      # (the experiment inside a model, whether it names its variants)
    },
    "SubGen and ClusterGen": {
        "title": "SubGen and ClusterGen (SubGen numbering; its Thm 1 is ClusterGen Thm 2.4)",
        "theorems": (("Thm 1", "SG.attention"), ("Lemma 1", "SG.reservoir"),
                     ("Lemma 2", "SG.clusters"), ("Thm 1 in generation", "SG.decode")),
        "as_written": ("Alg. 1 as written", "SG.attention", "real SmolLM2",
                       "worst-case attention error"),
        "released": None,
        "inside": ("SG.e2e", True),
    },
    "Subspace-FD-draft": {
        "title": "Subspace-FD-draft",
        "theorems": (("Sec. 8's FD linkage", "FD.residual"), ("Sec. 8's logit bound", "SUB.logit-error"),
                     ("Sec. 8's output bound", "SUB.output-error"), ("Sec. 6's blockwise lemma", "SUB.blockwise"),
                     ("Sec. 8's FD covariance bound", "FD.covariance")),
        "as_written": ("The static subspace as written", "SUB.output-error", "real SmolLM2",
                       "worst-case output error"),
        "released": None,
        "inside": ("SUB.lowrank", False),
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
    out += [p for p in (_past_onset(cid, *rate(summary, cid)) for _, cid in theorems) if p]
    slow = [(cid, rate(summary, cid)[1]) for _, cid in theorems if rate(summary, cid)[0] == "not-reached"]
    slow = [f"{link(cid)} ({info.get('param', 'n')} <= {num(info['tested_range'][1])})" for cid, info in slow
            if info.get("tested_range") and not _reached(info)]
    if slow:
        out.append("Rates not reached: " + ", ".join(slow) + ".")
    return out


def _reached(info: dict) -> bool:
    return info.get("onset") is not None and (info.get("largest") or 0) >= info["onset"]


def _past_onset(cid: str, st: str, info: dict) -> str:
    """A rate decided past its derived onset, one short sentence: "SB.discrepancy's stated rate holds past its derived
    onset, to n = 110656 (2 n*).", "MR.error's is not reached: still bending at t = 38336 (2 t*); deciding needs t ~
    1.5e+05."; "" where the onset was not reached (the exponents are in RESULTS.md)."""
    if st not in ("observed", "false", "not-reached", "n/a") or not _reached(info):
        return ""
    p, big = info.get("param", "n"), info["largest"]
    at = f"{p} = {num(big)} ({big / info['onset']:.2g} {p}*)"
    head = f"{link(cid)}'s stated rate"
    if st == "observed":
        return f"{head} holds past its derived onset, to {at}."
    if st == "false":
        return (f"{head} is false as stated past its derived onset, to {at}: measured exponent "
                f"{info['measured_exponent']:.2f}, stated {info['stated_exponent']:g}.")
    if st == "n/a":
        return f"{head} is undetermined past its derived onset, to {at}."
    needs = f"; deciding needs {p} ~ {info['needed']:.2g}" if info.get("needed") else ""
    return f"{head} is not reached: still bending at {at}{needs}."


def _calls_of(summary: dict, cid: str, family: str) -> dict[str, dict]:
    """The calls of one family, per control: on the practitioner's metric where the records carry it (the question is
    whether to use the method), else on the theorem's."""
    calls = [c for c in power_calls(summary, cid) if call_family(c) == family]
    practical = [c for c in calls if call_metric_key(c) == "practitioner"]
    return {c.get("control"): c for c in (practical or calls)}


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
    measure = PRACTITIONER_SHORT if call_metric(c, metric) == PRACTITIONER_METRIC else metric
    whose = CONTROL_WORDS.get(control, control)
    text = (f"{who}, on {family.split(' | ')[0]} keys at equal memory: {_ratio(call_effect(c))} "
            f"{whose + (chr(39) if whose.endswith('s') else chr(39) + 's')} {measure}, the strongest baseline "
            f"({call_word(c)}, {call_units(c)})")
    z = calls.get("zeros")
    if z is not None and call_word(z) == "worse":
        text += f"; zeros do better ({_ratio(call_effect(z))})"
    return text + "."


def method_words(method: str) -> str:
    """A method's short name from the method registry (kvbounds.methods): "BalanceKV (released)", "H2O",
    "uniform sampling (sensitivity control)"; a leaderboard's control row ("control: zeros") as its words."""
    from kvbounds.methods import get_method
    name = re.sub(r" \(the press's[^)]*\)", "", re.sub(r"^control: ", "", method))
    try:
        m = get_method(name)
    except (KeyError, ValueError):
        return {"uniform sample": "uniform sampling"}.get(name, name)
    if m.algorithm and m.variant:
        papers = m.algorithm.split("/")
        same = [p for p in papers if p.lower() == m.variant.lower()]
        if same:                                             # SubGen's own estimator
            return same[0]
        paper = papers[-1] if m.variant.startswith("kcenter") else papers[0]   # k-center: ClusterGen's
        return f"{paper} ({m.variant.replace('kcenter', 'k-center').replace('_', ', ')})"
    if name.startswith("uniform"):
        return "uniform sampling" + (" (sensitivity control)" if m.role == "control" else "")
    return m.label.split(":")[0].replace("NVIDIA kvpress's ", "kvpress ") if m.label else name


def variant_words(variant: str) -> str:
    """A reproduction's variant ("pseudocode", "released", a method's variant label) as a method's short name."""
    from kvbounds.methods import methods
    named = [m.name for m in methods() if m.variant == variant]
    return method_words(named[0]) if named else variant


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
    misses: dict[tuple, list] = {}       # (task, memories, exact) -> [(variant, the most it retrieves)]
    for r in reps:
        note = r.get("bound_note") or ""
        if not note.startswith("evidence against"):
            continue
        miss = MISS_PHRASE.search(note)
        if miss:
            task, counts, at, ke, ne = miss.groups()
            best = max((tuple(map(int, c.split("/"))) for c in counts.split(", ")), key=lambda kn: kn[0] / kn[1])
            misses.setdefault((task, at, f"{ke}/{ne}"), []).append((variant_words(r.get("variant") or ""), best))
        else:
            notes.setdefault(re.sub(r" \([^()]*\)", "", note.split(": ", 1)[1]), []).append(
                variant_words(r.get("variant") or ""))
    for (task, at, exact), got in misses.items():    # one phrase per task: the most any variant retrieves
        vs = [v for v, _ in got]
        k, n = max((kn for _, kn in got), key=lambda kn: kn[0] / kn[1])
        memories = at.split(", ")
        grid = [f"{100 * b:.3g}" for b in CURVE_BUDGETS]
        run = len(memories) > 1 and all(m in grid for m in memories) and \
            grid[grid.index(memories[0]):grid.index(memories[-1]) + 1] == memories
        where = f"{memories[0]}-{memories[-1]}%" if run else f"{', '.join(memories)}%"     # a range only without gaps
        who = "both walks" if len(vs) == 2 and "BalanceKV" in vs[0] else " and ".join(vs)
        notes[f"at {where} of the cache {who} retrieve{'s' if len(vs) == 1 else ''} the {task} answer in at most "
              f"{k}/{n} where exact attention retrieves {exact}"] = []
    if notes:
        text += ", " + "; ".join(
            note if not vs else
            f"both walks {re.sub(r'^retrieves', 'retrieve', note)}" if len(vs) == 2 and "BalanceKV" in vs[0]
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
    return f"Proof errata: {n} ({names}); statements stand."


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
