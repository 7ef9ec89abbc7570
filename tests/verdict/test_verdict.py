"""The shared verdict rules (issue 9): counterexamples, rates, power, errata, order independence."""
import dataclasses
import math
import random

import pytest

from kvbounds.core import Record
from kvbounds.verdict._rules import (FAILS, HOLDS, HOLDS_FITTED, NOT_REFUTED, Constant, Control, Erratum, Reproduction,
                                     Verdict, canonical_order, controls_from_records, counterexample, decide,
                                     decide_power, decide_rate, decide_statement, finalize, growth, loglog_slope,
                                     rate_label, standard_verdict, statement_from_reproduction)


def rec(measured, bound, *, kind="a-priori", check="main", control=False, holds=None, **params):
    return Record("X", dict(params), 0, "numpy", measured, bound, measured <= bound if holds is None else holds,
                  bound_kind=kind, check=check, control=control)


def test_counterexample_makes_false_and_names_the_smallest_input():
    rs = [rec(1, 2, n=8), rec(3, 2, n=64), rec(5, 2, n=16), rec(0.5, 2, n=4)]
    v = decide("X", rs, kind="theorem")
    assert v.statement == "false" and v.status == FAILS
    assert v.counterexample["params"] == {"n": 16} and v.counterexample["violations"] == 2
    assert v.headline.startswith("false as stated")


def test_a_reading_of_an_O_with_a_chosen_constant_is_not_a_counterexample():
    r = rec(9, 1, n=8)
    r.extra["reading"] = "O~ with constant 1"
    assert counterexample([r]) is None
    assert decide_statement([r, rec(1, 2, n=8)])[0] == "holds-fitted"   # an O(.) read with a constant


def test_proof_step_failures_are_not_counterexamples():
    rs = [rec(1, 2, n=8), rec(3, 0, kind="exact", check="Lemma step", n=8)]
    assert decide_statement(rs, proof_steps={"Lemma step"})[0] == "holds"
    assert decide_statement(rs)[0] == "false"


def test_rate_seen_only_below_the_bound_is_not_reached_never_false():
    # eps_hat ~ t^-0.5 against a stated t^-1: measured/shape grows like t^0.5, every proven bound holds
    ts = [16, 32, 64, 128]
    shape = [rec(t ** -0.5, 1 / t, kind="shape", holds=True, t=t) for t in ts]
    proven = [rec(t ** -0.5, 100 * t ** -0.5, t=t) for t in ts]
    g = growth(shape, "t")[0]
    assert g.grows and abs(g.slope - 0.5) < 1e-9
    rate = decide_rate(g, stated_exponent=-1.0, sets_in="t of order d c^2")
    v = decide("X", shape + proven, rate=rate)
    assert v.rate == "not-reached" and v.statement == "holds-fitted" and v.status == HOLDS_FITTED
    assert abs(v.rate_info.measured_exponent + 0.5) < 1e-9 and v.rate_info.tested_range == (16, 128)
    assert "O(1/t) rate not reached for t <= 128" in v.headline
    flat = [rec(1 / t, 1 / t, kind="shape", t=t) for t in ts]
    assert decide_rate(growth(flat, "t")[0], stated_exponent=-1.0)[0] == "observed"


def test_passing_negative_control_makes_low_power_and_rejected_makes_shown():
    rs = [rec(1, 2, n=8), rec(1, 2, n=8, check="broken", control=True)]
    v = decide("X", rs)
    assert v.power == "low" and v.statement == "holds" and "low power" in v.headline
    rs[1] = rec(3, 2, n=8, check="broken", control=True)
    v = decide("X", rs)
    assert v.power == "shown" and v.statement == "holds"
    # a bound so loose that the control meets it too: the check passes a Control it did not reject
    assert decide_power([Control("random signs vs c-bound", rejected=False)])[0] == "low"
    assert decide_power([])[0] == "n/a"


def test_errata_never_flip_the_statement():
    rs = [rec(1, 2, n=8)]
    errata = [Erratum("Lemma 1", "off by one", {"n": 4}, "use T + 1")]
    a, b = decide("X", rs), decide("X", rs, errata=errata)
    assert a.statement == b.statement == "holds" and b.proof == "errata" and a.proof == "n/a"
    assert b.headline == "bound holds; proof has 1 erratum"
    lb = decide("X", rs, errata=errata * 6, refutable=False)
    assert lb.statement == "not-refuted" and lb.status == NOT_REFUTED
    assert lb.headline == "not refuted; proof has 6 errata"


def test_lower_bound_is_at_best_not_refuted_even_with_a_failing_record():
    assert decide_statement([rec(3, 2, n=4)], refutable=False)[0] == "not-refuted"


def test_empirical_statement_comes_from_reproduction():
    reps = [Reproduction("pseudocode", "not-reproduced", "SmolLM2-135M (n = 2048)")]
    v = decide("X", [rec(1, 2, kind="fitted", n=1)], kind="empirical", reproductions=reps)
    assert v.statement == "inconclusive" and v.reproduction == "not-reproduced"
    assert v.headline == "not reproduced on SmolLM2-135M (n = 2048)"
    assert statement_from_reproduction("reproduced") == "holds"
    assert statement_from_reproduction("reversed", same_setup=True) == "false"


def test_finalize_derives_headline_and_legacy_status_and_validates():
    v = finalize(Verdict("X", "", "s", statement="holds-fitted", fitted_constant=Constant(2.5, "fitted", spread=(1, 2))))
    assert v.status == HOLDS_FITTED and v.headline == "holds with fitted constant C = 2.5" and v.constant == 2.5
    with pytest.raises(ValueError):
        finalize(Verdict("X", "", "s", statement="false"))          # no counterexample
    with pytest.raises(ValueError):
        finalize(Verdict("X", "", "s", statement="holds", power="maybe"))
    legacy = finalize(Verdict("X", HOLDS, "s"))                       # a verdict built the old way
    assert legacy.statement == "holds" and legacy.headline == "bound holds"
    assert finalize(Verdict("X", FAILS, "s")).statement == "inconclusive"   # "fails" without a counterexample


def test_rate_label():
    assert rate_label("t", -1) == "O(1/t)" and rate_label("n", 0.5) == "O(sqrt(n))" and rate_label("n", 0) == "O(1)"


def _records_for_order_test():
    rs = []
    for i, n in enumerate([16, 32, 64, 128, 256, 512]):
        for rep in range(3):
            m = n ** 0.3 * (1 + 0.1 * ((i * 7 + rep * 3) % 5))
            rs.append(rec(m, 1.0, kind="shape", holds=True, n=n, rep=rep))
            rs.append(rec(m, 10 * m + rep, n=n, rep=rep, check="bounded"))
    rs.append(rec(5, 4, n=64, check="broken", control=True))
    return rs


def test_verdicts_are_a_function_of_the_set_of_records():
    rs = _records_for_order_test()
    ref = dataclasses.asdict(standard_verdict("X", rs, sweep="n"))
    rng = random.Random(1)
    for _ in range(5):
        sh = rs[:]
        rng.shuffle(sh)
        assert dataclasses.asdict(standard_verdict("X", sh, sweep="n")) == ref
    xs, ys = [r.params["n"] for r in rs], [r.measured for r in rs]
    perm = list(range(len(xs)))
    rng.shuffle(perm)
    assert loglog_slope(xs, ys) == loglog_slope([xs[i] for i in perm], [ys[i] for i in perm])
    slope, lo, hi = loglog_slope([8, 64], [1.0, 8.0])            # two points: a slope but no interval
    assert slope == pytest.approx(1.0) and (lo, hi) == (-math.inf, math.inf)
    assert [id(r) for r in canonical_order(rs)] == [id(r) for r in canonical_order(list(reversed(rs)))]


def test_standard_verdict_dimensions():
    v = standard_verdict("X", _records_for_order_test(), sweep="n")
    assert v.statement == "holds-fitted" and v.rate == "not-reached" and v.power == "shown"
    assert v.fitted_constant.kind == "fitted" and v.headline.startswith("holds with fitted constant")
    assert controls_from_records(_records_for_order_test())[0].rejected


def test_undetermined_rate_is_na_with_its_info():
    pts = [rec(y, 1.0, kind="shape", t=t) for t, y in [(16, 1.0), (32, 3.0), (64, 0.5), (128, 2.0)]]
    status, info = decide_rate(growth(pts, "t")[0], stated_exponent=-1.0)
    assert status == "n/a" and info is not None and info.ci[0] < -1 < info.ci[1]


def test_holm_adjust():
    from kvbounds.verdict._rules import holm_adjust
    adj = holm_adjust([0.01, 0.04, 0.03, None])
    assert adj == pytest.approx([0.04, 0.09, 0.09, 1.0])


# -- vacuous bounds: zeros meets them, so they are named, never "holds" with a fitted constant -----------------------

def _scaled(measured, log_scale, zeros, **params):
    r = rec(measured, math.exp(log_scale) if log_scale < 700 else math.inf, kind="shape", holds=True, **params)
    r.extra.update(log_scale=log_scale, controls_eps=dict(zeros=zeros))
    return r


def test_a_bound_zeros_meets_is_vacuous_and_reports_no_fitted_constant():
    rs = [_scaled(0.02, ls, 0.9, n=n) for n, ls in ((64, 28.0), (128, 103.0), (256, 800.0))]
    v = decide("X", rs, fitted=Constant(2.3e-14, "fitted"))
    assert v.statement == "vacuous" and v.fitted_constant is None and v.constant is None
    assert v.headline.startswith("vacuous at these norms (scale e^103") and "zeros meets it in 3/3 cells" in v.headline
    assert v.vacuity.zeros_meets == 3 and v.vacuity.method_constant < 1e-10 and "holds" not in v.headline


def test_a_bound_below_zeros_error_in_most_cells_is_not_vacuous():
    rs = [_scaled(0.02, math.log(0.1), 0.9, n=n) for n in (64, 128)] + [_scaled(0.02, 5.0, 0.9, n=256)]
    v = decide("X", rs, fitted=Constant(0.2, "fitted"))
    assert v.statement == "holds-fitted" and v.vacuity is None and v.headline.startswith("holds with fitted constant")
    tb = rec(0.1, 2.0, n=8)          # an a-priori bound of 2 in units where doing nothing is guaranteed <= 1
    tb.extra["trivial_bound"] = 1.0
    assert decide("X", [tb]).statement == "vacuous"
    assert decide("X", [rec(5, 2.0, n=8)] + [tb]).statement == "false"    # a counterexample stays false


@pytest.mark.parametrize("c", [3.49e-148, 2.32e-14, 9.9e-7])
def test_no_headline_holds_with_a_fitted_constant_below_1e_6(c):
    v = finalize(Verdict("X", "", "s", statement="holds-fitted", fitted_constant=Constant(c, "fitted")))
    assert "holds with fitted constant" not in v.headline and f"C = {c:.3g}, below 1e-06" in v.headline


def test_the_committed_results_say_no_hold_with_a_fitted_constant_below_1e_6():
    """README's "What we found" and docs/RESULTS.md are generated from the records: a fitted constant below 1e-6
    means a scale so loose that zeros meets it, never "holds with fitted constant"."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    for name in ("README.md", "docs/RESULTS.md"):
        text = (root / name).read_text(encoding="utf-8")
        tiny = [m.group(0) for m in re.finditer(r"holds with fitted constant C = ([0-9.]+(?:e[-+]?\d+)?)", text)
                if float(m.group(1)) < 1e-6]
        assert not tiny, (name, tiny)
