"""SubGen's equal-memory fit counts each round's floats from its draws and builds one cache (issue 26): the same
cache, bit for bit, as building every round (equal_memory._SUBGEN_COUNT = False, the code before), and the count is
memory_floats of the cache the round would build."""
import numpy as np
import pytest

from kvbounds.algorithms import compressor_adapters as ca
from kvbounds.algorithms import equal_memory as EM
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
    from kvbounds.algorithms.subgen_rounds import subgen_held_floats
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
    from kvbounds.e2e import _methods as M
    K, V = _kv(3, 150, 8, seed, dup=seed % 2 == 1)
    floats = int(frac * 150 * 2 * 8)
    got = EM.fit_to_floats("subgen", K, V, floats, np.random.default_rng(seed), sink=4, window=4)
    monkeypatch.setattr(EM, "_SUBGEN_COUNT", False)
    rng = np.random.default_rng(seed)
    ref = EM.fit_to_floats("subgen", K, V, floats, rng, sink=4, window=4)
    for f in ("keys", "values", "log_w_num", "log_w_den"):
        assert np.array_equal(getattr(got, f), getattr(ref, f)), f


def test_stacked_layers_with_counted_rounds_equal_the_built_rounds(lm, monkeypatch):
    from kvbounds.e2e import _harness as harness
    from kvbounds.e2e import _methods as M
    from kvbounds.e2e import _tasks as tasks
    state = harness.prefill(lm, tasks.ppl_task(lm, 200, 2, 0).context, capture_inputs=False)
    for budget in (0.25, 0.4):
        got = M.compress_all("subgen", lm, state, budget, np.random.default_rng([1, 2]), sink=16, window=16)
        with monkeypatch.context() as m:
            m.setattr(EM, "_SUBGEN_COUNT", False)
            ref = M.compress_all("subgen", lm, state, budget, np.random.default_rng([1, 2]), sink=16, window=16)
        for c, r in zip(got, ref):
            for f in ("keys", "values", "log_w_num", "log_w_den"):
                assert np.array_equal(getattr(c, f), getattr(r, f)), f


def test_counted_floats_when_clusters_can_have_one_size():
    """k dividing n_mid (the one case that reads the clusters), with the middle's keys in equal pairs."""
    from kvbounds.algorithms.subgen_rounds import subgen_held_floats
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


def test_l2_draws_are_generator_choice():
    """SubGen's l2 draws on numpy (issue 26: choice's algorithm without its checks of p) are ``rng.choice(n, t, p)``,
    zero probabilities and one-token supports included; the per-head sample's distinct tokens and counts are
    np.unique's."""
    from kvbounds.algorithms import cache_compressors as ca
    r = np.random.default_rng(26)
    for trial in range(60):
        n, t = int(r.integers(1, 500)), int(r.integers(1, 300))
        P = r.random(n) ** 3
        if trial % 3 == 0:
            P[r.integers(n, size=n // 2 + 1)] = 0.0
        if trial % 10 == 0:
            P[:] = 0.0
            P[r.integers(n)] = 2.0
        p = P / P.sum()
        assert np.array_equal(ca.l2_draws(p, t, np.random.default_rng(trial)),
                              np.random.default_rng(trial).choice(n, size=t, p=p))
        uniq, a = ca.l2_sample(P, t, np.random.default_rng(trial))
        vals, cnt = np.unique(np.random.default_rng(trial).choice(n, size=t, p=p), return_counts=True)
        assert np.array_equal(uniq, vals) and a.dtype == np.float32
        assert np.array_equal(a, np.log(cnt.astype(np.float64) / (t * p[vals])).astype(np.float32))


def test_shared_value_norms_are_each_rounds_own():
    """The fit's rounds share V's squared row norms (issue 26): a slice of them is what a round computes on its
    middle, bit for bit, and the counted floats are the same with or without them."""
    from kvbounds.algorithms.subgen_rounds import subgen_held_floats
    r = np.random.default_rng(7)
    for H, n, d, sink, window in ((3, 96, 8, 4, 4), (2, 131, 64, 32, 17), (1, 40, 3, 1, 1)):
        K, V = _kv(H, n, d, int(r.integers(99)))
        V *= np.float32(10.0) ** r.integers(-3, 4, size=(1, n, 1)).astype(np.float32)
        norms2 = np.sum(V.astype(np.float64) ** 2, axis=-1)
        for extra in (0, 3):
            hi = n - window - extra
            assert np.array_equal(norms2[:, sink:hi], np.sum(V[:, sink:hi].astype(np.float64) ** 2, axis=-1))
            budget = (sink + window + extra) * 2 * d + 20 * d
            assert subgen_held_floats(K, V, budget, 5, sink=sink, window=window + extra, norms2=norms2) == \
                subgen_held_floats(K, V, budget, 5, sink=sink, window=window + extra)
    from kvbounds.algorithms.validation import InputError
    with pytest.raises(InputError, match="norms2"):
        subgen_held_floats(K, V, budget, 5, sink=1, window=1, norms2=norms2[:, 1:])
