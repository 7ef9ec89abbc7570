"""No two places state different calls for the same (method, setting, control, metric): every call the committed
documents state is the one the committed docs/summary.json carries (one rule, kvbounds.verdict), read back from
the words each document prints, and evaluate's card states its evaluation.json's calls.

Places: docs/summary.json (the verdicts' ``power_calls``, the practitioner's rows), docs/RESULTS.md (each claim's
calls, one line each, metric named), README.md's "What we found" (the claims' headlines, the per-paper answers, the
practitioner's table), the html report's first table (its cells' words), and evaluation.json / evaluation.html."""
from __future__ import annotations

import html
import re
from collections import defaultdict
from pathlib import Path

import pytest

from kvbounds import claims as registry
from kvbounds.report._paper_answers import CONTROL_WORDS, STANDARD, _setting, short_variant, _claim_variant
from kvbounds.report.markdown import anchor
from kvbounds.report.summary_read import load_summary, verdicts_from_summary
from kvbounds.verdict import LABELS, SHORT_METRIC, headline_calls

ROOT = Path(__file__).resolve().parents[2]
SUMMARY, RESULTS, README = ROOT / "docs" / "summary.json", ROOT / "docs" / "RESULTS.md", ROOT / "README.md"
# a call's head as the documents print it -> the call (the tie's two readings are one call)
HEADS = {"better than": "better", "leaning better than": "leaning better", "tied with": "tied",
         "not told apart from": "tied", "leaning worse than": "leaning worse", "worse than": "worse",
         "not attainable against": "not attainable", "not tested against": "not tested"}
HEAD_RE = "|".join(sorted(map(re.escape, HEADS), key=len, reverse=True))
LABEL_OF = {v: k for k, v in LABELS.items()}


@pytest.fixture(scope="module")
def summary():
    return load_summary(SUMMARY)


@pytest.fixture(scope="module")
def verdicts(summary):
    return verdicts_from_summary(summary)


def stated(verdicts) -> dict:
    """(claim, family, control, metric) -> the call docs/summary.json carries."""
    out = {}
    for cid, v in verdicts.items():
        for c in v.power_calls or []:
            key = (cid, c["family"], c["control"], c.get("metric") or "")
            assert out.setdefault(key, c["call"]) == c["call"], f"summary.json states two calls for {key}"
    return out


def test_summary_json_states_one_call_per_comparison(verdicts):
    calls = stated(verdicts)
    assert calls, "docs/summary.json carries no call"
    assert {m for *_, m in calls} <= {"practitioner", "theorem"}        # every call names its metric


def test_results_md_states_the_summarys_calls(verdicts):
    """Each claim's section of docs/RESULTS.md lists exactly its calls, one line each, "head control (metric; family:
    numbers)", and each line's head is the call summary.json carries for that (family, control, metric)."""
    from kvbounds.verdict import call_words
    from kvbounds.report.markdown import _cell
    text = RESULTS.read_text(encoding="utf-8")
    checked = 0
    for cid, v in verdicts.items():
        if not v.power_calls:
            continue
        section = text.split(f'<a id="{anchor(cid)}"></a>', 1)[1].split('<a id="claim-', 1)[0]
        block = section.split("- **power calls**:\n", 1)[1].split("\n- **", 1)[0]
        lines = [line[4:] for line in block.splitlines() if line.startswith("  - ")]
        want = [_cell(call_words(c, metric=True)) for c in v.power_calls]
        assert sorted(lines) == sorted(want), f"{cid}: docs/RESULTS.md's calls differ from summary.json's"
        for line, c in zip(want, v.power_calls):
            head = re.match(rf"({HEAD_RE}) ", line).group(1)
            assert HEADS[head] == c["call"], (cid, line, c["call"])
            checked += 1
    assert checked == len(stated(verdicts))


def test_readme_headlines_state_the_summarys_calls(verdicts):
    """The claims' headlines (README's table, the report's cards): "head control (family: ..." clauses."""
    calls = stated(verdicts)
    readme = README.read_text(encoding="utf-8")
    checked = 0
    for cid, v in verdicts.items():
        row = next((line for line in readme.splitlines() if line.startswith(f"| [{cid}](")), None)
        if row is None or not v.power_calls:
            continue
        metric = next((k for k, w in SHORT_METRIC.items() if f"{w}: " in row), "")
        for head, control, family in re.findall(rf"(?:^|; |: )({HEAD_RE}) ([^(;|]+?) \(([^:;()]+(?:\\\|[^:;()]+)?): ",
                                                 row):
            family = family.replace("\\|", "|").replace("\\_", "_").replace("\\*", "*")
            key = (cid, family, LABEL_OF.get(control, control), metric or "theorem")
            alt = (cid, family, LABEL_OF.get(control, control), "practitioner")
            want = calls.get(key, calls.get(alt))
            assert want is not None, f"README states a call summary.json does not carry: {key}"
            assert HEADS[head] == want, f"README: {key} is {head!r}, summary.json {want!r}"
            checked += 1
    assert checked >= 10, f"only {checked} calls read from README's headlines"


def test_readme_answers_state_the_summarys_calls(verdicts, summary):
    """The per-paper answers' "variant on real keys: better than StreamingLLM and uniform sampling, mixed against
    its ablation" against the calls of that (variant, setting, control, metric) in summary.json."""
    want: dict = defaultdict(set)
    for cid, v in verdicts.items():
        algorithm = registry.CLAIMS[cid].family if cid in registry.CLAIMS else ""
        for c in headline_calls(v.power_calls or []):
            if c.get("task") or c["call"] == "not tested" or c["control"] not in STANDARD:
                continue
            fam, _, suffix = c["family"].partition(" | ")
            name = (short_variant(suffix, algorithm) if suffix else "") or _claim_variant(cid) or \
                registry.CLAIMS[cid].algorithm
            metric = "" if c.get("metric") == "practitioner" else " (theorem's metric)"
            word = c["call"] if c["call"] != "tied" or c.get("equivalent") else "not told apart"
            want[(name, _setting(fam), metric, CONTROL_WORDS[c["control"]])].add(word)
    words = {"better than": "better", "leaning better than": "leaning better", "tied with": "tied",
             "not told apart from": "not told apart", "leaning worse than": "leaning worse", "worse than": "worse",
             "not attainable against": "not attainable"}
    checked = 0
    for a in summary["papers"].values():
        for name, where, metric, phrases in re.findall(r"([\w -]+?) on (synthetic streams|real keys)( \(theorem's "
                                                       r"metric\))?: ([^;.]+)", a["answer"]):
            setting = "synthetic" if where == "synthetic streams" else "real"
            for head, controls in re.findall(rf"(?:^|, )({'|'.join(map(re.escape, words))}) (.+?)(?=, (?:{'|'.join(map(re.escape, words))}|mixed)|$)",
                                             phrases):
                for control in re.split(r", | and ", controls):
                    key = (name.strip(), setting, metric, control)
                    assert want.get(key) == {words[head]}, f"an answer says {head} {control} for {key}; " \
                                                          f"summary.json's calls: {want.get(key)}"
                    checked += 1
    assert checked, "no call read from the per-paper answers"


def test_the_practitioners_table_states_each_claims_own_call(verdicts, summary):
    """A decode or end-to-end row's call is its claim's (the same dict), never a second rule's."""
    table = summary.get("practitioner") or {}
    by = {(c.get("method"), c.get("task"), c.get("setting", "after"), c.get("budget"), c["control"]): c
          for v in verdicts.values() for c in v.power_calls or [] if c.get("task")}
    for r in table.get("rows", []):
        c = r.get("comparison")
        if not c:
            continue
        assert r["call"] == c["call"]
        if c.get("task"):
            claim = by[(c["method"], c["task"], c.get("setting", "after"), c["budget"], c["control"])]
            assert claim["call"] == r["call"] and claim["effect"] == c["effect"]


def test_the_reports_first_table_states_the_summarys_calls(verdicts):
    from kvbounds.report._power import first_table
    calls = stated(verdicts)
    t = first_table(verdicts) or {"claims": []}
    for claim in t["claims"]:
        for row in claim["rows"]:
            for cell in row["cells"]:
                if cell["text"] == "-":
                    continue
                head = re.match(rf"({HEAD_RE}) (.+?) \(", html.unescape(cell["title"]))
                assert head, cell
                call = cell["text"].rsplit(" ", 1)[0] if cell["text"][-1].isdigit() else cell["text"]
                assert HEADS[head.group(1)] == call or call in ("not tested", "not attainable"), cell
                assert call in set(calls.values()) | {"not tested"}


def test_evaluate_card_states_its_json_calls(tmp_path):
    import json
    import kvbounds
    kvbounds.evaluate("uniform", profile="smoke", out=tmp_path, workers=1, progress=False)
    data = json.loads((tmp_path / "evaluation.json").read_text())
    card = (tmp_path / "evaluation.html").read_text()
    # the card's calls table: the one rule's word, then its effect (an error ratio) and interval
    chips = re.findall(r'<span class="chip \w+" title="[^"]*">([a-z ]+)</span> <span class="note">ratio ([-\d.e+inf]+) \[',
                       card)
    got = sorted((call, float(effect)) for call, effect in chips)
    want = sorted((c["call"], float(f"{c['effect']:.3g}")) for c in data["calls"] if c["call"] != "not tested")
    assert got == want and data["calls"] and {c["metric"] for c in data["calls"]} == {"practitioner"}
