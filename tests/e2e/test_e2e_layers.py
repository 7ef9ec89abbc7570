"""The e2e harness's host path compresses every layer in one call for some methods (issue 26: the cost next to
the prefill); each layer must get exactly what its own compress_ours call, in layer order, gives."""
import numpy as np
import pytest

from kvbounds.algorithms import equal_memory as EM
from kvbounds.algorithms.token_selection import memory_floats


@pytest.fixture(scope="module")
def state(lm):
    from kvbounds.e2e import _harness as harness
    from kvbounds.e2e import _tasks as tasks
    return harness.prefill(lm, tasks.ppl_task(lm, 160, 2, 0).context, capture_inputs=False)


@pytest.mark.parametrize("method", ["kcenter", "kcenter_sized", "subgen", "subspace", "balancekv", "balancekv_released"])
def test_stacked_layers_equal_layer_by_layer(lm, state, method):
    from kvbounds.e2e import _methods as M
    rng_all = np.random.default_rng([0, 1])
    got = M.compress_all(method, lm, state, 0.35, rng_all, sink=16, window=16)
    d = state.keys[0].shape[-1]
    floats, rng = int(np.floor(0.35 * state.n * 2 * d)), np.random.default_rng([0, 1])
    for l, c in enumerate(got):
        ref = M.compress_ours(method, state.keys[l][0].float().numpy(), state.values[l][0].float().numpy(), floats,
                              rng, sink=16, window=16)
        for f in ("keys", "values", "log_w_num", "log_w_den"):
            assert np.array_equal(getattr(c, f), getattr(ref, f)), (l, f)
        assert memory_floats(c) == memory_floats(ref)
    assert rng_all.bit_generator.state == rng.bit_generator.state     # the same draws, layer by layer


@pytest.mark.parametrize("budget", [0.2, 0.31, 0.45])
def test_subspace_rounds_on_one_head_build_the_same_cache(monkeypatch, budget):
    """Issue 26: subspace's equal-memory rounds run on the first head and the cache is built once; the cache is bit
    for bit the one of rounds on every head (the fit reads per-head float counts that do not depend on the data)."""
    from kvbounds.e2e import _methods as M
    rng = np.random.default_rng(7)
    K = rng.standard_normal((3, 300, 16)).astype(np.float32)
    V = rng.standard_normal((3, 300, 16)).astype(np.float32)
    floats = int(budget * 300 * 32)
    got = EM.fit_to_floats("subspace", K, V, floats, np.random.default_rng(1), sink=8, window=8)
    monkeypatch.setattr(EM, "_SUBSPACE_PROBE", False)
    ref = EM.fit_to_floats("subspace", K, V, floats, np.random.default_rng(1), sink=8, window=8)
    for f in ("keys", "values", "log_w_num", "log_w_den"):
        assert np.array_equal(getattr(got, f), getattr(ref, f)), f
    assert (got.rank, got.projected, got.extra_floats) == (ref.rank, ref.projected, ref.extra_floats)
    assert memory_floats(got) == memory_floats(ref)
