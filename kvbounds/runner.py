"""The sweep runner: expands claims into trials, skips finished ones, runs the rest on any Executor.

Resumption: every trial has a key (claim, params, seed, backend); a trial whose records are all in
``results.jsonl`` is not recomputed. Records are appended as each trial finishes, so an interrupted
sweep loses at most the trials in flight.

Any ``concurrent.futures.Executor`` works (a Dask ``Client.get_executor()`` too); the default is a
local process pool.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import hashlib
import os
import sys
import time
from collections import Counter
from typing import Callable, Iterable, Sequence

from .records import Record, ResultStore, trial_key
from .registry import Claim, get_claim

PROFILES = ("smoke", "quick", "full")


@dataclasses.dataclass(frozen=True)
class Trial:
    claim: str
    params: dict
    seed: int
    backend: str

    @property
    def key(self) -> str:
        return trial_key(self.claim, self.params, self.seed, self.backend)


def trial_seed(seed: int, claim: str, params: dict) -> int:
    """The seed a trial's draws come from: a function of the run seed, the claim and the params only,
    so the same trial draws the same numbers on every backend and in every process."""
    from .records import canonical
    h = hashlib.sha256(canonical([seed, claim, params]).encode()).digest()
    return int.from_bytes(h[:8], "little") & (2**63 - 1)


def expand(claims: Sequence[Claim], profile: str, seed: int, backend: str) -> list[Trial]:
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    out = []
    for c in claims:
        mod = c.check_module()
        if mod is None:
            continue
        for params in mod.trials(profile):
            out.append(Trial(c.id, dict(params), seed, backend))
    return out


def execute_trial(trial: Trial) -> list[Record]:
    """Run one trial in the current process (the function the executor calls)."""
    mod = get_claim(trial.claim).check_module()
    ts = trial_seed(trial.seed, trial.claim, trial.params)
    t0 = time.perf_counter()
    out = mod.run_trial(dict(trial.params), ts, trial.backend)
    recs = [out] if isinstance(out, Record) else list(out)
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


def _completed_keys(store: ResultStore) -> set[str]:
    counts: Counter = Counter()
    sizes: dict[str, int] = {}
    for r in store.load():
        counts[r.key] += 1
        sizes[r.key] = int(r.extra.get("trial_size", 1))
    return {k for k, n in counts.items() if n >= sizes[k]}


def _single_thread_worker() -> None:
    """One BLAS/OpenMP thread per worker process: the pool already uses every core. Setting
    OMP_NUM_THREADS here is too late for a forked worker whose numpy has loaded OpenBLAS, so the
    limit goes through threadpoolctl (and torch's own setting)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    from threadpoolctl import threadpool_limits
    threadpool_limits(1)
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        pass


def default_executor(max_workers: int | None = None) -> cf.Executor:
    n = max_workers or os.cpu_count() or 1
    if n == 1:
        return cf.ThreadPoolExecutor(max_workers=1)
    return cf.ProcessPoolExecutor(max_workers=n, initializer=_single_thread_worker)


class Progress:
    def __init__(self, total: int, stream=sys.stderr, enabled: bool = True):
        self.total, self.done, self.stream, self.enabled = total, 0, stream, enabled
        self.t0 = time.perf_counter()

    def step(self, trial: Trial, n_fail: int) -> None:
        self.done += 1
        if not self.enabled:
            return
        el = time.perf_counter() - self.t0
        eta = el / self.done * (self.total - self.done)
        flag = "" if n_fail == 0 else f"  ({n_fail} record(s) outside bound)"
        self.stream.write(f"[{self.done:>4}/{self.total}] {trial.claim:<22} {el:6.1f}s elapsed, ~{eta:5.0f}s left{flag}\n")
        self.stream.flush()


def run_checks(claim_ids: Iterable[str] | None, *, profile: str = "quick", seed: int = 0, backend: str = "numpy",
               out: str | os.PathLike = "results", executor: cf.Executor | None = None,
               progress: bool = True, on_record: Callable[[Record], None] | None = None) -> list[Record]:
    """Run every trial of the given claims (all checked claims when None) that is not already done.

    Returns the records written by this call (finished ones from earlier runs stay in the store)."""
    from .registry import checked_claims
    from kvbounds.gpu.backend import validate_backend
    validate_backend(backend)
    claims = [get_claim(c) for c in claim_ids] if claim_ids else checked_claims()
    missing = [c.id for c in claims if not c.has_check]
    if missing:
        raise ValueError(f"no check registered for: {', '.join(missing)}")
    store = ResultStore(out)
    done = _completed_keys(store)
    todo = [t for t in expand(claims, profile, seed, backend) if t.key not in done]
    if progress:
        sys.stderr.write(f"kvbounds: {len(todo)} trial(s) to run ({len(done)} already finished in {store.path})\n")
    prog = Progress(len(todo), enabled=progress)
    written: list[Record] = []
    own = executor is None
    ex = executor or default_executor()
    try:
        futures = {ex.submit(execute_trial, t): t for t in todo}
        for fut in cf.as_completed(futures):
            recs = fut.result()
            store.append(recs)
            written.extend(recs)
            if on_record:
                for r in recs:
                    on_record(r)
            prog.step(futures[fut], sum(not r.holds and not r.control for r in recs))
    finally:
        if own:
            ex.shutdown(wait=True, cancel_futures=True)
    return written
