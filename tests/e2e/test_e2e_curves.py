"""The end-to-end curves (kvbounds.e2e.curves) and the one paired call (kvbounds.e2e._comparisons.call), on
hand-made records whose answers are known."""
import math

import numpy as np
import pytest

from kvbounds.e2e import _comparisons as CMP
from kvbounds.e2e import curves
from kvbounds.core import Record

MODEL = "TinyModel"


def rec(task, index, method, budget, hit=True, ll=-1.0, exact_ll=-1.0, draw=0, model=MODEL, n=2048, depth=None,
        exact_hit=True):
    params = dict(task=task, n=n, index=index, model="x")
    if depth is not None:
        params["depth"] = depth
    extra = dict(task=task, model=model, method=method, budget=budget, draw=draw, error="", setting="after",
                 ll=[ll / 2, ll / 2], hit=[hit, hit], exact_ll=[exact_ll / 2, exact_ll / 2], exact_hit=[exact_hit] * 2,
                 memory_floats=int(budget * 1000), exact_floats=1000, compress_s=0.5, score_s=0.25, prefill_s=3.0)
    return Record(claim="BKV.e2e", params=params, seed=0, backend="", measured=0.0, bound=0.0, holds=True,
                  bound_kind="exact", check="t", source="s", extra=extra)


def retrieval(n_inst=20, exact_ok=20, methods=None):
    """Exact retrieves ``exact_ok`` of ``n_inst``; methods: name -> {budget: number of instances retrieved}."""
    out = []
    for i in range(n_inst):
        out.append(rec("passkey", i, "exact", 1.0, hit=i < exact_ok))
        for m, by in (methods or {}).items():
            for b, k in by.items():
                out.append(rec("passkey", i, m, b, hit=i < k))
    return out


def test_call_words():
    """The curves' calls are the one rule's (kvbounds.verdict.paired_calls, through comparisons.calls): the
    signed-rank test on per-instance differences, Holm over the family passed, a tie within the margin."""
    same = {i: 1.0 for i in range(20)}
    c = CMP.call(same, same, margin=0.1)
    assert c["call"] == "tied" and c["equivalent"]
    worse = {i: 0.0 for i in range(20)}
    assert CMP.call(worse, same, margin=0.1)["call"] == "worse"
    assert CMP.call(same, worse, margin=0.1)["call"] == "better"
    assert CMP.call({0: 1.0}, {0: 1.0}, margin=0.1)["call"] == "not tested"
    # 5 misses in 20: the signed-rank test on the 5 non-zero differences gives p = 2 / 2^5 = 0.0625: not
    # significant, no difference shown, and no equivalence either
    some = {i: float(i >= 5) for i in range(20)}
    c1 = CMP.call(some, same, margin=0.1)
    assert c1["call"] == "tied" and not c1["equivalent"] and c1["p_raw"] == 2 / 2 ** 5
    # 8 misses: p = 2 / 2^8, worse alone; leaning worse after Holm over a family of 40 (0.0078 x 40 = 0.31)
    eight = {i: float(i >= 8) for i in range(20)}
    assert CMP.call(eight, same, margin=0.1)["call"] == "worse"
    c40 = CMP.calls([(eight, same)] + [(same, same)] * 39, margin=0.1)[0]
    assert c40["call"] == "leaning worse" and c40["tests"] == 40 and c40["n"] == 20 and c40["p"] == 40 * 2 / 2 ** 8
    # equal on every instance: with scores in [0, 1], the difference is bounded by 1 - 0.025^(1/n) only
    four = {i: 0.0 for i in range(4)}
    c4 = CMP.call(four, four, margin=0.2, bounded=True)
    assert c4["call"] == "not attainable" and not c4["equivalent"]          # 4 units: 2^-3 > 0.05
    c20 = CMP.call(worse, worse, margin=0.2, bounded=True)
    assert c20["call"] == "tied" and c20["equivalent"] and c20["equivalence_ci"][1] == pytest.approx(1 - 0.025 ** (1 / 20))
    one = {i: float(i >= 1) for i in range(20)}     # one miss: neither different nor within 10 points
    c = CMP.call(one, same, margin=0.1, bounded=True)
    assert c["call"] == "tied" and not c["equivalent"] and c["equivalence_ci"][0] < -0.1     # up to 25% could be missed
    assert CMP.call(one, same, margin=0.3, bounded=True)["equivalent"]


def test_exact_scores_and_power():
    recs = retrieval(20, 19) + [rec("lines", i, "exact", 1.0, hit=i < 10) for i in range(20)]
    s = {x["task"]: x for x in curves.exact_scores(recs)}
    assert s["passkey"]["retrieved"] == 19 and s["passkey"]["powered"] and s["passkey"]["score"] == 0.95
    assert s["lines"]["retrieved"] == 10 and not s["lines"]["powered"]


def test_points_average_redraws_within_the_instance():
    recs = retrieval(4, 4)
    for i in range(4):
        recs += [rec("passkey", i, "uniform", 0.5, hit=d == 0, draw=d) for d in range(2)]    # half the draws
    p = {(x["method"], x["budget"]): x for x in curves.points(recs)}
    u = p[("uniform", 0.5)]
    assert u["instances"] == 4 and u["value"] == pytest.approx(0.5) and u["memory"] == pytest.approx(0.5)
    assert p[("exact", 1.0)]["value"] == 1.0


def test_decisions_read_the_curve():
    budgets = (0.1, 0.2, 0.35, 0.5, 0.75)
    recs = retrieval(20, 20, {"balancekv": {0.1: 2, 0.2: 5, 0.35: 12, 0.5: 20, 0.75: 20},
                              "streaming_llm": {0.1: 10, 0.2: 12, 0.35: 14, 0.5: 16, 0.75: 20},
                              "uniform": {b: 0 for b in budgets}})
    (d,) = curves.decisions(recs)
    assert d["method"] == "balancekv" and d["matches_exact"] == 0.5
    assert d["calls"][0.1]["baseline"] == "streaming_llm" and d["calls"][0.1]["call"] == "worse"
    assert d["calls"][0.75]["call"] == "tied" and d["calls"][0.75]["tests"] == len(budgets)
    assert "ties exact attention from 50% of the cache" in curves.decision_words(d)


def test_no_power_no_decision():
    recs = retrieval(20, 10, {"balancekv": {0.5: 10}, "uniform": {0.5: 0}})
    assert curves.decisions(recs) == []


def test_ppl_scores_and_depth_panels():
    recs = []
    for i in range(5):
        recs.append(rec("ppl", i, "exact", 1.0, ll=-4.0, exact_ll=-4.0))
        recs.append(rec("ppl", i, "uniform", 0.5, ll=-4.2, exact_ll=-4.0))
        recs.append(rec("niah_single", i, "exact", 1.0, depth=0.25))
    p = {(x["task"], x["method"]): x for x in curves.points(recs)}
    assert p[("ppl", "uniform")]["value"] == pytest.approx(0.1)        # NLL increase per token, lower is better
    assert p[("ppl", "uniform")]["metric"].startswith("NLL increase")
    assert ("niah_single @depth 0.25", "exact") in p
    s = {x["task"]: x for x in curves.exact_scores(recs)}
    assert s["ppl"]["score"] == pytest.approx(math.exp(2.0)) and s["ppl"]["powered"]


def test_timing_prefill_share():
    recs = retrieval(3, 3, {"uniform": {0.5: 3}})
    (t,) = curves.timing(recs)
    assert t["instances"] == 3 and t["seconds"] == pytest.approx(3.0 + 2 * 0.75)
    assert t["prefill_share"] == pytest.approx(3.0 / 4.5)


def test_report_draws_one_panel_per_task_and_model(tmp_path):
    from kvbounds.report import curves as RC
    recs = retrieval(20, 20, {"balancekv": {0.25: 2, 0.5: 20}, "streaming_llm": {0.25: 3, 0.5: 18}})
    recs += [rec("lines", i, "exact", 1.0, hit=i < 3, model="Other") for i in range(6)]
    for r in recs:
        r.params["curve"] = True
    data = RC.from_records(recs, "a test")
    assert RC.panels(data) == [("Other", "lines", 2048, "after"), (MODEL, "passkey", 2048, "after")]
    assert RC.draw(data, tmp_path / "c.png") and (tmp_path / "c.png").stat().st_size > 1000
    lines = RC.exact_lines(data)
    assert any("lines [Other, n = 2048]: 3/6 - no power" in x for x in lines)
    assert any("passkey [TinyModel, n = 2048]: 20/20" == x for x in lines)
    assert RC.decision_lines(data)[0].startswith("passkey [TinyModel, n = 2048] balancekv: ties exact attention from 50%")
    assert RC.from_records([rec("passkey", 0, "exact", 1.0)], "no curve records") is None


def test_compact_form_round_trips(tmp_path):
    import json

    from kvbounds.report import curves as RC
    from kvbounds.core import ResultStore
    recs = retrieval(3, 3, {"uniform": {0.5: 1}})
    for r in recs:
        r.params["curve"] = True
    ResultStore(tmp_path).append(recs)
    assert RC.main([str(tmp_path), str(tmp_path / "curves.json")]) == 0
    data = json.loads((tmp_path / "curves.json").read_text())
    assert data["format"] == RC.FORMAT and {p["method"] for p in data["points"]} == {"exact", "uniform"}
    assert RC.main([str(tmp_path / "missing"), str(tmp_path / "x.json")]) == 2


def test_cli_names_the_ruler_tasks_without_importing_them():
    from kvbounds.cli import _e2e as cli
    from kvbounds.e2e import ruler
    assert tuple(cli.RULER) == ruler.KINDS


def test_curve_grid_sizes():
    from kvbounds.e2e import curve_grid as G
    full = [p for c in (("ppl", "passkey") + G.RULER, ("lines",)) for p in G.trials("full", c)]
    cells: dict = {}
    for p in full:
        if p.get("depth") is None:
            key = (p["model"], p["task"], p["n"])
            cells[key] = cells.get(key, 0) + 1
            assert p["curve"] and (p["budgets"] == list(G.CURVE_BUDGETS) or not p["methods"])
    assert all(v >= 20 for k, v in cells.items() if any(p["methods"] for p in full if (p["model"], p["task"], p["n"]) == k))
    assert len(G.CURVE_BUDGETS) >= 5 and {0.25, 0.5} <= set(G.CURVE_BUDGETS)
    quick = G.trials("quick", ("passkey", "lines"))
    assert quick and all(p["n"] == 512 for p in quick)


def test_a_memory_the_method_cannot_hold_is_not_attainable():
    recs = retrieval(20, 20, {"subgen": {0.5: 20}, "uniform": {0.5: 10, 0.75: 20}})
    bad = rec("passkey", 0, "subgen", 0.75)
    bad.extra.update(error="not attainable: at this memory subgen stores 2504 entries per head", ll=None)
    del bad.extra["ll"]
    (d,) = curves.decisions(recs + [bad])
    assert d["calls"][0.75]["call"] == "not attainable" and d["calls"][0.5]["call"] == "better"
    assert "at 75%: not attainable (not attainable: at this memory subgen" in curves.decision_words(d)


def test_the_claims_verdict_says_what_the_curves_show():
    from types import SimpleNamespace

    from kvbounds.e2e._checks import add_curves
    recs = retrieval(20, 20, {"balancekv": {0.25: 5, 0.5: 20, 0.75: 20}, "streaming_llm": {0.25: 12, 0.5: 20, 0.75: 20}})
    recs += [rec("lines", i, "exact", 1.0, hit=i < 4, model="Other") for i in range(20)]
    v = SimpleNamespace(summary="head")
    add_curves(v, recs)
    assert v.summary == "head"                      # no curve records: nothing added
    for r in recs:
        r.params["curve"] = True
    add_curves(v, recs)
    assert "exact attention lines [Other, n=2048]: 4/20 (no power)" in v.summary
    assert "balancekv: ties exact attention from 50% of the cache; at 25%: worse vs streaming_llm" in v.summary
    assert "at 75%" not in v.summary


def test_readme_block_is_what_the_committed_curves_render_to():
    from pathlib import Path

    from kvbounds.report import curves as RC
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    data = RC.curves_data([])          # the committed docs/e2e_curves.json, or None
    assert RC.splice_readme(readme, RC.readme_block(data)) == readme
    with pytest.raises(ValueError, match="markers"):
        RC.splice_readme("no markers", RC.readme_block(None))


def test_readme_block_from_a_run():
    from kvbounds.report import curves as RC
    recs = retrieval(20, 20, {"balancekv": {0.25: 2, 0.5: 20, 0.75: 20}, "streaming_llm": {0.25: 14, 0.5: 18}})
    for r in recs:
        r.params["curve"] = True
    block = RC.readme_block(RC.from_records(recs, "a test"))
    assert block.startswith(RC.BEGIN) and block.endswith(RC.END)
    assert "- passkey [TinyModel, n = 2048]: 20/20" in block
    assert "balancekv: ties exact attention from 50% of the cache; at 25%: worse vs streaming_llm" in block
    assert "at 75%" not in block and "CPU s per instance" in block


def test_the_readme_block_says_each_kind_of_cell_and_folds_the_ones_without_a_call():
    """The committed curves' block: 20 instances a curve cell said as such (the cells of exact attention alone and of
    the depth sweep are smaller by design, not "a smaller run"), the decisions with no call at all folded into one
    line, and no "-0" in a number."""
    import json
    from kvbounds.report.curves import COMMITTED, readme_block
    data = json.loads(COMMITTED.read_text(encoding="utf-8"))
    assert "20 instances a curve cell" in data["provenance"] and "a smaller run" not in data["provenance"]
    block = readme_block(data)
    assert "not tested (fewer than 2 shared instances)" not in block and "pairs with no call" in block
    assert "-0 [" not in block and "[-0," not in block
