"""kvbounds: which guarantees of streaming attention / KV-cache compression hold, with what constants.

The package is a house of rooms, each a subpackage with a face (its __init__) and private modules (a leading
underscore); the layers between them are a contract (pyproject.toml's [tool.importlinter]):

    cli          the command line: list, show, check, report, evaluate, e2e, traces
    testing      kvbounds in your own pytest suite: assertions, hypothesis strategies, the pytest plugin
    evaluation   ``kvbounds evaluate SPEC`` / ``kvbounds.evaluate``: any press or compressor against the battery
    report       verdicts as a terminal table, summary.json, report.html and markdown
    proofs_checks  one check per claim id (the repository's folder proofs_checks/)
    streams      the stream families used by the checks, evaluate and testing
    battery      the controls at equal memory, the power rule and its calls, the walk probe
    presses      kvpress presses and the streaming presses
    e2e          every compressor inside a real model (transformers), the leaderboard's rows
    verdict      the verdict's dimensions, the rules that decide them, their statistics
    run, gpu, methods   the sweep runner and its workers; GPU paths (gpu/); the method registry
    core         records and their store, output files, progress
    claims       the claim registry and the papers
    theory, traces      bounds as functions (theory/); synthetic and real traces (traces/)
    algorithms   one module per algorithm of the papers, any array-API backend (algorithms/)

``kvbounds.evaluate(SPEC)`` evaluates any press or compressor against the battery (:mod:`kvbounds.evaluation`).

The repository keeps five of the rooms as top-level folders (theory/, algorithms/, proofs_checks/, gpu/, traces/). A
build maps each to its kvbounds name (setuptools' package-dir, pyproject.toml), and an editable install does the same
through setuptools' finder. Imported from the source tree itself (no install, or a test run from the repository
root), kvbounds finds exactly those five beside this folder through :class:`_RepositoryFolders` below; no other
folder of the repository (tests/, kvbounds/ itself) is ever a subpackage.
"""
import importlib.abc as _abc
import importlib.util as _util
import os as _os
import sys as _sys

__version__ = "0.1.0"
__all__ = ["__version__", "evaluate"]

_FOLDERS = ("theory", "algorithms", "proofs_checks", "gpu", "traces")


class _RepositoryFolders(_abc.MetaPathFinder):
    """``kvbounds.<folder>`` for the five folders of a source tree, found beside kvbounds/ (one level up)."""

    def __init__(self, root: str):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        prefix, _, name = fullname.partition(".")
        if prefix != __name__ or name not in _FOLDERS:
            return None
        init = _os.path.join(self.root, name, "__init__.py")
        if not _os.path.isfile(init):
            return None
        return _util.spec_from_file_location(fullname, init, submodule_search_locations=[_os.path.dirname(init)])


def _install_finder() -> None:
    """Only for a source tree (the folders beside kvbounds/, not inside it as in a wheel), and once per process."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    if _os.path.isdir(_os.path.join(here, "algorithms")):        # a build: the folders are inside kvbounds/
        return
    root = _os.path.dirname(here)
    if not _os.path.isfile(_os.path.join(root, "algorithms", "__init__.py")):
        return
    if not any(isinstance(f, _RepositoryFolders) for f in _sys.meta_path):
        _sys.meta_path.insert(0, _RepositoryFolders(root))     # before an editable install's finder: this tree's


_install_finder()


def _lazy_face(module: str, names: dict, more=lambda: ()):
    """A room's face that loads its private modules on first use of a name (PEP 562): ``(__getattr__, __dir__)``
    for the room ``module`` whose ``names`` map each public name to the module holding it (relative to the room,
    "._model", or absolute); ``more()``: further names found at run time (the presses the method registry names),
    all held by ``more.home``. A loaded name is kept in the room's globals. Here, in the package root, so that the
    rooms whose faces must stay light (the pytest plugin's imports load no numpy) share one copy."""
    import importlib

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        home = names.get(name) or (getattr(more, "home", None) if name in more() else None)
        if home is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, module), name)
        setattr(_sys.modules[module], name, value)
        return value

    def __dir__():
        return sorted(set(vars(_sys.modules[module])) | set(names) | set(more()))

    return __getattr__, __dir__


def __getattr__(name):
    """``kvbounds.evaluate(SPEC, ...)``: :func:`kvbounds.evaluation.evaluate`, imported on first use (importing
    kvbounds stays light)."""
    if name == "evaluate":
        from kvbounds.evaluation import evaluate
        return evaluate
    raise AttributeError(f"module 'kvbounds' has no attribute {name!r}")
