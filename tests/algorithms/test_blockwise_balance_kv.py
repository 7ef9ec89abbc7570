"""Blockwise BalanceKV (001 App. B) and the B.1 cache set-up: selection invariants, estimator, backends."""
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from kvbounds.algorithms.attention import exact_attention
from kvbounds.algorithms.blockwise_balance_kv import (block_gram, blockwise_balance_select, compress_cache,
                                             weighted_attention)
from kvbounds.algorithms.softmax_balance import normalized_kernel_gram
from kvbounds.algorithms.validation import InputError
from kvbounds.algorithms.arrays import asarray, to_numpy
from kvbounds.traces import make_trace


def _kv(seed, lead, n, d, s, knorm=1.0):
    rng = np.random.default_rng(seed)
    K = rng.standard_normal(lead + (n, d))
    K *= knorm / np.linalg.norm(K, axis=-1, keepdims=True) * rng.random(lead + (n, 1))
    return K, rng.standard_normal(lead + (n, s))


def _check_indices(idx, n, count):
    idx = to_numpy(idx)
    assert idx.shape[-1] == count
    assert np.issubdtype(idx.dtype, np.integer)
    assert np.all(np.diff(idx, axis=-1) > 0)              # sorted and unique
    assert idx.size == 0 or (idx.min() >= 0 and idx.max() < n)   # never a padded row (those have index >= n)


# -- selection invariants ---------------------------------------------------------------------------

@given(b=st.sampled_from([2, 4, 8, 16]), T=st.integers(0, 3), blocks=st.integers(1, 4), heads=st.integers(1, 3),
       d=st.integers(1, 5), s=st.integers(1, 3), seed=st.integers(0, 2**16), kernel=st.sampled_from(["value", "value+1"]))
def test_exact_halving_when_divisible(b, T, blocks, heads, d, s, seed, kernel):
    n = blocks * b * 2**T
    K, V = _kv(seed, (heads,), n, d, s, knorm=3.0)
    idx = blockwise_balance_select(K, V, block_size=b, levels=T, rng=np.random.default_rng(seed), value_kernel=kernel)
    assert idx.shape == (heads, n // 2**T)
    _check_indices(idx, n, n // 2**T)


@given(n=st.integers(1, 200), b=st.sampled_from([2, 4, 6, 16, 64]), T=st.integers(0, 4), seed=st.integers(0, 2**16))
def test_any_length_keeps_n_over_2T_and_never_padding(n, b, T, seed):
    if n >> T < 1:
        with pytest.raises(InputError, match="T too large"):
            blockwise_balance_select(*_kv(seed, (), n, 3, 2), block_size=b, levels=T, rng=np.random.default_rng(seed))
        return
    K, V = _kv(seed, (2,), n, 3, 2)
    idx = blockwise_balance_select(K, V, block_size=b, levels=T, rng=np.random.default_rng(seed))
    _check_indices(idx, n, n >> T)


def test_padding_rows_never_selected_even_when_attractive():
    # n = 5 < b = 16: 11 zero rows pad the single block. Real keys far apart (so their Gram is near
    # diagonal); nothing about the padded rows may leak into the selection
    for seed in range(20):
        K, V = _kv(seed, (4,), 5, 2, 2, knorm=50.0)
        idx = to_numpy(blockwise_balance_select(K, V, block_size=16, levels=1, rng=np.random.default_rng(seed)))
        assert idx.shape == (4, 2) and idx.max() < 5


@pytest.mark.parametrize("seed", range(10))
def test_minority_side_kept_first(seed):
    # replay the documented draws (walk uniforms, then priorities) for one level on one block of 16
    from kvbounds.algorithms.self_balancing_walk import gram_walk, walk_constant
    K, V = _kv(seed, (), 16, 3, 2, knorm=2.0)
    idx = blockwise_balance_select(K, V, block_size=16, levels=1, rng=np.random.default_rng(seed), c=2.0)
    u = np.random.default_rng(seed).random((1, 1, 16))
    W = np.concatenate([V, np.ones((16, 1))], axis=1)
    signs = gram_walk(block_gram(K, W, scale=1 / math.sqrt(3))[None, None], u, 2.0, on_fail="continue").signs[0, 0]
    plus = signs > 0
    minority = np.flatnonzero(plus if 2 * plus.sum() <= 16 else ~plus)
    assert set(minority) <= set(idx) and len(idx) == 8
    assert walk_constant(16, 0.01) > 2.0


@given(n=st.integers(2, 120), sink=st.integers(0, 10), window=st.integers(0, 10), T=st.integers(0, 3),
       method=st.sampled_from(["balance", "uniform"]), seed=st.integers(0, 2**16))
def test_compress_cache_keeps_sink_and_window(n, sink, window, T, method, seed):
    K, V = _kv(seed, (2,), n, 4, 3)
    kw = dict(sink=sink, window=window, levels=T, block_size=8, rng=np.random.default_rng(seed), method=method)
    n_mid = n - sink - window
    if n_mid < 0:
        with pytest.raises(InputError, match="sink"):
            compress_cache(K, V, **kw)
        return
    if n_mid > 0 and n_mid >> T < 1:
        with pytest.raises(InputError, match="T too large"):
            compress_cache(K, V, **kw)
        return
    idx, logw = compress_cache(K, V, **kw)
    idx, logw = to_numpy(idx), to_numpy(logw)
    count = sink + window + (n_mid >> T)
    _check_indices(idx, n, count)
    assert logw.shape == idx.shape
    for h in range(2):
        assert set(range(sink)) <= set(idx[h]) and set(range(n - window, n)) <= set(idx[h])
        exact = (idx[h] < sink) | (idx[h] >= n - window)
        assert np.all(logw[h][exact] == 0)
        np.testing.assert_allclose(logw[h][~exact], T * math.log(2))


# -- estimator --------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["balance", "uniform"])
def test_levels_zero_keeps_everything_and_equals_exact(method):
    K, V = _kv(1, (3,), 50, 8, 5, knorm=4.0)
    Q = np.random.default_rng(2).standard_normal((3, 7, 8))
    idx, logw = compress_cache(K, V, sink=4, window=6, levels=0, block_size=8, rng=np.random.default_rng(0),
                               method=method)
    assert np.array_equal(to_numpy(idx), np.broadcast_to(np.arange(50), (3, 50)))
    est = weighted_attention(Q, K, V, idx, logw)
    ref = np.stack([exact_attention(Q[h], K[h], V[h]) for h in range(3)])
    np.testing.assert_allclose(est, ref, rtol=1e-12, atol=1e-12)
    # single query per head, and a shared 1-D index
    np.testing.assert_allclose(weighted_attention(Q[:, 0], K, V, np.arange(50), np.zeros(50)), ref[:, 0], atol=1e-12)


def test_weighted_attention_is_the_weighted_ratio():
    K, V = _kv(4, (), 30, 4, 3)
    q = np.random.default_rng(5).standard_normal(4)
    idx = np.array([1, 4, 9, 20])
    logw = np.array([0.0, math.log(4), math.log(4), 0.0])
    e = np.exp(K[idx] @ q / 2.0) * np.exp(logw)
    np.testing.assert_allclose(weighted_attention(q, K, V, idx, logw), e @ V[idx] / e.sum(), rtol=1e-12)


# -- backends ---------------------------------------------------------------------------------------

def test_backends_agree_with_numpy(backend):
    K, V = _kv(7, (2,), 300, 8, 4, knorm=3.0)
    ref = blockwise_balance_select(K, V, block_size=32, levels=2, rng=np.random.default_rng(11))
    Kb, Vb = asarray(K, backend), asarray(V, backend)
    got = blockwise_balance_select(Kb, Vb, block_size=32, levels=2, rng=np.random.default_rng(11))
    assert np.array_equal(to_numpy(got), ref)
    for method in ("balance", "uniform"):
        i_ref, w_ref = compress_cache(K, V, sink=8, window=16, levels=2, block_size=32, rng=np.random.default_rng(3),
                                      method=method)
        i_b, w_b = compress_cache(Kb, Vb, sink=8, window=16, levels=2, block_size=32, rng=np.random.default_rng(3),
                                  method=method)
        assert np.array_equal(to_numpy(i_b), i_ref)
        q = np.random.default_rng(9).standard_normal((2, 3, 8))
        np.testing.assert_allclose(to_numpy(weighted_attention(asarray(q, backend), Kb, Vb, i_b, w_b)),
                                   weighted_attention(q, K, V, i_ref, w_ref), rtol=1e-10, atol=1e-12)


def test_weighted_attention_moves_host_indices_to_k_device(backend):
    """idx / logw given as numpy or as CPU torch tensors beside K on another device are moved to K's device (CPU
    torch indices beside CUDA keys used to reach xp.take on the wrong device); the answer equals numpy's."""
    torch = pytest.importorskip("torch")
    from backend_helpers import assert_close, assert_on_device_of
    K, V = _kv(7, (2,), 64, 8, 4, knorm=3.0)
    idx, logw = compress_cache(K, V, sink=4, window=4, levels=2, block_size=16, rng=np.random.default_rng(3))
    q = np.random.default_rng(9).standard_normal((2, 8))
    ref = weighted_attention(q, K, V, idx, logw)
    Kb, Vb, qb = (asarray(x, backend) for x in (K, V, q))
    for i, w in ((idx, logw), (torch.as_tensor(idx), torch.as_tensor(np.array(logw)))):
        out = weighted_attention(qb, Kb, Vb, i, w)
        assert_on_device_of(out, Kb)
        assert_close(out, ref)


def test_weighted_attention_stays_on_the_device(monkeypatch):
    """On torch arrays the estimator never converts to numpy (it would be a device-to-host copy on CUDA)."""
    torch = pytest.importorskip("torch")
    from backend_helpers import no_torch_host_copy
    K, V = _kv(7, (2,), 64, 8, 4, knorm=3.0)
    idx, logw = compress_cache(K, V, sink=4, window=4, levels=2, block_size=16, rng=np.random.default_rng(3))
    args = [torch.as_tensor(np.array(x)) for x in (np.ones((2, 8)), K, V, idx, logw)]
    with no_torch_host_copy(monkeypatch):
        out = weighted_attention(*args)
    np.testing.assert_allclose(out.numpy(), weighted_attention(np.ones((2, 8)), K, V, idx, logw), rtol=1e-12)


def test_float32_runs(backend):
    K, V = _kv(7, (2,), 256, 8, 4)
    idx = blockwise_balance_select(asarray(K, backend, "float32"), asarray(V, backend, "float32"), block_size=32,
                                   levels=2, rng=np.random.default_rng(0))
    _check_indices(idx, 256, 64)


# -- numerics ---------------------------------------------------------------------------------------

def test_block_gram_matches_normalized_kernel_gram():
    K, V = _kv(3, (), 16, 5, 3, knorm=6.0)
    W = np.concatenate([V, np.ones((16, 1))], axis=1)
    rk, rw = np.linalg.norm(K, axis=1).max(), np.linalg.norm(W, axis=1).max()
    np.testing.assert_allclose(block_gram(K, W, scale=1 / math.sqrt(5)), normalized_kernel_gram(K, W, rk, rw),
                               rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_no_overflow_large_key_norms(dtype):
    d, n = 64, 512
    rng = np.random.default_rng(0)
    K = rng.standard_normal((2, n, d))
    K *= 60.0 / np.linalg.norm(K, axis=-1, keepdims=True)
    K[:, ::3] *= 0.5                                     # mixed norms: 60 and 30
    V = rng.standard_normal((2, n, 8))
    Kx, Vx = asarray(K, "numpy", dtype), asarray(V, "numpy", dtype)
    G = block_gram(Kx[0, :64], np.concatenate([Vx[0, :64], np.ones((64, 1), dtype)], 1), scale=1 / 8)
    assert np.all(np.isfinite(G)) and np.abs(G).max() <= 1 + 1e-5
    idx, logw = compress_cache(Kx, Vx, sink=16, window=16, levels=2, block_size=64, rng=np.random.default_rng(1))
    _check_indices(idx, n, 32 + (n - 32) // 4)
    q = asarray(rng.standard_normal((2, 4, d)) * 60 / 8, "numpy", dtype)  # ||q|| ~ 60
    out = weighted_attention(q, Kx, Vx, idx, logw)
    assert np.all(np.isfinite(out))


def test_balance_beats_uniform_on_clustered_trace():
    """BKV.vs-uniform at T = 2 on a clustered synthetic trace (fixed seeds 0..4, defaults c and delta)."""
    n, d, b, T, sink, window = 1024, 16, 64, 2, 32, 32
    errs = {"balance": [], "uniform": []}
    for seed in range(5):
        tr = make_trace("clustered", n=n, d=d, seed=seed)
        Q = tr.Q[-32:]
        ref = exact_attention(Q, tr.K, tr.V)
        for method in errs:
            idx, logw = compress_cache(tr.K, tr.V, sink=sink, window=window, levels=T, block_size=b,
                                       rng=np.random.default_rng(100 + seed), method=method)
            est = weighted_attention(Q, tr.K, tr.V, idx, logw)
            errs[method].append(np.mean(np.linalg.norm(est - ref, axis=1) / np.linalg.norm(ref, axis=1)))
    bal, uni = np.mean(errs["balance"]), np.mean(errs["uniform"])
    assert bal < uni, (bal, uni)


# -- bad input --------------------------------------------------------------------------------------

def _bad_calls():
    K, V = _kv(0, (), 64, 4, 3)
    rng = np.random.default_rng(0)
    sel = lambda **kw: blockwise_balance_select(**{**dict(K=K, V=V, block_size=8, levels=1, rng=rng), **kw})
    cc = lambda **kw: compress_cache(**{**dict(K=K, V=V, sink=4, window=4, levels=1, block_size=8, rng=rng), **kw})
    Knan = K.copy()
    Knan[3, 1] = np.nan
    Vinf = V.copy()
    Vinf[0, 0] = np.inf
    return {
        "K 1-D": lambda: sel(K=K[0]),
        "V rows": lambda: sel(V=V[:10]),
        "int dtype": lambda: sel(K=K.astype(np.int64)),
        "dtype mismatch": lambda: sel(V=V.astype(np.float32)),
        "K NaN": lambda: sel(K=Knan),
        "V Inf": lambda: sel(V=Vinf),
        "not array": lambda: sel(K=K.tolist()),
        "odd block": lambda: sel(block_size=7),
        "block 0": lambda: sel(block_size=0),
        "block 1": lambda: sel(block_size=1),
        "block float": lambda: sel(block_size=8.0),
        "levels < 0": lambda: sel(levels=-1),
        "levels bool": lambda: sel(levels=True),
        "T too large": lambda: sel(levels=7),
        "delta": lambda: sel(delta=1.5),
        "c": lambda: sel(c=-1.0),
        "kernel": lambda: sel(value_kernel="keys"),
        "rng": lambda: sel(rng=0),
        "sink+window > n": lambda: cc(sink=40, window=30),
        "negative sink": lambda: cc(sink=-1),
        "method": lambda: cc(method="random"),
        "cc T too large": lambda: cc(levels=6),
        "wa idx float": lambda: weighted_attention(K[0], K, V, np.array([0.0, 1.0]), np.zeros(2)),
        "wa idx range": lambda: weighted_attention(K[0], K, V, np.array([0, 64]), np.zeros(2)),
        "wa logw shape": lambda: weighted_attention(K[0], K, V, np.array([0, 1]), np.zeros(3)),
        "wa q dim": lambda: weighted_attention(K[0, :3], K, V, np.array([0, 1]), np.zeros(2)),
        "wa logw NaN": lambda: weighted_attention(K[0], K, V, np.array([0, 1]), np.array([0.0, np.nan])),
    }


@pytest.mark.parametrize("case", list(_bad_calls()))
def test_bad_input_raises(case):
    with pytest.raises(InputError):
        _bad_calls()[case]()
