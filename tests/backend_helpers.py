"""Helpers for the backend-agreement tests (the ``backend`` fixture of conftest.py): numpy is the reference; the
same seeds give the same signs and indices on every backend, floats agree within a tolerance derived from the
dtype, and outputs live on the input's device (which a CUDA or CuPy run checks for real)."""
from __future__ import annotations

import contextlib

import numpy as np

from kvbounds.algorithms.arrays import device, to_numpy


def rtol(dtype) -> float:
    """sqrt(eps) of the dtype (1.5e-8 for float64, 3.5e-4 for float32): the agreement asked of two backends'
    floats computed by different kernels (BLAS vs cuBLAS, other summation orders), far above their rounding
    and far below any difference an error would make."""
    return float(np.sqrt(np.finfo(np.dtype(str(dtype).replace("torch.", ""))).eps))


def assert_close(got, ref, dtype="float64", atol: float = 0.0) -> None:
    """Entrywise within rtol(dtype), relative to each entry and, as a floor, to the largest |ref| (an entry near 0
    carries the rounding of the larger terms it was summed from: BLAS and cuBLAS round those differently)."""
    g, r = to_numpy(got), to_numpy(ref)
    scale = float(np.max(np.abs(r))) if r.size and np.all(np.isfinite(r)) else 0.0
    np.testing.assert_allclose(g, r, rtol=rtol(dtype), atol=max(atol, rtol(dtype) * scale))


def assert_equal(got, ref) -> None:
    np.testing.assert_array_equal(to_numpy(got), to_numpy(ref))


def assert_on_device_of(out, ref) -> None:
    """``out`` is an array of ``ref``'s backend on ``ref``'s device (no silent move to the host)."""
    assert type(out).__module__.split(".")[0] == type(ref).__module__.split(".")[0], (type(out), type(ref))
    assert device(out) == device(ref), (device(out), device(ref))


@contextlib.contextmanager
def no_torch_host_copy(monkeypatch):
    """Inside the block, ``torch.Tensor.numpy`` and ``__array__`` raise: a function that is meant to stay on the
    device but converts a tensor to numpy fails on CPU too (where the conversion would otherwise be free)."""
    import torch

    def refuse(*a, **k):
        raise AssertionError("a torch tensor was converted to numpy inside a device-resident computation")

    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "numpy", refuse)
        m.setattr(torch.Tensor, "__array__", refuse)
        yield


def host_tensor_after(backend: str, call) -> None:
    """``call(torch_cpu_array_factory)`` feeds a stream built on ``backend`` a CPU torch tensor: accepted on
    torch:cpu (same backend and device); an InputError on every other backend -- numpy and CuPy (another backend) and
    torch:cuda (another device, which used to surface as a RuntimeError from deep inside a later operation)."""
    import pytest
    import torch

    from kvbounds.algorithms.validation import InputError
    host = lambda x: torch.as_tensor(np.asarray(x, dtype=np.float64))
    if backend == "torch:cpu":
        call(host)
    else:
        with pytest.raises(InputError):
            call(host)
