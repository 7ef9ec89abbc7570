"""One paragraph per paper, generated from the verdicts: what a reader of the paper wants to know first.

Papers are grouped as their claims are (a claim's ``family`` in :data:`kvbounds.claims.CLAIMS`): BalanceKV
(BalanceKV-NeurIPS and BalanceKV-preprint, with the lower bound LB.index and the norm study NORM.bounded),
SubGen/ClusterGen, and Subspace-FD-draft. Each answer (:func:`paper_answers`) says, from the verdict fields only
(statement, vacuity, corrected bound, errata, rate, reproductions, ``variant`` and the battery's calls):

* which statements hold (as stated, or with a fitted constant), which are vacuous at real norms or at any norm (doing
  nothing meets the bound), which are false (with the corrected bound), which are not refuted;
* which proofs have errata and where a stated rate is not reached;
* which variant each empirical sentence speaks of (the pseudocode walk at the theorem's c is random halving; the
  released walk is the authors' near-greedy code; the streaming presses depart from the papers), defined once;
* how each variant does against StreamingLLM, uniform sampling and its ablation at equal memory, on synthetic streams
  and on real keys (the battery's three-way calls, :mod:`kvbounds.battery`), and the experiments' outcome.

The words change when the records change. An answer is held to :data:`MAX_WORDS` by dropping detail in a fixed
order (claim lists become counts, the evidence notes go, corrected bounds are cut to their first clause).
"""
from __future__ import annotations

import re
from collections import Counter

from kvbounds import claims as registry
from kvbounds.verdict import headline_calls
from ._words import check_text, check_verdicts

MIN_WORDS, MAX_WORDS = 30, 200
# a family of claims -> the answer's name (its papers' short names)
GROUPS = {"BalanceKV": "BalanceKV-NeurIPS and BalanceKV-preprint", "SubGen/ClusterGen": "SubGen and ClusterGen",
          "Subspace/FD": "Subspace-FD-draft"}
# the controls a practitioner compares against (older records: "recent" for the recent window)
STANDARD = ("streaming_llm", "recent", "uniform", "ablation")
CONTROL_WORDS = {"streaming_llm": "StreamingLLM", "recent": "the recent window", "uniform": "uniform sampling",
                 "ablation": "its ablation"}
# a short variant name -> the key of kvbounds.methods.VARIANT_WORDS that defines it
VARIANT_KEYS = {"pseudocode walk": "BalanceKV:pseudocode", "greedy walk": "BalanceKV:greedy",
                "released walk": "BalanceKV:released", "streaming press": "BalanceKV:streaming",
                "SubGen estimator": "SubGen/ClusterGen:subgen", "k-center": "SubGen/ClusterGen:kcenter",
                "size-weighted k-center": "SubGen/ClusterGen:kcenter_sized",
                "streaming SubGen press": "SubGen/ClusterGen:streaming", "static subspace": "Subspace/FD:subspace",
                "Frequent Directions": "Subspace/FD:fd"}
_REPRO = {"reproduced": "reproduced", "partial": "partly reproduced", "not-reproduced": "not reproduced",
          "not-shown": "not shown (underpowered)", "reversed": "reversed"}
_REPRO_RANK = ("reproduced", "partial", "not-shown", "reversed", "not-reproduced")


def short_variant(text: str, algorithm: str = "") -> str:
    """The short name of the variant a text names ("real SmolLM2 | released walk at temp 1" -> "released walk"; a
    registry key "BalanceKV:streaming" -> "streaming press"); "" when it names none."""
    t = check_text(text).lower()
    check_text(algorithm, "algorithm")
    rules = (("pseudocode", "pseudocode walk"), ("balance", "pseudocode walk"), ("greedy walk", "greedy walk"),
             ("released", "released walk"), ("consistent", "released walk"), ("sized", "size-weighted k-center"),
             ("center", "k-center"), ("subgen", "SubGen estimator"), ("subspace", "static subspace"),
             ("gamma=", "static subspace"), (":fd", "Frequent Directions"))
    if "streaming" in t:
        return "streaming SubGen press" if "subgen" in t or "SubGen" in algorithm else "streaming press"
    if t == "balance" or t.startswith("balance "):
        return "pseudocode walk"
    return next((name for key, name in rules if key in t and key != "balance"), "")


def _ids(ids: list[str], full: bool) -> str:
    return ", ".join(ids) if full else f"{len(ids)} claim{'s' if len(ids) != 1 else ''}"


def _count(ids: list[str], full: bool) -> str:
    return ", ".join(ids) if full else f"{len(ids)}"


def _first_clause(text: str, limit: int = 40) -> str:
    """A corrected bound without its worded asides ("(proven in ...)", "(Theorem R, ...)"), up to its first "; " or
    ", for any", at most ``limit`` words."""
    s = " ".join(registry.cite(text).split())
    s = re.sub(r" \((?=[A-Za-z]{3})[^()]*\)", "", s)
    s = re.split(r"; |,? for any | and raises | \((?:proven|Theorem|attained|measured)\b", s)[0].strip().rstrip(",.;:")
    if len(s.split()) <= limit:
        return s
    chain = s.split(" <= ")        # a chain X <= Y <= Z: its first link X <= Y is a bound by itself
    if len(chain) > 2 and len(" <= ".join(chain[:2]).split()) <= limit:
        return " <= ".join(chain[:2])
    return " ".join(s.split()[:limit]) + " \u2026"


def _claim_variant(cid: str) -> str:
    c = registry.CLAIMS.get(cid)
    return short_variant(c.variant, c.variant) if c and c.variant else ""


def _setting(family: str) -> str:
    return "real" if re.search(r"real|smollm|minilm|llama-3|decode", family, re.I) and "tiny" not in family.lower() \
        else "synthetic"


def _statements(group: dict, full: bool, corrected_words: int) -> str:
    by: dict[str, list[str]] = {}
    for cid, v in group.items():
        key = "empirical" if v.kind == "empirical" else (v.statement or "not-run")
        by.setdefault(key, []).append(cid)
    parts = []
    if by.get("holds"):
        parts.append(f"{_count(by['holds'], full)} hold{'s' if len(by['holds']) == 1 else ''} as stated")
    if by.get("holds-fitted"):
        parts.append(f"{_count(by['holds-fitted'], full)} hold{'s' if len(by['holds-fitted']) == 1 else ''} "
                     "with a fitted constant")
    for cid in by.get("vacuous", []):
        vac = group[cid].vacuity
        why = (f" (doing nothing meets its bound in {vac.zeros_meets}/{vac.cells} cells; scale e^{vac.log_scale[0]:.0f})"
               if vac else " (doing nothing meets its bound)")
        if vac is not None and getattr(vac, "any_norm", ""):
            parts.append(f"vacuous at any norm: {cid} ({vac.any_norm.split(';')[0]})")
        else:
            parts.append(f"vacuous at real norms: {cid}{why}")
    false = [cid + (f" (corrected: {_first_clause(group[cid].corrected, corrected_words)})" if group[cid].corrected
                    else " (no corrected bound derived)") for cid in by.get("false", [])]
    if false:
        parts.append("false as stated: " + ", ".join(false))
    if by.get("not-refuted"):
        parts.append(f"not refuted: {', '.join(by['not-refuted'])}")
    if by.get("inconclusive"):
        parts.append(f"inconclusive: {', '.join(by['inconclusive'])}")
    unrun = by.get("not-run", []) + by.get("no-check", [])
    if unrun:
        parts.append(f"not run here: {_ids(unrun, full)}")
    n = len(group) - len(by.get("empirical", []))
    return f"Of its {n} statements, " + "; ".join(parts) + "." if parts else ""


def _errata_rate(group: dict, full: bool) -> str:
    err = [(cid, len(v.errata)) for cid, v in group.items() if v.errata]
    slow = [cid for cid, v in group.items() if v.rate == "not-reached"]
    wrong = [cid for cid, v in group.items() if v.rate == "false"]
    parts = []
    if err:
        parts.append("proof errata (the statements stand): " + (", ".join(f"{c} ({k})" for c, k in err) if full
                                                                      else _ids([c for c, _ in err], False)))
    if wrong:
        parts.append(f"stated rate false past its onset: {', '.join(wrong)}")
    if slow:
        parts.append(f"stated rate not reached in the tested range: {', '.join(slow)}")
    text = "; ".join(parts) + "."
    return text[0].upper() + text[1:] if parts else ""


def _experiments(group: dict, notes: bool, per_variant: bool = True) -> tuple[str, set[str]]:
    """The empirical claims' outcome per variant, and the variants named."""
    parts, named = [], set()
    for cid, v in group.items():
        if v.kind != "empirical" or v.reproduction in ("", "n/a"):
            continue
        algorithm = registry.CLAIMS[cid].family if cid in registry.CLAIMS else ""
        per: dict[str, list[str]] = {}
        for r in v.reproductions:
            name = short_variant(r.variant, algorithm)
            if name:
                per.setdefault(name, []).append(r.status)
        text = f"{cid} {_REPRO.get(v.reproduction, v.reproduction)}"
        if per and per_variant:
            named |= set(per)
            best = {name: min(sts, key=lambda s: _REPRO_RANK.index(s) if s in _REPRO_RANK else 9)
                    for name, sts in per.items()}
            text += " (" + ", ".join(f"{_REPRO.get(s, s)} for the {name}" for name, s in best.items()) + ")"
        elif _claim_variant(cid) and per_variant:
            named.add(_claim_variant(cid))
            text += f" ({sum(r.status == 'reproduced' for r in v.reproductions)} of {len(v.reproductions)} parts, " \
                    f"on the {_claim_variant(cid)})"
        against = next((r for r in v.reproductions if r.bound_note.startswith("evidence against")), None)
        if notes and against:
            name = short_variant(against.variant, algorithm)
            note = re.sub(r" \([^()]*\)", "", against.bound_note)
            text += "; " + (note.replace("evidence against:", f"evidence against the {name}:", 1) if name else note)
        parts.append(text)
    return ("Experiments: " + "; ".join(parts) + "." if parts else ""), named


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


MIXED = {(False, False): "mixed, not shown better or worse than", (False, True): "mixed, not shown better than",
         (True, False): "mixed, not shown worse than", (True, True): "mixed against"}


def _call_phrases(by: dict[str, list[str]], counts: bool) -> str:
    """"better than uniform sampling, mixed, not shown better than StreamingLLM (2 tied, 1 worse)": the controls
    with one call in every family grouped by that call; the others "mixed", saying which direction no family showed
    (symmetric: "not shown better than" when no family is better, "not shown worse than" when none is worse, "mixed
    against" when both occur), with counts when ``counts``."""
    heads = {"better": "better than", "leaning better": "leaning better than", "tied": "tied with",
             "not told apart": "not told apart from", "leaning worse": "leaning worse than", "worse": "worse than",
             "not attainable": "not attainable against"}
    same: dict[str, list[str]] = {}
    mixed: dict[tuple, list[str]] = {}
    for k in STANDARD:
        if k not in by:
            continue
        c = Counter(by[k])
        if len(c) == 1:
            same.setdefault(by[k][0], []).append(CONTROL_WORDS.get(k, k))
        else:
            mixed.setdefault(("better" in c, "worse" in c), []).append(
                CONTROL_WORDS.get(k, k) + (" (" + ", ".join(f"{n} {w}" for w, n in sorted(c.items())) + ")"
                                           if counts else ""))
    order = ("worse", "leaning worse", "not attainable", "not told apart", "tied", "leaning better", "better")
    out = [f"{heads[w]} {_and(same[w])}" for w in order if w in same]
    return ", ".join(out + [f"{MIXED[k]} {_and(mixed[k])}" for k in MIXED if k in mixed])


def _comparisons(group: dict, counts: bool = True) -> tuple[str, set[str], str]:
    """The calls against the standard controls per (variant, setting); the variants named; and the claims that
    were not compared because the method holds the whole stream (does not compress)."""
    cells: dict[tuple, dict[str, list[str]]] = {}
    whole = []
    for cid, v in group.items():
        algorithm = registry.CLAIMS[cid].family if cid in registry.CLAIMS else ""
        for c in headline_calls(v.power_calls or []):       # the practitioner's metric where the claim has it
            if c.get("task"):            # an end-to-end cell: the experiments' sentence states those
                continue
            if c["call"] == "not tested":
                if "does not compress" in (c.get("reason") or "") and cid not in whole:
                    whole.append(cid)
                continue
            if c["control"] not in STANDARD:
                continue
            fam, _, suffix = c["family"].partition(" | ")
            name = short_variant(suffix, algorithm) if suffix else ""
            name = name or _claim_variant(cid) or (registry.CLAIMS[cid].algorithm if cid in registry.CLAIMS else cid)
            word = c["call"] if c["call"] != "tied" or c.get("equivalent") else "not told apart"
            metric = "" if c.get("metric") == "practitioner" else " (theorem's metric)"
            cells.setdefault((name, _setting(fam), metric), {}).setdefault(c["control"], []).append(word)
    clauses = []
    for (name, setting, metric), by in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1] != "synthetic",
                                                                             kv[0][2])):
        where = "synthetic streams" if setting == "synthetic" else "real keys"
        clauses.append(f"{name} on {where}{metric}: {_call_phrases(by, counts)}")
    text = ("At equal memory, on the practitioner's metric (mean error over held-out later queries) where the claim "
            "has it (mixed: varies by family): " + "; ".join(clauses) + ".") \
        if clauses else \
        "No comparison at equal memory against StreamingLLM, uniform sampling or an ablation in these records."
    note = (f"Not compared ({', '.join(whole)}): at these sizes the method holds at least the whole stream's floats, "
            "so it does not compress." if whole else "")
    return text, {n for n, _, _ in cells}, note


def _variants(group: dict, named: set[str]) -> str:
    from kvbounds.methods import VARIANT_WORDS
    names = set(named) | {_claim_variant(cid) for cid in group} - {""}
    defs = [VARIANT_WORDS[VARIANT_KEYS[n]] for n in sorted(names) if n in VARIANT_KEYS and VARIANT_KEYS[n] in VARIANT_WORDS]
    return ("Variants: " + "; ".join(defs) + ".") if defs else ""


# the details dropped, one more per level, until an answer fits MAX_WORDS
LEVELS = ("counts of mixed calls", "experiments per variant", "claim lists", "evidence notes", "long corrected bounds",
          "the does-not-compress note", "the variants' definitions")


def compose(name: str, group: dict, level: int = 0) -> str:
    """The paragraph with the first ``level`` details of :data:`LEVELS` dropped."""
    if not group:
        return ""
    run = {cid: v for cid, v in group.items() if (v.statement or "") not in ("not-run", "no-check")}
    if not run:
        return (f"{name} ({len(group)} claims). None has records in this run, so nothing about its statements, their "
                "variants or how they compare with the baselines can be said yet; run `make report` to check them all.")
    keep = lambda detail: LEVELS.index(detail) >= level
    full = keep("claim lists")
    comparisons, in_calls, whole = _comparisons(run, keep("counts of mixed calls"))
    experiments, in_experiments = _experiments(run, keep("evidence notes"), keep("experiments per variant"))
    sentences = [f"{name} ({len(group)} claims).", _statements(group, full, 40 if keep("long corrected bounds") else 20),
                 _errata_rate(run, full), _variants(run, in_calls | in_experiments) if keep("the variants' definitions")
                 else "", comparisons, whole if keep("the does-not-compress note") else "", experiments]
    return " ".join(s for s in sentences if s)


def answer(name: str, group: dict) -> str:
    """The paragraph for one group of claims, at most :data:`MAX_WORDS` words (detail dropped in order; a last
    resort cuts it at the limit)."""
    text = ""
    for level in range(len(LEVELS) + 1):
        text = compose(name, group, level)
        if len(text.split()) <= MAX_WORDS:
            return text
    return " ".join(text.split()[:MAX_WORDS - 1]) + " \u2026"


def groups(verdicts: dict) -> dict[str, dict]:
    """Answer name -> {claim id: verdict} in registry order; a family without an entry in :data:`GROUPS` is named
    by the papers its claims cite."""
    check_verdicts(verdicts)
    out: dict[str, dict] = {}
    for cid, v in verdicts.items():
        c = registry.CLAIMS.get(cid)
        fam = c.family if c else "other"
        name = GROUPS.get(fam) or " and ".join(p.short for p in registry.papers_in(c.source if c else "")) or fam
        out.setdefault(name, {})[cid] = v
    return out


def paper_answers(verdicts: dict) -> dict[str, dict]:
    """{answer name: {"answer": paragraph, "claims": [ids], "papers": [short names]}} for summary.json's "papers"."""
    out = {}
    for name, group in groups(verdicts).items():
        papers = [p for p in registry.PAPERS if re.search(rf"\b{re.escape(p)}\b", name)]
        out[name] = {"answer": answer(name, group), "claims": list(group), "papers": papers}
    return out
