"""The one-line reproducers of issue 11 (input half), each a test: a clear InputError, or the right answer."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

from kvbounds.algorithms import attention, blockwise_balance_kv as bbk, blockwise_softmax as bsm, kcenter
from kvbounds.algorithms import compressor_adapters as ca, subspace_attention as sa, uniform_sampling as us
from kvbounds.algorithms.balance_kv import BalanceKV, DegenerateEstimate
from kvbounds.algorithms.frequent_directions import FrequentDirections
from kvbounds.algorithms.merge_and_reduce import MergeAndReduce
from kvbounds.algorithms.self_balancing_walk import self_balancing_walk
from kvbounds.algorithms.softmax_balance import softmax_balance
from kvbounds.algorithms.subgen import SubGen
from kvbounds.algorithms.token_selection import make_selector
from kvbounds.algorithms.validation import InputError
from kvbounds.traces import synthetic

torch = pytest.importorskip("torch")


def test_exact_attention_huge_norms_is_the_hard_argmax():
    out = attention.exact_attention(np.array([1e160]), np.array([[1e160], [-1e160]]), np.eye(2))
    np.testing.assert_array_equal(out, [1.0, 0.0])
    out = bbk.weighted_attention(np.array([1e160]), np.array([[1e160], [-1e160]]), np.eye(2), np.array([0, 1]),
                                 np.zeros(2))
    np.testing.assert_array_equal(out, [1.0, 0.0])
    w = attention.attention_weights(np.array([[1e200], [-1e200]]), np.array([[1e200], [-1e200], [0.0]]))
    np.testing.assert_array_equal(w, [[1, 0, 0], [0, 1, 0]])


@pytest.mark.parametrize("dtype", [np.float16, "torch.bfloat16"])
def test_half_precision_is_rejected_up_front(dtype):
    K = np.full((2, 4), 300.0)
    if dtype == "torch.bfloat16":
        K = torch.as_tensor(K, dtype=torch.bfloat16)
        q, V = K[0], torch.eye(2, dtype=torch.bfloat16)
    else:
        K = K.astype(dtype)
        q, V = K[0], np.eye(2, dtype=dtype)
    with pytest.raises(InputError, match="half precision"):
        attention.exact_attention(q, K, V)
    with pytest.raises(InputError, match="half precision"):
        FrequentDirections(4, 2).update(K)
    with pytest.raises(InputError, match="half precision"):
        sa.top_basis(K, 1)


@pytest.mark.parametrize("scale", [math.nan, math.inf, "0.5", -1.0])
def test_bad_scale(scale):
    q, K, V = np.ones(2), np.ones((3, 2)), np.ones((3, 1))
    for call in (lambda: attention.exact_attention(q, K, V, scale=scale),
                 lambda: bbk.weighted_attention(q, K, V, np.arange(3), np.zeros(3), scale=scale),
                 lambda: us.uniform_parts(q, K, V, np.arange(3), scale=scale),
                 lambda: MergeAndReduce(2, 1, t=2, T=1, delta=0.1, rng=np.random.default_rng(0), scale=scale)):
        with pytest.raises(InputError, match="scale"):
            call()


def test_uniform_estimate_shifts_by_the_sampled_keys():
    # sampled keys ~745 logits below an unsampled one: the all-keys shift made this 0/0
    d = 4
    K = np.zeros((64, d))
    K[0] = [745.0 * 2 / 37.0, 0, 0, 0]        # <k, q>/sqrt d = 745 with q = (37, 0, 0, 0)
    K[1:, 1] = 1.0
    V = np.full((64, 2), 44.0)
    q = np.array([37.0, 0, 0, 0])
    rng = np.random.default_rng(0)
    for _ in range(20):
        out = us.uniform_estimate(q, K, V, 4, rng)
        assert np.all(np.isfinite(out))
        np.testing.assert_allclose(out, 44.0)


def test_balancekv_query_numerator_far_above_denominator():
    # the numerator's logits may exceed the denominator's by > 709: a finite answer or DegenerateEstimate, never inf
    r, d = 28.0, 1
    rng = np.random.default_rng(3)
    for seed in range(20):
        bkv = BalanceKV(d, batch_size=2, levels=1, eps=0.5, r=r, delta=0.1, seed=seed)
        for k, v in ((r, 1.0), (-r, 1.0), (r, 1.0), (-r, 1.0)):
            bkv.update(np.array([k]), np.array([v]))
        try:
            out = bkv.query(np.array([r * rng.choice([-1, 1])]))
        except DegenerateEstimate:
            continue
        assert np.all(np.isfinite(out))


def test_kcenter_never_repeats_a_centre():
    K = np.repeat(np.eye(3), 3, axis=0)
    idx, lw = make_selector("kcenter").select(K, np.ones((9, 1)), budget=5)
    assert len(set(idx.tolist())) == 5
    idx, lw = make_selector("kcenter", weights="cluster_size").select(K, np.ones((9, 1)), budget=5)
    assert np.all(np.isfinite(lw)) and math.isclose(np.exp(lw).sum(), 9)
    res = kcenter.greedy_k_center(K, 5)
    assert len(set(res.centers.tolist())) == 5 and res.exhausted
    out = make_selector("kcenter", weights="cluster_size").select(K, np.arange(9.0)[:, None], budget=5)
    assert np.all(np.isfinite(bbk.weighted_attention(np.ones(3), K, np.arange(9.0)[:, None], *out)))


def test_kcenter_overflowing_squared_norms():
    X = np.array([[1e200, 0.0], [0.0, 1e200], [-1e200, 0.0]])
    res = kcenter.greedy_k_center(X, 2)
    np.testing.assert_allclose(res.radii, [2e200, math.sqrt(2) * 1e200], rtol=1e-12)


def test_top_basis_with_inf_returns_at_once():
    X = np.ones((4, 3))
    X[1, 2] = np.inf
    t = time.perf_counter()
    with pytest.raises(InputError, match="NaN or Inf"):
        sa.top_basis(X, 2)
    assert time.perf_counter() - t < 1.0


def test_blockwise_select_cost_does_not_grow_with_block_size():
    K = np.random.default_rng(0).standard_normal((8, 4))
    t = time.perf_counter()
    idx = bbk.blockwise_balance_select(K, np.ones((8, 2)), block_size=2**20, levels=2, rng=np.random.default_rng(0))
    assert time.perf_counter() - t < 5.0 and idx.shape == (2,)
    small = bbk.blockwise_balance_select(K, np.ones((8, 2)), block_size=8, levels=2, rng=np.random.default_rng(0))
    assert small.shape == (2,)


def test_mixed_numpy_and_torch():
    q, K, V = np.ones(2), torch.ones((3, 2), dtype=torch.float64), np.ones((3, 1))
    with pytest.raises(InputError, match="mix array backends"):
        attention.exact_attention(q, K, V)
    with pytest.raises(InputError, match="mix array backends"):
        softmax_balance(K, V, delta=0.1, rng=np.random.default_rng(0))


@pytest.mark.parametrize("rng", [None, 2.5, "0", 0])
def test_rng_is_checked(rng):
    with pytest.raises(InputError, match="rng"):
        self_balancing_walk(np.ones((4, 2)), delta=0.1, rng=rng)
    with pytest.raises(InputError, match="rng"):
        us.uniform_select(5, 2, rng)


@pytest.mark.parametrize("seed", [2.5, -1, "1", math.nan])
def test_seeds_are_checked(seed):
    with pytest.raises(InputError, match="seed"):
        BalanceKV(2, batch_size=2, levels=1, eps=0.5, r=1.0, seed=seed)
    with pytest.raises(InputError, match="seed"):
        synthetic.make_trace("gaussian", n=4, d=2, seed=seed)
    with pytest.raises(InputError, match="seed"):
        SubGen(2, delta=0.5, s=1, t=1, seed=seed)


def test_huge_radius_is_an_input_error():
    with pytest.raises(InputError, match="r_key"):
        softmax_balance(np.ones((4, 2)), np.ones((4, 1)), delta=0.1, rng=np.random.default_rng(0), r_key=1e200)
    with pytest.raises(InputError, match="r = "):
        BalanceKV(2, batch_size=2, levels=1, eps=0.5, r=1e200)


def test_subgen_stream_empty_or_lists():
    sg = SubGen(2, delta=0.5, s=1, t=1)
    with pytest.raises(InputError, match="K"):
        sg.stream(np.zeros((0, 2)), np.zeros((0, 1)), np.zeros((0, 2)))
    with pytest.raises(InputError, match="must be an array"):
        sg.stream([[1.0, 2.0]], [[1.0]], [[1.0, 2.0]])


def test_clusterability_k_none():
    with pytest.raises(InputError, match="k"):
        kcenter.clusterability(np.random.default_rng(0).standard_normal((8, 2)), k=None)


def test_static_subspace_empty_basis():
    with pytest.raises(InputError, match="B"):
        sa.StaticSubspaceAttention(np.zeros((0, 3)), np.eye(3))


def test_softmax_concat_and_adapters_check_their_input():
    with pytest.raises(InputError):
        bsm.softmax_concat([(np.ones(2), np.ones((3, 1)))])
    with pytest.raises(InputError):
        bsm.softmax_concat([(np.ones(2), [[1.0], [2.0]])])
    with pytest.raises(InputError):
        bsm.softmax_concat(None)
    comp = ca.make_compressor("subgen", 3, d=4, r=1.0, u_size=4, seed=0)
    with pytest.raises(InputError):
        comp.consume([[1.0] * 4], [[1.0] * 4])
    with pytest.raises(InputError):
        ca.make_compressor("uniform", 10**30, d=4, r=1.0, u_size=4, seed=0)
    with pytest.raises(InputError, match="before consume"):
        ca.make_compressor("uniform", 3, d=4, r=1.0, u_size=4, seed=0).query(np.ones(4))


def test_calibrate_gamma_large_norms():
    rng = np.random.default_rng(0)
    Q, K = rng.standard_normal((3, 4)) * 1e150, rng.standard_normal((5, 4)) * 1e150
    B = np.linalg.qr(rng.standard_normal((4, 2)))[0].T
    g = sa.calibrate_gamma(Q, K, B)
    assert math.isfinite(g)
    assert math.isclose(g, sa.calibrate_gamma(Q / 1e150, K / 1e150, B), rel_tol=1e-9)
