"""pytest at the repository root. A file of theory/, algorithms/, proofs_checks/, gpu/ or traces/ that pytest collects
itself (``pytest --doctest-modules theory``) is named by its folder (``theory.lower_bound``: the folders have no
parent package in the repository); that name is made the module ``kvbounds.theory.lower_bound`` itself, so that each
module is imported once, under its kvbounds name, and its doctests run once. Nothing else imports those names."""
import importlib
import importlib.abc
import importlib.machinery
import sys

FOLDERS = ("theory", "algorithms", "proofs_checks", "gpu", "traces")


class _SameModule(importlib.abc.Loader):
    """Loads a name as an already imported module, whose own spec is kept."""

    def __init__(self, module):
        self.module = module
        self.spec = module.__spec__

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        module.__spec__ = self.spec          # the import system set the alias's spec; the module keeps its own


class _FolderAsKvbounds(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] not in FOLDERS:
            return None
        module = importlib.import_module(f"kvbounds.{fullname}")
        return importlib.machinery.ModuleSpec(fullname, _SameModule(module), is_package=hasattr(module, "__path__"))


if not any(isinstance(f, _FolderAsKvbounds) for f in sys.meta_path):
    sys.meta_path.insert(0, _FolderAsKvbounds())
