"""A method replaced by the zeros estimator must come out with power ``low`` (issue 20): BKV.attention,
SG.attention and MR.error run their power sweep (kvbounds.battery._power_rule) on small synthetic streams with the
method's
estimate monkeypatched to zeros, and the verdict must call it tied with zeros."""
import numpy as np
import pytest

from kvbounds.algorithms.balance_kv import BalanceKV
from kvbounds.algorithms.merge_and_reduce import MergeAndReduce
from kvbounds.algorithms.subgen import SubGen
from kvbounds.proofs_checks import bkv_attention, mr_error, sg_attention
from kvbounds.streams import POWER_CHECK
from kvbounds.run._runner import trial_seed

FAMILIES = ("synthetic benign", "concentrated")
MIN_STREAMS = 10                 # streams (independent draws: the units) per family


def power_records(mod, base):
    recs = []
    for fam in FAMILIES:
        for i in range(MIN_STREAMS):
            p = dict(base, family=fam, rep=i, sweep="power")
            out = mod.run_trial(p, trial_seed(0, mod.CLAIM, p), "numpy")
            recs += [out] if not isinstance(out, list) else out
    assert all(r.check == POWER_CHECK and "controls" in r.extra for r in recs)
    return recs


CASES = {
    "BKV.attention": (bkv_attention, BalanceKV, "query", lambda self, q: np.zeros(self.d if hasattr(self, "d") else 8),
                      dict(n=64, d=8, r=1.0, eps=0.5, delta=0.01, values="spread", t=16)),
    "SG.attention": (sg_attention, SubGen, "query", lambda self, q: np.zeros(4),
                     dict(kind="power", n=64, d=4, m=4, delta=0.5, benign="clustered")),
    "MR.error": (mr_error, MergeAndReduce, "estimate", lambda self, q: (0.0, np.zeros(4)),
                 dict(n=64, d=8, s=4, r=1.0, t=16, delta=0.01, c="paper")),
}


@pytest.mark.parametrize("claim", sorted(CASES))
def test_zeros_in_place_of_the_method_gives_low_power(claim, monkeypatch):
    mod, cls, meth, zeros, base = CASES[claim]
    monkeypatch.setattr(cls, meth, zeros)
    recs = power_records(mod, base)
    assert all(r.measured == pytest.approx(r.extra["controls"]["zeros"]) for r in recs)
    v = mod.summarize(recs)
    assert v.power == "low", v.power_detail
    assert v.power_note and v.power_note in v.headline
    assert {c["call"] for c in v.power_calls if c["control"] == "zeros"} == {"tied"}     # equal to zeros: a tie
    assert {c["setting"] for c in v.power_table} == set(FAMILIES)


def test_a_missing_real_trace_is_reported_not_dropped(monkeypatch):
    import kvbounds.traces.real as real
    monkeypatch.setattr(real, "available", lambda model: f"{model}: package not installed (test)")
    p = dict(CASES["BKV.attention"][4], family="real MiniLM", rep=0, sweep="power", d=32)
    recs = bkv_attention.run_trial(p, 1, "numpy")
    assert len(recs) == 1 and "package not installed" in recs[0].extra["missing"]
    v = bkv_attention.summarize(recs)
    assert "real MiniLM: not tested (minilm: package not installed (test))" in v.summary
