"""Every registered check runs its smoke profile, returns well-formed records and a verdict."""
import math

import pytest

from kvbounds.core import Record
from kvbounds.claims import checked_claims
from kvbounds.run import Trial
from kvbounds.verdict._rules import Verdict

CHECKED = [c.id for c in checked_claims()]


@pytest.mark.parametrize("claim_id", CHECKED)
def test_smoke_profile(claim_id, smoke_store):
    """Each smoke trial (run once per session by ``run_checks``, conftest.SmokeStore, and read back from its store as
    the report reads it) gave well-formed records, none an error, and the claim's verdict is built from them."""
    from kvbounds.claims import get_claim
    claim = get_claim(claim_id)
    mod = claim.check_module()
    assert mod.CLAIM == claim_id
    assert claim.bound_function() is not None
    params = mod.trials("smoke")
    assert params, "smoke profile must have trials"
    errors = smoke_store.errors(claim_id)
    assert not errors, [(e.params, e.error, e.extra.get("traceback")) for e in errors]
    stored = smoke_store.records(claim_id)
    records = []
    for p in params:
        recs = [r for r in stored if r.key == Trial(claim_id, p, 0, "numpy").key]
        assert recs and all(isinstance(r, Record) and r.claim == claim_id and r.key for r in recs), p
        for r in recs:
            assert not math.isnan(r.measured) and not math.isnan(r.bound)
            assert r.extra["trial_size"] == len(recs)
        records += recs
    assert len(records) == len(stored)
    v = mod.summarize(records)
    assert isinstance(v, Verdict) and v.claim == claim_id and v.summary


def test_every_balancekv_claim_has_a_check():
    for cid in ["SBW.balance", "SBW.kernel-identity", "SB.discrepancy", "SB.cost", "MR.error", "MR.memory",
                "BKV.attention", "BKV.memory"]:
        assert cid in CHECKED
