"""The package's structure as a contract: kvbounds' rooms (its subpackages) are layered, each importing only the rooms
below it (the contract is pyproject.toml's [tool.importlinter], run here with import-linter; `lint-imports` runs it
from the command line), and a room's private modules (a leading underscore) are imported only from inside the room,
its public face being its __init__. Imports inside functions count as much as those at the top of a module."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp")
pytest.importorskip("importlinter")

ROOT = Path(__file__).resolve().parents[2]
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
def graph():
    return grimp.build_graph("kvbounds", cache_dir=None)


def test_the_rooms_keep_their_layers():
    """`lint-imports` (import-linter) on pyproject.toml's contract: no room imports a room above it, directly or
    through another module, and rooms on one layer import nothing of each other (so no cycle between rooms)."""
    out = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                          "sys.exit(lint_imports_command())", "--no-cache"], cwd=ROOT, capture_output=True, text=True)
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


def test_no_room_imports_another_rooms_private_modules(graph):
    found = set()
    for m in graph.modules:
        for i in graph.find_modules_directly_imported_by(m):
            if private(i) and room(i) != room(m):
                found.add((m, i))
    assert found == PRIVATE_ACROSS_ROOMS, (
        "imports of another room's private module (import from the room's face instead, or add the name to it): "
        + ", ".join(f"{a} -> {b}" for a, b in sorted(found - PRIVATE_ACROSS_ROOMS)))


def test_every_room_says_what_lives_there_and_what_it_may_import():
    import importlib
    for p in sorted((ROOT / "kvbounds").iterdir()):
        if (p / "__init__.py").is_file() and not p.is_symlink():
            doc = importlib.import_module(f"kvbounds.{p.name}").__doc__ or ""
            assert len(doc) > 80, f"kvbounds.{p.name} has no docstring saying what lives there"
