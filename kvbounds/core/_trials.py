"""What every trial's code uses, below the rooms that run trials (the checks, the stream families, kvbounds
evaluate): a record of a measurement (:func:`make_record`), the value of a parameter for a profile (:func:`pick`),
random unit directions (:func:`unit_directions`). The checks read them through their kit,
:mod:`kvbounds.proofs_checks.common`."""
from __future__ import annotations

import numpy as np

from ._records import Record

_NO_GPU_VALUE = object()


def pick(profile: str, *, smoke, quick, full, gpu=_NO_GPU_VALUE):
    """The value for a profile: "smoke" (tests, notebooks), "quick" (the main job), "full", or "gpu" (the scale
    sweeps of the claims whose registry entry sets ``gpu_profile``; defaults to the full value)."""
    return {"smoke": smoke, "quick": quick, "full": full, "gpu": full if gpu is _NO_GPU_VALUE else gpu}[profile]


def make_record(claim: str, params: dict, *, measured: float, bound: float, holds: bool | None = None,
                bound_kind: str = "a-priori", check: str = "", control: bool = False, source: str = "",
                trials: int = 1, **extra) -> Record:
    """A record; ``holds`` defaults to measured <= bound."""
    measured, bound = float(measured), float(bound)
    if holds is None:
        holds = measured <= bound
    return Record(claim=claim, params=dict(params), seed=0, backend="", measured=measured, bound=bound,
                  holds=bool(holds), bound_kind=bound_kind, check=check, control=control, source=source,
                  trials=trials, extra=extra)


def unit_directions(rng: np.random.Generator, m: int, d: int) -> np.ndarray:
    x = rng.standard_normal((m, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)
