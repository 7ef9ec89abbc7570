"""The stricter reproduction rule (issue 21) and the end-to-end comparisons it reads: instance-level units,
redraws, duplicate baselines merged, not-reproduced (bounded) vs not-shown (underpowered)."""
import numpy as np
import pytest

from kvbounds.e2e import _checks as C
from kvbounds.e2e import _comparisons as CMP
from kvbounds.core import Record
from kvbounds.verdict._rules import MIN_INSTANCES, MIN_REDRAWS, combine_reproductions, headline, reproduction_status
from kvbounds.verdict import REPRODUCTION_VALUES, Reproduction, Verdict


def test_count_rule_needs_a_quarter_of_the_cells_for_partial():
    assert reproduction_status(1, 0, 8) == "not-reproduced"          # 1/8 < 25%
    assert reproduction_status(2, 0, 8) == "partial"
    assert reproduction_status(6, 0, 8) == "reproduced"
    assert reproduction_status(1, 0, 1) == "reproduced"
    assert reproduction_status(0, 0, 8, powered=False) == "not-shown"
    # the same share for test-type cells (the caller filtered them: >= 8 instances, most redraws significant)
    assert reproduction_status(1, 0, 8, kind="test") == "not-reproduced"
    assert reproduction_status(2, 0, 8, kind="test") == "partial"
    assert "not-shown" in REPRODUCTION_VALUES
    with pytest.raises(ValueError):
        reproduction_status(1, 0, 2, kind="vibes")


def test_not_shown_is_not_evidence_against_and_headline_says_why():
    reps = [Reproduction("a", "not-shown", "s", bound_note="underpowered: smallest detectable effect 0.2 nats"),
            Reproduction("b", "not-reproduced", "s", bound_note="evidence against, effect bounded by +0.01 nats")]
    assert combine_reproductions(reps) == "not-shown"
    v = Verdict("X", "inconclusive", "", kind="empirical", reproduction="not-shown", reproductions=reps)
    assert "not shown (underpowered: smallest detectable effect 0.2 nats)" in headline(v)


def _records(gain: dict, n_inst: int, task: str = "passkey", budget: float = 0.25) -> list:
    """gain: method -> callable(instance, draw) -> log-likelihood gain over exact; redraws for 'balancekv'."""
    out = []
    for m, f in gain.items():
        for i in range(n_inst):
            for draw in range(MIN_REDRAWS if m == "balancekv" else 1):
                out.append(Record(claim="BKV.e2e", params=dict(task=task, n=512, index=i), seed=0, backend="",
                                  measured=0.0, bound=0.0, holds=True, bound_kind="exact",
                                  extra=dict(method=m, task=task, budget=budget, ll=[f(i, draw), 0.0],
                                             exact_ll=[0.0, 0.0], draw=draw)))
    return out


def test_redraws_duplicates_and_power():
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.05, (40, MIN_REDRAWS))
    base = lambda i, d: -1.0 + 0.3 * np.sin(i)
    gain = {"balancekv": lambda i, d: base(i, d) + 0.5 + noise[i, d], "uniform": base,
            "kvpress:snapkv": lambda i, d: base(i, d) - 0.1, "kvpress:pyramidkv": lambda i, d: base(i, d) - 0.1}
    recs = _records(gain, 12)
    out = C.compare(recs, {"pseudocode": "balancekv"}, ["uniform", "kvpress:snapkv", "kvpress:pyramidkv"],
                    ("passkey",))["pseudocode"]
    assert out["cells"] == 2                          # PyramidKV = SnapKV here: one comparison, counted once
    assert out["better"] == 2 and out["worse"] == 0
    assert any("counted once" in d for d in out["details"])
    # too few instances for the family: 6 instances, 2 cells: even 6/6 wins give 2 x 2^-5 = 0.0625 after Holm, so
    # no cell can be called (not attainable) and a miss is not-shown
    few = C.compare(_records(gain, MIN_INSTANCES - 2), {"pseudocode": "balancekv"}, ["uniform", "kvpress:snapkv"],
                    ("passkey",))
    assert few["pseudocode"]["better"] == 0 and not few["pseudocode"]["powered"]
    assert {c[4] for c in few["pseudocode"]["calls"]} == {"not attainable"}
    assert "underpowered" in few["pseudocode"]["note"]


def test_units_are_instances_not_tokens():
    r = Record(claim="BKV.e2e", params=dict(task="ppl", n=512, index=0), seed=0, backend="", measured=0.0, bound=0.0,
               holds=True, bound_kind="exact", extra=dict(method="uniform", task="ppl", budget=0.25,
                                                          ll=[-1.0, -2.0, -3.0], exact_ll=[0.0, 0.0, 0.0]))
    e = CMP.effects([r], "uniform", 0.25, "ppl")
    assert list(e) == [0] and list(e[0].values()) == [-2.0]   # one unit per window: the mean per token


def test_leaderboard_ranks_marks_ties_and_collapses_uninformative_tables():
    from kvbounds.e2e._leaderboard import KEYS, leaderboard_rows
    from kvbounds.report import board_table
    gain = {"balancekv": lambda i, d: -0.2 + 0.01 * np.sin(i + d), "uniform": lambda i, d: -0.2 + 0.01 * np.cos(i),
            "kvpress:snapkv": lambda i, d: -2.0 + 0.1 * np.sin(i), "exact": lambda i, d: 0.0}
    recs = _records(gain, 10)
    for r in recs:
        r.extra.update(hit=[False, False] if r.extra["method"] != "exact" else [True, True], memory_floats=100)
    rows = leaderboard_rows(recs)
    assert all(set(r) == set(KEYS) for r in rows)
    ll = sorted((r for r in rows if r["metric"] == "passkey: answer log-likelihood (nats)" and r["method"] != "exact"),
                key=lambda r: r["rank"])
    assert ll[0]["best"] and ll[-1]["method"] == "kvpress:snapkv" and not ll[-1]["tied"]
    assert ll[0]["budget_label"] == "25% of the cache" and {r["family"] for r in ll} == {"ours", "baselines", "kvpress"}
    assert ll[1]["tied"]                     # balancekv vs uniform: 0.01-sized noise, not significant
    em = [r for r in rows if r["metric"] == "passkey: exact match" and r["method"] != "exact"]
    assert len(em) == 1 and em[0]["method"] == "all methods" and "no information" in em[0]["note"]
    t = board_table(rows)
    assert t["collapsed"] and t["tables"][0]["rows"][0]["mark"] == "best"


def test_first_retrieval_budget():
    from kvbounds.e2e import first_retrieval
    recs = _records({"balancekv": lambda i, d: 0.0, "uniform": lambda i, d: 0.0}, 3, budget=0.25)
    recs += _records({"uniform": lambda i, d: 0.0}, 3, budget=0.5)
    for r in recs:
        r.extra["hit"] = [r.extra["method"] == "balancekv" or r.extra["budget"] == 0.5]
    assert first_retrieval(recs) == {"passkey": {"balancekv": 0.25, "uniform": 0.5}}


def test_papers_setting_puts_the_question_inside_the_compressed_prompt():
    import types
    from kvbounds.e2e import _tasks as tasks
    from kvbounds.e2e import profile_grid
    lm = types.SimpleNamespace(encode=lambda t: np.frombuffer(t.encode(), np.uint8).astype(np.int64))
    after, inside = tasks.passkey_task(lm, 600, 1), tasks.passkey_task(lm, 600, 1, "inside")
    q = after.meta["question_len"]
    assert np.array_equal(inside.context[-(q - 1):], after.tail[:q - 1])       # the question ends the prompt
    assert len(inside.tail) == len(after.tail) - q + 1 and np.array_equal(inside.targets, after.targets)
    grid = profile_grid("x", {"passkey": (512, 2), "ppl": (512, 2)}, settings=("after", "inside"))
    # both settings: one trial per instance (one prefill), whose records carry each setting's own params
    both = [p for p in grid if p.get("setting") == "both"]
    assert len(both) == 2 and all(p["block_size"] == 128 for p in both)
    assert not any("setting" in p for p in grid if p["task"] == "ppl")
    from kvbounds.e2e._checks import setting_params
    assert setting_params(both[0], "inside")["setting"] == "inside" and setting_params(both[0], "inside")["block_size"] == 128
    assert "setting" not in setting_params(both[0], "after") and "block_size" not in setting_params(both[0], "after")
    assert profile_grid("x", {"passkey": (512, 2)}, settings=("inside",))[0]["setting"] == "inside"


def test_leaderboard_keeps_the_papers_setting_apart():
    from kvbounds.e2e import leaderboard_rows
    after = _records({"uniform": lambda i, d: -1.0, "exact": lambda i, d: 0.0}, 3)
    inside = _records({"uniform": lambda i, d: -3.0, "exact": lambda i, d: 0.0}, 3)
    for r in after + inside:
        r.extra.update(memory_floats=10, hit=[True, True], source="kvbounds")
    for r in inside:
        r.params.update(setting="inside", block_size=128)
    rows = [r for r in leaderboard_rows(after + inside) if r["method"] == "uniform" and "log-likelihood" in r["metric"]]
    by = {r["metric"]: r for r in rows}
    assert by["passkey: answer log-likelihood (nats)"]["value"] == -1.0 and by["passkey: answer log-likelihood (nats)"]["n"] == 3
    assert by["passkey, question inside: answer log-likelihood (nats)"]["value"] == -3.0


def test_lines_exact_match_collapses_with_the_measured_reason():
    from kvbounds.e2e import leaderboard_rows
    recs = _records({"uniform": lambda i, d: -1.0, "exact": lambda i, d: 0.0}, 3, task="lines")
    for r in recs:
        r.extra.update(memory_floats=10, hit=[False, False], source="kvbounds")
    row = [r for r in leaderboard_rows(recs) if r["method"] == "all methods" and "exact match" in r["metric"]][0]
    assert "no information" in row["note"] and "cannot do line retrieval" in row["note"] and "0/8" in row["note"]


def _retrieval(n_inst: int, hit: dict, gain: dict) -> list:
    """passkey records in both settings: hit[method] answers retrieved; exact retrieves every instance."""
    recs = []
    for setting in ("after", "inside"):
        for r in _records(gain, n_inst):
            r.params["setting"] = setting
            r.extra.update(setting=setting, hit=[hit[r.extra["method"]]] * 2, exact_hit=[True, True])
            recs.append(r)
    return recs


def test_a_method_that_never_retrieves_where_exact_attention_does_is_evidence_against():
    """BKV.e2e's passkey: exact attention 16/16, BalanceKV 0/80: not reproduced (evidence against), not
    'underpowered', even where the log-likelihood cells are too noisy to tell."""
    rng = np.random.default_rng(1)
    noise = rng.normal(0, 5.0, (40, MIN_REDRAWS))
    gain = {"balancekv": lambda i, d: -3.0 + noise[i, d], "uniform": lambda i, d: -3.0 + noise[i, 0] * 0.9}
    recs = _retrieval(8, {"balancekv": False, "uniform": False}, gain)
    assert C.retrieval_counts(recs, "exact", "passkey", None) == (16, 16)
    assert C.retrieval_counts(recs, "balancekv", "passkey", 0.25) == (0, 80)
    v = C.reproduction_verdict("BKV.e2e", recs, {"pseudocode": "balancekv"}, ["uniform"], ("passkey",))
    rep = v.reproductions[0]
    assert rep.status == "not-reproduced" and rep.bound_note.startswith("evidence against: retrieves the passkey answer "
                                                                         "in 0/80 at 25% of the cache (95% CI up to 5%) where exact")
    from kvbounds.e2e import MISS_PHRASE                  # the per-paper answers read it back by this pattern
    assert MISS_PHRASE.search(rep.bound_note).groups() == ("passkey", "0/80", "25", "16", "16")
    assert "pseudocode walk at the theorem's c (= random halving): " in v.variant
    assert "exact attention retrieves the passkey answer in 16/16" in v.variant
    # a method that retrieves as often as exact attention: no such evidence
    same = _retrieval(8, {"balancekv": True, "uniform": True}, gain)
    assert C.evidence_against(same, "balancekv", ("passkey",), [0.25], []) == []


def test_cells_below_zero_in_most_cells_are_evidence_against_and_budgets_say_who_ran():
    gain = {"subgen": lambda i, d: -7.0 + 0.5 * np.sin(i + d), "uniform": lambda i, d: 0.3 * np.cos(i),
            "h2o": lambda i, d: 0.2 * np.sin(3 * i)}
    recs = [r for r in _records(gain, 8)]
    for r in recs:
        if r.extra["method"] == "subgen":
            r.extra["draw"] = 0
    recs += _records({"uniform": lambda i, d: 0.5}, 8, budget=0.5)
    out = C.compare(recs, {"subgen": "subgen"}, ["uniform", "h2o"], ("passkey",))["subgen"]
    assert [c[4] for c in out["calls"]] == ["worse", "worse"]
    assert out["against"] and out["against"][-1].startswith("worse than the baseline, its 95% interval below zero, in "
                                                             "2/2 cells")
    assert "worse than H2O, uniform sampling (passkey; 95% interval below zero" in C.calls_text(out["calls"])
    assert C.budgets_line(recs) == ("budget 0.25 of the cache's floats (every method); 0.5 for uniform sampling only "
                                    "(the sensitivity control: uniform with more floats)")


def test_a_verdict_carries_each_cells_call_for_the_practitioners_table():
    """The end-to-end verdict stores each cell's call (the one rule's dict, its task, setting, budget and method
    named), and the practitioner's table states that call for its row, never a second rule's."""
    from kvbounds.report._practitioner import practitioner_table
    gain = {"balancekv": lambda i, d: -0.2 - 0.5 * (i % 2), "uniform": lambda i, d: 0.0,
            "streaming_llm": lambda i, d: 0.1, "exact": lambda i, d: 0.0}
    recs = _records(gain, 12)
    for r in recs:
        r.extra.update(hit=[True, True], memory_floats=100)
    v = C.reproduction_verdict("BKV.e2e", recs, {"pseudocode": "balancekv"}, ["uniform", "streaming_llm"],
                               ("passkey",))
    calls = {(c["control"], c["task"], c["budget"]): c for c in v.power_calls}
    assert set(calls) == {("uniform", "passkey", 0.25), ("streaming_llm", "passkey", 0.25)}
    assert calls[("streaming_llm", "passkey", 0.25)]["call"] == "worse" and calls[("uniform", "passkey", 0.25)]["n"] == 12
    from kvbounds.e2e import leaderboard_rows
    board = [dict(r, family="ours" if r["method"] == "balancekv" else r["family"]) for r in leaderboard_rows(recs)]
    t = practitioner_table(board, {"BKV.e2e": v}, [])
    row = next(r for r in t["rows"] if r["task"].startswith("passkey: answer"))
    assert row["baseline"] == "StreamingLLM" and row["comparison"] == calls[("streaming_llm", "passkey", 0.25)]
    assert row["call"] == "worse"


def test_a_skipped_cell_has_no_value_and_its_summary_reads_back():
    """A cell the method could not run (its memory above the budget) is a row with value null, never NaN: summary.json
    has no literal for NaN, and summary_read refused the full run's 'nan' (leaderboard[548])."""
    import json
    from kvbounds.core import jsonable
    from kvbounds.e2e._leaderboard import row
    from kvbounds.report._rows import check_board_rows
    skipped = row("subgen", "kvbounds", 0.75, 0, "skipped", None, note="not attainable: more entries than tokens")
    assert skipped["value"] is None and row("x", "", 0.5, 1, "m", float("nan"))["value"] is None
    check_board_rows(json.loads(json.dumps(jsonable([skipped]))))
