"""Independent uniform sampling at equal memory (the BKV.vs-uniform baseline, 001 Sec 4.1)."""
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from kvbounds.algorithms.attention import exact_attention
from kvbounds.algorithms.uniform_sampling import uniform_estimate, uniform_parts, uniform_select
from kvbounds.algorithms.validation import InputError
from kvbounds.algorithms.arrays import asarray, to_numpy


@given(n=st.integers(0, 300), frac=st.floats(0, 1), batch=st.sampled_from([(), (3,), (2, 2)]), seed=st.integers(0, 2**16))
def test_select_shape_sorted_unique(n, frac, batch, seed):
    m = int(frac * n)
    idx = uniform_select(n, m, np.random.default_rng(seed), batch=batch)
    assert idx.shape == batch + (m,) and idx.dtype == np.int64
    assert np.all(np.diff(idx, axis=-1) > 0)
    assert idx.size == 0 or (idx.min() >= 0 and idx.max() < n)


def test_select_is_uniform():
    n, m, R = 12, 4, 6000
    idx = uniform_select(n, m, np.random.default_rng(0), batch=(R,))
    counts = np.bincount(idx.ravel(), minlength=n)
    p = m / n
    # each count ~ Binomial(R, p): 5 sigma
    assert np.all(np.abs(counts - R * p) < 5 * math.sqrt(R * p * (1 - p)))
    # pairs: P(i and j both kept) = m(m-1)/(n(n-1)) (without replacement)
    both = np.mean(np.any(idx == 0, axis=1) & np.any(idx == 1, axis=1))
    assert abs(both - m * (m - 1) / (n * (n - 1))) < 5 * math.sqrt(0.1 * 0.9 / R)


def test_numerator_and_denominator_unbiased():
    rng = np.random.default_rng(1)
    n, d, s, m, R = 40, 4, 3, 10, 20000
    K = rng.standard_normal((n, d))
    V = rng.standard_normal((n, s))
    q = rng.standard_normal(d) * 2
    logits = K @ q / 2.0
    shift = logits.max()
    num_true = np.exp(logits - shift) @ V
    den_true = np.exp(logits - shift).sum()
    idx = uniform_select(n, m, rng, batch=(R,))
    sh, num, den = uniform_parts(np.broadcast_to(q, (R, d)), np.broadcast_to(K, (R, n, d)),
                                 np.broadcast_to(V, (R, n, s)), idx)
    np.testing.assert_allclose(sh, shift)
    se_num = num.std(axis=0) / math.sqrt(R)
    assert np.all(np.abs(num.mean(axis=0) - num_true) < 5 * se_num + 1e-12)
    assert abs(den.mean() - den_true) < 5 * den.std() / math.sqrt(R)


def test_estimate_shapes_and_full_sample_is_exact():
    rng = np.random.default_rng(2)
    K, V = rng.standard_normal((2, 30, 5)), rng.standard_normal((2, 30, 4))
    Q = rng.standard_normal((2, 6, 5))
    assert uniform_estimate(Q, K, V, 7, rng).shape == (2, 6, 4)
    assert uniform_estimate(Q[:, 0], K, V, 7, rng).shape == (2, 4)
    ref = np.stack([exact_attention(Q[h], K[h], V[h]) for h in range(2)])
    np.testing.assert_allclose(uniform_estimate(Q, K, V, 30, rng), ref, rtol=1e-12)
    assert uniform_estimate(Q[0, 0], K[0], V[0], 5, rng).shape == (4,)


def test_estimate_backends_agree(backend):
    rng = np.random.default_rng(3)
    K, V, q = rng.standard_normal((3, 50, 4)), rng.standard_normal((3, 50, 2)), rng.standard_normal((3, 4))
    ref = uniform_estimate(q, K, V, 12, np.random.default_rng(5))
    got = uniform_estimate(asarray(q, backend), asarray(K, backend), asarray(V, backend), 12, np.random.default_rng(5))
    np.testing.assert_allclose(to_numpy(got), ref, rtol=1e-10)


def test_estimate_large_norms_finite():
    rng = np.random.default_rng(4)
    K = rng.standard_normal((200, 64))
    K *= 60 / np.linalg.norm(K, axis=1, keepdims=True)
    out = uniform_estimate(K[0], K, rng.standard_normal((200, 8)), 50, rng)
    assert np.all(np.isfinite(out))


@pytest.mark.parametrize("call", [
    lambda r: uniform_select(5, 6, r),
    lambda r: uniform_select(-1, 0, r),
    lambda r: uniform_select(5, -1, r),
    lambda r: uniform_select(5.0, 2, r),
    lambda r: uniform_select(5, 2, 0),
    lambda r: uniform_select(5, 2, r, batch=(0,)),
    lambda r: uniform_estimate(np.zeros(3), np.zeros((5, 3)), np.zeros((5, 2)), 0, r),
    lambda r: uniform_estimate(np.zeros(3), np.zeros((5, 3)), np.zeros((5, 2)), 6, r),
    lambda r: uniform_estimate(np.zeros(4), np.zeros((5, 3)), np.zeros((5, 2)), 2, r),
    lambda r: uniform_estimate(np.zeros(3), np.zeros((5, 3)), np.zeros((4, 2)), 2, r),
    lambda r: uniform_estimate(np.zeros(3), np.full((5, 3), np.nan), np.zeros((5, 2)), 2, r),
    lambda r: uniform_estimate(np.zeros(3), np.zeros((0, 3)), np.zeros((0, 2)), 1, r),
    lambda r: uniform_parts(np.zeros(3), np.zeros((5, 3)), np.zeros((5, 2)), np.array([0, 5])),
    lambda r: uniform_parts(np.zeros(3), np.zeros((5, 3)), np.zeros((5, 2)), np.array([0.5])),
], ids=["m>n", "n<0", "m<0", "n float", "rng", "batch 0", "m=0", "m>n est", "q dim", "V rows", "NaN", "empty",
        "idx range", "idx float"])
def test_bad_input(call):
    with pytest.raises(InputError):
        call(np.random.default_rng(0))


def test_parts_backends_agree(backend):
    """The unbiased parts (shift, numerator, denominator) on the backend: numpy's within the dtype's tolerance,
    on the inputs' device, for numpy indices and for indices of the backend."""
    from backend_helpers import assert_close, assert_on_device_of
    rng = np.random.default_rng(6)
    K, V, q = rng.standard_normal((2, 40, 4)), rng.standard_normal((2, 40, 3)), rng.standard_normal((2, 5, 4))
    idx = uniform_select(40, 9, np.random.default_rng(1), batch=(2,))
    ref = uniform_parts(q, K, V, idx)
    Kb = asarray(K, backend)
    for ix in (idx, asarray(idx, backend, "int64")):
        got = uniform_parts(asarray(q, backend), Kb, asarray(V, backend), ix)
        for g, r in zip(got, ref):
            assert_on_device_of(g, Kb)
            assert_close(g, r)
