"""The methods: one module per KV-cache compression method, each holding its contract function and its entry
(``METHOD``, a :class:`kvbounds.methods.Method` whose fields are real references: its ``compress``, its stacked and
prefill forms, its press), found by importing this package.

Importing it imports every module here (the package's own in :data:`ORDER`, which is the order of the registry, the
README's method table and the end-to-end lists; any other module after them, by name) and collects each module's
``METHOD`` (or ``METHODS``, a tuple) into :data:`METHODS`. The registry (:mod:`kvbounds.methods`) imports this package
by name on its first use; nothing imports it statically, since its methods name functions of the rooms above the
registry (the end-to-end harness's stacked and prefill forms, the battery's ablations).

Adding a method (docs/EXTENDING.md): one module here with its ``compress`` and its ``METHOD``; nothing else changes.
It may import kvbounds.battery, kvbounds.presses, kvbounds.e2e, kvbounds.methods and every room below them; the layers
are a contract (tests/package/test_structure.py).
"""
from __future__ import annotations

import importlib
import pkgutil

from kvbounds.methods import Method, module_methods

__all__ = ["ORDER", "METHODS", "modules", "collect"]

# the package's own methods in the registry's order, the ablations after the methods they ablate, kvpress's last
ORDER = ("streaming_llm", "uniform", "kcenter", "kcenter_sized", "balancekv", "balancekv_released", "subgen",
         "subspace", "h2o", "kernel_thinning", "uniform_control", "balancekv_coin", "balancekv_released_coin",
         "subgen_uniform", "subspace_sketch", "subspace_random", "kcenter_random", "kcenter_sized_random",
         "kvpress_presses")


def modules() -> list[str]:
    """The names of this package's method modules: :data:`ORDER`, then any other module here by name."""
    found = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    return list(ORDER) + [m for m in found if m not in ORDER]


def _entries(module) -> tuple[Method, ...]:
    found = module_methods(module)
    if not found:
        raise TypeError(f"{module.__name__} is a module of kvbounds.catalog: it must define METHOD (a "
                        "kvbounds.methods.Method) or METHODS (a tuple of them)")
    return found


def collect() -> tuple[Method, ...]:
    """Every method module of :func:`modules` imported, and its entries, in that order."""
    return tuple(m for name in modules() for m in _entries(importlib.import_module(f"{__name__}.{name}")))


METHODS: tuple[Method, ...] = collect()
