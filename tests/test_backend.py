import numpy as np
import pytest

from kvbounds.gpu.backend import (BackendUnavailable, asarray, available_backends, backend_of, resolve, to_numpy,
                         validate_backend, why_unavailable)


def test_numpy_is_always_available():
    assert "numpy" in available_backends()
    assert why_unavailable("numpy") is None


def test_roundtrip(backend):
    x = np.arange(6.0).reshape(2, 3)
    y = asarray(x, backend, dtype="float32")
    assert backend_of(y).split(":")[0] == backend.split(":")[0]
    np.testing.assert_array_equal(to_numpy(y), x.astype(np.float32))


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown backend"):
        validate_backend("jax")


def test_missing_gpu_backends_say_why():
    for b in ("torch:cuda", "cupy"):
        why = why_unavailable(b)
        if why is not None:
            assert b.split(":")[0] in why or "CUDA" in why
            with pytest.raises(BackendUnavailable):
                resolve(b)
