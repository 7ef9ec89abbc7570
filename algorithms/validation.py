"""Input checks shared by the algorithms: bad input gets a clear error, never a silent NaN.

Policy, the same at every public entry point:

* arrays are numpy / torch / cupy arrays of dtype float32 or float64. Python lists, integer, bool and
  complex dtypes are rejected, and so is half precision (float16, bfloat16): its range (6.5e4) overflows
  ``exp`` and the squared norms at ordinary norms and torch's linalg does not support it, so it is
  rejected up front (convert with ``.astype(np.float32)``) rather than accepted and failing later;
* all arrays of one call share a backend (and a device); NaN/Inf entries are rejected;
* scalars are checked for type and range (a string, NaN, Inf, a negative or non-integer count, a seed
  of 2.5, ``rng=None`` are all :class:`InputError`, naming the argument).
"""
from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from kvbounds.algorithms.arrays import array_namespace, device

__all__ = ["InputError", "namespace", "check_array", "check_indices", "check_same_dtype", "check_real",
           "check_positive", "check_int", "check_probability", "check_scale", "check_rng", "check_seed", "check_choice",
           "check_error", "check_values"]


class InputError(ValueError):
    """Bad input to an algorithm: wrong shape or dtype, NaN/Inf, empty stream, impossible parameters."""


def namespace(*xs: Any, names: str = "the arrays") -> Any:
    """``array_namespace`` of arrays that must share a backend and a device; mixed numpy/torch, or a CPU tensor
    beside a CUDA one, is an InputError (not a RuntimeError from deep inside the computation)."""
    try:
        xp = array_namespace(*xs)
    except TypeError as e:
        kinds = sorted({type(x).__module__.split(".")[0] + "." + type(x).__name__ for x in xs})
        raise InputError(f"{names} mix array backends ({', '.join(kinds)}); pass arrays of one backend") from e
    if len(xs) > 1:
        devices = [device(x) for x in xs if hasattr(x, "shape")]
        if any(d != devices[0] for d in devices[1:]):
            raise InputError(f"{names} live on different devices ({', '.join(sorted({str(d) for d in devices}))}); "
                             f"move them to one device")
    return xp


def check_array(x: Any, name: str, *, ndim: int | tuple[int, ...], last_dim: int | None = None,
                min_rows: int = 0, finite: bool = True) -> Any:
    """Shape, dtype and (unless ``finite=False``) finiteness of one array; returns it unchanged."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype") or not hasattr(x, "ndim"):
        raise InputError(f"{name} must be an array (numpy, torch or cupy), got {type(x).__name__}"
                         + (" (convert with np.asarray(..., dtype=np.float64))" if isinstance(x, (list, tuple)) else ""))
    xp = namespace(x, names=name)
    ndims = (ndim,) if isinstance(ndim, int) else ndim
    if x.ndim not in ndims:
        raise InputError(f"{name} must have {' or '.join(map(str, ndims))} dimension(s), got shape {tuple(x.shape)}")
    if not xp.isdtype(x.dtype, "real floating"):
        raise InputError(f"{name} must have a real floating dtype (float32/float64), got {x.dtype}")
    if getattr(x.dtype, "itemsize", 8) < 4:
        raise InputError(f"{name} has dtype {x.dtype}: half precision is not supported (its range overflows exp "
                         f"and squared norms); convert to float32 or float64")
    if last_dim is not None and x.shape[-1] != last_dim:
        raise InputError(f"{name} has last dimension {x.shape[-1]}, expected {last_dim} (shape {tuple(x.shape)})")
    if x.ndim >= 2 and x.shape[-2] < min_rows:
        raise InputError(f"{name} has {x.shape[-2]} rows; at least {min_rows} needed (empty stream?)")
    if min_rows and any(int(n) == 0 for n in x.shape):
        raise InputError(f"{name} is empty (shape {tuple(x.shape)})")
    if finite and not bool(xp.all(xp.isfinite(x))):
        raise InputError(f"{name} contains NaN or Inf")
    return x


def check_indices(idx: Any, name: str, *, lead: tuple, n: int, allow_empty: bool = False) -> Any:
    """Token indices into n cached tokens: an integer array of shape (m,) (shared by the heads) or
    ``lead + (m,)``, entries in [0, n), m >= 1 unless ``allow_empty``; returns it unchanged."""
    if not hasattr(idx, "shape") or not hasattr(idx, "dtype"):
        raise InputError(f"{name} must be an integer array, got {type(idx).__name__}")
    xp = namespace(idx, names=name)
    if not xp.isdtype(idx.dtype, "integral"):
        raise InputError(f"{name} must have an integer dtype, got {idx.dtype}")
    if idx.ndim not in (1, len(lead) + 1) or (idx.ndim > 1 and tuple(idx.shape[:-1]) != lead) \
            or (idx.shape[-1] < 1 and not allow_empty):
        raise InputError(f"{name} must have shape (m,) or {lead + ('m',)}{'' if allow_empty else ' with m >= 1'}, "
                         f"got {tuple(idx.shape)}")
    if math.prod(idx.shape) and (int(xp.min(idx)) < 0 or int(xp.max(idx)) >= n):
        raise InputError(f"{name} has entries outside [0, {n})")
    return idx


def check_same_dtype(*named: tuple[str, Any]) -> None:
    """Arrays that are combined (matmul, concat) must share a dtype (torch refuses float32 @ float64)."""
    dtypes = {str(x.dtype) for _, x in named}
    if len(dtypes) > 1:
        raise InputError(" and ".join(n for n, _ in named) + " must have the same dtype, got "
                         + ", ".join(f"{n}: {x.dtype}" for n, x in named))


def check_real(value: Any, name: str, *, minimum: float | None = None, strict: bool = False,
               allow_inf: bool = False) -> float:
    """A real number (not bool, not str), finite unless ``allow_inf``, >= (or > if ``strict``) ``minimum``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise InputError(f"{name} must be a real number, got {value!r}")
    v = float(value)
    if math.isnan(v) or (not allow_inf and math.isinf(v)):
        raise InputError(f"{name} must be a finite number, got {value!r}")
    if minimum is not None and (v < minimum or (strict and v == minimum)):
        raise InputError(f"{name} must be {'>' if strict else '>='} {minimum}, got {value!r}")
    return v


def check_positive(value: float, name: str, *, integer: bool = False, allow_zero: bool = False) -> None:
    ok_type = isinstance(value, numbers.Integral) if integer else isinstance(value, numbers.Real)
    if isinstance(value, (bool, np.bool_)) or not ok_type:
        raise InputError(f"{name} must be a{'n integer' if integer else ' number'}, got {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise InputError(f"{name} must be {'>= 0' if allow_zero else '> 0'} and finite, got {value!r}")


def check_int(value: Any, name: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    """An integer (Python or numpy, not bool) in [minimum, maximum]."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < minimum \
            or (maximum is not None and value > maximum):
        bound = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise InputError(f"{name} must be an integer {bound}, got {value!r}")
    return int(value)


def check_probability(value: float, name: str) -> None:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not (0 < value < 1):
        raise InputError(f"{name} must be in (0, 1), got {value!r}")


def check_scale(scale: Any, d: int) -> float:
    """The logit scale: None means 1/sqrt(d); otherwise a finite real number >= 0."""
    if scale is None:
        return 1.0 / math.sqrt(d)
    return check_real(scale, "scale", minimum=0.0)


def check_rng(rng: Any, name: str = "rng") -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise InputError(f"{name} must be a numpy Generator (np.random.default_rng(seed)), got {type(rng).__name__}")
    return rng


def check_seed(seed: Any, name: str = "seed", *, allow_none: bool = True) -> Any:
    """A seed for ``np.random.default_rng``: an integer >= 0, a numpy Generator, or None (fresh entropy)."""
    if seed is None and allow_none:
        return None
    if isinstance(seed, np.random.Generator):
        return seed
    return check_int(seed, name, minimum=0)


def check_choice(value: Any, name: str, choices: tuple) -> Any:
    if not isinstance(value, str) or value not in choices:
        raise InputError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_error(value: Any, what: str) -> float:
    """An error (or a metric) as a float >= 0, +inf allowed (an undefined estimate is the worst); a NaN, a negative
    value or a non-number is an InputError naming ``what`` (a maximum or a median would drop a NaN silently)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InputError(f"{what} must be a real number, got {value!r}")
    v = float(value)
    if math.isnan(v):
        raise InputError(f"{what} is NaN (undefined); refusing to take a maximum or a median over it")
    if v < 0:
        raise InputError(f"{what} must be >= 0, got {value!r}")
    return v


def check_values(x: Any, name: str, *, allow_inf: bool) -> np.ndarray:
    """A 1-d sequence of real numbers as float64: no NaN (a median or a test would drop or return it)."""
    if isinstance(x, (str, bytes, dict)) or not hasattr(x, "__len__"):
        raise InputError(f"{name} must be a sequence of numbers, got {type(x).__name__}")
    try:
        a = np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        raise InputError(f"{name} must hold real numbers only") from None
    if a.ndim != 1:
        raise InputError(f"{name} must be one-dimensional, got shape {a.shape}")
    if np.isnan(a).any() or (not allow_inf and np.isinf(a).any()):
        raise InputError(f"{name} holds NaN{'' if allow_inf else ' or Inf'}")
    return a
