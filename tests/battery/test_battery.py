"""The battery (kvbounds.battery): each control's memory counted as the method's is, the controls exact where
they hold the whole stream, zeros and the mean what they say, uniform unbiased, the ablations of the claims'
streaming algorithms (fair coins on the walk's own uniforms), and run() sizing the controls from the floats the
method holds."""
from __future__ import annotations

import math

import numpy as np
import pytest

from kvbounds import battery as ab
from kvbounds.battery import _controls as bt
from kvbounds.algorithms.balance_kv import BalanceKV
from kvbounds.algorithms.frequent_directions import FrequentDirections
from kvbounds.algorithms.merge_and_reduce import MergeAndReduce
from kvbounds.algorithms.validation import InputError

N, D, DV = 40, 6, 3


@pytest.fixture(scope="module")
def kvq():
    rng = np.random.default_rng(0)
    return rng.standard_normal((N, D)), rng.standard_normal((N, DV)), rng.standard_normal(D)


def exact(q, K, V, scale):
    x = K @ q * scale
    w = np.exp(x - x.max())
    return w @ V / w.sum()


@pytest.mark.parametrize("floats", [0, 5, 13, 100, 241, N * (D + DV) - 1, N * (D + DV), 10**6])
def test_each_control_holds_at_most_the_floats_it_is_given(kvq, floats):
    K, V, _ = kvq
    cs = bt.controls(K, V, floats, np.random.default_rng(1), sink=2, window=3)
    assert set(cs) == {"zeros", "mean", "streaming_llm", "uniform"}
    assert bt.cache_floats(cs["zeros"]) == 0
    assert bt.cache_floats(cs["mean"]) == D + DV + 1                      # one token and its weight log n
    per_token = D + DV
    m = min(floats // per_token, N)
    assert bt.cache_floats(cs["streaming_llm"]) == m * per_token <= max(floats, 0)   # no weight: positional
    u = bt.cache_floats(cs["uniform"])
    assert u <= floats or floats < per_token and u == 0
    if floats >= N * per_token:
        assert u == N * per_token                                         # the whole stream, exact
    elif (floats - 1) // per_token > 5:                                   # a middle sample: one weight float
        assert u == (floats - 1) // per_token * per_token + 1


def test_controls_holding_the_whole_stream_are_exact(kvq):
    K, V, q = kvq
    cs = bt.controls(K, V, N * (D + DV), np.random.default_rng(2), sink=2, window=3)
    for name in ("streaming_llm", "uniform"):
        np.testing.assert_allclose(bt.attention(cs[name], q, 0.3), exact(q, K, V, 0.3), rtol=1e-12, atol=1e-15)
    assert bt.compression_problem(N * (D + DV), bt.stream_floats(N, D, DV)) == \
        f"does not compress: {N * (D + DV)} floats for {N * (D + DV)}"
    assert bt.compression_problem(N * (D + DV) - 1, bt.stream_floats(N, D, DV)) == ""


def test_zeros_and_the_mean(kvq):
    K, V, q = kvq
    z, m = bt.zeros(K, V, 100), bt.mean(K, V, 100)
    assert np.all(bt.attention(z, q, 0.3) == 0) and bt.log_partition(z, q, 0.3) == -math.inf
    mz, uz = bt.numerator(z, q, 0.3)
    assert mz == -math.inf and np.all(uz == 0)
    np.testing.assert_allclose(bt.attention(m, q, 0.3), V.mean(0), rtol=1e-12)
    mm, um = bt.numerator(m, q, 0.3)          # n e^{<mean k, q> scale} mean v
    np.testing.assert_allclose(np.exp(mm) * um, N * np.exp(K.mean(0) @ q * 0.3) * V.mean(0), rtol=1e-12)
    assert bt.log_partition(m, q, 0.3) == pytest.approx(math.log(N) + K.mean(0) @ q * 0.3)


def test_streaming_llm_keeps_four_sink_tokens_unless_the_method_has_its_own(kvq):
    K, V, _ = kvq
    c = bt.streaming_llm(K, V, 10 * (D + DV))
    np.testing.assert_array_equal(c.keys, np.concatenate([K[:4], K[-6:]]))
    c = bt.streaming_llm(K, V, 10 * (D + DV), sink=7)
    np.testing.assert_array_equal(c.keys, np.concatenate([K[:7], K[-3:]]))


def test_uniform_is_unbiased_and_keeps_the_sink_and_window(kvq):
    K, V, q = kvq
    rng = np.random.default_rng(3)
    c = bt.uniform(K, V, 12 * (D + DV) + 1, rng, sink=2, window=3)
    np.testing.assert_array_equal(c.keys[:2], K[:2])
    np.testing.assert_array_equal(c.keys[-3:], K[-3:])
    assert np.allclose(c.log_w_num[2:-3], math.log(35 / 7))
    # E[(n_mid / k) sum over the sample] = the middle's sum: the numerator's mean over draws
    x = np.exp(K @ q * 0.3)
    want = x @ V
    draws = [bt.uniform(K, V, 12 * (D + DV) + 1, rng, sink=2, window=3) for _ in range(4000)]
    got = np.mean([np.exp(m) * u for m, u in (bt.numerator(c, q, 0.3) for c in draws)], axis=0)
    sd = np.std([np.exp(m) * u for m, u in (bt.numerator(c, q, 0.3) for c in draws)], axis=0) / math.sqrt(4000)
    assert np.all(np.abs(got - want) <= 5 * sd + 1e-12)      # 5 standard errors: a false alarm ~ 1e-6


def test_run_sizes_the_controls_from_the_floats_the_method_holds(kvq):
    K, V, _ = kvq
    H, HV = np.stack([K, K[::-1]]), np.stack([V, V[::-1]])
    def half_budget(K, V, floats, rng, *, sink, window, block_size=64, Q=None):     # a method below its budget
        return bt.streaming_llm(K, V, floats // 2, sink=sink, window=window)
    out = bt.run(half_budget, H, HV, 300, np.random.default_rng(4), sink=2, window=2)
    held = bt.cache_floats(out["method"]) // 2
    assert held <= 150
    assert bt.cache_floats(out["streaming_llm"]) // 2 == held // (D + DV) * (D + DV)
    assert "ablation" not in out
    out = bt.run(half_budget, H, HV, 300, np.random.default_rng(4), sink=2, window=2, ablation=half_budget)
    assert bt.cache_floats(out["ablation"]) // 2 <= held // 2


def test_merge_and_reduce_random_signs_are_the_walk_with_its_balancing_removed():
    """signs="random" draws the walk's own uniforms with p = 1/2: the same cells as the walk at c = 1e300 (where
    p = 1/2 - x/(2c) rounds to 1/2), different from the walk at the paper's c on benign keys."""
    rng = np.random.default_rng(5)
    K = rng.standard_normal((64, 4)) / 2
    V = rng.standard_normal((64, 2))
    def cells(**kw):
        mr = MergeAndReduce(4, 2, t=16, T=2, delta=0.01, rng=np.random.default_rng(6), r_key=2.0, **kw)
        for k, v in zip(K, V):
            mr.update(k, v)
        return mr, [None if k is None else k.tolist() for k, _ in mr.cells()]
    coin, a = cells(signs="random")
    _, b = cells(c=1e300)
    assert a == b
    assert bt.method_floats(coin) == sum(coin.cell_sizes()) * (4 + 2) + sum(1 for s in coin.cell_sizes() if s)
    with pytest.raises(InputError, match="signs"):
        MergeAndReduce(4, 2, t=16, T=2, delta=0.01, rng=rng, signs="greedy")


def test_method_floats_of_the_streaming_algorithms():
    rng = np.random.default_rng(7)
    K = rng.standard_normal((100, 4))
    K /= np.linalg.norm(K, axis=1, keepdims=True)
    V = rng.standard_normal((100, 4))
    b = BalanceKV(4, batch_size=16, levels=2, eps=0.5, r=1.0 + 1e-9, seed=1, n=100, signs="random")
    for k, v in zip(K, V):
        b.update(k, v)
    num = sum(sum(mr.cell_sizes()) * 8 + sum(1 for s in mr.cell_sizes() if s) for mr in b.numerators.values())
    den = sum(b.denominator.cell_sizes()) * 4 + sum(1 for s in b.denominator.cell_sizes() if s)
    assert bt.method_floats(b) == num + den + 1
    fd = FrequentDirections(10, 3).update(rng.standard_normal((20, 10)))
    assert bt.method_floats(fd) == 2 * 3 * 10 + 1                        # the 2l-row buffer it streams with
    assert bt.method_floats(bt.mean(K, V, 0)) == 4 + 4 + 1


def test_sketch_controls():
    rng = np.random.default_rng(8)
    A = rng.standard_normal((30, 5))
    s = bt.sketch_controls(A, 41, rng, ablation=lambda A, floats, rng: A[:2])
    assert s["zeros"].shape == (0, 5) and s["ablation"].shape == (2, 5)
    np.testing.assert_allclose(s["mean"].T @ s["mean"], 30 * np.outer(A.mean(0), A.mean(0)))
    np.testing.assert_array_equal(s["streaming_llm"], np.concatenate([A[:4], A[-4:]]))
    assert s["uniform"].shape == (8, 5)
    full = bt.sketch_controls(A, 150, rng)
    np.testing.assert_array_equal(full["uniform"], A)


def test_bad_input_is_named(kvq):
    K, V, _ = kvq
    with pytest.raises(InputError, match="floats"):
        bt.controls(K, V, -1, np.random.default_rng(0))
    with pytest.raises(InputError, match="unknown control"):
        bt.controls(K, V, 10, np.random.default_rng(0), names=["recent"])
    with pytest.raises(InputError, match="same heads and tokens"):
        bt.uniform(K, V[:-1], 10, np.random.default_rng(0))
    with pytest.raises(InputError, match="numpy Generator"):
        bt.uniform(K, V, 10, 0)
    with pytest.raises(InputError, match="overflow"):
        bt.attention(bt.mean(K * 1e200, V, 0), np.full(D, 1e200), 1.0)


def test_the_documented_example_runs():
    """docs/EXTENDING.md's battery example, run as written."""
    import re
    from pathlib import Path
    doc = (Path(__file__).parents[2] / "docs" / "EXTENDING.md").read_text()
    section = doc.split("## The battery", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "EXTENDING.md (the battery)", "exec"), {})


@pytest.mark.parametrize("method", ["balancekv", "balancekv_released", "subgen", "subspace", "kcenter",
                                    "kcenter_sized"])
def test_each_registered_method_is_run_with_its_ablation_at_its_floats(method):
    """run() with a registered name builds the registry's ablation (kvbounds.battery._ablations) at the floats the
    method's
    cache holds; the ablation holds no more."""
    rng = np.random.default_rng(9)
    K = rng.standard_normal((2, 160, 8)).astype(np.float32)
    V = rng.standard_normal((2, 160, 8)).astype(np.float32)
    out = bt.run(method, K, V, 1200, np.random.default_rng(1), sink=4, window=8)
    held = bt.cache_floats(out["method"])
    assert set(out) == {"method", "zeros", "mean", "streaming_llm", "uniform", "ablation"}
    assert 0 < bt.cache_floats(out["ablation"]) <= held
    q = rng.standard_normal((2, 8))
    assert np.all(np.isfinite(bt.attention(out["ablation"], q)))


# -- Frequent Directions' and the subspace method's fair ablations (kvbounds.battery) ---------------------------
def test_random_projection_sketch_is_the_drawn_projection_and_unbiased():
    """S = G A / sqrt(rows) with G drawn from the generator (the same draw again gives the same S), and E[S^T S] =
    A^T A. Entry (i, j) of S^T S averages rows products with variance (||a_i||^2 ||a_j||^2 + <a_i, a_j>^2) / rows
    (a_i the columns of A); over M sketches its mean is within 6 standard errors of the entry (a bound derived from
    that variance: a fixed seed makes the test deterministic)."""
    A = np.random.default_rng(0).standard_normal((40, 6)) * np.arange(1, 7)
    S = ab.random_projection_sketch(A, 8, np.random.default_rng(1))
    G = np.random.default_rng(1).standard_normal((8, 40))
    np.testing.assert_allclose(S, G @ A / math.sqrt(8), rtol=1e-13, atol=1e-13 * np.abs(A).sum())
    M, rows = 400, 8
    rng = np.random.default_rng(2)
    mean = sum((lambda s: s.T @ s)(ab.random_projection_sketch(A, rows, rng)) for _ in range(M)) / M
    G2 = A.T @ A
    col = np.diag(G2)
    se = np.sqrt((np.outer(col, col) + G2 ** 2) / (rows * M))
    assert np.all(np.abs(mean - G2) <= 6 * se)
    for bad in (dict(A=[[1.0]]), dict(rows=0), dict(A=np.full((3, 2), np.inf))):
        kw = dict(A=A, rows=2, rng=np.random.default_rng(0)) | bad
        with pytest.raises(InputError):
            ab.random_projection_sketch(kw["A"], kw["rows"], kw["rng"])


def test_sketch_basis_spans_the_data_it_was_drawn_from():
    """A rank-3 X: three random combinations of its rows span its row space (almost surely), so X projected on the
    basis is X; the rows are orthonormal, one basis per head."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((2, 50, 3)) @ rng.standard_normal((2, 3, 10))
    B = ab.sketch_basis(X, 3, rng)
    assert B.shape == (2, 3, 10)
    np.testing.assert_allclose(B @ np.swapaxes(B, -1, -2), np.broadcast_to(np.eye(3), (2, 3, 3)), atol=1e-12)
    np.testing.assert_allclose(X @ np.swapaxes(B, -1, -2) @ B, X, atol=1e-10 * np.abs(X).max())
    assert ab.sketch_basis(X, 0, rng).shape == (2, 0, 10)
    with pytest.raises(InputError):
        ab.sketch_basis(X, 11, rng)


def test_the_subspace_method_is_ablated_by_a_sketch_of_its_data():
    """The registry's ablation of the subspace method is subspace_sketch; on keys of rank r it is exact where random
    bases are not, at the same floats."""
    from kvbounds.methods import get_method
    assert get_method("subspace").ablation == "subspace_sketch"
    rng = np.random.default_rng(4)
    K = (rng.standard_normal((1, 200, 2)) @ rng.standard_normal((1, 2, 16))).astype(np.float64)
    V = (rng.standard_normal((1, 200, 2)) @ rng.standard_normal((1, 2, 16))).astype(np.float64)
    floats = 8 * 2 * 16 + 2 * 2 * (192 + 16) + 4
    sk = ab.subspace_sketch(K, V, floats, np.random.default_rng(5), sink=4, window=4)
    blind = ab.subspace_random(K, V, floats, np.random.default_rng(5), sink=4, window=4)
    assert sk.rank == blind.rank == 2 and bt.cache_floats(sk) == bt.cache_floats(blind)
    np.testing.assert_allclose(sk.keys, K, atol=1e-9 * np.abs(K).max())
    assert np.abs(blind.keys - K).max() > 1e-3 * np.abs(K).max()


def test_the_uniform_control_never_holds_more_floats_than_the_method():
    """A method that keeps one token (d + dv floats) left uniform one weighted token: the method's floats + 1. At
    every budget, sink and window the uniform control now holds at most the floats it is given."""
    rng = np.random.default_rng(0)
    K, V = rng.standard_normal((40, 4)), rng.standard_normal((40, 3))
    for sink, window in ((0, 0), (2, 3), (4, 0), (0, 5)):
        for floats in range(0, 40 * 7 + 2):
            c = bt.uniform(K, V, floats, rng, sink=sink, window=window)
            assert bt.cache_floats(c) <= floats, (floats, sink, window, bt.cache_floats(c))
    one = bt.uniform(K, V, 7, rng)                   # one token's floats: the most recent token, no weight
    assert bt.cache_floats(one) == 7 and one.keys.shape[-2] == 1 and np.array_equal(one.keys[0], K[-1])
