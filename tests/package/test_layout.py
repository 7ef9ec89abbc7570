"""The source tree's layout, fast (the builds themselves are tested in the docs tier, tests/docs/test_packaging.py):
no committed symlink, every package listed for the build, the five top-level folders kvbounds' subpackages and
nothing else of the repository one, and pytest's name for a folder's file the kvbounds module itself."""
from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("theory", "algorithms", "proofs_checks", "gpu", "traces")


def test_no_committed_symlink():
    out = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        import pytest
        pytest.skip("not a git checkout (an sdist)")
    links = [line.split("\t", 1)[1] for line in out.stdout.splitlines() if line.startswith("120000")]
    assert not links, f"committed symlinks break a checkout without links (core.symlinks=false): {links}"


def test_every_package_is_listed_for_the_build():
    """pyproject.toml lists the packages (package-dir maps the five folders): a new subpackage must be listed."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(conf["packages"])
    found = {".".join(("kvbounds",) + p.parent.relative_to(ROOT / "kvbounds").parts)
             for p in (ROOT / "kvbounds").rglob("__init__.py") if "__pycache__" not in p.parts}
    found |= {f"kvbounds.{f}" for f in FOLDERS}
    assert listed == found, (sorted(found - listed), sorted(listed - found))
    assert conf["package-dir"] == {"kvbounds": "kvbounds", **{f"kvbounds.{f}": f for f in FOLDERS}}


def test_the_source_tree_maps_exactly_the_five_folders():
    """From the source tree (no install), kvbounds.<folder> is the folder beside kvbounds/; no other folder of the
    repository (tests/, kvbounds/ itself, notebooks/) is a subpackage."""
    code = ("import importlib, json\n"
            "out = {}\n"
            "for n in ('kvbounds.theory', 'kvbounds.algorithms', 'kvbounds.proofs_checks', 'kvbounds.gpu',\n"
            "          'kvbounds.traces', 'kvbounds.kvbounds', 'kvbounds.tests', 'kvbounds.notebooks', 'kvbounds.docs'):\n"
            "    try:\n"
            "        out[n] = importlib.import_module(n).__file__\n"
            "    except ImportError:\n"
            "        out[n] = None\n"
            "print(json.dumps(out))\n")
    import json
    import sysconfig
    # -S: site-packages as a plain path, its .pth files not run, so no editable install's finder: the source tree alone
    setup = f"import sys; sys.path[:0] = [{str(ROOT)!r}]; sys.path.append({sysconfig.get_paths()['purelib']!r}); "
    out = subprocess.run([sys.executable, "-S", "-c", setup + code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    for f in FOLDERS:
        assert Path(got[f"kvbounds.{f}"]) == ROOT / f / "__init__.py", got
    assert [n for n in ("kvbounds.kvbounds", "kvbounds.tests", "kvbounds.notebooks", "kvbounds.docs") if got[n]] == []


def test_pytests_name_for_a_folders_file_is_the_kvbounds_module():
    """conftest.py: ``theory.lower_bound`` (how pytest --doctest-modules names theory/lower_bound.py) is the module
    ``kvbounds.theory.lower_bound`` itself, which keeps its own name and spec."""
    alias = importlib.import_module("theory.lower_bound")
    real = importlib.import_module("kvbounds.theory.lower_bound")
    assert alias is real and real.__name__ == "kvbounds.theory.lower_bound"
    assert real.__spec__.name == "kvbounds.theory.lower_bound"
    assert importlib.import_module("algorithms") is importlib.import_module("kvbounds.algorithms")
