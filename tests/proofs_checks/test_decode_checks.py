"""The decode-time checks BKV.decode and SG.decode (issue 23): records and verdicts from measurement rows (cheap,
synthetic rows; the SmolLM2 smoke run of both checks is in tests/proofs_checks/test_checks.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from kvbounds.proofs_checks import bkv_decode, sg_decode
from kvbounds.proofs_checks.decode_stream import FAMILY, PROFILES, certificate_stats, trial_params
from kvbounds.proofs_checks.decode_verdict import SHAPE, build_records, summarize
from kvbounds.streams import POWER_CHECK
from kvbounds.claims import get_claim


def rows(method_err: float, layers: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for n in (160, 192, 224, 256):
        for layer in range(layers):
            heads = []
            for _ in range(3):
                e = method_err * rng.uniform(0.5, 1.5)
                heads.append(dict(err=e, units={"F": 1.0, "op": 0.5}, cert=10 * e, r=5.0, kmax=5.0, vmax=1.0,
                                  qnorm=4.0, controls={"zeros": 1.0 + rng.uniform(), "mean_values": 0.5 + rng.uniform(),
                                                       "recent": 0.3 + rng.uniform(0, .1), "uniform": 0.4}))
            out.append(dict(n=n, layer=layer, stored=96 + n % 32, d=64, heads=heads))
    return out


def generations(method_err: float, k: int, units: str = "F", **kw) -> list:
    """The records of ``k`` generations (distinct prompts: the units), each from its own rows."""
    return [r for g in range(k) for r in build_records("BKV.decode", "src", dict(trial_params("quick"), prompt_text=g),
                                                       rows(method_err, seed=g), units, lambda row, h: math.log(0.5),
                                                       unit=f"generation from text {g}", **kw)]


def test_records_and_verdict():
    rs = generations(0.01, 20)
    shape = [r for r in rs if r.check == SHAPE]
    power = [r for r in rs if r.check == POWER_CHECK]
    assert len(shape) == 20 * 48 and len(power) == 20 * 12 and all(r.params["family"] == FAMILY for r in power)
    assert all(r.bound == 0.5 and r.bound_kind == "shape" and r.extra["cert_covered"] == 3 for r in shape)
    v = summarize("BKV.decode", rs, scale_text="s", certificate_kind="a bound")
    assert v.statement == "holds-fitted" and v.fitted_constant.kind == "fitted"
    assert "covers the measured error in 2880/2880" in v.summary and v.power == "shown"
    assert "best trivial control (recent)" in v.summary
    # the unit is a generation: 20 of them, each the median over its 12 layers, on the theorem's metric
    assert {(c["n"], c["unit"], c["metric"]) for c in v.power_calls} == {
        (20, "generations from distinct prompts", "theorem")}


def test_one_generation_makes_no_call():
    """The layers of one generation are one unit: with one generation every call is not attainable."""
    v = summarize("BKV.decode", generations(0.01, 1), scale_text="s", certificate_kind="a bound")
    assert {c["call"] for c in v.power_calls} == {"not attainable"} and v.power == "low"
    assert "not attainable against uniform with 1 unit (smallest p = 1)" in v.summary


def test_the_practitioners_metric_is_the_generated_tokens_relative_error():
    out = rows(0.01)
    for row in out:
        for h in row["heads"]:
            h["exact_norm"] = 2.0
    rs = build_records("BKV.decode", "src", trial_params("quick"), out, "F", lambda row, h: math.log(0.5), unit="g")
    p = [r for r in rs if r.check == POWER_CHECK][0].extra["practitioner"]
    layer0 = [h for row in out if row["layer"] == 0 for h in row["heads"]]
    assert p["method"] == pytest.approx(np.mean([h["err"] / 2.0 for h in layer0]))
    assert p["controls"]["uniform"] == pytest.approx(0.2) and p["queries"] == len(layer0)


def test_a_scale_zeros_meets_is_vacuous_with_no_fitted_constant():
    """BKV.decode / SG.decode on SmolLM2: scales e^28..e^1027 against zeros' error <= 1 in the theorem's units."""
    rs = build_records("SG.decode", "src", trial_params("quick"), rows(0.01), "op",
                       lambda row, h: 100.0 + row["layer"], norm=lambda h: h["qnorm"] / 8)
    assert all(r.extra["r"] == 0.5 for r in rs if r.check == SHAPE)          # the query norm, as SubGen bounds it
    v = summarize("SG.decode", rs, scale_text="s", certificate_kind="an estimate")
    assert v.statement == "vacuous" and v.fitted_constant is None and v.constant is None
    assert v.headline.startswith("vacuous at these norms (scale e^10") and "zeros meets it in 48/48" in v.headline
    assert "not a fitted constant to report" in v.summary and "holds with fitted constant" not in v.headline


def test_no_better_than_a_control_is_low_power():
    rs = build_records("SG.decode", "src", trial_params("quick"), rows(2.0), "op", lambda row, h: 0.0)
    v = summarize("SG.decode", rs, scale_text="s", certificate_kind="an estimate")
    assert v.power == "low"


def test_certificate_stats_counts_vacuous_and_misses():
    row = dict(heads=[dict(err=1.0, cert=0.5, vmax=1.0), dict(err=0.1, cert=3.0, vmax=1.0)])
    s = certificate_stats([row])
    assert s == dict(heads=2, covered=1, looseness=np.median([0.5, 30.0]), vacuous=1, undefined=0)


def test_claims_registered_with_profiles():
    for mod in (bkv_decode, sg_decode):
        c = get_claim(mod.CLAIM)
        assert c.check_module() is mod and c.bound_function() is not None and c.kind == "theorem"
        full = mod.trials("full")        # 20 generations from distinct prompts (the units), one on quick
        assert len(full) == 20 and sorted(t["prompt_text"] for t in full) == list(range(20))
        assert len(mod.trials("quick")) == 1 and full[0]["prompt"] == PROFILES["full"]["prompt"]
        assert mod.trials("quick")[0]["model"] == "smollm2" and mod.trials("smoke")[0]["model"] == "tiny"


# -- valid edge cases: a record that says what happened or an InputError naming the NaN --------------------------

def test_a_generation_too_short_to_compress_is_a_record_that_says_so():
    """run_trial on a generation that ends before the press's first reduction: SG.decode raised AttributeError (the
    press has no SubGen state), BKV.decode returned no record at all."""
    p = dict(PROFILES["smoke"], prompt=16, new=4)            # target 48: never compressed
    for mod in (sg_decode, bkv_decode):
        recs = mod.run_trial(p, 0, "numpy")
        assert len(recs) == 1 and "ended before the press compressed" in recs[0].extra["missing"]
        v = mod.summarize(recs)
        assert v.statement == "not-run" and "not tested (no checkpoint measured" in v.summary


def test_all_zero_values_give_an_exact_zero_error_not_a_division_by_zero():
    from kvbounds.proofs_checks.decode_stream import head_eps
    zero = dict(err=0.0, units={"F": 0.0, "op": 0.0})
    assert head_eps(zero, "F") == 0.0                        # 0 / 0 raised ZeroDivisionError
    assert head_eps(dict(err=1e-3, units={"F": 0.0}), "F") == math.inf     # no eps meets it
    row = dict(n=64, layer=0, stored=32, d=4, heads=[dict(zero, cert=0.0, r=1.0, kmax=1.0, vmax=0.0, qnorm=1.0,
                                                         controls={"zeros": 0.0, "mean_values": 0.0})])
    rs = build_records("BKV.decode", "src", trial_params("smoke"), [row], "F", lambda row, h: 0.0)
    assert rs[0].measured == 0.0 and rs[0].extra["controls_eps"] == {"zeros": 0.0, "mean_values": 0.0}


def test_a_nan_certificate_is_counted_not_a_nan_looseness():
    from kvbounds.algorithms.validation import InputError
    from kvbounds.proofs_checks.decode_stream import head_eps
    row = dict(heads=[dict(err=0.1, cert=math.nan, vmax=1.0), dict(err=0.1, cert=0.5, vmax=1.0)])
    assert certificate_stats([row]) == dict(heads=2, covered=1, looseness=5.0, vacuous=0, undefined=1)
    rs = rows(0.01)
    rs[0]["heads"][0]["cert"] = math.nan
    recs = build_records("BKV.decode", "src", trial_params("quick"), rs, "F", lambda row, h: math.log(2.0))
    v = summarize("BKV.decode", recs, scale_text="s", certificate_kind="a bound")
    assert "undefined (NaN) in 1/144, left out" in v.summary and "certificate/error nan" not in v.summary
    with pytest.raises(InputError, match="NaN"):
        head_eps(dict(err=math.nan, units={"F": 1.0}), "F")
    rs[1]["heads"][0]["controls"]["zeros"] = math.nan
    with pytest.raises(InputError, match="'zeros' is NaN"):
        build_records("BKV.decode", "src", trial_params("quick"), rs, "F", lambda row, h: 0.0)


def test_decode_helpers_refuse_bad_input_by_name():
    from kvbounds.algorithms.validation import InputError
    from kvbounds.proofs_checks.decode_stream import head_eps
    good = rows(0.01)[:2]
    with pytest.raises(InputError, match="units"):
        build_records("BKV.decode", "src", trial_params("smoke"), good, "bogus", lambda row, h: 0.0)
    with pytest.raises(InputError, match="heads"):
        build_records("BKV.decode", "src", trial_params("smoke"), [dict(n=1, layer=0, stored=1)], "F", lambda r, h: 0.0)
    with pytest.raises(InputError, match="log of the theorem's scale"):
        build_records("BKV.decode", "src", trial_params("smoke"), good, "F", lambda row, h: None)
    with pytest.raises(InputError, match="profile"):
        trial_params("nope")
    with pytest.raises(InputError, match="units"):
        head_eps(dict(err=1.0, units={"F": 1.0}), "op")


def test_the_ablation_run_pairs_with_the_method_run_token_for_token():
    """run_forced feeds another press the tokens a run generated: with the same press it measures the same rows
    (the pairing the ablation relies on); with random halving (the ablation) the rows pair by (checkpoint, layer)
    and merge_ablation puts the ablation's eps, in the method's units, under each head's controls."""
    from kvbounds.proofs_checks.decode_stream import merge_ablation, run_forced, run_generation
    from kvbounds.presses._streaming import StreamingBalanceKVPress
    p = dict(trial_params("smoke"), new=20)
    tokens: list = []
    rows, _ = run_generation(StreamingBalanceKVPress, p, 3, tokens=tokens)
    assert rows and len(tokens) == p["prompt"] + p["new"]
    again = run_forced(StreamingBalanceKVPress, p, 3, tokens)
    assert [(r["n"], r["layer"]) for r in again] == [(r["n"], r["layer"]) for r in rows]
    assert all(a["err"] == pytest.approx(b["err"], rel=1e-9, abs=1e-12)
               for r, o in zip(rows, again) for a, b in zip(r["heads"], o["heads"]))
    coin = run_forced(StreamingBalanceKVPress, p, 3, tokens, signs="random")
    merged = merge_ablation(rows, coin, "F")
    for r, o in zip(merged, coin):
        for h, g in zip(r["heads"], o["heads"]):
            assert h["controls"]["ablation"] / h["units"]["F"] == pytest.approx(g["err"] / g["units"]["F"])
    with pytest.raises(Exception, match="signs"):
        StreamingBalanceKVPress(target=48, interval=16, sink=4, window=8, signs="greedy")


# -- vacuous at any norm, or at these norms only (kvbounds.verdict) -------------------------------------------
def test_zeros_errs_at_most_one_in_both_theorems_units():
    """What 'vacuous at any norm' compares with: returning zeros errs ||V^T p|| / (||p||_2 ||V||_op) <= 1 (SubGen's
    units) and ||V^T p|| / (||p||_2 ||V||_F) <= ||V||_op / ||V||_F <= 1 (BalanceKV's), for any softmax weights p and
    values V, with equality for a rank-one V along p: the most doing nothing can err is 1 in both."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        n, e = rng.integers(1, 30), rng.integers(1, 9)
        x = rng.standard_normal(n) * rng.uniform(0, 20)
        p = np.exp(x - x.max())
        p /= p.sum()
        V = rng.standard_normal((n, e)) * rng.uniform(0.01, 100)
        attn = np.linalg.norm(V.T @ p)
        assert attn <= np.linalg.norm(p) * np.linalg.norm(V, 2) * (1 + 1e-12)
        assert np.linalg.norm(V, 2) <= np.linalg.norm(V) * (1 + 1e-12)
    p = np.full(4, 0.25)
    V = np.outer(p, [3.0, 4.0])
    assert np.linalg.norm(V.T @ p) / (np.linalg.norm(p) * np.linalg.norm(V, 2)) == pytest.approx(1.0, rel=1e-12)


def test_sg_decode_is_vacuous_at_any_norm_on_the_quick_setting():
    """SubGen's scale sqrt(e^{2 delta r} log n / t) + sqrt(d / s) is at least its norm-free part sqrt(log n / t) +
    sqrt(d / s) (e^{2 delta r} >= 1); at the quick setting the press holds t = 1 sample per cluster and s = 20 value
    samples (target 48, sink 4, window 16, 8 clusters: a middle of 28), d = 64: sqrt(d / s) = 1.79 >= 1 alone. The
    check's own scale at delta r = 0 is that part; the verdict says 'vacuous at any norm', names the term and prints
    no rate verdict (its growth says nothing of a vacuous bound)."""
    p = PROFILES["quick"]
    middle = p["target"] - p["sink"] - p["window"]
    t = max(1, (middle // 2) // 8)
    s = middle - 8 * t
    assert (t, s) == (1, 20)
    nf = sg_decode.norm_free(224, 64, t, s)
    assert nf["terms"]["sqrt(d/s)"] == pytest.approx(math.sqrt(3.2)) and nf["terms"]["sqrt(d/s)"] > 1
    at_zero = float(np.logaddexp(0.5 * (math.log(math.log(224)) - math.log(t)), 0.5 * math.log(64 / s)))
    assert nf["log_scale"] == pytest.approx(at_zero, rel=1e-12)
    rs = build_records("SG.decode", "src", trial_params("quick"), rows(0.01), "op",
                       lambda row, h: at_zero + 2 * 0.3 * h["qnorm"], norm=lambda h: h["qnorm"] / 8,
                       norm_free=lambda row: sg_decode.norm_free(row["n"], row["d"], t, s))
    v = summarize("SG.decode", rs, scale_text="s", certificate_kind="an estimate")
    assert v.statement == "vacuous" and v.vacuity.any_norm.startswith(
        "sqrt(d/s) = 1.79 >= 1 alone, the most doing nothing errs in these units; so does sqrt(log n / t) = 2.25")
    assert v.headline.startswith("vacuous at any norm (sqrt(d/s) = 1.79 >= 1 alone") and "these norms" not in v.headline
    assert v.rate == "n/a" and v.rate_info is None and "not reached" not in v.headline
    assert "no rate verdict: the scale is vacuous" in v.summary
    assert any(f.title == "the a-priori scale is vacuous at any norm" for f in v.findings)


def test_bkv_decode_is_vacuous_at_these_norms_only():
    """BalanceKV's scale at r = 0 is sqrt(d) max(1, log2(n / M)) / M: 0.63-0.86 < 1 on the quick setting (M = 28,
    n = 128..224), so the bound is vacuous only from r* with e^{2 r*^2 / sqrt d} = 1 / that, well below the real keys'
    norms; the verdict says so, with r* beside the cells' r."""
    p = PROFILES["quick"]
    M = p["target"] - p["sink"] - p["window"]
    assert M == 28
    for n in (128, 224):
        nf = bkv_decode.norm_free(n, 64, M)
        floor = 8 * max(1.0, math.log2(n / M)) / M
        assert nf["log_scale"] == pytest.approx(math.log(floor)) and floor < 1
        r = nf["from_norm"]
        assert 0.5 * math.log(64) + 2 * r * r / 8 + math.log(max(1.0, math.log2(n / M)) / M) == pytest.approx(0.0,
                                                                                                           abs=1e-12)
    rs = build_records("BKV.decode", "src", trial_params("quick"), rows(0.01), "F",
                       lambda row, h: 0.5 * math.log(64) + 2 * h["r"] ** 2 / 8
                       + math.log(max(1.0, math.log2(row["n"] / M)) / M),
                       norm_free=lambda row: bkv_decode.norm_free(row["n"], row["d"], M))
    v = summarize("BKV.decode", rs, scale_text="s", certificate_kind="a bound")
    assert v.statement == "vacuous" and v.vacuity.any_norm == ""
    assert v.headline.startswith("vacuous at these norms (") and "; not at every norm: with every norm at 0 the " \
        "scale is at most " in v.headline
    onset = [bkv_decode.norm_free(n, 64, M)["from_norm"] for n in (160, 256)]
    assert f"it reaches 1 from r = {min(onset):.3g}..{max(onset):.3g}, and these cells' r is 5" in v.headline


def test_each_generation_reads_its_own_text():
    """Generation i's prompt is the start of the corpus's text i (distinct prompts: the units), named by its unit."""
    import types
    from kvbounds.proofs_checks.decode_stream import prompt_tokens, prompt_unit
    from kvbounds.traces.corpus import text, texts
    lm = types.SimpleNamespace(encode=lambda t: np.frombuffer(t.encode(), np.uint8).astype(np.int64))
    a, b = prompt_tokens(lm, 64, 0, 0), prompt_tokens(lm, 64, 0, 1)
    names = texts(min_chars=4 * 64)
    assert bytes(a.astype(np.uint8)) == text(names[0]).encode()[:64] and not np.array_equal(a, b)
    assert prompt_unit(dict(prompt=64, prompt_text=1), 5) == f"generation from {names[1]}"
    assert prompt_unit(dict(prompt=64), 5) == "generation (default text, seed 5)"
    with pytest.raises(Exception, match="beyond the corpus"):
        prompt_tokens(lm, 64, 0, 10**6)
