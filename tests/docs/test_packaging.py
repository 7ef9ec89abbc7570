"""Packaging: the wheel installs one top-level package, ``kvbounds`` (the repository's folders become its
subpackages through the symlinks kvbounds/<folder> -> ../<folder>), holds every module of the source tree and
imports each of them; the editable install is a static path that editors and static tools follow."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("theory", "algorithms", "proofs_checks", "gpu", "traces")


def source_modules() -> set[str]:
    """Every .py file of the package as the source tree holds it (following kvbounds/<folder> links)."""
    out = set()
    for dirpath, dirnames, files in os.walk(ROOT / "kvbounds", followlinks=True):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        rel = Path(dirpath).relative_to(ROOT)
        out |= {(rel / f).as_posix() for f in files if f.endswith(".py")}
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # built from a copy (links kept as links), so that setuptools' build/ and egg-info stay out of the checkout
    src = out / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".*", "__pycache__", "build", "*.egg-info", "results", "tests", "notebooks", "benchmarks", "docs"))
    # --no-build-isolation: build with this interpreter's setuptools, nothing fetched
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src),
                    "-w", str(out)], check=True, cwd=out, capture_output=True)
    (whl,) = out.glob("kvbounds-*.whl")
    return whl


def test_folders_are_links_into_kvbounds():
    """kvbounds/<folder> is a relative symlink to the top-level folder (a checkout without symlinks falls back to
    the folders beside kvbounds/, see kvbounds/__init__.py)."""
    for sub in FOLDERS:
        link = ROOT / "kvbounds" / sub
        assert link.is_symlink() and os.readlink(link) == f"../{sub}", sub
        assert (ROOT / sub / "__init__.py").is_file(), sub


def test_wheel_holds_every_module_of_the_source_tree(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = source_modules() - names
    assert not missing, f"the wheel lacks {sorted(missing)} (pyproject's [tool.setuptools.packages.find])"
    extra = {n for n in names if n.endswith(".py")} - source_modules()
    assert not extra, extra


def test_wheel_imports_every_module(wheel, tmp_path):
    """Unpacked and first on sys.path, every module of the wheel imports from the wheel (not from this checkout)."""
    zipfile.ZipFile(wheel).extractall(tmp_path)
    code = (
        "import importlib, pkgutil, sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import kvbounds\n"
        "bad = []\n"
        "for m in pkgutil.walk_packages(kvbounds.__path__, 'kvbounds.'):\n"
        "    if m.name.endswith('__main__'):\n"
        "        continue\n"
        "    try:\n"
        "        f = importlib.import_module(m.name).__file__\n"
        f"        assert f.startswith({str(tmp_path)!r}), f\n"
        "    except Exception as e:\n"
        "        bad.append(f'{m.name}: {e!r}')\n"
        "print(len(bad), *bad, sep='\\n')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[0] == "0", out.stdout


def test_editable_install_is_a_static_path_jedi_resolves(tmp_path):
    """The editable install that `make` makes is a .pth naming the repository root (no import hook), so jedi
    (IPython/Jupyter completion) resolves names deep in the mapped folders."""
    jedi = pytest.importorskip("jedi")
    import site
    pth = [p for d in site.getsitepackages() for p in Path(d).glob("__editable__*kvbounds*.pth")]
    if not pth:
        pytest.skip("kvbounds is not installed in editable mode here")
    text = pth[0].read_text()
    assert not text.lstrip().startswith("import"), f"the editable install is an import hook: {text!r}"
    assert Path(text.strip()).resolve() == ROOT, text
    code = "import kvbounds.algorithms.balance_kv as m\nm.BalanceK"
    script = jedi.Script(code, path=tmp_path / "x.py", project=jedi.Project(tmp_path),
                         environment=jedi.create_environment(sys.executable, safe=False))
    assert "BalanceKV" in [c.name for c in script.complete()]
    (name,) = jedi.Script("from kvbounds.algorithms.balance_kv import BalanceKV\nBalanceKV", path=tmp_path / "y.py",
                          project=jedi.Project(tmp_path)).infer(2, 3)
    assert name.full_name == "kvbounds.algorithms.balance_kv.BalanceKV"


def test_folders_import_only_as_subpackages():
    out = subprocess.run([sys.executable, "-c", "import algorithms"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode and "import kvbounds.algorithms" in out.stderr, out.stderr


def test_checkout_without_symlinks_finds_the_folders(tmp_path):
    """git with core.symlinks=false checks the links out as text files naming their target: kvbounds still
    finds its subpackages beside kvbounds/."""
    (tmp_path / "kvbounds").mkdir()
    shutil.copy(ROOT / "kvbounds" / "__init__.py", tmp_path / "kvbounds")
    for sub in FOLDERS:
        (tmp_path / "kvbounds" / sub).write_text(f"../{sub}")
    shutil.copytree(ROOT / "theory", tmp_path / "theory", ignore=shutil.ignore_patterns("__pycache__"))
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import kvbounds.theory as t; print(t.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert Path(out.stdout.strip()) == tmp_path / "theory" / "__init__.py"


def test_wheel_has_only_kvbounds_at_top_level(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"kvbounds"}, top
    assert "kvbounds/report/templates/report.html.j2" in names
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
