"""The sweep's trials on a dask.distributed cluster: ``kvbounds check --scheduler ADDRESS`` or ``--scheduler local:N``.

``ADDRESS`` is a running scheduler (``tcp://host:8786``); ``local:N`` starts a ``LocalCluster`` of N worker
processes here and closes it after the sweep. The trials go through ``Client.get_executor()``, the
``concurrent.futures.Executor`` the runner takes (:func:`kvbounds.run.run_checks`), and each runs on one
BLAS/OpenMP/torch thread (:func:`kvbounds.run._workers.one_thread`), so its records are those of the local pool.

Each worker must run one thread: threadpoolctl's and torch's thread limits are per process, so two trials sharing
a worker process would change each other's limits mid-trial; a scheduler whose workers have more threads is
refused (start them with ``dask worker ADDRESS --nthreads 1 --nworkers K``). A local cluster's workers start with
one thread and the thread variables set to 1, as the local pool's.

A worker that dies: the runner drops each trial's future as soon as its records are written, so the cluster
keeps no finished trial and recomputes none (dask recomputes a lost result only while a client still holds
its future); the trials in flight on it are run again by the scheduler. A local cluster allows that once per
trial (``distributed.scheduler.allowed-failures`` = 1: a trial that kills a second worker comes back as an error
record, which the next ``check`` retries); a remote scheduler applies its own setting.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from ._workers import THREAD_VARS

INSTALL = "pip install 'kvbounds[dask]'"


def parse_scheduler(spec: str) -> tuple[str, int | str]:
    """``("local", N)`` for ``local:N``, else ``("address", spec)``; a malformed spec raises ValueError."""
    if spec.startswith("local:") or spec == "local":
        n = spec.partition(":")[2]
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"--scheduler local:N needs a number of workers N >= 1, got {spec!r}")
        return "local", int(n)
    if not spec or any(c.isspace() for c in spec):
        raise ValueError(f"--scheduler must be a dask scheduler address (tcp://host:8786) or local:N, got {spec!r}")
    return "address", spec


def _distributed():
    try:
        import distributed
    except ImportError as e:
        raise RuntimeError(f"--scheduler needs dask.distributed ({e}); {INSTALL}") from None
    return distributed


@contextlib.contextmanager
def dask_executor(spec: str) -> Iterator[tuple[object, int]]:
    """``(executor, workers)`` for :func:`kvbounds.run.run_checks` on the cluster ``spec`` names (workers: its
    threads, for the progress line). A local cluster is closed on exit, a remote one only disconnected from."""
    kind, where = parse_scheduler(spec)
    distributed = _distributed()
    import dask
    with contextlib.ExitStack() as stack:
        if kind == "local":
            with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
                cluster = stack.enter_context(distributed.LocalCluster(
                    n_workers=where, threads_per_worker=1, processes=True, dashboard_address=None,
                    env={v: "1" for v in THREAD_VARS}))
            client = stack.enter_context(distributed.Client(cluster))
        else:
            try:
                client = stack.enter_context(distributed.Client(where, timeout="20s"))
            except (OSError, TimeoutError) as e:
                raise RuntimeError(f"cannot reach the dask scheduler at {where}: {e}") from None
        if kind == "address":
            with contextlib.suppress(TimeoutError):          # workers may still be connecting
                client.wait_for_workers(1, timeout=20)
        threads = {w: info["nthreads"] for w, info in client.scheduler_info()["workers"].items()}
        if not threads:
            raise RuntimeError(f"the dask scheduler at {where} has no workers")
        busy = {w: n for w, n in threads.items() if n != 1}
        if busy:
            raise RuntimeError(f"the workers of {where} run {sorted(set(busy.values()))} threads each; a trial needs "
                               "a worker process of its own (its BLAS/torch thread limits are per process): start them "
                               "with `dask worker ADDRESS --nthreads 1 --nworkers K`")
        yield client.get_executor(), len(threads)
