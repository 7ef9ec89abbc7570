"""The sweep runner: expands claims into trials, skips finished ones, runs the rest on any Executor.

Resumption: every trial has a key (claim, params, seed, backend); a trial whose records are stored
(one complete write, see :class:`kvbounds.core.ResultStore`) is not recomputed. Each trial's
records are appended as it finishes, all or nothing, so an interrupted sweep loses at most the
trials in flight, and rerunning the same command resumes it without duplicating a record.

One ``run_checks`` per output directory at a time: it holds the directory's lock and a second one
refuses (:class:`kvbounds.core._records.StoreLocked`). A trial that raises becomes an error record and the
sweep goes on; the next run retries it.

Any ``concurrent.futures.Executor`` works (a Dask ``Client.get_executor()`` too). The default is a
process pool whose workers are started by a fork server (never forked from a parent that may hold
torch/OpenMP threads), run one BLAS/OpenMP/torch thread each, ignore Ctrl-C (the parent ends them)
and die with their parent, even a parent killed by ``kill -9``. ``workers=1`` runs in-process with the
same one-thread setup, so a trial's records do not depend on the number of workers (:mod:`kvbounds.run`).
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import hashlib
import importlib
import os
import sys
import time
import traceback
from typing import Callable, Iterable, Iterator, Sequence

from kvbounds.core import Progress, append_run, duration as _duration  # noqa: F401 (re-exported)
from kvbounds.core import Record, ResultStore, canonical, trial_key
from kvbounds.claims import Claim, get_claim
from ._workers import (THREAD_VARS, Terminated, stop_now, default_executor, one_thread, sigterm_raises,
                       single_thread_process, single_thread_scope)
from kvbounds.claims import CLAIMS
from kvbounds.claims import checked_claims
from kvbounds.algorithms.arrays import validate_backend

PROFILES = ("smoke", "quick", "full", "gpu")


@dataclasses.dataclass(frozen=True)
class Trial:
    claim: str
    params: dict
    seed: int
    backend: str
    module: str = ""    # the check module's dotted path (a worker imports it without the registry)

    @property
    def key(self) -> str:
        return trial_key(self.claim, self.params, self.seed, self.backend)


def trial_seed(seed: int, claim: str, params: dict) -> int:
    """The seed a trial's draws come from: a function of the run seed, the claim and the params only,
    so the same trial draws the same numbers on every backend and in every process."""
    h = hashlib.sha256(canonical([seed, claim, params]).encode()).digest()
    return int.from_bytes(h[:8], "little") & (2**63 - 1)


def profile_trials(mod, profile: str) -> list[dict]:
    """A check module's trial grid for ``profile``; the ``gpu`` profile holds only the scale sweeps of the
    claims whose registry entry sets ``gpu_profile`` (SB.discrepancy, MR.error, BKV.memory)."""
    if profile == "gpu" and not (mod.CLAIM in CLAIMS and CLAIMS[mod.CLAIM].gpu_profile):
        return []
    return list(mod.trials(profile))


def expand(claims: Sequence[Claim], profile: str, seed: int, backend: str) -> list[Trial]:
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    heavy, light = [], []
    for c in claims:
        mod = c.check_module()
        if mod is None:
            continue
        # a claim whose trials are long (a real model's forward passes) sets schedule_first, a check whose sweeps
        # have long trials (the scale sweeps' units) names them in LONG_SWEEPS: those trials are submitted first, so
        # the pool does not end on a tail of them with the other workers idle
        long_sweeps = getattr(mod, "LONG_SWEEPS", ())
        for params in profile_trials(mod, profile):
            dest = heavy if c.schedule_first or params.get("sweep") in long_sweeps else light
            dest.append(Trial(c.id, dict(params), seed, backend, c.check))
    return heavy + light


# ------------------------------------------------------------------------------------ one trial

def error_record(trial: Trial, exc: BaseException, time_s: float = 0.0) -> Record:
    """The record of a trial that raised: type and message, plus the last three traceback frames."""
    msg = " ".join(str(exc).split())
    msg = f"{type(exc).__name__}: {msg[:400]}" if msg else type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    rec = Record.failed(trial.claim, trial.params, trial.seed, trial.backend, msg,
                        "".join(traceback.format_list(frames)), time_s)
    rec.key = trial.key
    rec.extra.update(trial_size=1, trial_seed=trial_seed(trial.seed, trial.claim, trial.params))
    return rec


def execute_trial(trial: Trial) -> list[Record]:
    """Run one trial in the current process, on one BLAS/OpenMP/torch thread; a check's error raises
    (the sweep calls :func:`execute_trial_or_error`, which records it instead)."""
    ts = trial_seed(trial.seed, trial.claim, trial.params)
    t0 = time.perf_counter()
    mod = importlib.import_module(trial.module) if trial.module else get_claim(trial.claim).check_module()
    with one_thread():
        out = mod.run_trial(dict(trial.params), ts, trial.backend)
    recs = [out] if isinstance(out, Record) else list(out)
    if not recs or not all(isinstance(r, Record) for r in recs):
        raise TypeError(f"run_trial returned {type(out).__name__} {out!r:.80}, not Record(s)")
    elapsed = time.perf_counter() - t0
    for r in recs:
        r.key = trial.key
        r.seed = trial.seed
        r.backend = trial.backend
        r.extra.setdefault("trial_size", len(recs))
        r.extra["trial_seed"] = ts
        if not r.time_s:
            r.time_s = elapsed
    return recs


def execute_trial_or_error(trial: Trial) -> list[Record]:
    """:func:`execute_trial`, with an error of the check returned as one error record (the function
    the sweep's executor calls: one failing trial must not abort the sweep)."""
    t0 = time.perf_counter()
    try:
        return execute_trial(trial)
    except Exception as e:  # noqa: BLE001
        return [error_record(trial, e, time.perf_counter() - t0)]


# ------------------------------------------------------------------------------------------- sweep

def run_checks(claim_ids: Iterable[str] | None, *, profile: str = "quick", seed: int = 0, backend: str = "numpy",
               out: str | os.PathLike = "results", executor: cf.Executor | None = None, workers: int | None = None,
               progress: bool = True, on_record: Callable[[Record], None] | None = None,
               timings: dict | None = None) -> list[Record]:
    """Run every trial of the given claims (all checked claims when None) that is not already done.

    ``executor``: any ``concurrent.futures.Executor``; by default :func:`default_executor` (``workers``
    processes, all cores when None). Returns the records written by this call, error records left out
    (as in ``ResultStore.load``; they are in ``ResultStore.errors()``). Raises
    :class:`kvbounds.core.StoreError` (one-line message) before any trial runs when ``out`` is not
    writable or another run holds it, and when a write fails later (the trials written stay valid).
    ``timings``, when given, receives this run's line of ``DIR/runs.jsonl`` (wall and CPU time, per claim too)."""
    validate_backend(backend)
    claims = [get_claim(c) for c in claim_ids] if claim_ids else checked_claims()
    missing = [c.id for c in claims if not c.has_check]
    if missing:
        raise ValueError(f"no check registered for: {', '.join(missing)}")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    trials = expand(claims, profile, seed, backend)
    return run_trials(trials, out=out, executor=executor, workers=workers, progress=progress, on_record=on_record,
                      timings=timings, run=dict(profile=profile, backend=backend, seed=seed), writer="check")


def run_trials(trials: Sequence[Trial], *, out: str | os.PathLike = "results", executor: cf.Executor | None = None,
               workers: int | None = None, progress: bool = True, on_record: Callable[[Record], None] | None = None,
               timings: dict | None = None, run: dict | None = None, writer: str = "check",
               sys_path: Sequence[str] = ()) -> list[Record]:
    """Run the given trials that are not already done in ``out`` (the sweep of :func:`run_checks`, for trials
    made elsewhere: ``kvbounds evaluate``'s, whose module is named by each trial). Holds the directory's lock;
    ``run``: the profile / backend / seed of the run's line in ``DIR/runs.jsonl``; ``writer``: the command writing
    the store ("check" or "evaluate"; a store the other one writes is refused); ``sys_path``: directories our own
    pool's worker processes put first on their ``sys.path`` (``kvbounds evaluate module:NAME``: the caller's current
    directory; nothing in the caller's process or environment changes). Returns the records written (error
    records left out); raises :class:`kvbounds.core.StoreError` as :func:`run_checks` does."""
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    store = ResultStore(out, writer=writer)
    with store.lock():
        stored = store.read()
        done, failed = stored.completed_keys, {e.key for e in stored.errors}
        todo = list({t.key: t for t in trials if t.key not in done}.values())   # a repeated trial runs once
        if progress:
            retry = sum(t.key in failed for t in todo)
            sys.stderr.write(f"kvbounds: {len(todo)} trial(s) to run ({len(trials) - len(todo)} already finished in "
                             f"{store.path}{f'; {retry} failed before, retried' if retry else ''})\n")
        return _sweep(todo, store, executor, workers, progress, on_record, run, timings, tuple(sys_path))


def _sweep(todo, store, executor, workers, progress, on_record, run=None, timings=None, sys_path=()) -> list[Record]:
    if not todo:
        return []
    own = executor is None
    ex = executor or default_executor(workers, sys_path=sys_path)
    in_process = own and isinstance(ex, cf.ThreadPoolExecutor)
    prog = Progress(len(todo), enabled=progress, todo=todo, workers=getattr(ex, "_max_workers", None) or workers or 1)
    try:
        with single_thread_scope() if in_process else contextlib.nullcontext():
            return _run_all(todo, store, ex, own, progress, on_record, prog)
    finally:
        if prog.done:          # also for an interrupted run: its finished trials are in the records
            line = prog.run_line(**(run or {}))
            append_run(store.dir, line)
            if timings is not None:
                timings.update(line)


WAKE_S = 0.5     # the main thread wakes this often while it waits for trials


def _as_completed(futures: dict) -> Iterator[cf.Future]:
    """The futures as they finish (those that finish together in the order they were submitted, so a trial that
    ends a run, a Ctrl-C in a worker, is never passed by a later one finishing in the same wake), waiting at most
    :data:`WAKE_S` at a time: a Ctrl-C or SIGTERM the kernel hands to another thread of this process (the pool's
    manager or queue feeder) is run by Python in the main thread only when it wakes, and ``cf.as_completed``'s
    untimed wait could then sleep until a trial ends (the CI hang of test_workers_die_with_the_main_process[int],
    whose stacks showed the main thread in as_completed after the SIGINT)."""
    order = {id(f): i for i, f in enumerate(futures)}     # ids, not the futures: no reference held here
    pending = set(futures)
    while pending:
        done, pending = cf.wait(pending, timeout=WAKE_S, return_when=cf.FIRST_COMPLETED)
        batch = sorted(done, key=lambda f: order[id(f)])
        del done
        while batch:                # hold no reference to a future handed out (a cluster frees its result then)
            yield batch.pop(0)


def _run_all(todo, store, ex, own, progress, on_record, prog) -> list[Record]:
    """Submit every trial, store each one's records as it finishes; on any exit but a normal one
    (Ctrl-C, SIGTERM, a write error) cancel the rest and end our own pool's workers."""
    written: list[Record] = []
    futures: dict[cf.Future, Trial] = {}
    try:
        futures = {ex.submit(execute_trial_or_error, t): t for t in todo}
        for fut in _as_completed(futures):
            trial = futures.pop(fut)
            try:
                recs = fut.result()
            except Exception as e:  # noqa: BLE001 - a worker died, or the result could not come back
                recs = [error_record(trial, e)]
            # the result is here: its future goes (this was the last reference). A cluster keeps a result while its
            # future lives and Dask recomputes a lost one a client still holds, so a worker dying later would have
            # its finished trials computed again
            del fut
            store.append(recs)
            ok = [r for r in recs if not r.is_error]
            written.extend(ok)
            if on_record:
                for r in ok:
                    on_record(r)
            prog.step(trial, recs)
    except BaseException:
        for f in futures:
            f.cancel()
        if own:
            stop_now(ex)
        raise
    finally:
        prog.close()
    if own:
        ex.shutdown(wait=True)
    if progress and prog.errors:
        sys.stderr.write(f"kvbounds: {prog.errors} trial(s) failed with an error; they do not count as bound "
                         "violations, `kvbounds report` lists them and the next `check` retries them\n")
    return written
