"""The trivial estimators and the power rule against them (kvbounds.battery._power_rule, issue 20)."""
import math
import random

import numpy as np
import pytest

from kvbounds.battery import power_table_lines, power_vs_controls
from kvbounds.core import Record
from kvbounds.verdict import decide


MIN_STREAMS = 10


def rec(setting, rep, method, **controls):
    return Record("X.claim", dict(family=setting, rep=rep, sweep="power"), 0, "numpy", method, min(controls.values()),
                  True, bound_kind="shape", check="trivial controls", extra=dict(controls=controls))


def synthetic(method_scale=0.1, n=MIN_STREAMS, settings=("a", "b")):
    rng = np.random.default_rng(0)
    out = []
    for s in settings:
        for i in range(n):
            z, mv = 5 + rng.random(), 0.5 + rng.random()
            out.append(rec(s, i, method_scale * mv * (1 + 0.1 * rng.random()), zeros=z, mean_values=mv))
    return out


def test_power_shown_when_method_beats_every_control():
    p = power_vs_controls(synthetic(0.1), setting=lambda r: r.params["family"])
    assert p.power == "shown" and not p.note
    assert all(c.ratio < 0.2 and c.best == "mean_values" for c in p.cells)


def test_power_low_names_the_control_and_the_setting():
    recs = synthetic(0.1, settings=("a",)) + synthetic(1.5, settings=("b",))
    p = power_vs_controls(recs, setting=lambda r: r.params["family"])
    assert p.power == "low"
    assert p.note.startswith("worse than mean of values (b: 1.") and "zeros" not in p.note.split(";")[0]
    assert [c.beaten("mean_values") for c in p.cells] == [True, False]
    assert [(c["family"], c["control"], c["call"]) for c in p.calls] == [
        ("a", "zeros", "better"), ("a", "mean_values", "better"), ("b", "zeros", "better"), ("b", "mean_values", "worse")]


def test_power_rule_is_order_independent():
    recs = synthetic(0.1) + synthetic(1.2, settings=("c",))
    a = power_vs_controls(recs, setting=lambda r: r.params["family"])
    random.Random(1).shuffle(recs)
    b = power_vs_controls(recs, setting=lambda r: r.params["family"])
    assert a.detail == b.detail and a.table() == b.table()


def test_holm_over_settings_makes_power_harder_to_show():
    # 10 streams, 9 better and one worse: raw one-sided p ~ 0.005 in each setting; with many settings Holm rejects less
    def cell(s):
        return [rec(s, i, 1.0 if i else 3.0, zeros=2.0) for i in range(MIN_STREAMS)]
    one = power_vs_controls(cell("a"), setting=lambda r: r.params["family"])
    many = power_vs_controls([r for s in "abcdefghijklmnop" for r in cell(s)], setting=lambda r: r.params["family"])
    assert one.power == "shown" and many.power == "low"


def test_too_few_units_for_any_call_is_not_attainable():
    # 4 settings x 2 controls = 8 tests; 5 units: even 5/5 wins give 8 x 2^-4 = 0.5 after Holm
    p = power_vs_controls(synthetic(0.1, n=5, settings="abcd"), setting=lambda r: r.params["family"])
    assert p.power == "low" and {c["call"] for c in p.calls} == {"not attainable"}
    assert "not attainable against zeros with 5 units (smallest p = 0.5)" in p.detail


def test_records_of_one_unit_count_once():
    # 12 seeds on each of 10 texts: 10 units, each summarised by its median, never 120
    recs = [Record("X.claim", dict(family="real", text=t, seed_index=s, sweep="power"), 0, "numpy",
                   0.5 if t < 8 else 2.0, 1.0, True, bound_kind="shape", check="trivial controls",
                   extra=dict(controls=dict(zeros=1.0))) for t in range(10) for s in range(12)]
    p = power_vs_controls(recs, setting=lambda r: r.params["family"], unit_of=lambda r: r.params["text"],
                          unit="distinct text windows")
    (c,) = p.calls
    assert c["n"] == 10 and c["wins"] == 8 and c["unit"] == "distinct text windows"
    assert p.cells[0].units == 10 and p.cells[0].streams == 120


def test_missing_family_is_reported_not_dropped():
    recs = synthetic(0.1, settings=("a",))
    recs.append(Record("X.claim", dict(family="real MiniLM", rep=0, sweep="power"), 0, "numpy", math.nan, math.nan,
                       True, bound_kind="shape", check="trivial controls", extra=dict(missing="package not installed")))
    p = power_vs_controls(recs, setting=lambda r: r.params["family"])
    assert "real MiniLM: not tested (package not installed)" in p.detail
    assert any("not tested" in line for line in power_table_lines(p.table()))


def test_old_records_without_controls_give_no_power_from_trivials():
    old = [Record("X.claim", dict(t=16), 0, "numpy", 0.1, 1.0, True, bound_kind="shape", check="shape")]
    p = power_vs_controls([], setting=lambda r: r.params["family"])
    v = decide("BKV.attention", old, trivial=p)
    assert v.power == "n/a" and "no better" not in v.headline


def test_verdict_headline_says_no_better_than_doing_nothing():
    recs = synthetic(20.0)
    p = power_vs_controls(recs, setting=lambda r: r.params["family"])
    v = decide("BKV.attention", [Record("BKV.attention", dict(t=16), 0, "numpy", 0.1, 1.0, True, bound_kind="shape")],
               trivial=p)
    assert v.power == "low" and "worse than mean of values (a: " in v.headline and "+1 more family" in v.headline
    assert v.power_table and v.power_table[0]["setting"] == "a"
    assert {(c["family"], c["control"], c["call"]) for c in v.power_calls} == {
        (f, n, "worse") for f in "ab" for n in ("zeros", "mean_values")}


def test_an_undefined_estimate_counts_against_the_method():
    recs = [rec("a", i, math.inf if i < 3 else 0.01, zeros=1.0) for i in range(MIN_STREAMS)]
    p = power_vs_controls(recs, setting=lambda r: r.params["family"])
    assert p.cells[0].streams == MIN_STREAMS and p.power == "low"


def test_a_hold_no_better_than_doing_nothing_is_not_green_in_the_glance():
    """Issue 20: the headline chip and the glance counts of a hold that a trivial estimator also earns say so."""
    from kvbounds.report._report import glance_category, tone
    from kvbounds.verdict._rules import Verdict
    v = Verdict("X.y", "", "s", statement="holds-fitted", power="low", power_note="no better than zeros (every setting)")
    assert glance_category(v) == "hold with a fitted constant, no better than doing nothing"
    assert tone("holds with fitted constant C = 1.5; no better than zeros (every setting)") == "warn"
    assert glance_category(Verdict("X.y", "", "s", statement="holds-fitted", power="shown")) == "hold with a fitted constant"


def test_vs_uniform_pairs_each_text_with_the_cell_controls_and_old_records_say_so():
    """BKV.vs-uniform's comparison with the battery (proofs_checks/bkv_trivial.py) at the unit, a text: per (text,
    layer, T) cell the variant's mean over its seeds against zeros (= 1), the mean of the values and StreamingLLM of
    the same cell; the layers of one text one unit; records without per-seed errors (stored before issue 20) give
    None."""
    from kvbounds.proofs_checks.bkv_trivial import trivial_power
    from kvbounds.core import make_record
    recs = []
    for text in range(12):
        for layer in (1, 5):
            p = dict(trace=f"smollm2:L{layer}:544", text=f"t{text}", T=2)
            u = dict(model="smollm2", unit=f"text t{text}")
            recs += [make_record("BKV.vs-uniform", p, measured=0.1, bound=0.2, check="error balance",
                                 per_seed=[0.1 + 0.001 * i for i in range(6)], **u),
                     make_record("BKV.vs-uniform", p, measured=0.9, bound=0.2, check="error mean_values", **u),
                     make_record("BKV.vs-uniform", p, measured=0.05 + 0.001 * text, bound=0.2,
                                 check="error streaming_llm", **u)]
    tp = trivial_power("BKV.vs-uniform", recs, {"balance": "pseudocode"})
    (cell,) = tp.table()
    assert cell["setting"] == "real SmolLM2 | pseudocode" and cell["streams"] == 24 and cell["units"] == 12
    assert cell["best"] == "streaming_llm" and tp.power == "low" and "worse than StreamingLLM" in tp.note
    assert cell["unit"] == "distinct texts" and {c["metric"] for c in tp.calls} == {"practitioner"}
    assert {c["n"] for c in tp.calls} == {12}
    for r in recs:
        r.extra.pop("per_seed", None)
    assert trivial_power("BKV.vs-uniform", recs, {"balance": "pseudocode"}) is None


# -- valid edge cases: a record that says what happened or an InputError naming the NaN, never a silent drop -------

def test_worst_error_refuses_a_nan_error_instead_of_dropping_it():
    from kvbounds.algorithms.validation import InputError
    from kvbounds.battery import WorstError
    w = WorstError()
    w.add("zeros", 0.25)
    w.add("zeros", math.inf)                       # an undefined estimate is the worst
    with pytest.raises(InputError, match="'zeros' is NaN"):
        w.add("zeros", math.nan)                    # max(0, nan) = 0 dropped it before
    assert w.values() == {"zeros": math.inf}


def test_power_record_with_a_control_that_could_not_run():
    from kvbounds.algorithms.validation import InputError
    from kvbounds.streams import power_record
    r = power_record("X.claim", {}, "src", 0.1, {"zeros": None, "mean_values": 0.5})   # None: could not run
    assert r.bound == 0.5 and r.holds and r.extra["controls"]["zeros"] is None
    for controls in ({}, {"zeros": None}):
        r = power_record("X.claim", {}, "src", 0.1, controls)
        assert math.isnan(r.bound) and r.holds and "no trivial control" in r.extra["no_control"]
    for bad in ({"zeros": math.nan, "mean_values": 0.5}, {"mean_values": 0.5, "zeros": math.nan}):
        with pytest.raises(InputError, match="'zeros' is NaN"):      # min() depended on the order before
            power_record("X.claim", {}, "src", 0.1, bad)
    with pytest.raises(InputError, match="measured"):
        power_record("X.claim", {}, "src", math.nan, {"zeros": 1.0})


def test_power_rule_says_what_it_left_out_as_undefined():
    recs = synthetic(0.1, settings=("a",))
    recs.append(rec("a", 99, math.nan, zeros=1.0, mean_values=1.0))
    recs.append(rec("a", 98, 0.1, zeros=math.nan, mean_values=1.0))
    p = power_vs_controls(recs, setting=lambda r: r.params["family"])
    assert "1 stream(s) with an undefined (NaN) method metric left out" in p.detail
    assert "zeros: 1 undefined (NaN) value(s) left out" in p.detail


@pytest.mark.parametrize("d", [2, 3, 4, 5, 16])
def test_concentrated_stream_keeps_its_heavy_logit_at_any_dimension(d):
    """At d <= clusters the centres spanned every direction: the heavy directions (projected orthogonal to them) were
    noise or NaN (d = 1). Now at most d - 1 clusters: each query's logit with its heavy key is GAP, with a cluster
    key only the clusters' noise along it."""
    from kvbounds.algorithms.validation import InputError
    from kvbounds.streams._power import GAP, concentrated_stream
    scale = 1 / math.sqrt(d)
    Q, K, r = concentrated_stream(np.random.default_rng(0), 200, d, scale)
    assert np.isfinite(Q).all() and np.isfinite(K).all()
    logits = K @ Q.T * scale
    heavy = np.isclose(logits, GAP).any(axis=1)             # a heavy key: logit GAP with the queries pointing at it
    assert 1 <= heavy.sum() <= 4 and np.allclose(logits.max(axis=0), GAP)
    assert logits[~heavy].max() < 0.5 * GAP
    with pytest.raises(InputError, match="d must be an integer in \\[2, "):
        concentrated_stream(np.random.default_rng(0), 200, 1, 1.0)


# -- the three-way calls (kvbounds.battery._power_calls) on constructed data
# ------------------------------------------------

def paired(ratios, setting="f", **extra):
    """Records whose method / control ratio per stream is ``ratios`` (control 1 + i/100, a spread of magnitudes)."""
    return [Record("X.claim", dict(family=setting, rep=i, sweep="power"), i, "numpy", x * (1 + i / 100), 1.0, True,
                   bound_kind="shape", check="trivial controls",
                   extra=dict(controls=dict(streaming_llm=1 + i / 100), **extra)) for i, x in enumerate(ratios)]


def one_call(recs):
    (c,) = power_vs_controls(recs, setting=lambda r: r.params["family"]).calls
    return c


def test_a_clear_win_a_clear_loss_a_tie_and_an_undecided_case():
    win = one_call(paired([0.5] * 20))
    assert win["call"] == "better" and win["wins"] == 20 and win["n"] == 20
    assert win["effect"] == pytest.approx(0.5, rel=1e-3) and win["ci"][1] < 1
    loss = one_call(paired([1.6 + 0.01 * (i % 3) for i in range(20)]))
    assert loss["call"] == "worse" and loss["wins"] == 0 and loss["ci"][0] > 1
    # a tie: ratios symmetric around 1 within 5%: no direction, the interval inside the 5% band
    tie = one_call(paired([1 + 0.05 * ((-1) ** i) * (i % 5) / 4 for i in range(20)]))
    assert tie["call"] == "tied" and tie["equivalent"]
    # undecided: 10 streams that scatter by 3x either way: tied (no difference shown), not equivalent
    few = one_call(paired([0.3, 3.0, 0.4, 2.5, 0.5, 0.6, 2.0, 0.7, 0.8, 1.5]))
    assert few["call"] == "tied" and not few["equivalent"] and few["ci"][0] < 1 < few["ci"][1]
    assert few["detectable"] > win["detectable"] >= 1


def test_call_words():
    from kvbounds.verdict import call_words
    c = one_call(paired([1.16] * 9 + [0.9] * 21))
    # 21/30 streams 10% better, 9 16% worse: the signed-rank test weighs the larger losses; no difference shown
    assert call_words(c) == "not told apart from StreamingLLM (f: 1.02 [0.9, 1.02], 21/30 wins)"
    loss = one_call(paired([1.2 + 0.001 * i for i in range(30)]))
    assert call_words(loss).startswith("worse than StreamingLLM (f: 1.2") and "0/30 wins" in call_words(loss)


def test_detectable_effect_shrinks_with_n_and_is_none_below_the_smallest_p():
    from kvbounds.verdict import detectable
    rng = np.random.default_rng(0)
    logs = rng.normal(0, 0.5, 200)
    r = [detectable(logs[:n], tests=16) for n in (10, 20, 40, 80, 160)]
    assert all(a > b for a, b in zip(r, r[1:])) and r[-1] > 0
    assert math.isnan(detectable(logs[:8], tests=16))     # 2^-8 > 0.05 / 32: no effect is detectable
    assert detectable(np.zeros(20), tests=4) == 0.0


def test_a_method_that_does_not_compress_is_not_tested():
    recs = paired([0.5] * 12, not_tested="does not compress: 5000 floats for 4096",
                  floats=dict(method=5000, stream=4096, fraction=5000 / 4096, controls={}))
    p = power_vs_controls(recs, setting=lambda r: r.params["family"])
    (c,) = p.calls
    assert c["call"] == "not tested" and "does not compress: 5000 floats for 4096" in c["reason"]
    assert p.power == "n/a" and "not tested" in p.detail
    mixed = paired([0.5] * 12, floats=dict(method=500, stream=4096, fraction=500 / 4096, controls={})) + \
        paired([0.5], "f", not_tested="does not compress: 5000 floats for 4096")
    for i, r in enumerate(mixed[-1:]):
        r.params["rep"] = 100 + i
    p = power_vs_controls(mixed, setting=lambda r: r.params["family"])
    assert p.calls[0]["call"] == "better" and "1/13 stream(s) not tested" in p.cells[0].missing
    assert p.calls[0]["fraction"] == pytest.approx(500 / 4096)


def test_the_glance_reads_the_calls():
    from kvbounds.report._report import glance_category
    from kvbounds.report._power import first_table, power_glance
    from kvbounds.verdict import Verdict
    better = dict(family="f", control="zeros", fraction=0.2, call="better", effect=0.5, ci=[0.4, 0.6], wins=20,
                  n=20, detectable=1.2, reason="", p=0.001, unit="independent streams")
    v = Verdict("X.y", "", "s", statement="holds-fitted", power="low", power_note="worse than StreamingLLM (...)",
                power_calls=[better, dict(better, control="streaming_llm", call="worse", effect=1.3)])
    assert glance_category(v) == "hold with a fitted constant"          # better than doing nothing: no suffix
    v.power_calls.append(dict(better, control="mean", call="worse", effect=2.0))
    assert glance_category(v) == "hold with a fitted constant, worse than doing nothing"
    counts = {label: n for label, n, _ in power_glance({"X.y": v})}
    assert counts["worse than StreamingLLM somewhere"] == 1 and counts["worse than doing nothing somewhere"] == 1
    t = first_table({"X.y": v})
    (row,) = t["claims"][0]["rows"]
    assert [c["text"] for c in row["cells"]] == ["worse 1.3", "-", "worse 2"] and row["fraction"] == "20%"
