"""The rate decided past a derived onset (kvbounds.verdict, issue 47): the exponent fitted per unit with a
t-interval over units, the power calculation of the number of units, the bend of the measured curve, and the four
outcomes (observed / false as stated / not reached with both numbers / undetermined)."""
import math
import random

import numpy as np
import pytest
from scipy import stats

from kvbounds.core import Record
from kvbounds.verdict import (GROWTH_TOL, Verdict, decide_onset_rate, finalize, flat_from, unit_fit, units_needed)


def _recs(curve, units=6, sizes=(1024, 2048, 4096, 8192, 16384), noise=0.05, seed=0):
    """Records of ratio = curve(n) times a unit's level and a little noise per (unit, size)."""
    rng = np.random.default_rng(seed)
    out = []
    for u in range(units):
        level = math.exp(rng.normal(0, 0.3))
        for n in sizes:
            out.append(Record("SB.discrepancy", dict(n=n, unit=u, d=4), 0, "numpy", curve(n) * level
                              * math.exp(rng.normal(0, noise)), 1.0, True, bound_kind="shape", check="paper c"))
    return out


def test_unit_fit_is_the_mean_of_per_unit_slopes_with_a_t_interval():
    recs = _recs(lambda n: n ** 0.5)
    fit = unit_fit(recs, "n")
    slopes = []
    for u in range(6):
        rs = [r for r in recs if r.params["unit"] == u]
        slopes.append(np.polyfit(np.log([r.params["n"] for r in rs]), np.log([r.ratio for r in rs]), 1)[0])
    half = stats.t.ppf(0.975, 5) * np.std(slopes, ddof=1) / math.sqrt(6)
    assert fit.slope == pytest.approx(np.mean(slopes)) and fit.half_width == pytest.approx(half)
    assert fit.units == 6 and fit.x_range == (1024.0, 16384.0) and fit.grows and not fit.flat
    # the level of a unit (its data draw) cancels in its slope: a large spread of levels, a narrow interval
    assert fit.half_width < 0.1
    shuffled = list(recs)
    random.Random(2).shuffle(shuffled)
    assert unit_fit(shuffled, "n") == fit                      # a function of the set of records
    assert unit_fit([r for r in recs if r.params["unit"] == 0], "n") is None     # one unit: no interval


def test_units_needed_is_the_smallest_count_with_the_half_width():
    for sd, h in ((0.15, 0.09), (0.3, 0.1), (0.05, 0.2)):
        u = units_needed(sd, h)
        assert stats.t.ppf(0.975, u - 1) * sd / math.sqrt(u) <= h
        assert u == 3 or stats.t.ppf(0.975, u - 2) * sd / math.sqrt(u - 1) > h
    assert units_needed(0.15, 0.09) == 14 and units_needed(0.0, 0.1) == 3
    with pytest.raises(ValueError):
        units_needed(0.1, 0.0)


def test_onset_rate_outcomes():
    onset = 4000.0
    flat = _recs(lambda n: min(n, 3000) ** 0.5)                # grows like random signs, then flat
    tail = [r for r in flat if r.params["n"] >= onset / 2]
    rate, info = decide_onset_rate(unit_fit(tail, "n"), stated_exponent=0.0, onset=onset, largest=16384, param="n",
                                   label="O(log n) regime")
    assert rate == "observed" and info.onset == onset and info.largest == 16384 and info.units == 6
    assert info.tested_range == (2048.0, 16384.0) and info.ci[1] <= GROWTH_TOL
    grows = _recs(lambda n: n ** 0.4)
    rate, info = decide_onset_rate(unit_fit([r for r in grows if r.params["n"] >= 2000], "n"), stated_exponent=-1.0,
                                   onset=onset, largest=16384, param="t")
    assert rate == "false" and info.measured_exponent == pytest.approx(-0.6, abs=0.05) and info.ci[0] > -1 + GROWTH_TOL
    # the onset beyond the largest size: not reached, with both numbers and the exponent over the whole range
    whole = unit_fit(grows, "n")
    rate, info = decide_onset_rate(None, stated_exponent=0.0, onset=5.5e4, largest=16384, param="n", whole=whole)
    assert rate == "not-reached" and info.onset == 5.5e4 and info.largest == 16384
    assert info.measured_exponent == pytest.approx(whole.slope)
    assert decide_onset_rate(whole, stated_exponent=0.0, onset=5.5e4, largest=16384, param="n")[0] == "not-reached"
    # past the onset but too noisy to tell: undetermined
    noisy = _recs(lambda n: n ** 0.15, units=3, noise=0.4, seed=3)
    rate, _ = decide_onset_rate(unit_fit(noisy, "n"), stated_exponent=0.0, onset=1000, largest=16384, param="n")
    assert rate == "n/a"


def test_the_measured_curve_bends_where_it_turns_flat():
    recs = _recs(lambda n: min(n, 3000) ** 0.5, sizes=(256, 512, 1024, 2048, 4096, 8192, 16384))
    x, fit = flat_from(recs, "n")
    assert x in (2048.0, 4096.0) and fit.flat
    assert flat_from(_recs(lambda n: n ** 0.5), "n") == (None, None)


def test_headline_says_the_rate_with_its_numbers():
    base = dict(statement="holds-fitted", kind="theorem")
    recs = _recs(lambda n: n ** 0.4)
    _, ri = decide_onset_rate(unit_fit(recs, "n"), stated_exponent=-1.0, onset=2000, largest=16384, param="t",
                              label="O(1/t) rate")
    v = finalize(Verdict("MR.error", "", "s", rate="false", rate_info=ri, **base))
    assert "O(1/t) rate false as stated past t* ~ 2e+03: measured t^-0.6" in v.headline and "6 units" in v.headline
    _, ri = decide_onset_rate(None, stated_exponent=0.0, onset=5.5e4, largest=2048, param="n", label="O(log) regime")
    v = finalize(Verdict("SB.discrepancy", "", "s", rate="not-reached", rate_info=ri, **base))
    assert "O(log) regime not reached: onset n* ~ 5.5e+04 beyond the largest n = 2048" in v.headline
