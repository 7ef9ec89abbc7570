"""The shared input checks (kvbounds.algorithms.validation): arrays of one call share a backend and a device."""
import numpy as np
import pytest

from kvbounds.algorithms.validation import InputError, namespace
from kvbounds.algorithms.arrays import asarray


def test_namespace_accepts_one_backend_on_one_device(backend):
    a, b = asarray(np.ones(3), backend), asarray(np.zeros((2, 3)), backend)
    assert namespace(a, b) is namespace(a)


def test_namespace_rejects_mixed_backends_and_devices():
    torch = pytest.importorskip("torch")
    with pytest.raises(InputError, match="mix array backends"):
        namespace(np.ones(2), torch.ones(2), names="K and V")
    # a second device without a GPU: torch's "meta" device (a CUDA run mixes cpu and cuda the same way)
    with pytest.raises(InputError, match="K and V live on different devices"):
        namespace(torch.ones(2), torch.ones(2, device="meta"), names="K and V")
