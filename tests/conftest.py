"""Shared fixtures: the backends present here (numpy is the reference), hypothesis profile."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from kvbounds.gpu.backend import why_unavailable

settings.register_profile("ci", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ALL_BACKENDS = ["numpy", "torch:cpu", "torch:cuda", "cupy"]


def backend_params():
    out = []
    for b in ALL_BACKENDS:
        why = why_unavailable(b)
        marks = [pytest.mark.skip(reason=f"{b}: {why}")] if why else []
        if b in ("torch:cuda", "cupy"):
            marks.append(pytest.mark.gpu)
        out.append(pytest.param(b, marks=marks, id=b))
    return out


@pytest.fixture(params=backend_params())
def backend(request):
    return request.param


@pytest.fixture
def rng():
    return np.random.default_rng(12345)
