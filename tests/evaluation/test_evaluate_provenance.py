"""issue 50: results that follow the code (records keyed on the method's source, the stream set's code and the
packages' versions; --force), the card a reviewer acts on (verdict first, levels with intervals, calls whose words
agree with their intervals, real keys first, a plot, versions and stream sizes), evaluate --e2e's RULER-style trials,
and no heavy import or trace extraction where none is needed."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest


COMPRESSOR = '''
from kvbounds.algorithms import token_selection as ts


def compress(K, V, floats, rng, *, sink, window, block_size=64, Q=None):
    return ts.StreamingLLM(sink=sink).compress(K, V, budget=floats // (2 * K.shape[-1]))
'''


@pytest.fixture
def own_compressor(user_module):
    return user_module(COMPRESSOR, "mycomp")


def _run(spec, out, capsys, **kw):
    import kvbounds
    res = kvbounds.evaluate(spec, profile="smoke", out=out, workers=1, **kw)
    return res, capsys.readouterr().err


def test_a_changed_method_reruns_and_force_reruns_anyway(own_compressor, tmp_path, capsys):
    """Editing the method's module gives new record keys (its trials run again: the old verdict never comes back
    silently); the same code reruns nothing; --force reruns everything; evaluation.json says which code and
    versions produced it."""
    import importlib
    spec, out = f"{own_compressor}:compress", tmp_path / "e"
    first, err = _run(spec, out, capsys)
    assert "20 trial(s) to run (0 already" in err
    code = first["code"]
    assert set(code["versions"]) == {"kvbounds", "kvpress", "transformers", "torch"}
    assert code["method_files"] == [f"{own_compressor} (its file)"] and not code["forced"]
    _, err = _run(spec, out, capsys)
    assert "0 trial(s) to run (20 already" in err
    (tmp_path / f"{own_compressor}.py").write_text(COMPRESSOR + "\nVERSION = 2\n")
    importlib.reload(sys.modules[own_compressor])
    second, err = _run(spec, out, capsys)
    assert "20 trial(s) to run (0 already" in err, err
    assert second["code"]["method"] != code["method"] and second["code"]["key"] != code["key"]
    forced, err = _run(spec, out, capsys, force=True)
    assert "20 trial(s) to run (0 already" in err and forced["code"]["forced"]
    from kvbounds.core import ResultStore
    assert len(ResultStore(out).read().records) == 3 * 20      # smoke: one fraction, one record per trial
    assert json.loads((out / "evaluation.json").read_text())["code"]["key"] == second["code"]["key"]
    card = (out / "evaluation.html").read_text()
    assert "torch " in card and second["code"]["key"] in card and "rerun forced" in card


def test_the_cli_takes_force_and_model(own_compressor, tmp_path, capsys):
    from kvbounds.cli import main
    out = tmp_path / "c"
    assert main(["evaluate", f"{own_compressor}:compress", "--profile", "smoke", "--workers", "1", "--out", str(out),
                 "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("At 25% of the cache's floats, ") and "records keyed on" in printed
    assert main(["evaluate", f"{own_compressor}:compress", "--profile", "smoke", "--workers", "1", "--out", str(out),
                 "--force"]) == 0
    assert "20 trial(s) to run (0 already" in capsys.readouterr().err


def test_the_card_puts_the_verdict_first_levels_beside_each_control_and_a_plot(own_compressor, tmp_path, capsys):
    res, _ = _run(f"{own_compressor}:compress", tmp_path / "k", capsys)
    card = (tmp_path / "k" / "evaluation.html").read_text()
    import html
    assert card.index('class="verdict"') < card.index('class="card') and html.escape(res["verdict"]) in card
    assert res["verdict"].startswith(f"At 25% of the cache's floats, {own_compressor}:compress is ")
    for fam in ("synthetic benign", "concentrated"):
        assert card.count(f'aria-label="{fam}: error vs memory"') == 1
        assert res["stream_sizes"][fam] == dict(n=112, queries=16, d=32, streams=10)
        assert "10 streams of 112 context tokens + 16 held-out queries, d = 32." in card
    lv = {(x["family"], x["name"]) for x in res["levels"]}
    assert {("concentrated", n) for n in ("method", "streaming_llm", "uniform", "zeros", "mean")} <= lv
    for x in res["levels"]:
        assert x["lo"] <= x["median"] <= x["hi"] and x["n"] == 10
    # the streaming_llm compressor is the StreamingLLM control: its level equals the control's on every stream
    same = {x["name"]: x["median"] for x in res["levels"] if x["family"] == "concentrated"}
    assert same["method"] == same["streaming_llm"]
    assert all(c["word"] for c in res["calls"]) and "random unit-direction keys" in card


@pytest.mark.parametrize("seed", range(12))
def test_the_cards_word_never_contradicts_the_interval_beside_it(seed):
    """The card prints the one rule's word beside the rule's own interval (no second rule re-words it): "better" /
    "worse" only with an interval on that side of 1, "leaning" likewise; over random families of paired errors."""
    import numpy as np
    from kvbounds.evaluation._card_parts import card_call
    from kvbounds.verdict import Comparison, paired_calls
    rng = np.random.default_rng(seed)
    comps = []
    for k in range(6):
        base = rng.lognormal(0, 0.3, 20)
        comps.append(Comparison("f", f"c{k}", base * rng.lognormal(rng.normal(0, 0.15), 0.2, 20), base, 0.25))
    for c in paired_calls(comps):
        d = dict(vars(c)) if hasattr(c, "__dict__") else c._asdict()
        word, (lo, hi) = card_call(d), d["ci"]
        assert word == d["call"]
        if word in ("better", "leaning better"):
            assert hi < 1, (word, lo, hi)
        if word in ("worse", "leaning worse"):
            assert lo > 1, (word, lo, hi)


def test_the_verdict_puts_real_keys_first_and_levels_have_distribution_free_intervals():
    from kvbounds.evaluation._card_parts import median_interval, order_families, verdict_sentence
    fams = order_families(["synthetic benign", "real SmolLM2", "concentrated", "real MiniLM"])
    assert fams == ["real SmolLM2", "real MiniLM", "synthetic benign", "concentrated"]
    calls = [dict(family=f, control=c, fraction=0.25, call="better", ci=(0.3, 0.6)) for f in fams[:2]
             for c in ("streaming_llm", "uniform")]
    calls += [dict(family="concentrated", control="uniform", fraction=0.25, call="worse", ci=(1.2, 1.5))]
    s = verdict_sentence("m", calls, 0.25, fams)
    assert s == ("At 25% of the cache's floats, m is better than every control on real keys (real SmolLM2, real "
                 "MiniLM); on synthetic streams: 1 worse of 1 calls (worse than uniform on concentrated).")
    med, lo, hi = median_interval(range(20))
    assert (med, lo, hi) == (9.5, 5.0, 14.0)          # x(6) and x(15) of 20: binomial(20, 1/2) coverage >= 95%
    assert math.isnan(median_interval([1, 2, 3])[1])


def test_e2e_runs_the_ruler_tasks_and_the_depth_sweep_on_the_model_asked():
    """evaluate --e2e builds the e2e curves' own trials (no second harness): every RULER-style task with the method
    and the strongest baselines at each ratio, the needle-depth sweep at the headline ratio, on --model."""
    from kvbounds.e2e import ruler
    from kvbounds.evaluation._e2e_curves import BASELINES, SETUP, curve_trials
    ts = curve_trials("kvpress:snapkv", "quick", 0.75, 0, "qwen", dict(code="abc"))
    curve = [t for t in ts if "depth" not in t.params]
    sweep = [t for t in ts if "depth" in t.params]
    assert {t.params["task"] for t in curve} == set(ruler.KINDS)
    assert len(curve) == len(ruler.KINDS) * SETUP["quick"]["instances"]
    for t in ts:
        assert t.claim == "BKV.e2e" and t.params["model"] == "qwen2.5-coder-0.5b" and t.params["curve"]
        assert t.params["code"] == "abc" and t.params["setting"] == "inside"
    assert curve[0].params["methods"] == ["kvpress:snapkv", *[m for m in BASELINES if m != "kvpress:snapkv"]]
    assert curve[0].params["budgets"] == [0.1, 0.25, 0.5]
    assert {(t.params["n"], t.params["depth"]) for t in sweep} == {(n, d) for n in (512, 1024)
                                                                  for d in (0.0, 0.5, 1.0)}
    assert all(t.params["budgets"] == [0.25] for t in sweep)


def test_a_press_holding_more_floats_at_one_ratio_says_so():
    from kvbounds.evaluation._e2e_curves import _more_floats
    pts = [dict(task="niah_single", budget=0.5, method="mine", memory=0.5),
           dict(task="niah_single", budget=0.5, method="subgen", memory=0.69),
           dict(task="niah_single", budget=0.5, method="h2o", memory=0.502)]
    assert _more_floats(pts, "mine") == ["at ratio 0.5: subgen holds 69% of the exact cache's floats, mine 50%"]


def test_evaluate_of_a_numpy_compressor_imports_no_kvpress_nor_torch(tmp_path):
    """issue 50 item 4: evaluate (the code's fingerprint reads versions from metadata) and assert_beats decide
    without importing kvpress, torch or transformers for a compressor that is no press."""
    (tmp_path / "numpycomp.py").write_text(COMPRESSOR)
    code = ("import sys, kvbounds\n"
            "r = kvbounds.evaluate('numpycomp:compress', profile='smoke', out='e', workers=1, progress=False)\n"
            "assert r['code']['versions']['torch']\n"
            "print(sorted(m for m in ('kvpress', 'torch', 'transformers') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr[-2000:]
