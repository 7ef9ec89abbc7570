"""issue 50: ``kv_streams`` never extracts traces inside a hypothesis draw (a real family is drawn from a prepared
cache only; named but not prepared: an InputError with the one command that prepares it), the plugin's real-trace
fixture skips with that command, and ``kvbounds evaluate`` says when it extracts and shows that it is alive."""
from __future__ import annotations

import pytest

import kvbounds.streams._prepared as prepared
import kvbounds.testing.strategies as strategies
from kvbounds.algorithms.validation import InputError
from kvbounds.streams import REAL, SYNTHETIC


def _not_prepared(monkeypatch):
    monkeypatch.setattr(strategies, "real_available", lambda f: None)           # the models are here ...
    monkeypatch.setattr(strategies, "real_prepared",                             # ... their traces are not
                        lambda f: f"{f}'s traces are not prepared here; prepare them once with "
                                  f"`{prepared.prepare_command(f)}`")


def test_kv_streams_leaves_unprepared_real_families_out_and_names_the_command(monkeypatch):
    _not_prepared(monkeypatch)
    assert strategies.families_here() == SYNTHETIC
    with pytest.raises(InputError, match=r"kvbounds traces extract --model smollm2 --tokens 2048.*never extracts"):
        strategies.families_here(("concentrated", "real SmolLM2"))
    with pytest.raises(InputError, match="kvbounds traces extract --model minilm --tokens 512"):
        strategies.kv_streams(families=("real MiniLM",))
    monkeypatch.setattr(strategies, "real_available", lambda f: "model missing")   # no model: left out, as before
    assert strategies.families_here(("concentrated", "real SmolLM2")) == ("concentrated",)


def test_prepare_real_says_it_is_extracting_and_how_long_it_took(monkeypatch, capsys):
    import kvbounds.traces.real as real
    calls = []
    monkeypatch.setattr(real, "available", lambda model: None)
    monkeypatch.setattr(prepared, "real_prepared", lambda f: None if calls else "not prepared")
    monkeypatch.setattr(real, "extract", lambda model, n: calls.append((model, n)))
    prepared.prepare_real("real SmolLM2")
    err = capsys.readouterr().err
    assert calls == [("smollm2", 2048)]
    assert "kvbounds: extracting real SmolLM2's traces (smollm2, 2048 tokens" in err and "extracted in" in err
    prepared.prepare_real("real SmolLM2")                      # prepared now: nothing extracted, nothing said
    assert calls == [("smollm2", 2048)] and capsys.readouterr().err == ""


def test_the_real_trace_fixture_skips_with_the_command(tmp_path):
    import subprocess
    import sys
    (tmp_path / "conftest.py").write_text("import kvbounds.streams as S\n"
                                          "from kvbounds.streams._prepared import prepare_command\n"
                                          "S.real_prepared = lambda f: f'not prepared: `{prepare_command(f)}`'\n")
    (tmp_path / "test_t.py").write_text("def test_t(kvbounds_real_trace):\n    pass\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist",
                        "-p", "no:randomly"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert f"{len(REAL)} skipped" in r.stdout, r.stdout[-2000:]
    assert "kvbounds traces extract --model smollm2 --tokens 2048" in r.stdout
