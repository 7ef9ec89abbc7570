"""The e2e harness's host path compresses every layer in one call for some methods (issue 26: the cost next to
the prefill); each layer must get exactly what its own compress_ours call, in layer order, gives."""
import numpy as np
import pytest

from kvbounds.algorithms.token_selection import memory_floats


@pytest.fixture(scope="module")
def state(lm):
    from kvbounds.e2e import harness, tasks
    return harness.prefill(lm, tasks.ppl_task(lm, 160, 2, 0).context, capture_inputs=False)


@pytest.mark.parametrize("method", ["kcenter", "kcenter_sized", "subgen", "subspace", "balancekv"])
def test_stacked_layers_equal_layer_by_layer(lm, state, method):
    from kvbounds.e2e import methods as M
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
