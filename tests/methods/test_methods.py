"""The method registry (kvbounds.methods): one entry per method, every list of methods derived from it, the README's
table its text, and a method's name written in no more places than its module and the registry."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from kvbounds.methods import _registry as registry
from kvbounds.algorithms.validation import InputError

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("kvbounds", "algorithms", "theory", "proofs_checks", "gpu", "traces")


def test_every_list_of_methods_derives_from_the_registry():
    from kvbounds.e2e import _method_names as M
    from kvbounds.e2e._leaderboard import family
    assert M.DEFAULT_METHODS == tuple(m.name for m in registry.methods() if m.role != "ablation" and m.source != "external")
    for m in registry.methods(role="method", source="kvbounds"):   # each of the package's methods names its ablation
        assert registry.get_method(m.ablation).role == "ablation", m.name
    assert set(M.OURS) == {m.name for m in registry.methods(source="kvbounds") if m.role not in ("control", "ablation")}
    assert M.CONTROLS == registry.names(role="control", source="kvbounds") and M.KVPRESS == registry.names(source="kvpress")
    assert set(M.RANDOMIZED) == {m.name for m in registry.methods() if m.randomized}
    assert M.NEEDS_INPUTS == registry.names(needs_queries=True)
    for m in registry.methods():
        assert family(m.name) == ("kvpress" if m.source == "kvpress" else "ours" if m.role == "method"
                                  else "baselines"), m.name
        if m.control_of:
            assert m.control_of in registry.names(), m.name
        for field in ("compress", "compress_prefill", "compress_layers"):
            ref = getattr(m, field)
            if isinstance(ref, str) and m.source != "kvpress":
                assert callable(m.function(field)), (m.name, field, ref)


def test_lookup_and_registration():
    assert registry.get_method("balancekv").algorithm == "BalanceKV"
    with pytest.raises(InputError, match="did you mean balancekv"):
        registry.get_method("balancekvv")
    with pytest.raises(InputError, match="method name"):
        registry.get_method(3)
    with pytest.raises(ValueError, match="different method"):
        registry.register(registry.Method("uniform", registry.get_method("kcenter").compress))
    assert registry.register(registry.get_method("uniform")) is registry.get_method("uniform")    # the same: no-op
    with pytest.raises(ValueError, match="role"):
        registry.Method("x", "m:f", role="oracle")
    assert registry.variants("BalanceKV") == {"pseudocode": "balancekv", "released": "balancekv_released"}
    assert registry.press_method("KCenterPress", cluster_sized=True) == "kcenter_sized"


def test_a_registered_method_runs_through_the_harness_contract(monkeypatch):
    """A method registered at run time (a plain function of the contract) is run by compress_ours like the
    package's own, at its float budget."""
    from kvbounds.algorithms.token_selection import gather_selection, memory_floats
    from kvbounds.e2e import compress_ours

    def first_tokens(K, V, floats, rng, *, sink, window, block_size=64, Q=None):
        m = (floats - 1) // (2 * K.shape[-1])
        idx = np.broadcast_to(np.arange(m), K.shape[:-2] + (m,))
        return gather_selection(K, V, idx, np.zeros(idx.shape, np.float32))

    monkeypatch.setattr(registry, "_METHODS", dict(registry._METHODS))
    registry.register(registry.Method("first_tokens", first_tokens, role="baseline", source="external"))
    K = np.random.default_rng(0).standard_normal((2, 64, 8)).astype(np.float32)
    c = compress_ours("first_tokens", K, K, 400, np.random.default_rng(1), sink=4, window=4)
    assert c.keys.shape == (2, 24, 8) and memory_floats(c) <= 2 * 400      # floats per KV head, 2 heads


def test_readme_method_table_is_the_registry():
    text = (ROOT / "README.md").read_text()
    table = re.search(r"<!-- method table: kvbounds.methods.method_table\(\) -->\n(.*?)\n<!-- end of method table -->",
                      text, re.S)
    assert table, "README.md lost its method table markers"
    assert table.group(1) == registry.method_table(), \
        "README.md's method table is stale: paste kvbounds.methods.method_table() between its markers"


# Registered names that are also names in other namespaces of the package, so their literals there are not this
# registry's: the LB.index game's players (compressor_adapters.COMPRESSORS), the token selectors
# (token_selection.SELECTORS), the single-layer experiment's variants (BKV.vs-uniform), the claims' choices of
# baselines (which baselines a paper compares with is a fact of the claim) and kvpress's own names.
SHARED_NAMES = {"streaming_llm", "uniform", "kcenter", "balancekv", "subgen", "subspace", "h2o", "kernel_thinning"}


def string_literals(path: Path) -> set[str]:
    """The string constants of a module, docstrings and ``__all__`` (names of the module's own objects) left out."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and ast.get_docstring(n)}
    docs |= {id(c) for n in ast.walk(tree) if isinstance(n, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets) for c in ast.walk(n.value)}
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs}


def test_a_method_name_is_written_in_at_most_two_source_files():
    """Its module (kvbounds/catalog/<name>.py: its contract function and its entry) and at most one other (the
    equal-memory fit that serves it); every other list derives from the registry. The catalog's ORDER (the registry's
    order, which names the package's own modules) is the registry's place, not counted."""
    order = ROOT / "kvbounds" / "catalog" / "__init__.py"
    files = [p for d in SOURCES for p in (ROOT / d).rglob("*.py") if not p.is_symlink() and p != order]
    literals = {p: string_literals(p) for p in files}
    for m in registry.methods(source="kvbounds"):
        if m.name in SHARED_NAMES:
            continue
        where = sorted(str(p.relative_to(ROOT)) for p, lits in literals.items() if m.name in lits)
        assert len(where) <= 2, f"{m.name!r} is written in {where}: derive it from kvbounds.methods"
