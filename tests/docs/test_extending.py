"""docs/EXTENDING.md is kept true: its two recipes (a new method, a new claim) are followed as written, by both routes
of step 2. As a plugin: each recipe's module and test copied out of the document's code blocks into a temporary
directory, its module registered through the entry-point group the document names (a .dist-info of a package in that
directory), the recipes' tests run with pytest in a fresh interpreter. Inside the repository: a temporary copy of the
repository with each file where the recipe puts it and ``ruff format`` run on it, then the recipes' tests and the
suite's tests that read the registries run in that copy, with nothing added to the repository itself."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "EXTENDING.md"


def blocks() -> dict[str, str]:
    """file name -> code of the document's ```python blocks that start with '# file: NAME'."""
    out = {}
    for code in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S):
        first, _, rest = code.partition("\n")
        m = re.fullmatch(r"# file: (\S+)", first.strip())
        if m:
            out[m.group(1)] = rest
    return out


def entry_points() -> dict[str, list[tuple[str, str]]]:
    """group -> (name, value) from the document's ```toml blocks."""
    out: dict[str, list] = {}
    for code in re.findall(r"```toml\n(.*?)```", DOC.read_text(), re.S):
        group = re.search(r'\[project\.entry-points\."([^"]+)"\]', code).group(1)
        out.setdefault(group, []).extend(re.findall(r'^(\w+) = "([\w.]+)"$', code, re.M))
    return out


def test_extending_recipes_work_as_written(tmp_path):
    files = blocks()
    assert {"kvb_norm_topk.py", "test_kvb_norm_topk.py", "kvb_hoeffding.py", "test_kvb_hoeffding.py"} <= set(files)
    eps = entry_points()
    assert set(eps) == {"kvbounds.methods", "kvbounds.claims"}, eps
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    # step 2 of each recipe, done the way pip would: the package's metadata with its entry points
    info = tmp_path / "kvb_recipes-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvb-recipes\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{n} = {v}\n" for n, v in items) + "\n" for group, items in eps.items()))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path)] + sys.path), PYTHONDONTWRITEBYTECODE="1")
    tests = sorted(n for n in files if n.startswith("test_"))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "--rootdir", str(tmp_path), *tests], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert f"{len(tests)} passed" in out.stdout, out.stdout[-2000:]


# the suite's tests a new method or claim could break (they read the registries, the README's method table, the
# end-to-end lists and the layers), run in the copy beside the recipes' own tests
AFFECTED = ("tests/methods/test_methods.py", "tests/package/test_structure.py", "tests/e2e/test_e2e_cli.py",
            "tests/claims")
# where each recipe puts its files inside the repository (docs/EXTENDING.md, step 2 and tests/README.md)
PLACES = {"kvb_norm_topk.py": "kvbounds/catalog", "test_kvb_norm_topk.py": "tests/catalog",
          "kvb_hoeffding.py": "proofs_checks", "test_kvb_hoeffding.py": "tests/proofs_checks"}


def ruff() -> list[str] | None:
    """The command that runs ruff (the dev extra installs it), or None."""
    exe = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    return [exe] if exe else None


def test_extending_recipes_in_a_copy_of_the_repository(tmp_path):
    """Step 2's route inside the repository, literally: a copy of the repository's files (git ls-files), each recipe
    file added where the recipe puts it and formatted by ``ruff format`` (which splits the long ``Method(...)`` and
    ``register_claim(...)`` calls: discovery does not read source text), nothing else changed; then the recipes'
    tests and the affected tests of the suite pass in that copy (imported from it: the copy comes first on the
    path). Counts the files and lines each recipe adds."""
    fmt = ruff()
    if fmt is None:
        pytest.skip("ruff is not installed (pip install 'kvbounds[dev]')")
    files = blocks()
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split("\0")
    copy = tmp_path / "repo"
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, copy / rel)
    added = []
    for name, folder in PLACES.items():
        path = copy / folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[name])
        added.append(path)
    subprocess.run(fmt + ["format", "--quiet", *map(str, added)], cwd=copy, check=True)
    assert "METHOD = Method(\n" in (copy / PLACES["kvb_norm_topk.py"] / "kvb_norm_topk.py").read_text(), \
        "ruff kept the registration on one line: the test no longer shows that a reformatted call still registers"
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    tests = [str(p.relative_to(copy)) for p in added if p.name.startswith("test_")] + list(AFFECTED)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "-W", "error::UserWarning:kvbounds.methods._registry", *tests], cwd=copy, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    where = subprocess.run([sys.executable, "-c", "import kvbounds.catalog as c, kvbounds.methods as m; "
                            "print(c.__file__); print(m.get_method('norm_topk').compress.__module__)"],
                           cwd=copy, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert where == [str(copy / "kvbounds" / "catalog" / "__init__.py"), "kvbounds.catalog.kvb_norm_topk"]
    counts = {p.name: len(p.read_text().splitlines()) for p in added}
    print("recipe inside the repository, files and lines after ruff format:", counts)


def test_extending_recipes_inside_the_package(tmp_path, monkeypatch):
    """Step 2's route inside the repository, in this process: each module where the recipe puts it, nothing else
    changed. A temporary folder added to the path of kvbounds.catalog / kvbounds.proofs_checks stands for those
    folders (the import system finds a module there as it finds one in kvbounds/catalog/ or proofs_checks/); the
    catalog, imported again, finds the method by its METHOD, the claims' registry the claim by its registration
    call. Checked here: the method through compress_ours, the claim's smoke trials through run_checks on a thread
    and its verdict."""
    import concurrent.futures as cf

    import kvbounds.catalog as catalog
    import kvbounds.proofs_checks as proofs_checks
    from kvbounds.methods import _registry as methods
    from kvbounds import claims as registry
    files = blocks()
    for folder, name in (("catalog", "kvb_norm_topk.py"), ("proofs_checks", "kvb_hoeffding.py")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_text(files[name])
    monkeypatch.setattr(catalog, "__path__", list(catalog.__path__) + [str(tmp_path / "catalog")])
    monkeypatch.setattr(proofs_checks, "__path__", list(proofs_checks.__path__) + [str(tmp_path / "proofs_checks")])
    monkeypatch.setattr(methods, "_METHODS", {})
    monkeypatch.setattr(methods, "_LOADED", False)
    monkeypatch.setattr(registry, "CLAIMS", dict(registry.CLAIMS))
    monkeypatch.setattr(registry, "PAPERS", dict(registry.PAPERS))
    added = ("kvbounds.catalog.kvb_norm_topk", "kvbounds.proofs_checks.kvb_hoeffding")
    try:
        assert "kvb_norm_topk" in catalog.modules()
        monkeypatch.setattr(catalog, "METHODS", catalog.collect())        # what importing the package collects
        assert added[1] in registry.load_check_modules()
        assert methods.get_method("norm_topk").source == "external"
        assert methods.names()[:3] == ("streaming_llm", "uniform", "kcenter")      # the package's order kept
        claim = registry.get_claim("DEMO.hoeffding")
        assert claim.check == added[1] and claim.has_check
        ns: dict = {}
        exec(files["test_kvb_norm_topk.py"], ns)
        ns["test_norm_topk_holds_its_budget_and_keeps_the_ends"]()
        from kvbounds.report import build_verdicts
        from kvbounds.run import run_checks
        with cf.ThreadPoolExecutor(1) as ex:
            records = run_checks(["DEMO.hoeffding"], profile="smoke", out=tmp_path / "out", executor=ex,
                                 progress=False)
        assert len(records) == 2 and all(r.holds for r in records)
        assert build_verdicts(records, ["DEMO.hoeffding"])["DEMO.hoeffding"].statement == "holds"
    finally:
        for name in added:
            sys.modules.pop(name, None)
