"""The package's array layer: backend name -> array namespace and device, via ``array-api-compat`` (every
module that touches arrays goes through it; the GPU-specific code is in :mod:`kvbounds.gpu`).

Backend names: ``numpy`` (the reference), ``torch`` (CUDA when present, else CPU), ``torch:cpu``,
``torch:cuda``, ``cupy``. Algorithms receive arrays and call ``array_namespace(*arrays)``; they never
import a backend themselves. Randomness is drawn with a numpy ``Generator`` and moved to the backend
(:func:`asarray`), so a seed gives the same draws, hence the same result, on every backend.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any

import numpy as np
from array_api_compat import array_namespace as _array_namespace
from array_api_compat import device as _device
from array_api_compat import is_numpy_array, is_torch_array, is_cupy_array

__all__ = ["BACKENDS", "DTYPES", "BackendUnavailable", "input_error", "why_unavailable", "available_backends",
           "validate_backend", "resolve", "asarray", "like", "to_numpy", "backend_of", "is_gpu_array",
           "array_namespace", "device", "synchronize", "single_blas_thread"]

BACKENDS = ("numpy", "torch", "torch:cpu", "torch:cuda", "cupy")
DTYPES = ("float32", "float64", "int32", "int64", "bool")


class BackendUnavailable(RuntimeError):
    pass


def input_error(msg: str, *, type_error: bool = False) -> Exception:
    """kvbounds.algorithms.validation.InputError (imported late: validation imports this module). With
    ``type_error`` an InputError that is also a TypeError, for callers that catch array-api-compat's TypeError."""
    from kvbounds.algorithms.validation import InputError
    if type_error:
        return type("NotAnArray", (InputError, TypeError), {})(msg)
    return InputError(msg)


@functools.cache
def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is a declared dependency of the Makefile set-up
        raise BackendUnavailable("backend 'torch' needs torch (pip install torch==2.13.0)") from e
    return torch


@functools.cache
def _cupy():
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        raise BackendUnavailable(f"backend 'cupy' is unavailable here: {type(e).__name__}: {e}") from e
    return cupy


def why_unavailable(name: str) -> str | None:
    """None when the backend can run here, else the reason (used for test skips)."""
    try:
        validate_backend(name)
        resolve(name)
    except (BackendUnavailable, ValueError) as e:
        return str(e)
    return None


def available_backends() -> list[str]:
    return [b for b in ("numpy", "torch:cpu", "torch:cuda", "cupy") if why_unavailable(b) is None]


def validate_backend(name: str) -> str:
    """The name if it is one of BACKENDS, else InputError (a ValueError)."""
    if not isinstance(name, str) or name not in BACKENDS:
        raise input_error(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return name


def resolve(name: str) -> tuple[Any, Any]:
    """(namespace, device) of a backend name."""
    validate_backend(name)
    if name == "numpy":
        return _array_namespace(np.empty(0)), "cpu"
    if name.startswith("torch"):
        torch = _torch()
        if name == "torch:cuda" or (name == "torch" and torch.cuda.is_available()):
            if not torch.cuda.is_available():
                raise BackendUnavailable("backend 'torch:cuda' needs a CUDA device; none is visible")
            dev = torch.device("cuda")
        else:
            dev = torch.device("cpu")
        return _array_namespace(torch.empty(0)), dev
    cp = _cupy()
    return _array_namespace(cp.empty(0)), cp.cuda.Device()


def asarray(x: Any, backend: str = "numpy", dtype: str = "float64") -> Any:
    """Move a numpy array (or nested list) to a backend with the named dtype."""
    xp, dev = resolve(backend)
    if dtype not in DTYPES:
        raise input_error(f"dtype must be one of {DTYPES}, got {dtype!r}")
    try:
        arr = np.asarray(x)
        if arr.dtype.kind not in "biuf" or arr.dtype == object:
            raise ValueError(f"dtype {arr.dtype}")
    except (ValueError, TypeError) as e:
        raise input_error(f"x must be a real numeric array or nested list, got {type(x).__name__} ({e})") from None
    dt = getattr(xp, dtype)
    if backend == "numpy":
        return arr.astype(dt, copy=False)
    if backend.startswith("torch"):
        return _torch().as_tensor(_contiguous(arr), dtype=dt, device=dev)
    return xp.asarray(arr, dtype=dt)


def _contiguous(arr: np.ndarray) -> np.ndarray:
    """C-contiguous, keeping a 0-d array 0-d (``np.ascontiguousarray`` returns at least 1-d)."""
    return np.ascontiguousarray(arr) if arr.ndim else arr


def like(x_np: Any, ref: Any) -> Any:
    """Move a numpy array to the namespace, device and float dtype of ``ref``; a float array whose values exceed
    the range of ref's (narrower) float dtype is an InputError, not a silent inf."""
    xp = array_namespace(ref)
    arr = np.asarray(x_np)
    if arr.dtype.kind == "f" and arr.size and xp.isdtype(ref.dtype, "real floating") \
            and getattr(ref.dtype, "itemsize", 8) < arr.dtype.itemsize:
        top = float(np.max(np.abs(arr)))
        if np.isfinite(top) and top > float(xp.finfo(ref.dtype).max):
            raise input_error(f"values up to {top:.3g} exceed the range of {ref.dtype}")
    if is_numpy_array(ref):
        return arr.astype(ref.dtype if arr.dtype.kind == "f" else arr.dtype, copy=False)
    if is_torch_array(ref):
        torch = _torch()
        dt = ref.dtype if arr.dtype.kind == "f" else None
        return torch.as_tensor(_contiguous(arr), device=ref.device, dtype=dt)
    return xp.asarray(arr, dtype=ref.dtype if arr.dtype.kind == "f" else None, device=_device(ref))


def to_numpy(x: Any) -> np.ndarray:
    """A host numpy copy (or view) of an array of any backend; torch bfloat16, which numpy lacks, as float32."""
    if is_numpy_array(x) or np.isscalar(x):
        return np.asarray(x)
    if is_torch_array(x):
        x = x.detach().cpu()
        return (x.float() if x.dtype == _torch().bfloat16 else x).numpy()
    if is_cupy_array(x):
        return x.get()
    return np.asarray(x)


def backend_of(x: Any) -> str:
    if is_torch_array(x):
        return "torch:cuda" if x.is_cuda else "torch:cpu"
    if is_cupy_array(x):
        return "cupy"
    return "numpy"


def is_gpu_array(x: Any) -> bool:
    """An array on a GPU (a CUDA torch tensor or a CuPy array): reading one of its values waits for the device."""
    return (is_torch_array(x) and x.device.type == "cuda") or is_cupy_array(x)


def array_namespace(*xs: Any) -> Any:
    """The array-API namespace of arrays of one backend; anything else (a list, a string, mixed backends) is an
    InputError that is also the TypeError array-api-compat raises."""
    try:
        return _array_namespace(*xs)
    except TypeError as e:
        raise input_error(f"expected arrays of one backend (numpy, torch or cupy): {e}", type_error=True) from None


def device(x: Any) -> Any:
    """The device an array lives on (array-API ``device``), for allocating alongside it."""
    if not hasattr(x, "shape"):
        raise input_error(f"expected an array (numpy, torch or cupy), got {type(x).__name__}", type_error=True)
    return _device(x)


def synchronize(x: Any) -> None:
    """Wait until the work queued on ``x``'s device is done (CUDA tensors, CuPy arrays; a no-op for numpy and CPU
    tensors). GPU kernels run asynchronously: a clock read after a call measures its launch, not its work, unless
    the device is synchronised first (``t0 = perf_counter(); f(X); synchronize(X); dt = perf_counter() - t0``)."""
    if is_torch_array(x):
        if x.device.type == "cuda":
            _torch().cuda.synchronize(x.device)
    elif is_cupy_array(x):
        x.device.synchronize()


class single_blas_thread(contextlib.ContextDecorator):
    """Limit numpy's BLAS/LAPACK to one thread inside a block (``with single_blas_thread():``) or a
    function (``@single_blas_thread()``). Small SVDs and matmuls gain nothing from threads, and with one
    pool worker per core a multi-threaded OpenBLAS spins against the other workers (20-30x slower
    SVDs measured on 2 cores). Timings "with one BLAS thread" use it too."""

    def __enter__(self):
        from threadpoolctl import threadpool_limits
        self._limits = threadpool_limits(limits=1, user_api="blas")
        return self

    def __exit__(self, *exc):
        self._limits.restore_original_limits()
        return False
