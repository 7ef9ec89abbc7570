"""kvbounds.catalog: one module per method, found by importing the package; each entry's functions are real
references (no "module:function" strings), its contract function in its own module."""
from __future__ import annotations

import importlib

import pytest

import kvbounds.catalog as catalog
from kvbounds.methods import _registry as registry

FUNCTION_FIELDS = ("compress", "compress_prefill", "compress_layers", "make_press")


def test_every_module_of_the_catalog_is_found_and_registered_in_order():
    assert catalog.modules()[:len(catalog.ORDER)] == list(catalog.ORDER)
    assert catalog.METHODS == catalog.collect()
    assert [m.name for m in catalog.METHODS] == list(registry.names())[:len(catalog.METHODS)]
    for name in catalog.modules():
        module = importlib.import_module(f"kvbounds.catalog.{name}")
        assert registry.module_methods(module), name


def test_entries_hold_real_references_and_their_own_contract_function():
    for m in catalog.METHODS:
        for field in FUNCTION_FIELDS:
            ref = getattr(m, field)
            assert ref is None or callable(ref), (m.name, field, ref)
        if m.compress is not None and m.source == "kvbounds" and m.role != "control":
            # the method's behaviour beside its identity: its module, or the battery's for an ablation it shares
            assert m.compress.__module__ in (f"kvbounds.catalog.{m.name}", "kvbounds.battery._ablations"), m.name


def test_a_read_of_the_registry_while_the_catalog_loads_is_refused(monkeypatch):
    """A module the catalog imports must not read the registry at its import (it would see a partial registry)."""
    monkeypatch.setattr(registry, "_METHODS", {})
    monkeypatch.setattr(registry, "_LOADED", False)
    monkeypatch.setattr(registry, "_LOADING", True)
    with pytest.raises(RuntimeError, match="while the catalog was loading"):
        registry.names()


def test_a_module_without_an_entry_is_named():
    class Empty:
        __name__ = "kvbounds.catalog.empty"
    with pytest.raises(TypeError, match="kvbounds.catalog.empty .* must define METHOD"):
        catalog._entries(Empty())


def test_an_entry_point_may_name_a_module_or_a_method():
    entry = catalog.METHODS[0]
    module = type("M", (), {"METHOD": entry, "METHODS": (entry,), "other": 3})
    assert registry.module_methods(module) == (entry, entry)
