"""The shared token-selection interface: StreamingLLM, H2O, uniform, k-center, the BalanceKV adapter."""
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from kvbounds.algorithms.attention import exact_attention
from kvbounds.algorithms.blockwise_balance_kv import compress_cache, weighted_attention
from kvbounds.algorithms.kcenter import greedy_k_center
from kvbounds.algorithms.token_selection import (H2O, SELECTORS, BalanceKV, KCenter, StreamingLLM, Uniform, estimate,
                                        make_selector, relative_error)
from kvbounds.algorithms.validation import InputError
from kvbounds.algorithms.arrays import asarray, to_numpy
from kvbounds.testing import assert_attention_error
from kvbounds.testing.strategies import kv_streams

CONFIGS = [("streaming_llm", {}), ("h2o", {}), ("uniform", dict(sink=2, window=4)), ("kcenter", dict(window=4)),
           ("kcenter", dict(window=4, weights="cluster_size")), ("balancekv", dict(sink=2, window=4, block_size=8))]


def _qkv(seed, lead, n, d=4, s=3):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(lead + (n, d)), rng.standard_normal(lead + (n, d)), rng.standard_normal(lead + (n, s)))


@pytest.mark.parametrize("name, kw", CONFIGS)
@pytest.mark.parametrize("lead", [(), (3,)])
def test_selection_form(name, kw, lead):
    Q, K, V = _qkv(0, lead, 64)
    idx, lw = make_selector(name, **kw).select(K, V, budget=20, rng=np.random.default_rng(1), Q=Q)
    idx, lw = to_numpy(idx), to_numpy(lw)
    assert idx.shape == lw.shape and idx.shape[:-1] == lead
    assert idx.shape[-1] == 20 or (name == "balancekv" and idx.shape[-1] <= 20)
    assert np.issubdtype(idx.dtype, np.integer) and np.all(np.diff(idx, axis=-1) > 0)
    assert idx.min() >= 0 and idx.max() < 64 and np.all(np.isfinite(lw))
    out = estimate(Q[..., -1, :], K, V, idx, lw)
    assert out.shape == lead + (3,) and np.all(np.isfinite(out))


@pytest.mark.parametrize("name, kw", CONFIGS)
def test_full_budget_is_exact(name, kw, kvbounds_stream):
    """On every stream family of kvbounds.testing (the plugin's kvbounds_stream fixture), a budget that holds every
    token gives exact attention (float64: 1e-12 of ||Attn||, a few hundred roundings of n = 64 terms)."""
    Q, K, V = kvbounds_stream.Q, kvbounds_stream.K, kvbounds_stream.V
    idx, lw = make_selector(name, **kw).select(K, V, budget=kvbounds_stream.n, rng=np.random.default_rng(0), Q=Q)
    assert_attention_error(lambda q: estimate(q, K, V, idx, lw), kvbounds_stream, Q[-1], 1e-12, scale="relative")
    assert relative_error(Q[-1], K, V, idx, lw) < 1e-12


def test_streaming_llm_keeps_sink_and_recent():
    _, K, V = _qkv(0, (), 40)
    idx, _ = StreamingLLM(sink=3).select(K, V, budget=10)
    assert to_numpy(idx).tolist() == [0, 1, 2] + list(range(33, 40))


def _h2o_reference(Q, K, budget, recent, scale):
    cache, score = [], {}
    for j in range(len(K)):
        cache.append(j)
        score[j] = 0.0
        logits = np.array([Q[j] @ K[i] * scale for i in cache])
        w = np.exp(logits - logits.max())
        for i, x in zip(cache, w / w.sum()):
            score[i] += x
        if len(cache) > budget:
            old = [i for i in cache if i <= j - recent]
            victim = min(old, key=lambda i: (score[i], cache.index(i)))
            cache.remove(victim)
    return sorted(cache)


@given(stream=kv_streams(max_n=40, max_d=6), budget=st.integers(2, 12), recent=st.integers(0, 11))
def test_h2o_matches_a_plain_reference(stream, budget, recent):
    """On streams of every family (kvbounds.testing.strategies.kv_streams: heavy hitters, huge norms, duplicated
    keys, ...), H2O keeps what a plain transcription of its eviction keeps."""
    recent = min(recent, budget - 1)
    Q, K, V = stream.Q, stream.K, stream.V
    idx, _ = H2O(recent=recent).select(K, V, budget=budget, Q=Q)
    ref = _h2o_reference(Q, K, budget, recent, stream.scale) if budget < stream.n else list(range(stream.n))
    assert to_numpy(idx).tolist() == ref, stream


def test_h2o_needs_queries_and_keeps_recent_window():
    Q, K, V = _qkv(2, (2,), 50)
    with pytest.raises(InputError, match="needs the queries"):
        H2O().select(K, V, budget=10)
    idx = to_numpy(H2O(recent=4).select(K, V, budget=10, Q=Q)[0])
    assert np.all(np.isin(np.arange(46, 50), idx[0])) and np.all(np.isin(np.arange(46, 50), idx[1]))


def test_uniform_weights_and_kcenter_content():
    Q, K, V = _qkv(3, (), 100)
    idx, lw = Uniform(sink=10, window=10).select(K, V, budget=30, rng=np.random.default_rng(0))
    idx = to_numpy(idx)
    assert idx[:10].tolist() == list(range(10)) and idx[-10:].tolist() == list(range(90, 100))
    np.testing.assert_allclose(to_numpy(lw)[10:20], math.log(80 / 10))
    kidx, klw = KCenter(window=5, weights="cluster_size").select(K, V, budget=12)
    centers = sorted(to_numpy(greedy_k_center(K[:95], 7).centers).tolist())
    assert to_numpy(kidx).tolist() == centers + list(range(95, 100))
    np.testing.assert_allclose(np.exp(to_numpy(klw)).sum(), 100)


def test_balancekv_adapter_is_compress_cache():
    Q, K, V = _qkv(4, (2,), 200)
    sel = BalanceKV(sink=8, window=8, block_size=16)
    assert sel.levels_for(200, 108) == 1 and sel.levels_for(200, 107) == 2 and sel.levels_for(200, 70) == 2
    a = sel.select(K, V, budget=70, rng=np.random.default_rng(5))
    b = compress_cache(K, V, sink=8, window=8, levels=2, block_size=16, rng=np.random.default_rng(5))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(to_numpy(x), to_numpy(y))
    np.testing.assert_allclose(estimate(Q[:, -1], K, V, *a), weighted_attention(Q[:, -1], K, V, *b))


def test_backend_agreement(backend):
    Q, K, V = _qkv(6, (2,), 48)
    for name, kw in CONFIGS:
        ref = make_selector(name, **kw).select(K, V, budget=16, rng=np.random.default_rng(3), Q=Q)
        got = make_selector(name, **kw).select(asarray(K, backend), asarray(V, backend), budget=16,
                                               rng=np.random.default_rng(3), Q=asarray(Q, backend))
        np.testing.assert_array_equal(to_numpy(got[0]), to_numpy(ref[0]))
        np.testing.assert_allclose(to_numpy(got[1]), to_numpy(ref[1]), rtol=1e-12)


def test_backend_compress_estimate_and_device(backend):
    """Selections on the backend stay on K's device, and so does their contract form (compress); both and the estimator agree
    with numpy's within the dtype's tolerance."""
    from backend_helpers import assert_close, assert_on_device_of
    Q, K, V = _qkv(6, (2,), 48)
    Qb, Kb, Vb = (asarray(x, backend) for x in (Q, K, V))
    for name, kw in CONFIGS:
        idx, lw = make_selector(name, **kw).select(Kb, Vb, budget=16, rng=np.random.default_rng(3), Q=Qb)
        assert_on_device_of(idx, Kb)
        assert_on_device_of(lw, Kb)
        out = estimate(Qb[:, -1], Kb, Vb, idx, lw)
        assert_on_device_of(out, Kb)
        ref_idx, ref_lw = make_selector(name, **kw).select(K, V, budget=16, rng=np.random.default_rng(3), Q=Q)
        assert_close(out, estimate(Q[:, -1], K, V, ref_idx, ref_lw))
        got = make_selector(name, **kw).compress(Kb, Vb, budget=16, rng=np.random.default_rng(3), Q=Qb)
        ref = make_selector(name, **kw).compress(K, V, budget=16, rng=np.random.default_rng(3), Q=Q)
        for field in ("keys", "values", "log_w_num", "log_w_den"):     # the contract's arrays stay on K's device
            assert_on_device_of(getattr(got, field), Kb)
            np.testing.assert_allclose(to_numpy(getattr(got, field)), getattr(ref, field), rtol=1e-7)
        np.testing.assert_allclose(got.estimate(Qb[:, -2:]), ref.estimate(Q[:, -2:]), rtol=1e-6)   # q of any backend
    idx, lw = make_selector("uniform", sink=2, window=4).select(Kb[0], Vb[0], budget=16, rng=np.random.default_rng(3))
    ref = relative_error(Q[0, -3:], K[0], V[0], *make_selector("uniform", sink=2, window=4).select(
        K[0], V[0], budget=16, rng=np.random.default_rng(3)))
    assert_close(relative_error(Qb[0, -3:], Kb[0], Vb[0], idx, lw), ref)


def test_bad_input():
    Q, K, V = _qkv(0, (), 20)
    with pytest.raises(InputError, match="budget"):
        StreamingLLM().select(K, V, budget=0)
    with pytest.raises(InputError, match="unknown selector"):
        make_selector("nope")
    with pytest.raises(InputError, match="no center"):
        KCenter(window=8).select(K, V, budget=8)
    with pytest.raises(InputError, match="weights"):
        KCenter(window=1, weights="x").select(K, V, budget=8)
    with pytest.raises(InputError, match="rng"):
        Uniform().select(K, V, budget=8)
    with pytest.raises(InputError, match="NaN"):
        StreamingLLM().select(np.full((5, 2), np.nan), np.ones((5, 2)), budget=2)
    with pytest.raises(InputError, match="agree"):
        StreamingLLM().select(K, V[:5], budget=2)
    with pytest.raises(InputError, match="Q must have"):
        H2O().select(K, V, budget=5, Q=Q[:3])
    assert set(SELECTORS) == {"streaming_llm", "h2o", "uniform", "kcenter", "balancekv"}


def test_a_count_field_is_none_only_where_its_default_is():
    """Found by the fuzz: BalanceKV(window=None) was accepted (None passed for every count field) and its select
    ended in a TypeError; H2O's recent (default None: a share of the budget) stays optional."""
    from kvbounds.algorithms.token_selection import make_selector
    with pytest.raises(InputError, match="window"):
        make_selector("balancekv", window=None)
    with pytest.raises(InputError, match="sink"):
        make_selector("uniform", sink=None)
    assert make_selector("h2o", recent=None).recent is None
