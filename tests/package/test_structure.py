"""The package's structure as a contract: kvbounds' rooms (its subpackages) are layered, each importing only the rooms
below it (the contract is pyproject.toml's [tool.importlinter], run here with import-linter), and a room's private
modules (a leading underscore) are imported only from inside the room, its public face being its __init__. Imports
inside functions count as much as those at the top of a module.

grimp and import-linter read the package's files where the import system finds the package, so they run on the
package laid out as installed (the five top-level folders inside kvbounds/), a copy made here in a temporary folder."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp")
pytest.importorskip("importlinter")

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("theory", "algorithms", "proofs_checks", "gpu", "traces")
# An import of another room's private module, each with its reason; nothing else may reach past a room's face.
PRIVATE_ACROSS_ROOMS = {
    # the walk probe wraps the streaming press's walk in place to record each halving (instrumentation)
    ("kvbounds.battery.walk_probe", "kvbounds.presses._streaming.balance"),
}


def room(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def private(module: str) -> bool:
    return any(p.startswith("_") and not p.startswith("__") for p in module.split(".")[1:])


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """kvbounds as a wheel lays it out: kvbounds/ with the five folders inside."""
    site = tmp_path_factory.mktemp("site")
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "kvbounds", site / "kvbounds", ignore=ignore)
    for f in FOLDERS:
        shutil.copytree(ROOT / f, site / "kvbounds" / f, ignore=ignore)
    return site


def in_installed(site: Path, args, **kw):
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, *args], cwd=site, env=env, capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def edges(installed) -> set[tuple[str, str]]:
    code = ("import grimp, json; g = grimp.build_graph('kvbounds', cache_dir=None); "
            "print(json.dumps(sorted([m, i] for m in g.modules for i in g.find_modules_directly_imported_by(m))))")
    out = in_installed(installed, ["-c", code])
    assert out.returncode == 0, out.stderr[-2000:]
    found = {tuple(e) for e in json.loads(out.stdout)}
    assert ("kvbounds.proofs_checks.common", "kvbounds.core") in found      # the graph sees the five folders
    return found


def test_the_rooms_keep_their_layers(installed):
    """`lint-imports` (import-linter) on pyproject.toml's contract: no room imports a room above it, directly or
    through another module, and rooms on one layer import nothing of each other (so no cycle between rooms)."""
    out = in_installed(installed, ["-c", "import sys; from importlinter.cli import lint_imports_command; "
                                   "sys.exit(lint_imports_command())", "--no-cache", "--config",
                                   str(ROOT / "pyproject.toml")])
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "Contracts: 1 kept, 0 broken" in out.stdout, out.stdout[-2000:]


def test_every_room_is_in_a_layer():
    """A new room must be placed in the contract (a room outside every layer would be unchecked)."""
    import tomllib
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in conf if c["id"] == "layers"]
    named = {r.strip() for layer in layers for r in layer.split("|")}
    rooms = {p.name for p in (ROOT / "kvbounds").iterdir() if (p / "__init__.py").is_file()}
    rooms |= {name for name in ("theory", "algorithms", "proofs_checks", "gpu", "traces")}
    assert rooms == named, (f"rooms not in a layer: {sorted(rooms - named)}; "
                            f"layers naming no room: {sorted(named - rooms)}")


def test_no_room_imports_another_rooms_private_modules(edges):
    found = {(m, i) for m, i in edges if private(i) and room(i) != room(m)}
    assert found == PRIVATE_ACROSS_ROOMS, (
        "imports of another room's private module (import from the room's face instead, or add the name to it): "
        + ", ".join(f"{a} -> {b}" for a, b in sorted(found - PRIVATE_ACROSS_ROOMS)))


def test_every_room_says_what_lives_there_and_what_it_may_import():
    import importlib
    for p in sorted((ROOT / "kvbounds").iterdir()):
        if (p / "__init__.py").is_file() and not p.is_symlink():
            doc = importlib.import_module(f"kvbounds.{p.name}").__doc__ or ""
            assert len(doc) > 80, f"kvbounds.{p.name} has no docstring saying what lives there"
