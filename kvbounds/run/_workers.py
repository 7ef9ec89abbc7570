"""Worker processes and threads of the sweep runner (:mod:`kvbounds.run`): one BLAS/OpenMP/torch thread per
trial, a fork-server process pool whose workers ignore Ctrl-C and die with their parent (even a parent killed by
``kill -9``), and SIGTERM turned into an exception the runner handles like Ctrl-C."""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import signal
import sys
import threading

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


class Terminated(BaseException):
    """SIGTERM arrived while :func:`sigterm_raises` was active (handled like Ctrl-C)."""


_ONE_THREAD_PROCESS = False   # set in pool workers, which single_thread_process put on one thread


def single_thread_process() -> None:
    """Put this (pool worker) process on one BLAS/OpenMP/torch thread for good: the environment
    variables for the libraries loaded later (torch reads OMP_NUM_THREADS when it loads), threadpoolctl
    and torch's own setting for those loaded already. The pool already uses every core."""
    global _ONE_THREAD_PROCESS
    from threadpoolctl import threadpool_limits
    os.environ.update({v: "1" for v in THREAD_VARS})
    threadpool_limits(1)
    if "torch" in sys.modules:          # importing torch just to limit it would cost every worker ~1 s
        sys.modules["torch"].set_num_threads(1)
    _ONE_THREAD_PROCESS = True


@contextlib.contextmanager
def single_thread_scope():
    """One BLAS/OpenMP/torch thread in this process while the block runs, everything restored after:
    the sweep of ``workers=1``, which runs in the caller's process. Enter it in the thread that calls
    ``run_checks``: threadpoolctl lets one thread at a time set OpenBLAS's process-wide limit, so a
    limit set from the pool's thread can be silently ignored."""
    env = {v: os.environ.get(v) for v in THREAD_VARS}
    os.environ.update({v: "1" for v in THREAD_VARS})      # for libraries (torch) first loaded in the sweep
    try:
        with _blas_and_torch_on_one_thread():
            yield
    finally:
        for v, old in env.items():
            if old is None:
                os.environ.pop(v, None)
            else:
                os.environ[v] = old


@contextlib.contextmanager
def one_thread():
    """One BLAS/OpenMP/torch thread inside the block, restored after (for trials run on an executor
    that did not call :func:`single_thread_process`, e.g. a user's ThreadPoolExecutor or Dask)."""
    if _ONE_THREAD_PROCESS:
        yield
        return
    with _blas_and_torch_on_one_thread():
        yield


@contextlib.contextmanager
def _blas_and_torch_on_one_thread():
    """threadpoolctl's limit of 1 and torch's intra-op threads set to 1; torch's count is restored before
    threadpoolctl restores its own (which sets OpenMP too)."""
    from threadpoolctl import threadpool_limits
    torch = sys.modules.get("torch")
    old = torch.get_num_threads() if torch is not None else None
    with threadpool_limits(1):
        if torch is not None:
            torch.set_num_threads(1)
        try:
            yield
        finally:
            if torch is not None:
                torch.set_num_threads(old)


def _die_with_parent() -> None:
    """Linux: the kernel sends SIGKILL to this worker when its parent dies: the main process (spawn),
    or the fork server, which exits once the main process is gone and no worker holds its "alive"
    pipe; so the worker drops the copy of that pipe it was handed (it starts no processes itself)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)      # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    from multiprocessing import forkserver
    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if isinstance(fd, int) and getattr(server, "_forkserver_pid", 0) is None:   # a worker, not the main process
        with contextlib.suppress(OSError):
            os.close(fd)
        server._forkserver_alive_fd = server._forkserver_address = None     # a nested pool starts its own server


def _watch_parent(alive) -> None:
    """Exit as soon as the main process is gone: it holds the only write end of ``alive``, so the read
    returns EOF when it dies, however it dies (kill -9 too), even before anyone reaps it."""
    try:
        alive.recv_bytes()
    except (EOFError, OSError):
        pass
    os._exit(1)


def _worker_init(alive, sys_path=()) -> None:
    """Pool worker setup: ignore Ctrl-C (the main process ends the pool), die with the main process
    (a watchdog thread on the ``alive`` pipe, plus PR_SET_PDEATHSIG on Linux), one thread for
    every numerical library, and ``sys_path`` first on the module path (given explicitly by the caller: the
    caller's own environment is never changed for the workers' sake)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for p in reversed(sys_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    threading.Thread(target=_watch_parent, args=(alive,), name="kvbounds-parent-watch", daemon=True).start()
    _die_with_parent()
    single_thread_process()


def _start_method() -> str:
    """A fork server where there is one (a fresh interpreter forks the workers: nothing inherited from
    a parent holding torch/OpenMP threads, which deadlocks forked workers), else spawn."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def default_executor(max_workers: int | None = None, *, sys_path=()) -> cf.Executor:
    """A process pool of ``max_workers`` (default: all cores; 1: a thread in this process) set up by
    :func:`_worker_init`; ``sys_path``: directories the worker processes put first on their module path."""
    n = max_workers if max_workers is not None else (os.cpu_count() or 1)
    if n < 1:
        raise ValueError(f"workers must be >= 1, got {max_workers}")
    if n == 1:
        return cf.ThreadPoolExecutor(max_workers=1)      # run_checks wraps it in single_thread_scope()
    ctx = multiprocessing.get_context(_start_method())
    if ctx.get_start_method() == "forkserver":
        # imported once in the fork server, not once per worker (numpy/scipy: no OpenMP threads, fork-safe)
        ctx.set_forkserver_preload(["kvbounds.run._runner", "kvbounds.proofs_checks.common"])
    alive_r, alive_w = ctx.Pipe(duplex=False)      # workers get the read end only
    ex = cf.ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=_worker_init,
                                initargs=(alive_r, tuple(str(p) for p in sys_path)))
    ex._kvbounds_alive = (alive_r, alive_w)        # open as long as the pool lives
    return ex


def stop_now(ex: cf.Executor) -> None:
    """Cancel what has not started and end the worker processes of our own pool (Ctrl-C, write error)."""
    procs = list((getattr(ex, "_processes", None) or {}).values())
    ex.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)


@contextlib.contextmanager
def sigterm_raises():
    """Inside the block, SIGTERM raises :class:`Terminated` in the main thread (so the pool is ended
    and the command says how to resume) instead of killing the process on the spot."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated()
    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
