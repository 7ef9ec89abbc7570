"""The committed documents come from the full profile (docs/summary.json, `make report PROFILE=full && make
results-md`); the quick profile, the smoke run of `make report`, is committed beside it (docs/summary-quick.json).
Where both decide a dimension of a claim's verdict, they must not contradict each other (issue 47): a statement that
holds in one is not false in the other, a rate observed in one is not false in the other, a proof found sound in one
has no erratum in the other, an experiment reproduced in one is not refuted in the other. Undecided values (a rate not
reached, not shown, n/a) contradict nothing."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvbounds.report.markdown import FOUND_BEGIN
from kvbounds.report.summary_read import load_summary, verdicts_from_summary

ROOT = Path(__file__).resolve().parents[2]
FULL, QUICK = ROOT / "docs" / "summary.json", ROOT / "docs" / "summary-quick.json"

# per dimension, the decided values and which pairs of them contradict each other
HOLDS = {"holds", "holds-fitted", "vacuous"}
CONTRADICT = {
    "statement": lambda a, b: "false" in (a, b) and ({a, b} - {"false"}) <= HOLDS and a != b,
    "rate": lambda a, b: {a, b} == {"observed", "false"},
    "proof": lambda a, b: {a, b} == {"sound", "errata"},
    "reproduction": lambda a, b: bool({a, b} & {"reproduced", "partial"}) and bool({a, b} & {"not-reproduced", "reversed"}),
}


def contradictions(full: dict, quick: dict) -> list[str]:
    """'CLAIM dimension: full X vs quick Y' for every dimension both verdicts decide differently."""
    out = []
    for cid in sorted(set(full) & set(quick)):
        for dim, clash in CONTRADICT.items():
            a, b = getattr(full[cid], dim), getattr(quick[cid], dim)
            if a and b and clash(a, b):
                out.append(f"{cid} {dim}: full {a} vs quick {b}")
    return out


def test_the_rule_flags_only_decided_opposites():
    from kvbounds.verdict import Verdict
    v = lambda **kw: {"X": Verdict("X", "", "", **kw)}
    assert contradictions(v(statement="false"), v(statement="holds-fitted")) == ["X statement: full false vs quick holds-fitted"]
    assert contradictions(v(rate="observed"), v(rate="false")) == ["X rate: full observed vs quick false"]
    assert contradictions(v(rate="observed"), v(rate="not-reached")) == []          # not reached decides nothing
    assert contradictions(v(statement="holds"), v(statement="holds-fitted")) == []
    assert contradictions(v(reproduction="partial"), v(reproduction="not-shown")) == []
    assert contradictions(v(reproduction="reproduced"), v(reproduction="reversed")) != []
    assert contradictions(v(proof="n/a"), v(proof="errata")) == []


def test_quick_verdicts_do_not_contradict_the_committed_full_ones():
    full, quick = load_summary(FULL), load_summary(QUICK)
    assert quick["run"]["profile"] == "quick", "docs/summary-quick.json must be the quick profile's summary"
    bad = contradictions(verdicts_from_summary(full), verdicts_from_summary(quick))
    assert not bad, ("the quick profile contradicts the committed full profile where both decide (rerun both and "
                     "look at these claims):\n" + "\n".join(bad))


def test_the_committed_documents_name_their_profile():
    profile = load_summary(FULL)["run"]["profile"]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme[readme.index(FOUND_BEGIN):]
    assert f"Rendered from the **{profile}** profile's run" in block
    assert f"profile {profile}" in (ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8")


def test_the_committed_documents_are_the_full_profile():
    profile = load_summary(FULL)["run"]["profile"]
    if profile == "quick":
        pytest.skip("docs/summary.json is still the quick profile's: the full profile's run is pending (`make report "
                    "PROFILE=full && make report && make results-md`, ~2 h on 2 cores)")
    assert profile == "full"
