"""SUB.logit-error against the battery: the static subspace beats zeros and the mean of the keys on exactly low-rank
keys at gamma = 1; with its logits replaced by zeros, it is tied with zeros and power comes out ``low``."""
import numpy as np

from kvbounds.algorithms.subspace_attention import StaticSubspaceAttention
from kvbounds.proofs_checks import sub_logit_error
from kvbounds.proofs_checks.sub_logit_power import power_trials


def _records():
    recs = sub_logit_error.run_trial(sub_logit_error.settings("smoke")[0], 1, "numpy")   # the minimal case
    for p in power_trials("smoke"):
        if p["family"] == "low_rank":
            recs += sub_logit_error.run_trial(dict(p, streams=10), 1, "numpy")
    return recs


def test_low_rank_keys_beat_doing_nothing_at_gamma_1():
    recs = _records()
    power = [r for r in recs if "controls" in r.extra]
    assert len(power) == 20 and all(set(r.extra["controls"]) == {"zeros", "mean", "streaming_llm", "uniform", "ablation"}
                                    for r in power)
    assert all(r.extra["floats"]["fraction"] < 0.3 for r in power)
    v = sub_logit_error.summarize(recs)
    cell = next(c for c in v.power_table if c["setting"] == "low_rank | gamma=1")
    assert all(p < 0.05 for p in cell["p_adjusted"].values()) and cell["ratio"] < 0.05
    assert "better than zeros" in v.summary


def test_zeros_in_place_of_the_logits_gives_low_power(monkeypatch):
    monkeypatch.setattr(StaticSubspaceAttention, "logits", lambda self, q: np.zeros((len(q), self.n)))
    v = sub_logit_error.summarize(_records())
    assert v.power == "low" and v.power_note in v.headline
    assert {c["call"] for c in v.power_calls if c["control"] == "zeros"} == {"tied"}
