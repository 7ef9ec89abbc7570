"""Every registered check runs its smoke profile, returns well-formed records and a verdict."""
import math

import pytest

from kvbounds.records import Record
from kvbounds.registry import checked_claims
from kvbounds.runner import Trial, execute_trial
from kvbounds.verdict import Verdict

CHECKED = [c.id for c in checked_claims()]


@pytest.mark.parametrize("claim_id", CHECKED)
def test_smoke_profile(claim_id):
    from kvbounds.registry import get_claim
    claim = get_claim(claim_id)
    mod = claim.check_module()
    assert mod.CLAIM == claim_id
    assert claim.bound_function() is not None
    params = mod.trials("smoke")
    assert params, "smoke profile must have trials"
    records = []
    for p in params:
        recs = execute_trial(Trial(claim_id, p, 0, "numpy"))
        assert recs and all(isinstance(r, Record) and r.claim == claim_id and r.key for r in recs)
        for r in recs:
            assert not math.isnan(r.measured) and not math.isnan(r.bound)
            assert r.extra["trial_size"] == len(recs)
        records += recs
    v = mod.summarize(records)
    assert isinstance(v, Verdict) and v.claim == claim_id and v.summary


def test_every_balancekv_claim_has_a_check():
    for cid in ["SBW.balance", "SBW.kernel-identity", "SB.discrepancy", "SB.cost", "MR.error", "MR.memory",
                "BKV.attention", "BKV.memory"]:
        assert cid in CHECKED
