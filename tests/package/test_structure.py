"""The package's structure: no import cycle between its folders (grimp's import graph of every module, imports
inside functions included)."""
from __future__ import annotations

import pytest

grimp = pytest.importorskip("grimp")

# kvbounds' subpackages; every other module of kvbounds (kvbounds/*.py) is a node of its own
FOLDERS = ("theory", "algorithms", "gpu", "traces", "proofs_checks", "e2e", "core", "claims", "methods", "run", "verdict",
           "presses", "battery", "streams", "report", "evaluation", "testing", "cli")


def node(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in FOLDERS:
        return "kvbounds." + parts[1]
    return module


def folder_graph() -> dict[str, set[str]]:
    g = grimp.build_graph("kvbounds", cache_dir=None)
    out: dict[str, set[str]] = {}
    for m in g.modules:
        for i in g.find_modules_directly_imported_by(m):
            a, b = node(m), node(i)
            if a != b and "kvbounds" not in (a, b):      # the root (the package's face) is no room
                out.setdefault(a, set()).add(b)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one node (Tarjan)."""
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(set(graph) | {w for ws in graph.values() for w in ws}):
        if v not in index:
            visit(v)
    return comps


def test_no_import_cycle_between_folders():
    graph = folder_graph()
    assert "kvbounds.algorithms" in graph["kvbounds.proofs_checks"]   # the graph sees through the folder links
    found = cycles(graph)
    detail = []
    for comp in found:
        g = grimp.build_graph("kvbounds", cache_dir=None)
        for a in comp:
            for b in comp:
                if b in graph.get(a, ()):
                    chains = [f"{m} -> {i}" for m in g.modules if node(m) == a
                              for i in g.find_modules_directly_imported_by(m) if node(i) == b]
                    detail.append(f"{a} -> {b}: {', '.join(sorted(chains)[:3])}")
    assert not found, f"import cycles between folders {found}:\n" + "\n".join(detail)
