"""The one rule for "better" (kvbounds.verdict.paired_calls): the exact signed-rank test, Holm over the family,
the Hodges-Lehmann effect and interval, the practical threshold, the symmetric words, "not attainable", and calls
that do not depend on float rounding (issue 43 item 3: common scaling, the order of the units, ulps)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy import stats

from kvbounds.algorithms.validation import InputError
from kvbounds.verdict import (CALLS, Comparison, hodges_lehmann, paired_calls, per_unit, signed_rank, smallest_p)
from kvbounds.verdict import call_words, summary_words

FLIP = {"better": "worse", "worse": "better", "leaning better": "leaning worse", "leaning worse": "leaning better",
        "tied": "tied", "not attainable": "not attainable", "not tested": "not tested"}


def one(method, baseline, tests=1, **kw):
    """The call of one comparison in a family of ``tests`` identical ones (Holm over them)."""
    return paired_calls([Comparison("f", "streaming_llm", method, baseline)] * tests, **kw)[0]


@pytest.mark.parametrize("n", [1, 5, 10, 20, 30, 60])
def test_the_exact_test_is_scipys_exact_signed_rank_test_without_ties(n):
    x = np.random.default_rng(n).normal(0.3, 1, n)
    p_less, p_greater = signed_rank(x)
    assert p_less == pytest.approx(stats.wilcoxon(x, alternative="less", method="exact").pvalue, rel=1e-12)
    assert p_greater == pytest.approx(stats.wilcoxon(x, alternative="greater", method="exact").pvalue, rel=1e-12)


def test_ties_and_zeros_get_the_exact_distribution_of_the_mid_ranks():
    # |x| = 1, 1, 2 (mid-ranks 1.5, 1.5, 3) and one zero (dropped): 2^3 sign patterns, T+ over doubled ranks
    x = np.array([1.0, -1.0, 2.0, 0.0])
    p_less, p_greater = signed_rank(x)
    sums = [a * 3 + b * 3 + c * 6 for a in (0, 1) for b in (0, 1) for c in (0, 1)]   # doubled ranks 3, 3, 6
    t = 3 + 6                                  # the positive effects 1.0 and 2.0
    assert p_greater == pytest.approx(sum(s >= t for s in sums) / 8)
    assert p_less == pytest.approx(sum(s <= t for s in sums) / 8)
    assert signed_rank(np.zeros(5)) == (1.0, 1.0)


def test_the_hodges_lehmann_interval_is_the_signed_rank_tests_inversion():
    x = np.random.default_rng(1).normal(0, 1, 10)
    est, lo, hi = hodges_lehmann(x)
    w = np.sort([(x[i] + x[j]) / 2 for i in range(10) for j in range(i, 10)])
    assert est == pytest.approx(np.median(w))
    assert (lo, hi) == (w[8], w[46])          # n = 10: P(T <= 8) = 0.0244 <= 0.025 < P(T <= 9)
    # the interval excludes 0 exactly when the exact two-sided test rejects at 5% (no ties)
    for seed in range(40):
        y = np.random.default_rng(seed).normal(0.6, 1, 12)
        _, l, h = hodges_lehmann(y)
        assert (l > 0 or h < 0) == (2 * min(signed_rank(y)) < 0.05)
    assert hodges_lehmann(np.array([0.1, 0.2, 0.3]))[1:] == (-math.inf, math.inf)   # too few for any 95% interval


def test_the_issues_example_ratios_of_exactly_1_1_on_10_streams_do_not_flip_when_both_metrics_are_scaled():
    base = np.array([1 + i / 7 for i in range(10)])
    calls = []
    for k in (1.0, 7.0, 1e-3, 3.3e5):
        for perm in (np.arange(10), np.arange(10)[::-1], np.random.default_rng(0).permutation(10)):
            c = paired_calls([Comparison("f", "streaming_llm", k * 1.1 * base[perm], k * base[perm]),
                              Comparison("f", "uniform", k * base[perm], k * base[perm])])[0]
            calls.append((c.call, c.p, c.p_raw, c.wins))
    assert len(set(calls)) == 1
    call, p, p_raw, wins = calls[0]
    assert call == "worse" and wins == 0 and p_raw == 2 / 2 ** 10 and p == 2 * p_raw


finite = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(pairs=st.lists(st.tuples(finite, finite), min_size=1, max_size=25),
       ties=st.lists(st.integers(0, 24), max_size=8), k=st.sampled_from([7.0, 1e-4, 3.0e6, 0.3]),
       seed=st.integers(0, 2**32 - 1), scale=st.sampled_from(["ratio", "difference"]))
def test_a_call_is_invariant_under_common_scaling_and_permutation(pairs, ties, k, seed, scale):
    m, b = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    for i in ties:                            # exact ties: the same ratio 1.1 on several units
        if i < len(m):
            m[i] = 1.1 * b[i]
    perm = np.random.default_rng(seed).permutation(len(m))
    fam = lambda mm, bb: [Comparison("f", "streaming_llm", mm, bb), Comparison("g", "uniform", bb * 1.3, bb)]
    a = paired_calls(fam(m, b), scale=scale)[0]
    z = paired_calls(fam(k * m[perm], k * b[perm]), scale=scale)[0]
    assert (a.call, a.p, a.p_raw, a.wins, a.losses, a.n) == (z.call, z.p, z.p_raw, z.wins, z.losses, z.n)
    f = (lambda x: x) if scale == "ratio" else (lambda x: x * k)
    for x, y in zip((a.effect, *a.ci), (z.effect, *z.ci)):
        assert (math.isinf(x) and x == (y / k if scale == "difference" else y)) or \
            f(x) == pytest.approx(y, rel=1e-8, abs=1e-300)


def test_the_words_are_symmetric_swapping_the_two_sides_swaps_the_call():
    rng = np.random.default_rng(3)
    for shift, n, tests in ((0.5, 20, 1), (0.25, 20, 20), (0.02, 20, 1), (0.0, 20, 1), (1.0, 8, 40), (0.4, 12, 6)):
        m = np.exp(rng.normal(shift, 0.3, n))
        b = np.ones(n)
        c, r = one(m, b, tests), one(b, m, tests)
        assert FLIP[c.call] == r.call and c.wins == r.losses
        assert c.effect * r.effect == pytest.approx(1.0) and c.ci[0] * r.ci[1] == pytest.approx(1.0)


def test_better_leaning_tied_not_attainable_and_not_tested():
    b = np.ones(20)
    assert one(0.5 * b * np.linspace(0.9, 1.1, 20), b).call == "better"
    assert one(2.0 * b * np.linspace(0.9, 1.1, 20), b).call == "worse"
    # significant but negligible: a 1% lower error on every unit (FD.residual gaussian 0.991) is tied, not better
    small = one(0.99 * b * np.linspace(0.999, 1.001, 20), b)
    assert small.call == "tied" and small.p < 0.05 and small.equivalent
    # leaning: 15/20 units better by ~20%, significant before Holm over 30 tests, not after
    m = np.where(np.arange(20) < 15, 0.8, 1.2) * np.linspace(0.95, 1.05, 20)
    lean = one(m, b, tests=30)
    assert lean.call == "leaning better" and lean.p_raw < 0.05 <= lean.p and lean.ci[1] < 1
    assert one(b / m, b, tests=30).call == "leaning worse"
    # the issue's BKV.vs-uniform at the cell unit: 8 cells, 20 tests: 20 x 2 / 2^8 = 0.156, no call can be made
    na = one(0.5 * b[:8], b[:8], tests=20)
    assert na.call == "not attainable" and na.smallest_p == pytest.approx(20 * 2 / 2 ** 8) == smallest_p(8, 20)
    assert "not attainable against StreamingLLM with 8 units (smallest p = 0.16)" in call_words(na.as_dict())
    (nt,) = paired_calls([Comparison("f", "zeros", [], [], reason="does not compress")])
    assert nt.call == "not tested" and nt.reason == "does not compress"
    assert set(CALLS) == {"better", "leaning better", "tied", "leaning worse", "worse", "not attainable", "not tested"}


def test_holm_is_over_the_family_passed():
    b = np.ones(10)
    strong, weak = 0.5 * b * np.linspace(0.9, 1.1, 10), np.where(np.arange(10) < 8, 0.8, 1.2)
    alone = paired_calls([Comparison("f", "uniform", weak, b)])[0]
    many = paired_calls([Comparison("f", "uniform", weak, b)] + [Comparison("g", "zeros", strong, b)] * 5)[0]
    assert alone.p == alone.p_raw and many.p > alone.p and many.tests == 6


def test_scores_on_the_difference_scale_with_higher_better():
    exact = np.linspace(-5, -1, 16)
    method = exact + 0.5 + 0.01 * np.arange(16)            # higher log-likelihood: better
    c = one(method, exact, scale="difference", lower_is_better=False, threshold=0.1)
    assert c.call == "better" and c.effect == pytest.approx(0.575, abs=0.01) and c.ci[0] > 0.1 and c.wins == 16
    worse = one(exact - 0.05, exact, scale="difference", lower_is_better=False, threshold=0.1)
    assert worse.call == "tied" and worse.effect == pytest.approx(-0.05)      # below the threshold: negligible
    acc = one(np.r_[np.ones(12), np.zeros(4)], np.zeros(16), scale="difference", lower_is_better=False, tests=1)
    assert acc.call == "better" and acc.n == 16 and acc.wins == 12          # zeros dropped: the sign test on 12
    assert "+1 [" in call_words(acc.as_dict())


def test_units_seeds_are_summarised_within_a_unit():
    got = per_unit([("text 1", 1.0), ("text 1", 3.0), ("text 1", 100.0), ("text 2", 2.0)])
    assert got == {"text 1": 3.0, "text 2": 2.0}
    assert per_unit([("a", 1.0), ("a", 3.0)], how="mean") == {"a": 2.0}
    with pytest.raises(InputError, match="unit 'a'"):
        per_unit([("a", float("nan"))])


def test_the_headline_names_its_metric_and_orders_the_calls():
    b = np.ones(20)
    calls = [c.as_dict() for c in paired_calls(
        [Comparison("real", "streaming_llm", 2 * b * np.linspace(0.9, 1.1, 20), b),
         Comparison("real", "uniform", 0.5 * b * np.linspace(0.9, 1.1, 20), b)], metric="practitioner")]
    words = summary_words(calls)
    assert words.startswith("practitioner's metric: worse than StreamingLLM (real: 2")
    assert "better than uniform" in words and words.index("worse") < words.index("better than uniform")


@pytest.mark.parametrize("bad, match", [
    (dict(scale="log"), "scale must be one of"), (dict(threshold=0.5), "threshold must be >= 1.0"),
    (dict(alpha=1.5), "alpha must be in"), (dict(lower_is_better="yes"), "lower_is_better must be True or False"),
    (dict(unit=3), "unit must be a string")])
def test_bad_arguments_are_refused_by_name(bad, match):
    with pytest.raises(InputError, match=match):
        paired_calls([Comparison("f", "zeros", [1.0], [2.0])], **bad)


def test_bad_values_are_refused():
    with pytest.raises(InputError, match="paired"):
        one([1.0, 2.0], [1.0])
    with pytest.raises(InputError, match=">= 0"):
        one([-1.0], [1.0])
    with pytest.raises(InputError, match="NaN"):
        one([float("nan")], [1.0])
    with pytest.raises(InputError, match="sequence of Comparison"):
        paired_calls([("f", "zeros", [1.0], [1.0])])


def test_bounded_scores_are_never_called_equivalent_on_too_few_units():
    """0/1 scores equal on most units: the rank interval is [0, 0]; the shares of units lower / higher (their
    Clopper-Pearson upper ends) bound the difference, so 20 equal units tie within 20 points but not within 10, and
    one unit lower of 20 leaves up to 25% that could be."""
    same, one_miss = np.ones(20), np.r_[0.0, np.ones(19)]
    kw = dict(scale="difference", lower_is_better=False)
    eq = paired_calls([Comparison("f", "x", same, same, bounded=True, threshold=0.2)], **kw)[0]
    assert eq.call == "tied" and eq.equivalent and eq.equivalence_ci[1] == pytest.approx(1 - 0.025 ** (1 / 20))
    assert tuple(eq.ci) == (0.0, 0.0)                                    # the call's own interval: the rank test's
    assert not paired_calls([Comparison("f", "x", same, same, bounded=True, threshold=0.1)], **kw)[0].equivalent
    miss = paired_calls([Comparison("f", "x", one_miss, same, bounded=True, threshold=0.2)], **kw)[0]
    assert miss.call == "tied" and not miss.equivalent
    assert miss.equivalence_ci[0] == pytest.approx(-stats.beta.ppf(0.975, 2, 19))
    unbounded = paired_calls([Comparison("f", "x", one_miss, same, threshold=0.2)], **kw)[0]
    assert unbounded.equivalent                                          # the rank interval alone: [0, 0]
    from kvbounds.verdict import rule_for
    assert rule_for("passkey: exact match") == ("difference", False, 0.2, True)
    assert rule_for("decode: relative attention error") == ("ratio", True, 1.05, False)


def test_a_call_on_bounded_scores_prints_the_interval_it_was_made_on():
    """0/1 scores, the method lower on 12 of 20 units and never higher: "worse", and the interval beside it (the
    rank test's) lies below 0; the Clopper-Pearson widening, which only judges equivalence, does not reach the
    printed interval (a "worse" beside an interval reaching past 0 was the defect)."""
    from kvbounds.verdict import call_words
    method, base = np.r_[np.zeros(12), np.ones(8)], np.ones(20)
    c = paired_calls([Comparison("passkey", "StreamingLLM", method, base, bounded=True, threshold=0.2)],
                     scale="difference", lower_is_better=False)[0]
    assert c.call == "worse" and c.ci[1] < 0 and not c.equivalent
    assert c.equivalence_ci[1] > 0 >= c.ci[1]                # the widened interval reaches the zero share's bound
    assert "equivalence judged" not in call_words(c.as_dict())
