"""SG.clusterability on real caches: the real-trace trials run, and say so when a model package is missing."""
import pytest

from kvbounds.proofs_checks import sg_clusterability as check
from kvbounds.traces.real import available


def test_real_trials_are_in_the_main_profile():
    real = [p for p in check.trials("quick") if p["source"] == "real"]
    assert {p["positional"] for p in real} == {"rope", "absolute"}
    assert len({(p["model"], p["layer"], p["head"]) for p in real}) == len(real)


@pytest.mark.parametrize("model", ["smollm2", "minilm"])
def test_real_trial(model):
    params = dict(source="real", spec=f"{model}:L0:H0:128", model=model, layer=0, head=0,
                  positional=check.POSITIONAL[model], n=128)
    recs = check.run_trial(params, 0, "numpy")
    if available(model):
        assert recs[0].check == "real trace unavailable" and "unavailable" in recs[0].extra
        assert "SYNTHETIC ONLY" in check.summarize(recs).summary
    else:
        assert {r.check for r in recs} == {"radius keys vs values", "cluster growth keys"}
        assert recs[0].extra["keys"]["normalized_radius"] > 0
