"""Running a sweep: the runner that expands claims into trials, skips finished ones and runs the rest on any executor;
the worker processes; the dask cluster of ``--scheduler``.

Its modules are private (a leading underscore); this __init__ names what the room offers. It may import kvbounds.core,
kvbounds.claims, kvbounds.algorithms; the layers are a contract (tests/package/test_structure.py).
"""
from ._cluster import dask_executor
from ._runner import (PROFILES, Trial, execute_trial, execute_trial_or_error, expand, profile_trials, run_checks,
                      run_trials)
from ._workers import Terminated, sigterm_raises

__all__ = ["dask_executor", "PROFILES", "Trial", "execute_trial", "execute_trial_or_error", "expand", "profile_trials",
           "run_checks", "run_trials", "Terminated", "sigterm_raises"]
