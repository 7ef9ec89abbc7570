"""SubGen's equal-memory fit counts each round's floats from its draws and builds one cache (issue 26): the same
cache, bit for bit, as building every round (methods._SUBGEN_COUNT = False, the code before), and the count is
memory_floats of the cache the round would build."""
import numpy as np
import pytest

from kvbounds.algorithms import compressor_adapters as ca
from kvbounds.algorithms.token_selection import memory_floats


def _kv(H, n, d, seed, dup=False):
    r = np.random.default_rng(seed)
    K, V = r.standard_normal((H, n, d)).astype(np.float32), r.standard_normal((H, n, d)).astype(np.float32)
    if dup:                       # repeated keys and one heavy value: equal cluster sizes, repeated draws
        K[:, 1::2] = K[:, ::2][:, :K[:, 1::2].shape[1]]
        V[:, 5] *= 50
    return K, V


@pytest.mark.parametrize("H,n,d,sink,window,budget,dup", [
    (3, 96, 8, 4, 4, 900, False), (2, 64, 4, 2, 2, 300, True), (2, 40, 4, 2, 2, 2000, False),
    (1, 30, 4, 1, 1, 60, True), (3, 200, 16, 8, 8, 3000, True), (2, 24, 2, 2, 2, 70, False)])
def test_counted_floats_are_the_built_caches(H, n, d, sink, window, budget, dup):
    from kvbounds.e2e.subgen_rounds import subgen_held_floats
    K, V = _kv(H, n, d, budget, dup)
    n_mid = n - sink - window
    for b in range(budget // 3, budget + 1, max(1, budget // 7)):
        left = b - (sink + window) * 2 * d
        if left < 3 * d + 2:
            continue
        c = ca.SubGenCompressor(sink=sink, window=window).compress(K, V, budget_floats=b,
                                                                   rng=np.random.default_rng(b))
        assert subgen_held_floats(K, V, b, b, sink=sink, window=window) == memory_floats(c), b
    k_all = ca.SubGenCompressor(sink=sink, window=window).sizes(n_mid, d, 10**6, 10**6)[0]
    assert k_all == n_mid or n_mid % 2 == 0


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("frac", [0.2, 0.35, 0.6])
def test_fit_builds_the_same_cache_as_every_round(monkeypatch, seed, frac):
    from kvbounds.e2e import methods as M
    K, V = _kv(3, 150, 8, seed, dup=seed % 2 == 1)
    floats = int(frac * 150 * 2 * 8)
    got = M._filled("subgen", K, V, floats, np.random.default_rng(seed), sink=4, window=4)
    monkeypatch.setattr(M, "_SUBGEN_COUNT", False)
    rng = np.random.default_rng(seed)
    ref = M._filled("subgen", K, V, floats, rng, sink=4, window=4)
    for f in ("keys", "values", "log_w_num", "log_w_den"):
        assert np.array_equal(getattr(got, f), getattr(ref, f)), f


def test_stacked_layers_with_counted_rounds_equal_the_built_rounds(lm, monkeypatch):
    from kvbounds.e2e import harness, methods as M, tasks
    state = harness.prefill(lm, tasks.ppl_task(lm, 200, 2, 0).context, capture_inputs=False)
    for budget in (0.25, 0.4):
        got = M.compress_all("subgen", lm, state, budget, np.random.default_rng([1, 2]), sink=16, window=16)
        with monkeypatch.context() as m:
            m.setattr(M, "_SUBGEN_COUNT", False)
            ref = M.compress_all("subgen", lm, state, budget, np.random.default_rng([1, 2]), sink=16, window=16)
        for c, r in zip(got, ref):
            for f in ("keys", "values", "log_w_num", "log_w_den"):
                assert np.array_equal(getattr(c, f), getattr(r, f)), f


def test_counted_floats_when_clusters_can_have_one_size():
    """k dividing n_mid (the one case that reads the clusters), with the middle's keys in equal pairs."""
    from kvbounds.e2e.subgen_rounds import subgen_held_floats
    K, V = _kv(2, 64, 4, 0)
    K[:, 3::2] = K[:, 2::2][:, :K[:, 3::2].shape[1]]
    seen = 0
    for b in range(60, 1200, 3):
        k = ca.SubGenCompressor(sink=2, window=2).sizes(60, 4, b - 32, b)[0] if b - 32 >= 14 else 0
        if not (1 < k < 60 and 60 % k == 0):
            continue
        seen += 1
        c = ca.SubGenCompressor(sink=2, window=2).compress(K, V, budget_floats=b, rng=np.random.default_rng(b))
        assert subgen_held_floats(K, V, b, b, sink=2, window=2) == memory_floats(c), b
    assert seen >= 10
