"""The ``gpu`` profile (issue 15): the scale sweeps of SB.discrepancy, MR.error and BKV.memory, run on CPU at a
reduced size here; trials too large for a CPU backend are deferred records, which the verdicts list and never
summarize."""
import random

import numpy as np
import pytest

from kvbounds.cli import main
from kvbounds.proofs_checks import bkv_memory, common, mr_error, sb_discrepancy
from kvbounds.core import DEFERRED, Record, ResultStore
from kvbounds.claims import checked_claims
from kvbounds.report._report import build_verdicts, split_deferred, summary_json
from kvbounds.run import PROFILES, profile_trials, run_checks
from kvbounds.verdict import decide_regime_rate

GPU_CLAIMS = {"SB.discrepancy", "MR.error", "BKV.memory"}


def test_gpu_profile_holds_only_the_scale_sweeps():
    assert "gpu" in PROFILES
    have = {c.id for c in checked_claims() if profile_trials(c.check_module(), "gpu")}
    assert have == GPU_CLAIMS
    assert max(p["n"] for p in sb_discrepancy.trials("gpu")) == 2 ** 17
    assert max(p["t"] for p in mr_error.trials("gpu")) == 2 ** 17
    assert max(p["n"] for p in bkv_memory.trials("gpu")) == 2 ** 20
    assert common.pick("gpu", smoke=1, quick=2, full=3) == 3 and common.pick("gpu", smoke=1, quick=2, full=3, gpu=4) == 4


@pytest.mark.parametrize("mod,params", [
    (sb_discrepancy, dict(d=2, s=1, r=1.0, q_norm=1.0, delta=0.01, reps=128, dirs=8, sweep="n-large",
                          n=2 ** 17, variant="paper c")),
    (mr_error, dict(n=2 ** 19, d=2, s=1, r=1.0, t=2 ** 17, delta=0.01, sweep="t-large", c="paper")),
    (bkv_memory, dict(n=2 ** 20, d=8, r=1.0, eps=1.0, rule="alg1", sweep="n", host=True)),
])
def test_largest_trials_are_deferred_on_cpu_backends(mod, params):
    assert params in mod.trials("gpu")
    for backend in ("numpy", "torch:cpu"):
        recs = mod.run_trial(dict(params), 0, backend)
        assert [r.check for r in recs] == [DEFERRED]
        assert "torch:cuda" in recs[0].extra["deferred"]


def test_random_signs_control_runs_at_every_size_on_cpu():
    p = dict(d=2, s=1, r=1.0, q_norm=1.0, delta=0.01, reps=4, dirs=2, sweep="n-large", n=2 ** 15,
             variant="random-signs")
    assert sb_discrepancy.run_trial(p, 0, "numpy")[0].check == "random-signs"


def _rec(check="x", backend="numpy", **params):
    return Record("MR.error", params, 0, backend, 0.0, 0.0, True, bound_kind="shape", check=check,
                  extra={"deferred": "too large"} if check == DEFERRED else {})


def test_deferred_records_stay_deferred_until_another_backend_measures_them():
    a = _rec(DEFERRED, t=128, sweep="t-large")
    b = _rec(DEFERRED, t=256, sweep="t-large")
    measured, deferred = split_deferred([a, b])
    assert measured == [] and deferred == [a, b]
    cuda = _rec("BalanceKV-NeurIPS paper c", backend="torch:cuda", t=128, sweep="t-large")
    measured, deferred = split_deferred([a, b, cuda])
    assert measured == [cuda] and deferred == [b]


def _growth_records(xs, ys, d):
    return [Record("SB.discrepancy", dict(n=x, d=d), 0, "numpy", y, 1.0, True, bound_kind="shape", check="paper c")
            for x, y in zip(xs, ys)]


def test_regime_rate_is_decided_past_half_the_onset():
    onset = lambda r: {2: 1000.0, 4: 4000.0}[r.params["d"]]
    xs = [2 ** k for k in range(4, 14)]
    # grows like sqrt(n) before the onset, flat from n*/2 on: observed (the early growth does not count)
    flat_tail = _growth_records(xs, [min(x, 500) ** 0.5 for x in xs], 2)
    rate, info, tails = decide_regime_rate(flat_tail, "n", onset=onset, stated_exponent=0.0)
    assert rate == "observed" and info.tested_range == (512.0, 8192.0) and len(tails) == 1
    grows = _growth_records(xs, [x ** 0.5 for x in xs], 2)
    assert decide_regime_rate(grows, "n", onset=onset, stated_exponent=0.0)[0] == "not-reached"
    # one group per onset; a group with a single size past n*/2 cannot decide
    both = flat_tail + _growth_records([1024, 2048], [1.0, 1.0], 4)
    assert decide_regime_rate(both, "n", onset=onset, stated_exponent=0.0)[0] == "observed"
    short = _growth_records([512, 600], [1.0, 1.0], 2)[:1] + _growth_records([64, 128], [1.0, 2.0], 2)
    assert decide_regime_rate(short, "n", onset=onset, stated_exponent=0.0) == ("n/a", None, [])
    two = _growth_records([512, 4096], [1.0, 8.0], 2)            # two sizes: a slope, no interval, no decision
    assert decide_regime_rate(two, "n", onset=onset, stated_exponent=0.0) == ("n/a", None, [])
    shuffled = list(flat_tail)
    random.Random(0).shuffle(shuffled)
    assert decide_regime_rate(shuffled, "n", onset=onset, stated_exponent=0.0)[1] == info


@pytest.fixture
def small_gpu_profile(monkeypatch):
    """The gpu profile at a reduced size: the same code paths with sizes a CPU runs in seconds."""
    monkeypatch.setattr(sb_discrepancy, "LARGE_N", [32, 64, 128, 256])
    monkeypatch.setattr(sb_discrepancy, "CPU_N_MAX", 128)
    monkeypatch.setattr(mr_error, "LARGE_T", [16, 32, 64, 128])
    monkeypatch.setattr(mr_error, "CPU_T_MAX", 64)
    monkeypatch.setattr(bkv_memory, "LARGE_N", [256, 512, 1024])
    monkeypatch.setattr(bkv_memory, "CPU_N_MAX", 512)


def test_gpu_profile_runs_on_cpu_at_reduced_size(small_gpu_profile, tmp_path, capsys):
    assert main(["check", "--profile", "gpu", "--out", str(tmp_path), "--workers", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert sorted(line.split()[0] for line in out.splitlines() if line.split()[0] in GPU_CLAIMS) == sorted(GPU_CLAIMS)
    assert out.count("deferred:") == 3
    recs = ResultStore(tmp_path).read().records
    assert {r.claim for r in recs} == GPU_CLAIMS
    v = build_verdicts(recs)
    assert "n = 256" in v["SB.discrepancy"].deferred and "t = 128" in v["MR.error"].deferred
    assert "n = 1024" in v["BKV.memory"].deferred
    # below the onsets (n* ~ 1.9e4): the rate is decided on the whole range and says where it sets in
    for cid in ("SB.discrepancy", "MR.error"):
        assert v[cid].rate in ("not-reached", "observed", "n/a") and "1.9e+04" in v[cid].summary
    assert {r.extra.get("ran_on", r.check) for r in recs if r.claim == "BKV.memory"} == {"numpy", DEFERRED}
    shuffled = list(recs)
    random.Random(1).shuffle(shuffled)
    assert summary_json(build_verdicts(shuffled)) == summary_json(v)
    # rerunning resumes: nothing recomputed, deferred trials included
    assert run_checks(sorted(GPU_CLAIMS), profile="gpu", out=tmp_path, workers=1,
                      progress=False) == []


@pytest.mark.parametrize("mod,params", [
    (sb_discrepancy, dict(d=2, s=1, r=1.0, q_norm=1.0, delta=0.01, reps=16, dirs=4, sweep="n-large", n=256,
                          variant="paper c")),
    (mr_error, dict(n=256, d=2, s=1, r=1.0, t=64, delta=0.01, sweep="t-large", c="paper")),
])
def test_gpu_profile_trials_record_the_same_on_torch(mod, params):
    """The gpu profile's code path on torch (as on torch:cuda, where these trials run): same records as numpy."""
    pytest.importorskip("torch")
    a, b = mod.run_trial(dict(params), 3, "numpy"), mod.run_trial(dict(params), 3, "torch:cpu")
    assert [r.check for r in a] == [r.check for r in b]
    for x, y in zip(a, b):
        assert x.holds == y.holds and x.measured == pytest.approx(y.measured, rel=1e-9)


def test_report_names_the_fewest_profiles_that_cover_the_records(small_gpu_profile, tmp_path):
    from kvbounds.report._meta import infer_profile
    run_checks(["MR.error"], profile="smoke", out=tmp_path, workers=1, progress=False)
    assert infer_profile(ResultStore(tmp_path).read().records) == "smoke"
    run_checks(["MR.error"], profile="gpu", out=tmp_path, workers=1, progress=False)
    assert infer_profile(ResultStore(tmp_path).read().records) == "smoke + gpu"
