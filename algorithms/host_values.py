"""Several device scalars brought to the host with one copy (each read of a GPU value waits for the device).

``host_floats(xp, a, b, ...)`` is ``[float(a), float(b), ...]`` for 0-d arrays of any backend and real or boolean
dtype (booleans come back as 0.0/1.0), with one device-to-host transfer instead of one per value. Each value is
cast to float64 on the device first; float32 and float64 values, and integers below 2^53, convert exactly, so the
floats are those ``float(x)`` would give."""
from __future__ import annotations

import numpy as np

from kvbounds.algorithms.arrays import to_numpy

__all__ = ["host_floats"]


def host_floats(xp, *scalars) -> list[float]:
    if all(isinstance(x, (np.ndarray, np.generic)) for x in scalars):
        return [float(x) for x in scalars]
    vals = xp.stack([xp.astype(xp.reshape(x, ()), xp.float64) for x in scalars])
    return [float(x) for x in to_numpy(vals).tolist()]
