"""docs/EXTENDING.md is kept true: its two recipes (a new method, a new claim) are followed as written in a temporary
directory. Each recipe's module and test are copied out of the document's code blocks, and its module is registered
through the entry-point group the document names (a .dist-info of a package in that directory). Then the recipes'
tests run with pytest in a fresh interpreter, with nothing added to the repository."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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


def test_extending_recipes_inside_the_package(tmp_path, monkeypatch):
    """Step 2's route inside the repository: each module where the recipe puts it, nothing else changed. A temporary
    folder added to the path of kvbounds.algorithms / kvbounds.proofs_checks stands for those folders (the import
    system finds a module there as it finds one in algorithms/ or proofs_checks/); the registries find the modules
    by their registration calls. Checked in this process: the method through compress_ours, the claim's smoke
    trials through run_checks on a thread and its verdict."""
    import concurrent.futures as cf
    import sys

    import kvbounds.algorithms as algorithms
    import kvbounds.proofs_checks as proofs_checks
    from kvbounds.methods import _registry as methods
    from kvbounds import claims as registry
    files = blocks()
    for folder, name in (("algorithms", "kvb_norm_topk.py"), ("proofs_checks", "kvb_hoeffding.py")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_text(files[name])
    monkeypatch.setattr(algorithms, "__path__", list(algorithms.__path__) + [str(tmp_path / "algorithms")])
    monkeypatch.setattr(proofs_checks, "__path__", list(proofs_checks.__path__) + [str(tmp_path / "proofs_checks")])
    monkeypatch.setattr(methods, "_METHODS", dict(methods._METHODS))
    monkeypatch.setattr(registry, "CLAIMS", dict(registry.CLAIMS))
    monkeypatch.setattr(registry, "PAPERS", dict(registry.PAPERS))
    added = ("kvbounds.algorithms.kvb_norm_topk", "kvbounds.proofs_checks.kvb_hoeffding")
    try:
        assert added[0] in methods.load_algorithm_modules()
        assert added[1] in registry.load_check_modules()
        assert methods.get_method("norm_topk").source == "external"
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
