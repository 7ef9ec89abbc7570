"""BKV.attention's t-sweep with an undefined estimate (the denominator vanished at small t: ratio inf, as the full
profile's n = 8192 run had at t = 16): the growth is fitted on the defined estimates and says how many it left out,
and no 'nan' reaches the verdict's words (the full run printed 'slope +nan [+nan,+nan]')."""
import math

from kvbounds.core import Record
from kvbounds.proofs_checks import bkv_attention


def _rec(t, ratio):
    bound = 0.36 * 16 / t
    return Record("BKV.attention", dict(d=8, delta=0.01, eps=0.5, n=8192, r=1.0, sweep="t", t=t, values="spread"), 0,
                  "numpy", ratio * bound, bound, math.isfinite(ratio), bound_kind="shape",
                  check="BalanceKV-NeurIPS shape")


def test_an_undefined_estimate_is_left_out_of_the_growth_and_said():
    recs = [_rec(16, math.inf), _rec(32, 1.04), _rec(64, 0.97), _rec(128, 0.6)]
    v = bkv_attention.summarize(recs)
    assert "nan" not in v.summary and "1 undefined estimate(s) left out of the growth fits (t = 16)" in v.summary
    assert v.rate_info is not None and math.isfinite(v.rate_info.measured_exponent)
    assert v.rate_info.tested_range == (32.0, 128.0)
