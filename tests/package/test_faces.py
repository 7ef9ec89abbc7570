"""A declared face (issue 44 item 4): every public module of kvbounds (no component of its name starts with an
underscore) declares ``__all__``, and every name it declares is there (a room's lazy face resolves it on first use;
a folder's ``__all__`` may name its public modules)."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"kvbounds": ROOT / "kvbounds", "kvbounds.algorithms": ROOT / "algorithms", "kvbounds.theory": ROOT / "theory",
           "kvbounds.proofs_checks": ROOT / "proofs_checks", "kvbounds.gpu": ROOT / "gpu",
           "kvbounds.traces": ROOT / "traces"}
# modules that are scripts, not faces
SCRIPTS = {"kvbounds.__main__"}
# a room whose names need optional extras to resolve (torch, transformers, kvpress): declared, resolved when present
OPTIONAL = {"kvbounds.presses", "kvbounds.e2e", "kvbounds.gpu.triton_walk", "kvbounds.traces.hf_capture"}


def public_modules() -> dict[str, Path]:
    out = {}
    for prefix, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([prefix, *parts])
            if prefix == "kvbounds" and parts and parts[0] in ("algorithms", "theory", "proofs_checks", "gpu", "traces"):
                continue
            if any(p.startswith("_") for p in parts) or name in SCRIPTS:
                continue
            out[name] = path
    return out


def declares_all(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(n, (ast.Assign, ast.AnnAssign)) and any(
        isinstance(t, ast.Name) and t.id == "__all__" for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))
        for n in tree.body)


def test_every_public_module_declares_its_face():
    missing = sorted(name for name, path in public_modules().items() if not declares_all(path))
    assert not missing, f"public modules without __all__ (declare what is public; a helper's name starts with _): " \
                        f"{missing}"


@pytest.mark.parametrize("name", sorted(public_modules()))
def test_every_declared_name_is_there(name):
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        pytest.skip(f"{name} needs an optional dependency: {e}")
    absent = []
    for attr in module.__all__:
        try:
            getattr(module, attr)
        except AttributeError:
            if hasattr(module, "__path__"):
                try:
                    importlib.import_module(f"{name}.{attr}")
                    continue
                except ImportError as e:
                    if name in OPTIONAL or "No module named" in str(e) and attr not in str(e):
                        continue
            absent.append(attr)
        except ImportError as e:
            if name in OPTIONAL:
                continue
            raise AssertionError(f"{name}.{attr}: {e}") from e
    assert not absent, f"{name} declares names it lacks: {absent}"
