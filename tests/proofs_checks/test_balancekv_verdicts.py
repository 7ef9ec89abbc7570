"""The BalanceKV family under the shared verdict rules (issue 9): the vector-form walk of SBW.balance, the
GPU sweep of MR.error exercised on CPU, and verdicts that are a function of the set of records."""
import dataclasses
import json
import math
import random

import numpy as np
import pytest

from kvbounds.algorithms.self_balancing_walk import self_balancing_walk_result
from kvbounds.algorithms.arrays import why_unavailable
from kvbounds.proofs_checks import mr_error, sbw_balance
from kvbounds.claims import get_claim
from kvbounds.run import Trial, execute_trial
from kvbounds.theory.balancekv import merge_reduce_rate_onset, walk_saturation_steps

FAMILY = ["SBW.balance", "SBW.kernel-identity", "SB.discrepancy", "SB.cost", "MR.error", "MR.memory",
          "BKV.attention", "BKV.memory", "NORM.bounded"]


def test_vector_walk_is_alg3():
    """Same uniforms, same signs as the reference walk: w = sum eps_i u_i agrees, FAIL flags too."""
    rng = np.random.default_rng(3)
    U = rng.standard_normal((200, 3))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    for c in (2.0, 30 * math.log(200 / 0.01)):
        res = self_balancing_walk_result(np.broadcast_to(U, (5, 200, 3)), delta=0.01, rng=np.random.default_rng(7),
                                         r=1.0, c=c, on_fail="continue")
        w, failed, top = sbw_balance.vector_walk(U, np.random.default_rng(7).random((5, 200)), c)
        np.testing.assert_allclose(w, np.asarray(res.signs) @ U, atol=1e-9)
        assert (failed == np.asarray(res.failed)).all()
        # chunked = one pass
        w2, f2, _ = sbw_balance.vector_walk(U[100:], np.random.default_rng(7).random((5, 200))[:, 100:], c,
                                            sbw_balance.vector_walk(U[:100], np.random.default_rng(7).random((5, 200))[:, :100], c)[0])
        np.testing.assert_allclose(w2, w, atol=1e-9)


def test_walk_plateau_theory():
    assert walk_saturation_steps(0.25, 100.0, 1.0) == 200.0     # c d/2 with lam = 1/d, d = 4


def test_sbw_balance_regime_shows_power():
    """d = 2, n up to 4^7: the walk levels off at ~ sqrt(c/2), random signs cross the paper-c bound."""
    recs = [r for n in (64, 256, 1024, 4096, 16384, 65536) for v in sbw_balance.VARIANTS
            for r in execute_trial(Trial("SBW.balance", dict(n=n, d=2, delta=0.01, reps=64, dirs=8, variant=v), 0,
                                         "numpy"))]
    v = sbw_balance.summarize(recs)
    assert v.statement == "holds-fitted" and v.power == "shown" and v.rate == "observed"
    x = sbw_balance.crossover([r for r in recs if r.check == "walk c=30log"],
                              [r for r in recs if r.check == "random-signs"])
    assert 0.5 < x["n_cross"] / x["n_star_theory"] < 2


def test_mr_error_scale_sweep_runs_on_torch_cpu_at_small_size():
    if why_unavailable("torch:cpu"):
        pytest.skip("torch missing")
    p = dict(d=2, s=1, r=1.0, delta=0.01, c="paper", sweep="t-scale", runs=3, dirs=2, sizes=[16], unit=0)
    a = mr_error.run_trial(dict(p), 5, "numpy")
    b = mr_error.run_trial(dict(p), 5, "torch:cpu")
    assert [r.check for r in a] == [r.check for r in b] == ["BalanceKV-NeurIPS paper c", "random-signs"]
    assert abs(a[0].measured - b[0].measured) <= 1e-9 * max(1.0, a[0].measured)
    big = mr_error.run_trial(dict(p, sizes=[16, mr_error.CPU_T_MAX * 2]), 5, "numpy")
    assert [r.check for r in big] == ["deferred"] and "torch:cuda" in big[0].extra["deferred"]


def test_mr_error_rate_onset_is_beyond_cpu_reach():
    on = merge_reduce_rate_onset(8, 4, 1.0, 0.01)
    assert on["t_star"] > 2 ** 16 and on["gram_gb"] > 100 and on["t_top_direction"] < on["t_star"]


@pytest.fixture(scope="module")
def smoke_records(smoke_store):
    """The session's smoke records of each claim (conftest.SmokeStore: run once, shared with
    tests/proofs_checks/test_checks.py)."""
    return {cid: smoke_store.records(cid) for cid in FAMILY}


@pytest.mark.parametrize("claim_id", FAMILY)
def test_verdict_is_a_function_of_the_set_of_records(claim_id, smoke_records):
    mod = get_claim(claim_id).check_module()
    recs = smoke_records[claim_id]
    ref = json.dumps(dataclasses.asdict(mod.summarize(recs)), default=str, sort_keys=True)
    sh = recs[:]
    random.Random(2).shuffle(sh)
    v = mod.summarize(sh)
    assert json.dumps(dataclasses.asdict(v), default=str, sort_keys=True) == ref
    assert v.headline and v.statement != "false" and v.status


def test_lb_index_is_at_best_not_refuted(smoke_store):
    mod = get_claim("LB.index").check_module()
    keys = {Trial("LB.index", p, 0, "numpy").key for p in mod.trials("smoke")
            if p.get("task") in ("c3 bounds", "group ones")}
    recs = [r for r in smoke_store.records("LB.index") if r.key in keys]
    assert {r.key for r in recs} == keys
    v = mod.summarize(recs)
    assert v.statement == "not-refuted" and v.errata and all(e.where and e.what for e in v.errata)
    assert v.headline.startswith("not refuted")
