"""The build from any checkout (issue 44): a normal clone and one made with ``git -c core.symlinks=false clone`` give
the same complete package through ``pip install .``, ``pip install -e .``, ``python -m build`` (sdist and wheel) and
a wheel built from the sdist; the sdist carries what its tests need and they are collected from it; coverage
(``--source=kvbounds``), mypy, ``pytest --doctest-modules`` on each folder and jedi each see each module once, under
its kvbounds name; ``python -m kvbounds.proofs_checks.<claim>`` runs the module once.

The clones are of the repository's committed HEAD (what CI checks out). Builds run without build isolation (this
environment's setuptools, nothing fetched). Minutes of work: the docs tier (`make test-docs`)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("theory", "algorithms", "proofs_checks", "gpu", "traces")
CHECKOUTS = ("normal", "no-symlinks")
PY = sys.executable


def run(cmd, cwd, **kw):
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, **kw)
    assert out.returncode == 0, (f"{' '.join(map(str, cmd))} (rc {out.returncode}):\n"
                                 f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


def source_modules(tree: Path) -> set[str]:
    """Every module of the package in a source tree: kvbounds/ and the five folders, under their kvbounds names."""
    out = set()
    for top, base in [("kvbounds", tree / "kvbounds")] + [(f"kvbounds.{f}", tree / f) for f in FOLDERS]:
        for p in base.rglob("*.py"):
            if "__pycache__" in p.parts:
                continue
            parts = list(p.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out.add(".".join([top] + parts))
    return out


def wheel_modules(whl: Path) -> set[str]:
    names = zipfile.ZipFile(whl).namelist()
    out = set()
    for n in names:
        if n.endswith(".py"):
            parts = n[:-3].split("/")
            if parts[-1] == "__init__":
                parts.pop()
            out.add(".".join(parts))
    return out


@pytest.fixture(scope="module")
def checkouts(tmp_path_factory):
    """Both clones of HEAD, each built: sdist, wheel, and a wheel built from the sdist."""
    pytest.importorskip("build")
    base = tmp_path_factory.mktemp("checkouts")
    out = {}
    for kind in CHECKOUTS:
        src = base / kind
        flags = ["-c", "core.symlinks=false"] if kind == "no-symlinks" else []
        run(["git", *flags, "clone", "-q", "--no-hardlinks", ROOT, src], cwd=base)
        dist = base / f"{kind}-dist"
        run([PY, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", dist, src], cwd=base)
        (sdist,) = dist.glob("kvbounds-*.tar.gz")
        (whl,) = dist.glob("kvbounds-*.whl")
        unpacked = base / f"{kind}-sdist"
        with tarfile.open(sdist) as t:
            t.extractall(unpacked, filter="data")
        (sdist_src,) = unpacked.iterdir()
        from_sdist = base / f"{kind}-from-sdist"
        run([PY, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", from_sdist, sdist_src],
            cwd=base)
        (whl2,) = from_sdist.glob("kvbounds-*.whl")
        out[kind] = dict(src=src, sdist=sdist, sdist_src=sdist_src, wheel=whl, wheel_from_sdist=whl2)
    return out


def test_the_clones_hold_no_symlink_and_the_same_files(checkouts):
    trees = [checkouts[k]["src"] for k in CHECKOUTS]
    files = [sorted(p.relative_to(t).as_posix() for p in t.rglob("*") if ".git" not in p.parts) for t in trees]
    assert files[0] == files[1]
    links = [p for p in trees[0].rglob("*") if p.is_symlink()]
    assert not links, f"committed symlinks (a checkout without links breaks): {links}"


def test_every_build_holds_every_module_of_the_source_tree(checkouts):
    expected = source_modules(ROOT)
    assert {"kvbounds.theory.lower_bound", "kvbounds.claims", "kvbounds.core"} <= expected
    for kind in CHECKOUTS:
        c = checkouts[kind]
        assert source_modules(c["src"]) == expected, kind
        for build in ("wheel", "wheel_from_sdist"):
            got = wheel_modules(c[build])
            assert got == expected, (f"{kind} {build}: missing {sorted(expected - got)[:10]}, "
                                     f"extra {sorted(got - expected)[:10]}")
        names = zipfile.ZipFile(c["wheel"]).namelist()
        assert "kvbounds/report/templates/report.html.j2" in names
        assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"kvbounds"}


def _venv(path: Path) -> Path:
    """A virtual environment that sees this one's dependencies (numpy, ...) but not its kvbounds."""
    subprocess.run([PY, "-m", "venv", "--without-pip", path], check=True)
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([path / "bin" / "python", "-c", code], capture_output=True, text=True,
                               check=True).stdout.strip())
    deps = [p for p in sys.path if p.endswith("site-packages")]
    (site / "zz_kvbounds_test_deps.pth").write_text("\n".join(deps) + "\n")   # plain paths: their .pth not run
    return path / "bin" / "python"


IMPORT_ALL = textwrap.dedent("""
    import importlib, json, sys
    names = json.load(open(sys.argv[1]))
    bad, where = [], {}
    for n in names:
        if n.endswith("__main__"):
            continue
        try:
            where[n] = importlib.import_module(n).__file__
        except Exception as e:
            bad.append(f"{n}: {e!r}")
    stray = []
    for n in ("kvbounds.kvbounds", "kvbounds.tests", "kvbounds.notebooks", "kvbounds.benchmarks", "kvbounds.docs"):
        try:
            importlib.import_module(n)
            stray.append(n)
        except ImportError:
            pass
    print(json.dumps(dict(bad=bad, stray=stray, where=where)))
""")


@pytest.mark.parametrize("kind", CHECKOUTS)
def test_pip_install_and_editable_install_import_every_module(checkouts, kind, tmp_path):
    c = checkouts[kind]
    names = tmp_path / "names.json"
    names.write_text(json.dumps(sorted(source_modules(ROOT))))
    script = tmp_path / "import_all.py"
    script.write_text(IMPORT_ALL)
    for mode in ("install", "editable"):
        py = _venv(tmp_path / mode)
        args = ["-e", c["src"]] if mode == "editable" else [c["src"]]
        run([PY, "-m", "pip", "--python", py, "install", "-q", "--no-deps", "--no-build-isolation", *args],
            cwd=tmp_path)
        out = json.loads(run([py, script, names], cwd=tmp_path).stdout)
        assert not out["bad"], (mode, out["bad"][:5])
        assert not out["stray"], (mode, out["stray"])
        home = c["src"] if mode == "editable" else Path(sysconfig.get_paths(vars={"base": tmp_path / mode})["purelib"])
        assert all(Path(f).is_relative_to(home) for f in out["where"].values()), mode


def test_the_sdist_carries_its_tests_and_they_are_collected(checkouts):
    src = checkouts["normal"]["sdist_src"]
    for need in ("conftest.py", "tests/conftest.py", "tests/data", "docs/EXTENDING.md", "notebooks/balancekv.ipynb",
                 "tests/README.md", "Makefile"):
        assert (src / need).exists(), need
    out = subprocess.run([PY, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", ""], cwd=src,
                         capture_output=True, text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " error" not in out.stdout.splitlines()[-1], out.stdout.splitlines()[-1]
    run([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/core/test_records.py"], cwd=src)


def test_coverage_sees_each_module_once_under_its_kvbounds_name(tmp_path):
    """``coverage run --source=kvbounds`` in the checkout measures every file of the package once, the five folders'
    included (pyproject.toml's [tool.coverage.run] source_pkgs: by module name, kvbounds.theory.x being theory/x.py)."""
    pytest.importorskip("coverage")
    names = tmp_path / "names.json"
    names.write_text(json.dumps(sorted(source_modules(ROOT))))
    script = tmp_path / "import_all.py"
    script.write_text(IMPORT_ALL)
    data = tmp_path / ".coverage"
    run([PY, "-m", "coverage", "run", f"--data-file={data}", "--source=kvbounds", script, names], cwd=ROOT)
    report = tmp_path / "cov.json"
    run([PY, "-m", "coverage", "json", f"--data-file={data}", "-o", report], cwd=ROOT)
    files = [(ROOT / f).resolve() for f in json.loads(report.read_text())["files"]]
    assert len(files) == len(set(files)), "a file measured twice"
    expected = {p.resolve() for base in [ROOT / "kvbounds", *(ROOT / f for f in FOLDERS)] for p in base.rglob("*.py")
                if "__pycache__" not in p.parts}
    assert set(files) == expected, (sorted(map(str, expected - set(files)))[:10],
                                    sorted(map(str, set(files) - expected))[:10])


@pytest.mark.parametrize("folder", FOLDERS + ("kvbounds",))
def test_doctest_modules_on_each_folder_imports_each_module_once(folder):
    """``pytest --doctest-modules FOLDER`` from the repository root: each module collected under its kvbounds name
    (conftest.py names theory.x as the module kvbounds.theory.x), no error."""
    out = subprocess.run([PY, "-m", "pytest", "--doctest-modules", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "-m", "", folder], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode in (0, 5), out.stdout[-3000:] + out.stderr[-2000:]
    assert "error" not in out.stdout.splitlines()[-1], out.stdout[-2000:]


@pytest.fixture(scope="module")
def installed(checkouts, tmp_path_factory):
    """The normal clone's wheel unpacked into a folder of its own (what site-packages holds after pip install)."""
    target = tmp_path_factory.mktemp("installed")
    zipfile.ZipFile(checkouts["normal"]["wheel"]).extractall(target)
    return target


def test_mypy_sees_each_module_once_under_its_kvbounds_name(installed, tmp_path):
    """mypy on the installed package: every module once, under its kvbounds name (its type errors are not the point)."""
    pytest.importorskip("mypy")
    report = tmp_path / "report"
    out = subprocess.run([PY, "-m", "mypy", "-p", "kvbounds", "--ignore-missing-imports", "--follow-imports=skip",
                          "--no-incremental", "--linecount-report", report, "--no-error-summary"],
                         cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "MYPYPATH": str(installed)})
    assert "found twice" not in out.stdout + out.stderr, (out.stdout + out.stderr)[-2000:]
    assert out.returncode in (0, 1), (out.stdout + out.stderr)[-3000:]
    lines = (report / "linecount.txt").read_text().splitlines()[1:]
    seen = [l.split()[-1] for l in lines if l.strip()]
    assert len(seen) == len(set(seen))
    # a folder of data files (report/templates/) is a namespace package to mypy, with no code
    folders = {m: installed / m.replace(".", "/") for m in set(seen) - source_modules(ROOT)}
    namespaces = {m for m, d in folders.items() if d.is_dir() and not list(d.glob("*.py"))}
    assert set(seen) - namespaces == source_modules(ROOT), sorted((set(seen) - namespaces) ^ source_modules(ROOT))[:10]


def test_jedi_resolves_every_room_under_its_kvbounds_name(installed, tmp_path):
    jedi = pytest.importorskip("jedi")
    project = jedi.Project(tmp_path, added_sys_path=[str(installed)], smart_sys_path=False)
    for module, name in [("kvbounds.algorithms.balance_kv", "BalanceKV"),
                         ("kvbounds.theory.lower_bound", "space_lower_bound"),
                         ("kvbounds.proofs_checks.common", "grid"), ("kvbounds.traces.synthetic", "make_trace"),
                         ("kvbounds.gpu.support", "describe"), ("kvbounds.core", "ResultStore"),
                         ("kvbounds.report", "build_verdicts"), ("kvbounds.e2e", "load_model")]:
        script = jedi.Script(f"from {module} import {name}\n{name}", path=tmp_path / "x.py", project=project)
        (d,) = script.goto(2, 1, follow_imports=True)
        assert d.module_path is not None and Path(d.module_path).is_relative_to(installed), (module, d.module_path)
        assert d.full_name.startswith("kvbounds."), (module, d.full_name)


def test_python_m_a_check_module_runs_it_once(tmp_path):
    """A claim living in its check module alone (docs/EXTENDING.md), run as ``python -m kvbounds.proofs_checks.X``:
    its body runs once and its claim is registered once (runpy's __main__ is the module discovery would import)."""
    tree = tmp_path / "tree"
    for d in ("kvbounds",) + FOLDERS:
        shutil.copytree(ROOT / d, tree / d, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "proofs_checks" / "demo_once.py").write_text(textwrap.dedent('''
        import sys
        from kvbounds.claims import Claim, register_claim
        print("body runs", flush=True)
        register_claim(Claim("DEMO.once", "Demo", "one plus one is two", "SubGen Thm 1", check=__name__,
        kind="theorem"))
        if __name__ == "__main__":
            from kvbounds.claims import CLAIMS
            print("registered as", CLAIMS["DEMO.once"].check, "module", sys.modules[CLAIMS["DEMO.once"].check].__name__)
    '''))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = run([PY, "-m", "kvbounds.proofs_checks.demo_once"], cwd=tree, env=env)
    assert out.stdout.count("body runs") == 1, out.stdout
    assert "registered as kvbounds.proofs_checks.demo_once" in out.stdout, out.stdout


def test_the_wheels_metadata(checkouts):
    wheel = checkouts["normal"]["wheel"]
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
    hits = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in files
            for m in pattern.finditer(p.read_text(errors="replace"))]
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


def test_folders_import_only_as_subpackages():
    out = subprocess.run([sys.executable, "-c", "import algorithms"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode and "import kvbounds.algorithms" in out.stderr, out.stderr
