"""The method registry: one entry per KV-cache compression method, the one place a method is named.

A method compresses one layer's cache to a float budget. Its contract (every entry's ``compress``)::

    compress(K, V, floats, rng, *, sink, window, block_size=64, Q=None) -> CompressedKV

K, V (Hkv, n, d) of one layer, numpy or torch (the result lives where K does); ``floats`` the floats it may hold per
KV head (keys, values and log-weights, as :func:`kvbounds.algorithms.compressed_kv.memory_floats` counts them: the
one budget unit from a press down to the algorithm); the first ``sink`` and last ``window`` tokens kept exactly;
every random draw from the numpy Generator ``rng`` (the same seed, the same cache on every backend); ``Q`` the
layer's queries (K's shape) for methods with ``needs_queries``. The floats it holds are ``memory_floats`` of what it
returns.

The package's methods are the modules of :mod:`kvbounds.catalog`, one per method: each holds its contract function
and its entry (``METHOD``), whose fields are real references (its ``compress``, stacked and prefill forms). The
registry imports that package by name on its first use (:data:`CATALOG`: it sits above the rooms its methods call,
so no static import reaches it from here) and registers what it collects, in its order.

Everything that lists methods reads this registry: the end-to-end harness's method lists and their families
(:mod:`kvbounds.e2e`), its dispatch (:mod:`kvbounds.e2e`), the leaderboard's families, the
presses of :mod:`kvbounds.presses` (one class per press an entry names), the end-to-end claims' variants, the
README's method table (tested against it). NVIDIA kvpress's presses enter through one adapter: each
``kvpress:<name>`` entry names its press class and runs through :func:`kvbounds.e2e.compress_kvpress_prefill`.

Adding a method (docs/EXTENDING.md): a module with its ``compress`` function and its ``METHOD = Method(...)``. In
``kvbounds/catalog/`` it is found when the package is imported; outside the package, the entry-point group
``kvbounds.methods`` names it (a distribution's ``[project.entry-points."kvbounds.methods"]``: each value names a
module, or a :class:`Method`). ``register(Method(...))`` at run time adds one too.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import warnings
from importlib.metadata import entry_points
from typing import Callable

from kvbounds.algorithms.validation import InputError

__all__ = ["Method", "register", "get_method", "methods", "names", "variants", "press_method", "leaderboard_family",
           "load_entry_points", "module_methods", "method_table", "VARIANT_WORDS", "variant_words"]

ROLES = ("method", "baseline", "control", "ablation")
SOURCES = ("kvbounds", "kvpress", "external")


@dataclasses.dataclass(frozen=True)
class Method:
    """One compression method.

    ``compress``: its contract function (the module docstring), a callable (or, for a plugin that defers an
    import, ``"module:function"``, imported on first call); None for a
    method that only runs on a model's prefill (``compress_prefill``: kvpress's presses).
    ``role``: ``"method"`` (an algorithm of the papers under test), ``"baseline"``, ``"control"`` (a null control:
    a method that must not be found better than another) or ``"ablation"`` (a method with its core ingredient
    replaced by chance: the battery's control, :mod:`kvbounds.battery`; not run by the end-to-end lists). ``source``:
    who implements it (``kvbounds``, ``kvpress``,
    ``external`` for a third party's).
    ``algorithm`` / ``variant``: the algorithm it is a variant of, as the claims name it ("BalanceKV"), and its label
    among that algorithm's variants ("pseudocode", "released"); ``label``: one line a reader sees.
    ``ablation``: the registered method that is this one with its core ingredient replaced by chance (a control at
    equal memory), or "". ``control_of``: for a null control, the registered method it repeats (it must not be found
    better than that method).
    ``randomized``: its cache depends on ``rng`` (the checks redraw it). ``needs_queries``: it reads the layer's
    queries (the harness captures the prefill's attention inputs). ``needs_scores``: it reads the attention each key
    received during the prefill.
    ``compress_prefill``: ``(method, lm, state, budget, *, seed, sink, window, where) -> list[CompressedKV]``, a form
    that reads the model's prefill instead of K, V (used instead of ``compress`` by the harness when set).
    ``compress_layers``: ``(method, state, floats, rng, *, sink, window, block_size) -> list[CompressedKV] | None``,
    every layer on the host at once, the same caches as layer by layer (None: go layer by layer).
    ``press`` / ``press_options``: the :mod:`kvbounds.presses` class that runs it and the field values that select it
    (for ``kvpress:`` entries, kvpress's class name). ``host_only``: why it cannot run on torch tensors (else "").
    ``device_host_reads``: the small arrays its device path reads on the host (never K or V).
    ``requires``: a module that must import for it to run (its rows are skipped with the reason otherwise).
    ``make_press``: for a kvpress press that is not one of kvpress's own entries (a press of one's own, registered by
    ``kvbounds evaluate module:NAME``): ``ratio -> press instance`` at kvpress's compression ratio; the end-to-end
    harness runs it inside the model as it runs kvpress's presses (``compress_prefill`` =
    :func:`kvbounds.e2e.compress_kvpress_prefill`).
    """
    name: str
    compress: Callable | str | None = None
    role: str = "method"
    source: str = "kvbounds"
    algorithm: str = ""
    variant: str = ""
    label: str = ""
    paper: str = ""
    ablation: str = ""
    control_of: str = ""
    randomized: bool = False
    needs_queries: bool = False
    needs_scores: bool = False
    compress_prefill: Callable | str | None = None
    compress_layers: Callable | str | None = None
    press: str = ""
    press_options: tuple = ()
    host_only: str = ""
    device_host_reads: str = ""
    requires: str = ""
    make_press: Callable | str | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or self.name != self.name.strip():
            raise ValueError(f"a method's name must be a non-empty string without surrounding spaces, "
                             f"got {self.name!r}")
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {self.source!r}")
        if self.compress is None and self.compress_prefill is None:
            raise ValueError(f"method {self.name!r} needs compress or compress_prefill")

    def function(self, field: str = "compress") -> Callable | None:
        """The callable behind ``compress`` (or another function field), imported on first use."""
        return _resolve(getattr(self, field))


def _resolve(ref):
    if ref is None or callable(ref):
        return ref
    mod, _, attr = ref.partition(":")
    obj = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


_METHODS: dict[str, Method] = {}
_LOADED = False
_LOADING = False


def register(method: Method, *, replace: bool = False) -> Method:
    """Add ``method`` to the registry (in registration order); the same entry again is a no-op, another entry under
    a registered name an error unless ``replace``."""
    if not isinstance(method, Method):
        raise TypeError(f"register takes a Method, got {type(method).__name__}")
    old = _METHODS.get(method.name)
    if old is not None and old != method and not replace:
        raise ValueError(f"a different method is registered as {method.name!r} (register(..., replace=True))")
    _METHODS[method.name] = method
    return method


def load_entry_points(group: str = "kvbounds.methods") -> list[str]:
    """Register the methods the installed distributions name in the entry-point group: each value names a module
    (its ``METHOD`` / ``METHODS``, as a module of :mod:`kvbounds.catalog` has, or the ``register`` calls its import
    makes) or a :class:`Method`. Returns the names of those that failed, each with its error; the registry stays
    usable."""
    failed = []
    for ep in entry_points(group=group):
        try:
            obj = ep.load()
            found = (obj,) if isinstance(obj, Method) else module_methods(obj)
            for m in found:
                register(m)
        except Exception as e:  # noqa: BLE001 - one broken plugin must not take the registry down
            failed.append(f"{ep.name} ({ep.value}): {type(e).__name__}: {e}")
    return failed


def module_methods(module) -> tuple[Method, ...]:
    """The entries a method module defines: its ``METHOD`` and the members of its ``METHODS`` (found by isinstance,
    as :mod:`kvbounds.catalog` finds the package's own)."""
    one = getattr(module, "METHOD", None)
    many = tuple(getattr(module, "METHODS", ()))
    return tuple(m for m in ((one,) if one is not None else ()) + many if isinstance(m, Method))


# The catalog of the package's own methods, imported by name on the registry's first use: its modules name
# functions of rooms above this one (the end-to-end harness's stacked and prefill forms, the battery's ablations), so
# no static import may reach it from here (the layers, pyproject.toml [tool.importlinter]).
CATALOG = "kvbounds.catalog"


def _ensure_loaded() -> None:
    global _LOADED, _LOADING
    if _LOADED:
        return
    if _LOADING:
        raise RuntimeError("kvbounds.methods was asked for a method while the catalog was loading: a module that "
                           f"{CATALOG} imports reads the registry when it is imported (read it inside a function)")
    _LOADING = True
    try:
        for m in importlib.import_module(CATALOG).METHODS:
            register(m)
        for why in load_entry_points():
            warnings.warn(f"kvbounds.methods: an entry point failed to load: {why}")
        _LOADED = True
    finally:
        _LOADING = False


def methods(**where) -> list[Method]:
    """Every registered method, in registration order, with the given field values (``methods(role="method")``)."""
    _ensure_loaded()
    out = list(_METHODS.values())
    for field, value in where.items():
        out = [m for m in out if getattr(m, field) == value]
    return out


def names(**where) -> tuple[str, ...]:
    """The names of :func:`methods` (``names(randomized=True)``)."""
    return tuple(m.name for m in methods(**where))


def get_method(name: str) -> Method:
    """The registered method ``name``; an unknown name raises ``InputError`` naming the closest ones."""
    _ensure_loaded()
    if isinstance(name, str) and name in _METHODS:
        return _METHODS[name]
    if not isinstance(name, str):
        raise InputError(f"method must be a method name (str), got {type(name).__name__}")
    close = difflib.get_close_matches(name, list(_METHODS), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    ours = ", ".join(n for n, m in _METHODS.items() if m.source != "kvpress")
    kvp = ", ".join(n for n, m in _METHODS.items() if m.source == "kvpress")
    raise InputError(f"unknown method {name!r}{hint}; ours: {ours}; kvpress: {kvp}")


def variants(algorithm: str) -> dict[str, str]:
    """variant label -> method name of ``algorithm``'s variants run by this package (registration order)."""
    return {m.variant: m.name for m in methods(algorithm=algorithm, role="method") if m.variant}


# What a reader is told each variant is, wherever a verdict's empirical sentence speaks of one (headlines, per-variant
# reproductions): keyed "algorithm:variant" with the algorithm as the registry's entries name it. The variants of the
# registered methods (their ``algorithm`` / ``variant``) and those the claims' checks run that are no compression
# method of the contract (a walk rule, a streaming press, a sketch).
_STREAMING_BKV = ("streaming press (merge-and-reduce over weighted coresets; departs from the paper in three ways: "
                  "pairs not free signs, a fixed token budget, one walk for numerator and denominator)")
VARIANT_WORDS = {
    "BalanceKV:pseudocode": "pseudocode walk at the theorem's c (= random halving)",
    "BalanceKV:greedy": "greedy walk (each sign the one that lowers the running discrepancy most: the walk's c -> 0)",
    "BalanceKV:released": "released walk (authors' code: centred keys, temp 1, gamma 4)",
    "BalanceKV:released-t0.1": "released walk at the Fig. 1/3 notebook's temp 0.1 (authors' code: centred keys, gamma 4)",
    "BalanceKV:consistent-t0.1": "released walk at temp 0.1 with a consistent estimator (log w in both sums)",
    "BalanceKV:streaming": _STREAMING_BKV,
    "SubGen/ClusterGen:subgen": "SubGen's estimator (cluster representatives for the denominator, l2-sampled values)",
    "SubGen/ClusterGen:kcenter": "greedy k-center (centres and the recent window, weights 1, as the papers keep)",
    "SubGen/ClusterGen:kcenter_sized": "greedy k-center with each centre weighted by its cluster's size",
    "SubGen/ClusterGen:streaming": ("streaming SubGen press (online clusters with per-cluster reservoirs for the "
                                    "denominator, l2 samples of the values; a fixed token budget)"),
    "Subspace/FD:subspace": "static top-r projection of the keys and values (the draft's subspace attention)",
    "Subspace/FD:fd": "Frequent Directions sketch (l rows kept, a 2l-row working buffer)",
}


def variant_words(algorithm: str, variant: str) -> str:
    """The words for ``algorithm``'s ``variant`` (:data:`VARIANT_WORDS`); a registered method's label when the table
    has no entry; else the variant's own name."""
    key = f"{algorithm}:{variant}"
    if key in VARIANT_WORDS:
        return VARIANT_WORDS[key]
    named = [m for m in methods(algorithm=algorithm) if m.variant == variant and m.label]
    return named[0].label if named else variant


def press_method(press: str, **options) -> str:
    """The method a :mod:`kvbounds.presses` class runs with these field values (``press_method("KCenterPress",
    cluster_sized=True)``): the entry naming that press whose ``press_options`` all hold (the most specific)."""
    fits = [m for m in methods(press=press) if all(options.get(k) == v for k, v in m.press_options)]
    if not fits:
        raise KeyError(f"no registered method runs press {press!r} with {options}")
    return max(fits, key=lambda m: len(m.press_options)).name


def leaderboard_family(name: str) -> str:
    """The leaderboard's family of a method: ``ours`` (the papers' methods as implemented here), ``kvpress`` (NVIDIA
    kvpress's presses) or ``baselines`` (everything else: baselines, null controls, exact attention)."""
    _ensure_loaded()
    m = _METHODS.get(name)
    if m is None:
        return "kvpress" if isinstance(name, str) and name.startswith("kvpress:") else "baselines"
    if m.source == "kvpress":
        return "kvpress"
    return "ours" if m.role == "method" and m.source == "kvbounds" else "baselines"


def method_table(sources: tuple[str, ...] = ("kvbounds", "kvpress")) -> str:
    """The registry's methods of ``sources`` as a markdown table (the README's method table is this text for the
    package's own and kvpress's, tests/methods/test_methods.py; a third party's, ``source="external"``, is not in it,
    so adding one changes no committed document)."""
    rows = ["| method | role | algorithm (variant) | randomized | press | what it keeps |",
            "| --- | --- | --- | --- | --- | --- |"]
    for m in (m for m in methods() if m.source in sources):
        alg = f"{m.algorithm} ({m.variant})" if m.algorithm else ""
        options = ", ".join(f"{k}={v}" for k, v in m.press_options)
        press = f"`{'kvpress.' if m.source == 'kvpress' else ''}{m.press}`" if m.press else ""
        press += f" ({options})" if press and options else ""
        rows.append(f"| `{m.name}` | {m.role} | {alg} | {'yes' if m.randomized else ''} | {press} | {m.label} |")
    return "\n".join(rows)
