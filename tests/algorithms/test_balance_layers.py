"""compress_cache_layers (issue 26): every layer at once, the same indices and weights as one compress_cache call
per layer in layer order with the same rng."""
import numpy as np
import pytest

from kvbounds.algorithms.balance_layers import compress_cache_layers
from kvbounds.algorithms.blockwise_balance_kv import compress_cache
from kvbounds.algorithms.validation import InputError


@pytest.mark.parametrize("L,H,n,d,sink,window,levels,block", [
    (5, 3, 200, 8, 4, 4, 2, 64),        # partial last block, layers stacked
    (4, 2, 130, 6, 0, 3, 3, 32),        # odd middle, three levels
    (3, 1, 96, 4, 8, 8, 0, 16),         # no level: everything kept, no draws
    (2, 2, 40, 4, 2, 2, 1, 256),        # block longer than the middle
    (2, 4, 4200, 4, 2, 2, 1, 64),       # one layer's walk is wider than STEP_ENTRIES: one layer at a time
])
def test_layers_equal_one_call_per_layer(L, H, n, d, sink, window, levels, block):
    rng = np.random.default_rng(L * 1000 + n)
    K = rng.standard_normal((L, H, n, d)).astype(np.float32) * 2
    V = rng.standard_normal((L, H, n, d + 1)).astype(np.float32)
    r1, r2 = np.random.default_rng(7), np.random.default_rng(7)
    ref = [compress_cache(K[l], V[l], sink=sink, window=window, levels=levels, block_size=block, rng=r1)
           for l in range(L)]
    idx, lw = compress_cache_layers(K, V, sink=sink, window=window, levels=levels, block_size=block, rng=r2)
    assert np.array_equal(idx, np.stack([i for i, _ in ref]))
    assert np.array_equal(lw, np.stack([np.broadcast_to(w, i.shape) for i, w in ref]))
    assert r1.random() == r2.random()            # the stream is left where the per-layer calls leave it


def test_layers_bad_input():
    K = np.zeros((2, 1, 16, 4), np.float32)
    with pytest.raises(InputError, match="method"):
        compress_cache_layers(K, K, sink=0, window=0, levels=1, block_size=8, rng=np.random.default_rng(0),
                              method="uniform")
    with pytest.raises(InputError, match="rng"):
        compress_cache_layers(K, K, sink=0, window=0, levels=1, block_size=8, rng=0)


@pytest.mark.parametrize("L,H,n,d,sink,window,levels,block,big", [
    (4, 3, 200, 8, 4, 4, 2, 64, None),      # partial last block
    (3, 2, 130, 6, 0, 3, 3, 32, 1),         # layer 1's kernel overflows float32: that layer alone in float64
    (2, 1, 40, 4, 2, 2, 0, 16, None),       # no level
])
def test_released_layers_equal_one_call_per_layer(L, H, n, d, sink, window, levels, block, big):
    from kvbounds.algorithms.balance_kv_released import compress_cache_released
    from kvbounds.algorithms.balance_layers import compress_cache_released_layers
    rng = np.random.default_rng(L * 1000 + n)
    K = rng.standard_normal((L, H, n, d)).astype(np.float32) * 2
    V = rng.standard_normal((L, H, n, d + 1)).astype(np.float32)
    if big is not None:
        K[big] *= 4.0
    r1, r2 = np.random.default_rng(7), np.random.default_rng(7)
    ref = [compress_cache_released(K[l], V[l], sink=sink, window=window, levels=levels, block_size=block, rng=r1,
                                   overflow="float64") for l in range(L)]
    got = compress_cache_released_layers(K, V, sink=sink, window=window, levels=levels, block_size=block, rng=r2,
                                         overflow="float64")
    for j in range(3):
        assert np.array_equal(got[j], np.stack([r[j] for r in ref])), j
    assert r1.random() == r2.random()
    if big is not None:
        with pytest.raises(InputError, match="overflows"):
            compress_cache_released_layers(K, V, sink=sink, window=window, levels=levels, block_size=block,
                                           rng=np.random.default_rng(7))
