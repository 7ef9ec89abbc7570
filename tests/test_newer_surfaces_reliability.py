"""Regression tests of issue 24 (reliability of the newer surfaces): each example of the issue, as found by fuzzing,
with the answer it must now give (the right value, or an InputError naming the argument and the rule)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from kvbounds.algorithms import compressor_adapters as ca
from kvbounds.algorithms import token_selection as ts
from kvbounds.algorithms.validation import InputError

torch = pytest.importorskip("torch")


# -- CompressedKV.estimate ---------------------------------------------------------------------------------------

def _cache(H=1, m=4, d=3, seed=0):
    rng = np.random.default_rng(seed)
    K, V = rng.standard_normal((H, m, d)), rng.standard_normal((H, m, d))
    z = np.zeros((H, m))
    return ts.CompressedKV(K, V, z, z.copy()), K, V


def _softmax(q, K, V, scale):
    l = q @ K.T * scale
    w = np.exp(l - l.max())
    return w @ V / w.sum()


@pytest.mark.parametrize("bad, match", [
    (dict(q=np.array([[[np.nan, 0.0, 1.0]]] * 2)), "q contains NaN"),
    (dict(q=np.ones((2, 1, 3)), scale=math.nan), "scale"),
    (dict(q=np.ones((2, 1, 4))), "last dimension 4, expected 3"),
    (dict(q=np.ones((2, 1, 3), dtype=np.int64)), "real floating"),
    (dict(q=np.ones((5, 1, 3))), "does not broadcast"),
])
def test_estimate_refuses_bad_queries(bad, match):
    c, _, _ = _cache(H=2)
    with pytest.raises(InputError, match=match):
        c.estimate(bad.pop("q"), **bad)


def test_estimate_empty_denominator_is_refused_empty_numerator_is_zero():
    c, K, V = _cache()
    c.log_w_den[:] = -np.inf
    with pytest.raises(InputError, match="denominator has no token"):
        c.estimate(np.ones((1, 1, 3)))
    c, K, V = _cache()
    c.log_w_num[:] = -np.inf                         # nothing in the numerator: the sum over no token is 0
    np.testing.assert_array_equal(c.estimate(np.ones((1, 1, 3))), 0.0)
    c0 = ts.CompressedKV(np.zeros((1, 0, 3)), np.zeros((1, 0, 3)), np.zeros((1, 0)), np.zeros((1, 0)))
    with pytest.raises(InputError, match="denominator has no token"):
        c0.estimate(np.ones((1, 1, 3)))


def test_estimate_log_gap_above_709_is_exact():
    """Numerator logit 800, denominator logit 0, value 1e-100: Attn_hat = e^800 1e-100 ~ 1e247 (finite); the old
    ``num / den * exp(mn - md)`` gave inf. A gap beyond float64's range is refused by name."""
    K = np.array([[[800.0], [0.0]]])
    V = np.array([[[1e-100], [5.0]]])
    a, b = np.array([[0.0, -np.inf]]), np.array([[-np.inf, 0.0]])
    c = ts.CompressedKV(K, V, a, b)
    out = c.estimate(np.ones((1, 1, 1)), scale=1.0)
    assert math.isclose(float(out[0, 0, 0]), math.exp(800 - 100 * math.log(10)), rel_tol=1e-12)
    c.values[0, 0, 0] = 1.0
    with pytest.raises(InputError, match="exceeds float64's range"):
        c.estimate(np.ones((1, 1, 1)), scale=1.0)


def test_estimate_matches_softmax_on_numpy_and_torch():
    c, K, V = _cache(H=2, m=5, d=3)
    q = np.random.default_rng(1).standard_normal((2, 2, 3))
    ref = np.stack([np.stack([_softmax(q[h, j], K[h], V[h], 3 ** -0.5) for j in range(2)]) for h in range(2)])
    np.testing.assert_allclose(c.estimate(q), ref, rtol=1e-12)
    np.testing.assert_allclose(c.estimate(torch.as_tensor(q)), ref, rtol=1e-12)


def test_subgen_compressor_estimate_at_key_norm_1e3_is_finite_or_refused():
    rng = np.random.default_rng(0)
    K, V = rng.standard_normal((1, 40, 4)) * 1e3, rng.standard_normal((1, 40, 4))
    c = ca.SubGenCompressor(sink=1, window=1).compress(K, V, budget_floats=200, rng=np.random.default_rng(1))
    for _ in range(20):
        try:
            assert np.isfinite(c.estimate(rng.standard_normal((1, 3, 4)) * 1e3)).all()
        except InputError as e:
            assert "range" in str(e)


# -- budgets of the subspace and SubGen compressors ----------------------------------------------------------------

@pytest.mark.parametrize("cls", [ca.SubGenCompressor, ca.SubspaceCompressor])
def test_compressors_never_exceed_their_budget(cls):
    """Issue 24: 192 floats held for a budget of 80, 154 for 130. Now: at most the budget per head, or an
    InputError saying how many floats the minimum needs."""
    rng = np.random.default_rng(0)
    fitted = refused = 0
    for H, n, d in ((1, 16, 4), (2, 40, 8), (1, 13, 3)):
        K, V = rng.standard_normal((H, n, d)), rng.standard_normal((H, n, d))
        for budget in range(10, 400, 9):
            try:
                out = cls(sink=1, window=1).compress(K, V, budget_floats=budget, rng=np.random.default_rng(1))
            except InputError as e:
                assert "budget" in str(e)
                refused += 1
                continue
            assert ts.memory_floats(out) <= budget * H, (H, n, d, budget)
            fitted += 1
    assert fitted and refused


def test_subspace_budget_80_is_refused_with_the_minimum():
    K = np.random.default_rng(0).standard_normal((1, 40, 8))
    with pytest.raises(InputError, match="rank 1 needs"):
        ca.SubspaceCompressor(sink=1, window=1).compress(K, K, budget_floats=80)


# -- SubGen(replicas=1).query ----------------------------------------------------------------------------------

@pytest.mark.parametrize("replicas, shape", [(None, (2,)), (1, (1, 2)), (3, (3, 2))])
def test_subgen_query_shape_is_the_same_on_numpy_and_torch(replicas, shape):
    from kvbounds.algorithms.subgen import SubGen
    rng = np.random.default_rng(0)
    K, V, q = rng.standard_normal((6, 3)), rng.standard_normal((6, 2)), rng.standard_normal(3)
    outs = []
    for conv in (np.asarray, torch.as_tensor):
        sg = SubGen(3, delta=0.5, s=2, t=2, seed=0, replicas=replicas)
        for j in range(6):
            sg.update(conv(K[j]), conv(V[j]))
        out = sg.query(conv(q))
        assert tuple(out.shape) == shape
        outs.append(np.asarray(out))
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-12)
