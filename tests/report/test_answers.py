"""The per-paper answers and the decision map (issue 48 items 1-2): held to the records they are read from.

Every number a sentence quotes is a field of summary.json: the test takes the committed docs/summary.json and a small
synthetic summary, changes a field, and sees the sentence follow; the README's block is what the committed summary
renders to (tests/docs/test_results_md.py), so these checks hold for it too.
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from kvbounds.report import _answers as A
from kvbounds.report import _decisions as D

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = json.loads((ROOT / "docs" / "summary.json").read_text(encoding="utf-8"))
THEOREM = re.compile(r"\b(?:Thm \d+(?:\.\d+)?|Lemma \d+|Sec\. \d+)")


def _sentences(summary):
    return A.paper_answers(summary)


@pytest.mark.parametrize("name", list(A.PAPERS))
def test_each_answer_is_short_named_by_theorem_and_never_pools(name):
    sentences = _sentences(SUMMARY)[name]
    assert sum(A.words(s) for s in sentences) <= 150
    assert max(A.words(s) for s in sentences) <= 30
    text = " ".join(A.plain(s) for s in sentences)
    assert THEOREM.search(text), text
    assert "mixed" not in text.lower()
    for label, cid in A.PAPERS[name]["theorems"]:
        assert f"{label} ({cid}" in text or cid not in SUMMARY


def test_the_theorem_numbers_are_the_registry_s():
    """Each theorem label names what the claim registry cites for that claim (the paper's own numbering)."""
    from kvbounds import claims as registry
    for spec in A.PAPERS.values():
        for label, cid in spec["theorems"]:
            head = label.split(" in generation")[0].split("'s ")[0]
            head = head.replace("Sec. 8", "Sec. 8").strip()
            assert head.split()[-1] in registry.CLAIMS[cid].source or head in registry.CLAIMS[cid].source, (cid, label)


def _numbers_in_fields(summary) -> set[str]:
    """Every number summary.json holds, as the sentences format them."""
    out = set()

    def walk(x):
        if isinstance(x, bool):
            return
        if isinstance(x, (int, float)):
            out.update({A.num(x), f"{x:.0f}"})
        elif isinstance(x, str):
            out.update(re.findall(r"-?\d+(?:\.\d+)?(?:/\d+)?", x))
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(summary)
    return out


def test_every_number_in_the_answers_is_a_field_of_the_summary():
    fields = _numbers_in_fields(SUMMARY)
    for name, sentences in _sentences(SUMMARY).items():
        for s in sentences:
            for n in A.sentence_numbers(s):
                assert n.lstrip("-") in fields or n in fields, (name, n, s)


def test_a_changed_field_changes_the_sentence():
    s = copy.deepcopy(SUMMARY)
    s["BKV.attention"]["fitted_constant"]["value"] = 4.56
    for c in s["SG.attention"]["power_calls"]:
        if c["family"] == "real SmolLM2" and c["control"] == "streaming_llm":
            key = "effect" if "effect" in c else "ratio_median"
            c[key] = 125.0
    s["FD.covariance"]["statement"] = "false"
    text = {k: " ".join(v) for k, v in _sentences(s).items()}
    assert "C = 4.56" in text["BalanceKV"] and "C = 1.53" not in text["BalanceKV"]
    assert "125x" in text["SubGen and ClusterGen"]
    assert "(FD.covariance) are false as stated" in A.plain(text["Subspace-FD-draft"])


def test_the_words_follow_each_statement_kind():
    s = copy.deepcopy(SUMMARY)
    s["SG.attention"]["statement"] = "holds"
    s["SB.discrepancy"]["statement"] = "vacuous"
    s["SB.discrepancy"]["vacuity"] = {"zeros_meets": 7, "cells": 9, "log_scale": [12.0]}
    text = {k: A.plain(" ".join(v)) for k, v in _sentences(s).items()}
    assert "Thm 1 (SG.attention), Lemma 1 (SG.reservoir) and Lemma 2 (SG.clusters) hold as stated" in \
        text["SubGen and ClusterGen"]
    assert "returning zeros meets it in 7/9 cells (bound scale e^12)" in text["BalanceKV"]


SYNTHETIC = {
    "run": {"profile": "quick"},
    "BKV.e2e": {"reproductions": [{"setup": "TinyModel (test), CPU", "status": "not-reproduced", "variant": "pseudocode",
                                   "bound_note": ""}]},
    "leaderboard": [
        {"method": "exact", "metric": "passkey: exact match", "budget_label": "exact", "value": 1.0, "n": 4,
         "family": "baselines", "best": False, "tied": False},
        {"method": "streaming_llm", "metric": "passkey: exact match", "budget_label": "25% of the cache", "value": 0.5,
         "n": 4, "family": "baselines", "best": True, "tied": False},
        {"method": "balancekv", "metric": "passkey: exact match", "budget_label": "25% of the cache", "value": 0.25,
         "n": 4, "family": "ours", "best": False, "tied": True},
        {"method": "uniform", "metric": "passkey: exact match", "budget_label": "50% of the cache", "value": 0.75,
         "n": 4, "family": "baselines", "best": True, "tied": False},
    ],
}


def test_the_decision_map_reads_the_leaderboard():
    ds = D.decisions(SYNTHETIC)
    assert len(ds) == 1, "a budget where no method of the papers ran is left out"
    d = ds[0]
    assert (d["budget"], d["best"], d["best_value"], d["papers"]) == ("25% of the cache", "streaming_llm", "2/4",
                                                                      [("balancekv", "tied")])
    assert d["all_lose"] == "yes, at most 2/4 against 4/4 uncompressed"
    text = "\n".join(D.decision_lines(SYNTHETIC))
    assert "50%" not in text and "TinyModel" in text and "quick profile" in text
    assert "every method loses passkey (exact match): at most 2/4 against 4/4 uncompressed" in text


def test_the_committed_decision_map_names_what_ran():
    text = "\n".join(D.decision_lines(SUMMARY))
    ran = {r["budget_label"] for r in SUMMARY["leaderboard"]}
    said = set(re.findall(r"At ([\d.]+% of the cache)", text))
    assert said and said <= ran, (said, ran)          # every memory named ran, and none that did not
    best = {(d["budget"], d["task"], d["table"]): d["best"] for d in D.decisions(SUMMARY)}
    for r in SUMMARY["leaderboard"]:
        key = (r["budget_label"], r["metric"], D._table(r))
        if r.get("best") and key in best:           # each table's best, a claim's own table apart (BKV / SG.decode)
            assert best[key] == r["method"]


def test_a_paper_without_records_says_so():
    text = A.paper_answers({"run": {"profile": "quick"}})
    assert all(v == ["None of its claims has records in this run; `make report` checks them all."] for v in text.values())


def test_a_decision_names_one_tasks_measures_together():
    """"passkey (question inside, log-likelihood)" and "passkey (question inside, exact match)" topped by one method
    read as one task; a task with one measure, and a claim's own run, keep their words."""
    tasks = ["passkey (question inside, log-likelihood)", "passkey (question inside, exact match)",
             "perplexity (NLL increase)", "perplexity (perplexity)",
             "decode (relative attention error, SmolLM2 generating) in BKV.decode's run"]
    assert D._join_tasks(tasks) == ("passkey (question inside: log-likelihood, exact match) and perplexity (NLL "
                                    "increase, perplexity) and decode (relative attention error, SmolLM2 generating)"
                                    " in BKV.decode's run")
