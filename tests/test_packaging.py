"""Packaging: the wheel installs one top-level package, ``kvbounds`` (the repository's folders become its
subpackages), and carries the report's templates."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_has_only_kvbounds_at_top_level(tmp_path):
    # --no-build-isolation: build with this interpreter's setuptools, nothing fetched
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(ROOT),
                    "-w", str(tmp_path)], check=True, cwd=tmp_path, capture_output=True)
    (wheel,) = tmp_path.glob("kvbounds-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"kvbounds"}, top
    for sub in ("algorithms", "theory", "proofs_checks", "gpu", "traces"):
        assert f"kvbounds/{sub}/__init__.py" in names, sub
    assert "kvbounds/templates/report.html.j2" in names
    assert "kvbounds/press.py" in names and "kvbounds/e2e/weighted_cache.py" in names
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    for extra in ("report", "notebooks", "dask", "gpu", "models", "dev", "torch", "hf", "kvpress"):
        assert f"Provides-Extra: {extra}" in text, extra
    requires = [l.split(":", 1)[1].strip() for l in text.splitlines() if l.startswith("Requires-Dist:")]
    # torch as a range, never pinned; transformers in hf without kvpress, kvpress only in its own extra
    assert [r for r in requires if r.startswith("torch")] and not [r for r in requires if r.startswith("torch==")]
    assert any(r.startswith("transformers") and 'extra == "hf"' in r for r in requires)
    assert all('extra == "kvpress"' in r for r in requires if r.startswith("kvpress")), requires
    # no upper cap on Python (no dependency needs one)
    py = next(l for l in text.splitlines() if l.startswith("Requires-Python:"))
    assert "<" not in py, py
    core = [l.split(":", 1)[1].strip() for l in text.splitlines()
            if l.startswith("Requires-Dist:") and "extra ==" not in l]
    assert not [r for r in core if r.split(">")[0].split("=")[0].strip().lower()
                in ("matplotlib", "seaborn", "pandas", "gguf", "tokenizers", "safetensors", "torch")], core


def test_no_path_outside_the_repository_in_package_or_readme():
    """The package cites papers as a reader finds them; no file of the research notes is named."""
    import re
    pattern = re.compile(r"\.\./shared|shared/seeds|seeds/|CLAIMS\.md|\b00[0-4]_[0-9a-f]{6}")
    files = [ROOT / "README.md"] + [p for d in ("kvbounds", "algorithms", "theory", "proofs_checks", "gpu", "traces",
                                                "notebooks")
                                    for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".ipynb", ".j2", ".md")]
    hits = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in files for m in pattern.finditer(p.read_text(errors="replace"))]
    assert not hits, hits


def test_provenance_files():
    """A package people can cite: the MIT licence pyproject names, CITATION.cff and a changelog at the version,
    arXiv links for the public papers in the README."""
    import tomllib
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    cff = (ROOT / "CITATION.cff").read_text()
    assert "cff-version: 1.2.0" in cff and f"version: {version}" in cff and "license: MIT" in cff
    assert f"## {version}" in (ROOT / "CHANGELOG.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for url in ("https://arxiv.org/abs/2502.07861", "https://arxiv.org/abs/2402.06082"):
        assert url in readme and url in cff
