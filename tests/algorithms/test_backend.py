import numpy as np
import pytest

from kvbounds.algorithms.arrays import (BackendUnavailable, asarray, available_backends, backend_of, resolve, to_numpy,
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


def test_like_and_asarray_land_on_the_backends_device(backend):
    """numpy draws moved with like() take ref's backend, device and float dtype (integers and booleans keep
    theirs); asarray() puts arrays on the device resolve() names; synchronize() accepts every backend."""
    from backend_helpers import assert_on_device_of
    from kvbounds.algorithms.arrays import device, like, synchronize
    ref = asarray(np.ones((2, 2)), backend, dtype="float32")
    dev = resolve(backend)[1]
    if backend.startswith("torch"):
        assert device(ref).type == dev.type          # a tensor's device carries an index ("cuda:0"), resolve's not
    elif backend == "cupy":
        assert device(ref) == dev
    for x, kind in ((np.random.default_rng(0).random(3), "f"), (np.arange(3), "i"), (np.array([True, False]), "b")):
        y = like(x, ref)
        assert_on_device_of(y, ref)
        np.testing.assert_array_equal(to_numpy(y), x.astype(np.float32) if kind == "f" else x)
        assert to_numpy(y).dtype.kind == kind and (kind != "f" or y.dtype == ref.dtype)
        synchronize(y)
    synchronize(np.ones(2))


def test_to_numpy_of_bfloat16_tensors():
    """numpy has no bfloat16 (a GPU benchmark's cache dtype): to_numpy returns float32, exactly."""
    torch = pytest.importorskip("torch")
    x = torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16)
    y = to_numpy(x)
    assert y.dtype == np.float32 and y.tolist() == [1.5, -2.25, 3.0]
