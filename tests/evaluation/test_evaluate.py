"""``kvbounds evaluate`` / ``kvbounds.evaluate``: SPECs resolved (registered names, kvpress:NAME, module:NAME for a press
or a contract compressor), the press adapter on a bare stream, the battery's calls, evaluation.json and the card,
resume, clear errors that write nothing, --decode, --e2e (slow), assert_beats."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("kvpress")

from kvbounds.methods import _registry as registry  # noqa: E402
from kvbounds.testing import make_stream  # noqa: E402

MY_PRESS = '''
"""A press of one's own in 20 lines: keep the tokens whose values have the largest norms."""
from dataclasses import dataclass

from kvpress import BasePress, ScorerPress


@dataclass
class MyPress(ScorerPress):
    compression_ratio: float = 0.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return values.norm(dim=-1)


@dataclass
class RaisingPress(ScorerPress):
    compression_ratio: float = 0.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        raise RuntimeError("my press is broken")


@dataclass
class WrongLengthPress(BasePress):
    compression_ratio: float = 0.0

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        return keys, values                   # keeps every token whatever the ratio


@dataclass
class NaNPress(ScorerPress):
    compression_ratio: float = 0.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        keys[..., 0] = float("nan")           # corrupts the cache it returns
        return -keys.norm(dim=-1)


def not_a_compressor(x):
    return x
'''


@pytest.fixture
def own_module(user_module):
    """A module of one's own (a unique name per test) in the current directory; the registry restored after."""
    return user_module(MY_PRESS, "mymod")


def _cli(*args):
    from kvbounds.cli import main
    return main(["evaluate", *args])


@pytest.mark.parametrize("spec, extra, words", [
    ("nomodule_at_all:X", (), "does not import: ModuleNotFoundError"),
    ("{m}:not_a_compressor", (), "neither a kvpress press"),
    ("{m}:Missing", (), "has no 'Missing'"),
    ("balancekw", (), "did you mean balancekv"),
    ("kvpress:AdaKVPress", (), "wraps another press"),
    ("{m}:MyPress", ("--ratio", "1.0"), "--ratio must be a number in [0, 1)"),
    ("{m}:MyPress", ("--ratio", "-0.1"), "--ratio must be a number in [0, 1)"),
    ("{m}:RaisingPress", (), "raised RuntimeError: my press is broken"),
    ("{m}:WrongLengthPress", (), "(wrong length)"),
    ("{m}:NaNPress", (), "non-finite keys or values"),
])
def test_bad_specs_exit_2_with_the_reason_and_write_nothing(own_module, tmp_path, capsys, spec, extra, words):
    out = tmp_path / "out"
    rc = _cli(spec.format(m=own_module), "--profile", "smoke", "--out", str(out), "--workers", "1", *extra)
    err = capsys.readouterr().err
    assert rc == 2 and words in err, err
    assert not out.exists(), "nothing may be written for a SPEC that cannot be evaluated"


def test_ratio_for_keeps_exactly_the_tokens_asked():
    from kvpress.utils import compute_n_kept
    from kvbounds.evaluation._stream_press import kept_tokens, ratio_for
    for n in range(1, 700, 7):
        for kept in {1, n // 3 or 1, n // 2 or 1, n}:
            assert compute_n_kept(n, ratio_for(kept, n)) == kept, (n, kept)
    assert kept_tokens(1000, 4, 4, 64) == 64 and kept_tokens(3, 4, 4, 64) == 1


def test_snapkv_on_a_stream_keeps_what_its_observation_window_scores():
    """The adapter gives SnapKV the stream's own queries: its kept tokens are those of the top scores computed here
    from the last 64 queries' causal attention (mean over the window, pooled with kernel 5, the window kept)."""
    import torch
    from kvpress import SnapKVPress
    from kvbounds.evaluation._stream_press import press_compressor
    s = make_stream("real SmolLM2", 200, seed=4) if not _real_missing() else make_stream("rope", 200, 16, seed=4)
    K, V, Q = s.layer(np.float64)
    fn = press_compressor(lambda r: SnapKVPress(compression_ratio=r), name="SnapKV")
    kept = 100                                 # more than the window of 64 (kept whole: its scores tie)
    c = fn(K, V, kept * 2 * s.d, np.random.default_rng(0), Q=Q)
    n, w = s.n, 64
    logits = s.Q[-w:] @ s.K.T * s.scale
    logits[np.triu(np.ones((w, n), bool), n - w + 1)] = -np.inf
    att = np.exp(logits - logits.max(1, keepdims=True))
    att /= att.sum(1, keepdims=True)
    score = att[:, :n - w].mean(0)
    score = torch.nn.functional.avg_pool1d(torch.tensor(score)[None], 5, padding=2, stride=1)[0].numpy()
    score = np.concatenate([score, np.full(w, score.max() + 1)])
    want = set(np.argsort(-score, kind="stable")[:kept].tolist())
    got = {int(np.where((s.K == row).all(1))[0][0]) for row in np.asarray(c.keys[0])}
    assert got == want


def _real_missing():
    from kvbounds.testing import real_available
    return real_available("real SmolLM2") is not None


def test_a_press_that_needs_the_model_is_named():
    from kvpress import QFilterPress
    from kvbounds.evaluation._stream_press import PressError, press_compressor
    s = make_stream("clustered", 64, 8, seed=0)
    K, V, Q = s.layer()
    fn = press_compressor(lambda r: QFilterPress(compression_ratio=r), name="QFilterPress")
    with pytest.raises(PressError, match="QFilterPress raised .* needs the model itself runs with .kvbounds evaluate --e2e"):
        fn(K, V, 32 * 16, np.random.default_rng(0), Q=Q)


def test_streaming_llm_press_is_tied_with_the_streaming_llm_control_everywhere(tmp_path):
    """kvpress's StreamingLLMPress and the battery's StreamingLLM keep the same tokens at the same floats: the
    accounting is the same on both sides, so every tested call is tied, ratio exactly 1, no stream won."""
    import kvbounds
    res = kvbounds.evaluate("kvpress:StreamingLLMPress", profile="smoke", out=tmp_path, workers=1, progress=False)
    sl = [c for c in res["calls"] if c["control"] == "streaming_llm"]
    assert len(sl) == 2 and all(c["call"] == "tied" and c["effect"] == 1.0 and c["ci"] == [1.0, 1.0]
                                and c["wins"] == 0 and c["equivalent"] and c["metric"] == "practitioner"
                                for c in sl), sl
    data = json.loads((tmp_path / "evaluation.json").read_text())
    assert data["method"] == "kvpress:streaming_llm" and "streaming_llm" in data["battery"]
    assert set(data["call_vocabulary"]) == {"better", "leaning better", "tied", "leaning worse", "worse",
                                            "not attainable", "not tested"}
    for c in data["calls"]:
        assert {"family", "control", "fraction", "call", "effect", "ci", "unit", "metric"} <= set(c)
        assert c["call"] in data["call_vocabulary"] and c["fraction"] == 0.25
    assert set(data["regime"]) == {"synthetic benign", "concentrated"}
    card = (tmp_path / "evaluation.html").read_text()
    assert "tied" in card and "kvpress:streaming_llm" in card and "<style>" in card


def test_own_press_in_one_command_then_resumed(own_module, tmp_path, capsys):
    """`kvbounds evaluate module:MyPress` for a 20-line BasePress subclass in a module of the current directory
    (a fresh interpreter, as a user runs it): evaluation.json and the card; the same evaluation again runs no trial
    (resumed from the records) and gives the same calls."""
    import kvbounds
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "kvbounds", "evaluate", f"{own_module}:MyPress", "--profile", "smoke", "--out",
           "ev", "--workers", "1"]
    first = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "synthetic benign" in first.stdout and "wrote ev/evaluation.json" in first.stdout
    data = json.loads((tmp_path / "ev" / "evaluation.json").read_text())
    assert data["method"] == f"{own_module}:MyPress" and data["kind"] == "press" and len(data["calls"]) == 8
    assert (tmp_path / "ev" / "evaluation.html").is_file()
    again = kvbounds.evaluate(f"{own_module}:MyPress", profile="smoke", out=tmp_path / "ev", workers=1)
    assert "0 trial(s) to run (20 already finished" in capsys.readouterr().err
    assert json.loads(json.dumps(again["calls"])) == data["calls"]


def test_a_registered_method_by_name_and_in_e2e(monkeypatch):
    """A third party's method (as the entry-point group kvbounds.methods registers it) is found by name."""
    from kvbounds.cli._e2e import problems
    from kvbounds.evaluation._spec import resolve
    registry.names()
    monkeypatch.setattr(registry, "_METHODS", dict(registry._METHODS))
    registry.register(registry.Method("recent_only", "kvbounds.catalog.streaming_llm:compress",
                                      role="baseline", source="external", label="a third party's method"))
    r = resolve("recent_only")
    assert r.kind == "compressor" and r.name == "recent_only"
    args = type("A", (), dict(n=512, instances=1, window=32, budgets=[0.25], methods=["recent_only"],
                              model="smollm2", device="cpu"))()
    assert not [p for p in problems(args) if "--methods" in p]


def test_decode_time_check_on_streams(tmp_path):
    from kvbounds.evaluation._decode import run_decode
    from kvbounds.evaluation._spec import resolve
    res = run_decode(resolve("kvpress:KnormPress"), profile="smoke", ratio=0.5, seed=0, out=tmp_path, workers=1,
                     progress=False)
    assert {c["family"] for c in res["calls"]} == {"synthetic benign", "concentrated"}
    assert all(c["n"] == 10 for c in res["calls"]) and "recompressed every 80" in res["setup"]
    skipped = run_decode(resolve("streaming_llm"), profile="smoke", ratio=0.5, seed=0, out=tmp_path)
    assert "runs presses" in skipped["skipped"]


def test_assert_beats_passes_and_says_why_it_fails():
    from kvbounds.testing import assert_beats
    streams = [make_stream("concentrated", 128, 16, seed=i) for i in range(10)]
    res = assert_beats("kvpress:TOVAPress", "mean", streams)
    assert res["call"] == "better" and res["wins"] == 10
    with pytest.raises(AssertionError) as e:
        assert_beats("kvpress:StreamingLLMPress", "streaming_llm", streams)
    msg = str(e.value)
    assert "not better than streaming_llm at 25%" in msg and "tied with StreamingLLM (1 [1, 1], 0/10 wins)" in msg
    assert "smallest stream it lost on: make_stream('concentrated', n=128, d=16, seed=0)" in msg


@pytest.mark.slow
def test_evaluate_end_to_end_smoke(own_module, tmp_path):
    import kvbounds
    res = kvbounds.evaluate(f"{own_module}:MyPress", profile="smoke", e2e=True, out=tmp_path / "e", workers=1,
                            progress=False)
    e2e = res["e2e"]
    assert not e2e.get("errors") and not e2e.get("skipped_rows"), e2e
    assert f"{own_module}:MyPress" in {r["method"] for r in e2e["rows"]}
    assert "passkey, question inside" in e2e["headline"] and "ppl" in e2e["headline"]
    assert math.isfinite(res["time"]["wall_s"])


def test_the_readme_command_runs_as_written(tmp_path):
    """README, "Evaluate your own method": its `kvbounds evaluate ...` line, run as written in a fresh directory."""
    import re
    import shlex
    from pathlib import Path
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Evaluate your own method", 1)[1].split("\n## ", 1)[0]
    bash = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    (line,) = [ln for ln in bash.splitlines() if ln.startswith("kvbounds evaluate ")]
    args = shlex.split(line.split("#")[0])[1:]
    res = subprocess.run([sys.executable, "-m", "kvbounds", *args], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    assert res.returncode == 0, res.stderr[-3000:]
    out = tmp_path / args[args.index("--out") + 1]
    data = json.loads((out / "evaluation.json").read_text())
    assert data["method"] == "kvpress:knorm" and data["calls"] and (out / "evaluation.html").is_file()


def test_regime_says_where_the_method_beats_every_control_and_where_not():
    """'from X%' only when every larger memory beats every control too (SnapKV on real SmolLM2 beat all at 25% but
    was not shown better than StreamingLLM at 50%, and the card said 'from 25%')."""
    from kvbounds.evaluation._evaluate import regime
    call = lambda fam, f, c, ctl="zeros": dict(family=fam, fraction=f, call=c, control=ctl)
    calls = [call("a", 0.1, "worse"), call("a", 0.25, "better"), call("a", 0.5, "better"),
             call("b", 0.1, "better"), call("b", 0.25, "better"), call("b", 0.5, "tied"),
             call("c", 0.1, "tied"), call("c", 0.25, "not tested"), call("c", 0.5, "worse"),
             call("d", 0.1, "not tested")]
    out = regime(calls, ["a", "b", "c", "d"], [0.1, 0.25, 0.5])
    assert out["a"] == dict(smallest_fraction=0.25, text="better than every control from 25% of the cache's floats")
    assert out["b"] == dict(smallest_fraction=0.1,
                            text="better than every control at 10%, 25% of the cache's floats (not at 50%)")
    assert out["c"] == dict(smallest_fraction=None, text="never in range (10%-50%)")
    assert out["d"] == dict(smallest_fraction=None, text="not tested")
