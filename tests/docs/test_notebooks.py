"""Every notebook under notebooks/ runs top to bottom on the smoke profile without a cell error.

The kernel is this interpreter (``sys.executable``, i.e. the venv's python with kvbounds installed),
through a private "python3" kernel spec in a temporary directory: the test does not depend on which
kernels are registered on the machine, nor on ``python`` on PATH, and installs nothing.

A notebook runs its claims' checks with ``run_checks``, which runs only the trials missing in ``KVBOUNDS_OUT``. The
test fills ``KVBOUNDS_OUT`` beforehand with the session's smoke records of those claims (conftest.SmokeStore, the
records tests/proofs_checks/test_checks.py checks), so a notebook draws from the same records instead of recomputing
them; the
claims are read from the notebook's own ``...CLAIMS = [...]`` assignments. Every axes of every figure a cell draws
must show some data (a line, points, bars, an image): a filter on names the records no longer carry drew empty
figures silently.
"""
from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
KERNEL = "python3"
# The kernel's numerical pools on one thread each: `make test` runs two xdist workers on two cores, and a kernel's
# second OpenMP/BLAS thread only spins against them (~25% more CPU for the same cells on a loaded machine).
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def kernel_specs(tmp_path_factory) -> KernelSpecManager:
    d = tmp_path_factory.mktemp("kernels")
    (d / KERNEL).mkdir()
    (d / KERNEL / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (kvbounds tests)", "language": "python"}))
    return KernelSpecManager(kernel_dirs=[str(d)])


def notebook_claims(nb) -> list[str]:
    """The claim ids of the notebook's ``CLAIMS = [...]`` (and ``VARIANT_CLAIMS = [...]``, ...) literal lists."""
    out = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:        # an IPython magic: no claim list there
            continue
        for node in tree.body:
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id.endswith("CLAIMS")
                                                     for t in node.targets)):
                out += [c for c in ast.literal_eval(node.value) if c not in out]
    return out


def test_notebook_claims_are_read_from_the_notebook():
    nb = nbformat.read(ROOT / "notebooks" / "balancekv.ipynb", as_version=4)
    claims = notebook_claims(nb)
    assert claims[:5] == ["SBW.balance", "SB.discrepancy", "MR.error", "BKV.attention", "BKV.memory"]
    assert "BKV.vs-uniform" in claims and "BKV.ablation" in claims


# Run before the notebook's cells (in the same kernel): after each cell, before the inline backend shows and closes the
# figures, every axes of every open figure must draw some data; an empty one is noted with its cell and title.
EMPTY_AXES_HOOK = """
def _kvbounds_axes_with_data(ax):
    lines = [l for l in ax.get_lines() if len(l.get_xdata()) and len(l.get_ydata())]
    collections = [c for c in ax.collections if len(c.get_offsets()) or len(c.get_paths())]
    return bool(lines or collections or ax.patches or ax.images or ax.tables)


def _kvbounds_note_empty_axes(*_):
    import sys
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for num in plt.get_fignums():
        for ax in plt.figure(num).axes:
            if ax.axison and not _kvbounds_axes_with_data(ax):
                cell = get_ipython().user_ns["In"][-1].strip().splitlines()[0]
                _KVBOUNDS_EMPTY_AXES.append(f"the cell {cell!r}: axes {ax.get_title()!r}")


_KVBOUNDS_EMPTY_AXES = []
get_ipython().events.register("post_execute", _kvbounds_note_empty_axes)
"""


def empty_axes(nb) -> list[str]:
    """The "the cell 'first line': axes 'title'" notes of the hook above, printed by the last cell the test appended."""
    text = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []))
    return json.loads(text.split("EMPTY_AXES=", 1)[1])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_on_smoke(path: Path, tmp_path: Path, kernel_specs: KernelSpecManager, smoke_store):
    nb = nbformat.read(path, as_version=4)
    out = tmp_path / "results"
    claims = notebook_claims(nb)
    assert claims, f"{path.name}: no CLAIMS = [...] list found"
    smoke_store.copy_into(out, claims)
    env = {**os.environ, "KVBOUNDS_PROFILE": "smoke", "KVBOUNDS_OUT": str(out), **ONE_THREAD}
    env.pop("MPLBACKEND", None)  # the kernel picks its inline backend, whatever the caller's setting
    nb.cells.insert(0, nbformat.v4.new_code_cell(EMPTY_AXES_HOOK))
    nb.cells.append(nbformat.v4.new_code_cell('import json; print("EMPTY_AXES=" + json.dumps(_KVBOUNDS_EMPTY_AXES))'))
    km = AsyncKernelManager(kernel_name=KERNEL, kernel_spec_manager=kernel_specs)
    client = NotebookClient(nb, km=km, kernel_name=KERNEL, timeout=300,
                            resources={"metadata": {"path": str(ROOT)}})  # cwd = repo root
    client.execute(env=env)  # raises CellExecutionError on the first failing cell
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, errors
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert f"record(s) of profile 'smoke' in {out}/" in text, "the notebook did not read its records in KVBOUNDS_OUT"
    assert not empty_axes(nb), f"{path.name}: figures with an empty axes (no line, point, bar or image drawn): " \
                               f"{empty_axes(nb)}"
    shown = "".join(o.get("data", {}).get("text/markdown", "") for c in nb.cells if c.cell_type == "code"
                    for o in c.get("outputs", []))
    assert all(f"**{c}**" in shown for c in claims), f"{path.name}: no closing words for {claims} in {shown[:300]!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebook_has_no_error_output(path: Path):
    """Notebooks ship executed (``make notebooks``) so a reader sees the figures; none may carry an error."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    errors = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: cell(s) {errors} end in an error; rerun `make notebooks`"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_ends_with_what_its_figures_show(path: Path):
    """The last cell says in words what the figures show about the theorem; the one before writes, from the
    verdicts of the records, what each claim's records show (so the words follow a fresh run)."""
    nb = nbformat.read(path, as_version=4)
    last, generated = nb.cells[-1], nb.cells[-2]
    assert last.cell_type == "markdown" and last.source.startswith("**What the figures show") and \
        150 <= len(last.source) <= 900, last.source[:200]
    assert generated.cell_type == "code" and "what_the_records_show(" in generated.source
