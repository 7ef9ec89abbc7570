"""Input checks shared by the algorithms: bad input gets a clear error, never a silent NaN."""
from __future__ import annotations

import math
import numbers
from typing import Any

from kvbounds.gpu.backend import array_namespace


class InputError(ValueError):
    """Bad input to an algorithm: wrong shape or dtype, NaN/Inf, empty stream, impossible parameters."""


def check_array(x: Any, name: str, *, ndim: int | tuple[int, ...], last_dim: int | None = None,
                min_rows: int = 0) -> Any:
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise InputError(f"{name} must be an array (numpy, torch or cupy), got {type(x).__name__}")
    xp = array_namespace(x)
    ndims = (ndim,) if isinstance(ndim, int) else ndim
    if x.ndim not in ndims:
        raise InputError(f"{name} must have {' or '.join(map(str, ndims))} dimension(s), got shape {tuple(x.shape)}")
    if not xp.isdtype(x.dtype, "real floating"):
        raise InputError(f"{name} must have a real floating dtype (float32/float64), got {x.dtype}")
    if last_dim is not None and x.shape[-1] != last_dim:
        raise InputError(f"{name} has last dimension {x.shape[-1]}, expected {last_dim} (shape {tuple(x.shape)})")
    if x.ndim >= 2 and x.shape[-2] < min_rows:
        raise InputError(f"{name} has {x.shape[-2]} rows; at least {min_rows} needed (empty stream?)")
    if min_rows and any(int(n) == 0 for n in x.shape):
        raise InputError(f"{name} is empty (shape {tuple(x.shape)})")
    if not bool(xp.all(xp.isfinite(x))):
        raise InputError(f"{name} contains NaN or Inf")
    return x


def check_positive(value: float, name: str, *, integer: bool = False, allow_zero: bool = False) -> None:
    ok_type = isinstance(value, numbers.Integral) if integer else isinstance(value, numbers.Real)
    if isinstance(value, bool) or not ok_type:
        raise InputError(f"{name} must be a{'n integer' if integer else ' number'}, got {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise InputError(f"{name} must be {'>= 0' if allow_zero else '> 0'} and finite, got {value!r}")


def check_probability(value: float, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0 < value < 1):
        raise InputError(f"{name} must be in (0, 1), got {value!r}")
