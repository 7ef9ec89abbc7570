"""The per-paper answers (kvbounds.report._paper_answers) from hand-made verdicts: one paragraph of 30-200 words per
paper
group, a false claim's corrected bound and a vacuous claim named, the variant defined, the calls against the standard
controls in words, and the text a function of the verdicts (changing one changes it)."""
from __future__ import annotations

import dataclasses

from kvbounds.report._paper_answers import MAX_WORDS, MIN_WORDS, answer, paper_answers
from kvbounds.verdict._rules import Erratum, Reproduction, Vacuity, Verdict, finalize


CX = {"params": {"n": 8}, "measured": 2.0, "bound": 1.0}


def _call(family, control, call):
    return dict(family=family, control=control, fraction=0.25, call=call, effect=0.8, ci=[0.7, 0.9], wins=8,
                n=10, detectable=1.4, reason="", p=0.01, unit="independent streams", metric="practitioner")


def verdicts() -> dict[str, Verdict]:
    v = {
        "FD.residual": Verdict("FD.residual", "", "s", statement="false", corrected="||A(I-P)|| <= sqrt(s_r+1^2 + eps) "
                               "(Theorem R, proven here)", kind="lemma", counterexample=CX),
        "FD.covariance": Verdict("FD.covariance", "", "s", statement="holds", kind="theorem",
                                 power_calls=[_call("gaussian", "uniform", "better"),
                                              _call("real SmolLM2", "uniform", "worse")]),
        "SUB.cost": Verdict("SUB.cost", "", "s", statement="holds-fitted", kind="cost",
                            errata=[Erratum("Sec. 9", "a factor J missing", corrected="add J")]),
        "BKV.decode": Verdict("BKV.decode", "", "s", statement="vacuous", kind="theorem",
                              vacuity=Vacuity("vacuous at these norms", 90, 90, (103.0, 28.0, 280.0)),
                              power_calls=[_call("SmolLM2 greedy decode", "uniform", "better"),
                                           _call("SmolLM2 greedy decode", "streaming_llm", "tied")]),
        "MR.error": Verdict("MR.error", "", "s", statement="holds-fitted", rate="not-reached", kind="theorem"),
        "BKV.e2e": Verdict("BKV.e2e", "", "s", kind="empirical", statement="inconclusive", reproduction="not-reproduced",
                           reproductions=[Reproduction("pseudocode", "not-reproduced", "SmolLM2",
                                                       bound_note="evidence against: retrieves the passkey in 0/80"),
                                          Reproduction("released", "not-reproduced", "SmolLM2")]),
    }
    return {cid: finalize(x) for cid, x in v.items()}


def test_answers_bounded_and_say_what_the_verdicts_say():
    a = paper_answers(verdicts())
    assert set(a) == {"Subspace-FD-draft", "BalanceKV-NeurIPS and BalanceKV-preprint"}
    for name, entry in a.items():
        assert MIN_WORDS <= len(entry["answer"].split()) <= MAX_WORDS, entry["answer"]
        assert entry["answer"].startswith(name) and "\n" not in entry["answer"]
    fd, bkv = a["Subspace-FD-draft"], a["BalanceKV-NeurIPS and BalanceKV-preprint"]
    assert fd["claims"] == ["FD.residual", "FD.covariance", "SUB.cost"] and fd["papers"] == ["Subspace-FD-draft"]
    assert "false as stated: FD.residual (corrected: ||A(I-P)|| <= sqrt(s_r+1^2 + eps))" in fd["answer"]
    assert "SUB.cost (1)" in fd["answer"]                                  # the erratum, with its count
    assert "better than uniform sampling" in fd["answer"] and "worse than uniform sampling" in fd["answer"]
    assert "synthetic streams" in fd["answer"] and "real keys" in fd["answer"]
    assert "on the practitioner's metric" in fd["answer"] and "(theorem's metric)" not in fd["answer"]
    assert "not told apart from StreamingLLM" in bkv["answer"]          # a tie that is no equivalence, in words
    assert "vacuous at real norms: BKV.decode (doing nothing meets its bound in 90/90 cells" in bkv["answer"]
    assert "random halving" in bkv["answer"]                              # the variant, defined
    assert "departs from the paper" in bkv["answer"]                      # the streaming press, said to depart
    assert "MR.error" in bkv["answer"] and "rate not reached" in bkv["answer"]
    assert "BKV.e2e not reproduced" in bkv["answer"] and "0/80" in bkv["answer"]


def test_the_answers_state_the_practitioners_calls_where_a_claim_has_them():
    v = verdicts()
    calls = v["FD.covariance"].power_calls
    theorem = [dict(c, metric="theorem", call="tied", equivalent=True) for c in calls]
    v["FD.covariance"] = dataclasses.replace(v["FD.covariance"], power_calls=calls + theorem)
    fd = paper_answers(v)["Subspace-FD-draft"]["answer"]
    assert "better than uniform sampling" in fd and "worse than uniform sampling" in fd      # the practitioner's
    assert "tied with" not in fd                                        # never the theorem's beside them
    only = dataclasses.replace(v["FD.covariance"], power_calls=theorem)
    fd = paper_answers(dict(v, **{"FD.covariance": only}))["Subspace-FD-draft"]["answer"]
    assert "(theorem's metric): tied with uniform sampling" in fd     # a claim with no other says which metric


def test_the_words_change_when_a_verdict_changes():
    v = verdicts()
    before = paper_answers(v)
    v["FD.covariance"] = finalize(dataclasses.replace(v["FD.covariance"], statement="false", corrected="X <= 2 Y",
                                                      headline="", counterexample=CX))
    after = paper_answers(v)
    assert after["Subspace-FD-draft"]["answer"] != before["Subspace-FD-draft"]["answer"]
    assert "FD.covariance (corrected: X <= 2 Y)" in after["Subspace-FD-draft"]["answer"]
    assert after["BalanceKV-NeurIPS and BalanceKV-preprint"] == before["BalanceKV-NeurIPS and BalanceKV-preprint"]


def test_a_long_group_is_cut_to_the_limit_and_an_unrun_one_says_so():
    many = {f"X.{i}": finalize(Verdict(f"X.{i}", "", "s", statement="false", kind="lemma", counterexample=CX,
                                       corrected=" + ".join(f"term{j}" for j in range(30)))) for i in range(20)}
    assert MIN_WORDS <= len(answer("A paper", many).split()) <= MAX_WORDS
    unrun = {"FD.residual": finalize(Verdict("FD.residual", "", "s", statement="not-run", kind="lemma"))}
    text = paper_answers(unrun)["Subspace-FD-draft"]["answer"]
    assert "has records in this run" in text and MIN_WORDS <= len(text.split()) <= MAX_WORDS


def test_a_bound_vacuous_at_any_norm_is_said_so_with_its_term():
    v = verdicts()
    vac = Vacuity("vacuous at any norm (sqrt(d/s) = 1.79 >= 1 alone, ...)", 90, 90, (38.0, 10.0, 89.0),
                  any_norm="sqrt(d/s) = 1.79 >= 1 alone, the most doing nothing errs in these units; so does x")
    v["SG.decode"] = finalize(Verdict("SG.decode", "", "s", statement="vacuous", kind="theorem", vacuity=vac))
    answers = paper_answers(v)
    answer = next(a["answer"] for k, a in answers.items() if "SubGen" in k)
    assert "vacuous at any norm: SG.decode (sqrt(d/s) = 1.79 >= 1 alone, the most doing nothing errs in these " \
           "units)" in answer and "vacuous at real norms: SG.decode" not in answer
    assert dataclasses.replace(vac, any_norm="").any_norm == ""


def test_mixed_calls_say_which_direction_no_family_showed():
    """Issue 45 item 4: a variant whose calls against a control differ by family says the direction none showed
    ("the released walk: better than uniform sampling, mixed, not shown better than StreamingLLM"), symmetrically."""
    from kvbounds.report._paper_answers import _call_phrases
    by = {"uniform": ["better", "better"], "streaming_llm": ["tied", "worse", "not told apart"]}
    assert _call_phrases(by, counts=False) == "better than uniform sampling, mixed, not shown better than StreamingLLM"
    assert _call_phrases({"streaming_llm": ["tied", "better"]}, counts=True) == \
        "mixed, not shown worse than StreamingLLM (1 better, 1 tied)"
    assert _call_phrases({"streaming_llm": ["tied", "leaning better"]}, counts=False) == \
        "mixed, not shown better or worse than StreamingLLM"
    assert _call_phrases({"streaming_llm": ["worse", "better"]}, counts=False) == "mixed against StreamingLLM"
