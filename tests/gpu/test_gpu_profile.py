"""The scale sweeps of SB.discrepancy, MR.error and BKV.memory (issues 15 and 47): one trial per unit (an independent
stream run at every size on its nested prefixes), in the full profile on a CPU and in the ``gpu`` profile at larger
sizes; run here at reduced sizes. A gpu-profile unit too large for a CPU backend is a deferred record, which the
verdicts list and never summarize."""
import random

import numpy as np
import pytest

from kvbounds.cli import main
from kvbounds.proofs_checks import bkv_memory, common, mr_error, sb_discrepancy
from kvbounds.core import DEFERRED, Record, ResultStore
from kvbounds.claims import checked_claims, get_claim
from kvbounds.report._report import build_verdicts, split_deferred, summary_json
from kvbounds.run import PROFILES, Trial, execute_trial, expand, profile_trials, run_checks

SCALE_CLAIMS = {"SB.discrepancy", "MR.error", "BKV.memory"}
MODS = {"SB.discrepancy": sb_discrepancy, "MR.error": mr_error, "BKV.memory": bkv_memory}


def test_gpu_profile_holds_only_the_scale_sweeps():
    assert "gpu" in PROFILES
    have = {c.id for c in checked_claims() if profile_trials(c.check_module(), "gpu")}
    assert have == SCALE_CLAIMS
    from kvbounds.theory.balancekv import rate_onset
    assert max(max(p["sizes"]) for p in sb_discrepancy.trials("gpu")) >= 4 * rate_onset(4, 1, 1.0, 0.01)
    assert max(max(p["sizes"]) for p in mr_error.trials("gpu")) >= 2 * rate_onset(8, 4, 1.0, 0.01)
    assert max(max(p["sizes"]) for p in mr_error.trials("gpu") if p["d"] == 2) >= 8 * rate_onset(2, 1, 1.0, 0.01)
    assert max(max(p["sizes"]) for p in bkv_memory.trials("gpu")) == 2 ** 20
    assert common.pick("gpu", smoke=1, quick=2, full=3) == 3 and common.pick("gpu", smoke=1, quick=2, full=3, gpu=4) == 4


def test_full_profile_holds_the_cpu_scale_sweeps_past_the_onsets():
    """SB.discrepancy to 2 n* at d = 4 (n* ~ 5.5e4) and d = 2 (n* ~ 1.9e4), n*/2 and n* among the sizes, MR.error to
    t = 2 t* at d = 2, BKV.memory to 2^17; every unit within the CPU limits (nothing deferred on a CPU); none on quick."""
    from kvbounds.theory.balancekv import rate_onset
    for cid, mod in MODS.items():
        scale = [p for p in mod.trials("full") if p["sweep"].endswith("-scale")]
        assert scale and not [p for p in mod.trials("quick") if "sizes" in p]
        assert len({p["unit"] for p in scale}) == mod.SCALE_UNITS["full"] >= 3
    for d in (2, 4):
        sizes = next(p["sizes"] for p in sb_discrepancy.trials("full") if p.get("d") == d and "sizes" in p)
        on = rate_onset(d, 1, 1.0, 0.01)
        assert 2 * on <= max(sizes) <= sb_discrepancy.CPU_N_MAX and sum(s >= on / 2 for s in sizes) >= 3
    top_t = max(max(p["sizes"]) for p in mr_error.trials("full") if "sizes" in p)
    assert 2 * rate_onset(2, 1, 1.0, 0.01) <= top_t <= mr_error.CPU_T_MAX
    assert max(max(p["sizes"]) for p in bkv_memory.trials("full") if "sizes" in p) == 2 ** 17 <= bkv_memory.CPU_N_MAX
    # the units are submitted before the other trials (long trials first)
    trials = expand([get_claim(c) for c in ("BKV.memory", "MR.error")], "full", 0, "numpy")
    first = [t.params.get("sweep", "").endswith("-scale") for t in trials]
    assert first == sorted(first, reverse=True) and any(first)


@pytest.mark.parametrize("cid", sorted(SCALE_CLAIMS))
def test_largest_units_are_deferred_on_cpu_backends(cid):
    mod = MODS[cid]
    big = max(mod.trials("gpu"), key=lambda p: max(p["sizes"]))
    for backend in ("numpy", "torch:cpu"):
        recs = mod.run_trial(dict(big), 0, backend)
        assert [r.check for r in recs] == [DEFERRED]
        assert "torch:cuda" in recs[0].extra["deferred"]


def test_deferred_records_stay_deferred_until_another_backend_measures_them():
    def rec(check="x", backend="numpy", **params):
        return Record("MR.error", params, 0, backend, 0.0, 0.0, True, bound_kind="shape", check=check,
                      extra={"deferred": "too large"} if check == DEFERRED else {})
    a = rec(DEFERRED, t=128, sizes=[64, 128], unit=0, sweep="t-scale")
    b = rec(DEFERRED, t=128, sizes=[64, 128], unit=1, sweep="t-scale")
    measured, deferred = split_deferred([a, b])
    assert measured == [] and deferred == [a, b]
    cuda = rec("BalanceKV-NeurIPS paper c", backend="torch:cuda", t=128, sizes=[64, 128], unit=0, sweep="t-scale")
    measured, deferred = split_deferred([a, b, cuda])
    assert measured == [cuda] and deferred == [b]


def _units(cid, params, units, backend="numpy"):
    mod = MODS[cid]
    return [r for u in range(units)
            for r in execute_trial(Trial(cid, dict(params, unit=u), 0, backend, mod.__name__))]


SMALL = {"SB.discrepancy": dict(d=2, s=1, r=1.0, q_norm=1.0, delta=0.01, reps=8, dirs=4, sweep="n-scale",
                                sizes=[128, 256, 512, 1024]),
         "MR.error": dict(d=2, s=1, r=1.0, delta=0.01, c="paper", sweep="t-scale", runs=8, dirs=4,
                          sizes=[32, 64, 128, 256]),
         "BKV.memory": dict(d=8, r=1.0, eps=1.0, rule="alg1", sweep="n-scale", sizes=[512, 1024, 2048])}


@pytest.mark.parametrize("cid", sorted(SCALE_CLAIMS))
def test_a_unit_measures_every_size_on_its_nested_prefixes(cid):
    recs = _units(cid, SMALL[cid], 1)
    key = "t" if cid == "MR.error" else "n"
    sizes = SMALL[cid]["sizes"]
    assert sorted({r.params[key] for r in recs}) == sizes
    assert all(r.params["sizes"] == sizes and r.params["unit"] == 0 for r in recs)
    timed = [r for r in recs if "cpu_s" in r.extra]
    assert timed and all(r.extra["cpu_s"] >= 0 and r.extra["wall_s"] > 0 for r in timed)
    if cid == "SB.discrepancy":   # the random-signs control and |C'| <= |C|/2 at every size
        assert {r.check for r in recs} == {"paper c", "random-signs", "half"} and all(r.holds for r in recs if r.check == "half")
    if cid == "MR.error":         # the fair-coin ablation at every size
        assert {r.check for r in recs} == {"BalanceKV-NeurIPS paper c", "random-signs"}


def test_sb_scale_unit_walks_the_prefixes_with_the_prefixes_of_its_coins():
    """The walk at size n of a unit is softmax_balance on the stream's first n tokens with the first n coins."""
    from kvbounds.algorithms.softmax_balance import softmax_balance
    p = dict(SMALL["SB.discrepancy"], unit=0, sizes=[64, 128])
    recs = sb_discrepancy.scale_trial(dict(p), 11, "numpy")
    rng = np.random.default_rng(11)
    K = common.unit_directions(rng, 128, 2)
    V = rng.standard_normal((128, 1))
    Q = common.unit_directions(rng, 4, 2)
    U = rng.random((8, 128))
    res = softmax_balance(K[:64], V[:64], delta=0.01, rng=None, repeats=8, on_fail="continue", uniforms=U[:, :64])
    logD = sb_discrepancy._log_discrepancies(K[:64], V[:64], Q, np.asarray(res.signs))
    rec = next(r for r in recs if r.check == "paper c" and r.params["n"] == 64)
    assert rec.measured == pytest.approx(np.exp(np.quantile(logD, 0.99)), rel=1e-12)


@pytest.fixture
def small_profiles(monkeypatch):
    """The full and gpu profiles' scale sweeps at reduced sizes: the same code paths in seconds."""
    monkeypatch.setattr(sb_discrepancy, "SCALE_SIZES", {"full": {2: [64, 128, 256]}, "gpu": {2: [64, 128, 256, 512]}})
    monkeypatch.setattr(sb_discrepancy, "SCALE_UNITS", {"full": 3, "gpu": 3})
    monkeypatch.setattr(sb_discrepancy, "SCALE_REPS", 4)
    monkeypatch.setattr(sb_discrepancy, "CPU_N_MAX", 256)
    monkeypatch.setattr(mr_error, "SCALE_SIZES", {"full": {(2, 1): [16, 32, 64]}, "gpu": {(2, 1): [16, 32, 64, 128]}})
    monkeypatch.setattr(mr_error, "SCALE_UNITS", {"full": 3, "gpu": 3})
    monkeypatch.setattr(mr_error, "CPU_T_MAX", 64)
    monkeypatch.setattr(bkv_memory, "SCALE_SIZES", {"full": [256, 512], "gpu": [256, 512, 1024]})
    monkeypatch.setattr(bkv_memory, "SCALE_UNITS", {"full": 3, "gpu": 3})
    monkeypatch.setattr(bkv_memory, "CPU_N_MAX", 512)


def test_gpu_profile_runs_on_cpu_at_reduced_size(small_profiles, tmp_path, capsys):
    assert main(["check", "--profile", "gpu", "--out", str(tmp_path), "--workers", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert sorted(line.split()[0] for line in out.splitlines() if line.split()[0] in SCALE_CLAIMS) == sorted(SCALE_CLAIMS)
    assert out.count("deferred:") == 3
    recs = ResultStore(tmp_path).read().records
    assert {r.claim for r in recs} == SCALE_CLAIMS and all(r.check == DEFERRED for r in recs)
    v = build_verdicts(recs)
    assert "n = 512" in v["SB.discrepancy"].deferred and "t = 128" in v["MR.error"].deferred
    assert "n = 1024" in v["BKV.memory"].deferred
    # rerunning resumes: nothing recomputed, deferred trials included
    assert run_checks(sorted(SCALE_CLAIMS), profile="gpu", out=tmp_path, workers=1, progress=False) == []


def test_full_profile_scale_sweeps_below_the_onsets_say_not_reached(small_profiles, tmp_path):
    """At sizes far below the onsets (n* ~ 1.9e4): not reached, with the onset and the largest size."""
    trials = [Trial(c, p, 0, "numpy", MODS[c].__name__) for c in ("SB.discrepancy", "MR.error")
              for p in MODS[c].trials("full") if "sizes" in p]
    recs = [r for t in trials for r in execute_trial(t)]
    v = build_verdicts(recs)
    for cid, largest in (("SB.discrepancy", 256), ("MR.error", 64)):
        assert v[cid].rate == "not-reached" and v[cid].rate_info.largest == largest
        assert v[cid].rate_info.onset == pytest.approx(1.9e4, rel=0.02) and "1.9e+04" in v[cid].headline
    shuffled = list(recs)
    random.Random(1).shuffle(shuffled)
    assert summary_json(build_verdicts(shuffled)) == summary_json(v)


@pytest.mark.parametrize("cid", ["SB.discrepancy", "MR.error"])
def test_scale_rate_decided_past_a_reached_onset(cid, monkeypatch):
    """With the onset moved below the sizes run (the code path past a reached onset): a decided rate, the random-signs
    control tested past it, the bend and the time per size said."""
    mod = MODS[cid]
    recs = _units(cid, SMALL[cid], 4)
    monkeypatch.setattr(mod, "_onset", lambda r: 100.0 if cid == "SB.discrepancy" else 40.0)
    v = mod.summarize(recs)
    assert v.rate in ("observed", "false", "n/a", "not-reached") and v.rate_info.units == 4
    assert v.rate_info.onset in (100.0, 40.0) and v.rate_info.largest >= v.rate_info.onset
    if v.rate == "not-reached":         # past the onset: only a curve still bending, with the size a decision needs
        assert "does not turn flat" in v.summary and v.rate_info.needed > v.rate_info.largest
    assert "random-signs vs the rate test past 0.5" in v.power_detail
    assert "time per size" in v.summary and ("flat from" in v.summary or "does not turn flat" in v.summary)


def test_bkv_memory_exponent_is_fitted_per_unit():
    recs = _units("BKV.memory", SMALL["BKV.memory"], 3)
    v = bkv_memory.summarize(recs)
    assert "floats held ~ n^" in v.summary and "3 units" in v.summary
    assert any("memory sublinear in n" in f.title or "sublinear" in f.title for f in v.findings)


@pytest.mark.parametrize("cid", ["SB.discrepancy", "MR.error"])
def test_scale_units_record_the_same_on_torch(cid):
    """The scale sweep's code path on torch (as on torch:cuda, where the gpu profile runs): same records as numpy."""
    pytest.importorskip("torch")
    p = dict(SMALL[cid], unit=0, sizes=SMALL[cid]["sizes"][:2])
    a, b = MODS[cid].run_trial(dict(p), 3, "numpy"), MODS[cid].run_trial(dict(p), 3, "torch:cpu")
    assert [r.check for r in a] == [r.check for r in b]
    for x, y in zip(a, b):
        assert x.holds == y.holds and x.measured == pytest.approx(y.measured, rel=1e-9)


def test_report_names_the_fewest_profiles_that_cover_the_records(small_profiles, tmp_path):
    from kvbounds.report._meta import infer_profile
    run_checks(["MR.error"], profile="smoke", out=tmp_path, workers=1, progress=False)
    assert infer_profile(ResultStore(tmp_path).read().records) == "smoke"
    run_checks(["MR.error"], profile="gpu", out=tmp_path, workers=1, progress=False)
    assert infer_profile(ResultStore(tmp_path).read().records) == "smoke + gpu"


def test_groups_combine_into_one_rate():
    """False anywhere is false; observed where reached and nowhere false is observed, the undetermined group named;
    undetermined where none decided; not reached where no group reached its onset."""
    from kvbounds.proofs_checks.scale_sweep import ScaleRate, combine
    from kvbounds.verdict import RateInfo
    info = lambda e, on, big: RateInfo("n", (on / 2, big), 0.0, e, (e - 0.05, e + 0.05), "set", "O(1)", onset=on,
                                       largest=big, units=10)
    obs = ScaleRate(4, 5e4, 4e3, "observed", info(0.06, 5e4, 1.1e5), "", None)
    und = ScaleRate(2, 2e4, 5e3, "n/a", info(0.11, 2e4, 4e4), "", None)
    far = ScaleRate(8, 2.5e5, 6e3, "not-reached", info(0.5, 2.5e5, 128), "", None)
    bad = ScaleRate(3, 1e4, 1e3, "false", info(0.4, 1e4, 4e4), "", None)
    rate, ri = combine([und, obs, far])
    assert rate == "observed" and ri.measured_exponent == 0.06 and "d = 2: undetermined, exponent 0.11" in ri.sets_in
    assert "d = 8: not-reached" in ri.sets_in
    assert combine([obs, bad])[0] == "false" and combine([und, far]) == ("n/a", und.info)
    assert combine([far]) == ("not-reached", far.info) and combine([]) == ("n/a", None)
