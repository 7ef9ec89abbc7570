"""The walk's discrepancy as held-out queries see it (kvbounds.algorithms.query_discrepancy): random signs'
expectation exactly (every signing of a small block), cases by hand, the centring identity, the GQA stacking of the
held-out queries, and its place in the walk diagnostics."""
import itertools
import math

import numpy as np
import pytest

from kvbounds.algorithms import walk_diagnostics as wd
from kvbounds.algorithms.query_discrepancy import held_out_queries, query_discrepancy, query_terms
from kvbounds.algorithms.validation import InputError

EPS = np.finfo(np.float64).eps


def _block(seed, n=6, d=4, dv=3, m=5, lead=()):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(lead + (n, d)), rng.standard_normal(lead + (n, dv)),
            rng.standard_normal(lead + (m, d)), rng)


def test_random_signs_expectation_is_one_exactly():
    """Averaged over all 2^n signings (the law of independent random signs), both ratios are 1 for every query: the
    cross terms cancel in pairs. Each ratio is a sum of n^2 terms of size <= 1 in units of its expectation, and the
    average of 64 of them is taken: within 64 n^2 eps."""
    K, V, Q, _ = _block(0)
    n = K.shape[0]
    signs = np.array(list(itertools.product((-1.0, 1.0), repeat=n)))             # (64, n)
    out = query_discrepancy(signs, K[None], V[None], Q[None], weights=np.full((1, n), 0.7))
    for key in ("query_num", "query_den"):
        assert out[key].shape == (2 ** n,)
        assert abs(out[key].mean() - 1.0) <= 64 * n * n * EPS


def test_cases_by_hand():
    """Two equal keys and values: opposite signs cancel exactly (0), equal signs double the sum (ratio 2)."""
    K = np.array([[0.3, -1.0], [0.3, -1.0]])
    V = np.array([[1.0, 2.0], [1.0, 2.0]])
    Q = np.array([[2.0, 0.5], [-1.0, 4.0]])
    cancel = query_discrepancy(np.array([1.0, -1.0]), K, V, Q)
    assert cancel == dict(query_num=0.0, query_den=0.0)
    same = query_discrepancy(np.array([1.0, 1.0]), K, V, Q)
    assert same["query_num"] == pytest.approx(2.0, rel=8 * EPS) and same["query_den"] == pytest.approx(2.0, rel=8 * EPS)
    # one dominant token per query: a signing cannot change what that query sees (ratio 1 up to e^-100)
    Kd = np.array([[10.0, 0.0], [0.0, 10.0]])
    Qd = np.array([[20.0, 0.0]])
    assert query_discrepancy(np.array([1.0, 1.0]), Kd, np.ones((2, 1)), Qd)["query_num"] == pytest.approx(1.0)
    # values all zero: no query has a numerator to weigh (ratio 1 by convention), the denominator still counts
    zero = query_discrepancy(np.array([1.0, -1.0]), K, np.zeros((2, 2)), Q)
    assert zero == dict(query_num=1.0, query_den=0.0)


def test_centring_the_keys_leaves_the_ratios_unchanged():
    """k -> k - mu multiplies every term of query q by e^{-<mu, q> scale}: each query's ratio is the same."""
    K, V, Q, rng = _block(1, n=16, d=8, dv=4, m=7)
    s = np.where(rng.random(16) < 0.5, 1.0, -1.0)
    a = query_discrepancy(s, K, V, Q)
    b = query_discrepancy(s, K - K.mean(0) + 3.0, V, Q)
    for key in a:
        assert b[key] == pytest.approx(a[key], rel=1e-12)


def test_terms_and_broadcasting():
    """Every block of a head meets that head's queries: K (heads, blocks, n, d) against Q (heads, 1, m, d)."""
    K, V, _, rng = _block(2, lead=(2, 3))
    Q = rng.standard_normal((2, 1, 5, 4))
    s = np.where(rng.random((2, 3, 6)) < 0.5, 1.0, -1.0)
    out = query_discrepancy(s, K, V, Q)
    assert out["query_num"].shape == (2, 3)
    one = query_discrepancy(s[1, 2], K[1, 2], V[1, 2], Q[1, 0])
    assert out["query_num"][1, 2] == pytest.approx(one["query_num"], rel=1e-14)
    A = query_terms(K[0, 0], Q[0, 0])
    assert A.shape == (5, 6) and np.allclose(A.max(axis=-1), 1.0)


def test_held_out_queries_stack_each_kv_heads_group():
    Q = np.arange(6 * 10 * 2, dtype=float).reshape(6, 10, 2)          # 6 query heads, 3 per KV head
    H = held_out_queries(Q, 3, 4)
    assert H.shape == (2, 12, 2)
    assert np.array_equal(H[1, 4:8], Q[4, 6:])                           # KV head 1's second query head, last 4
    for bad in (dict(group=4, window=2), dict(group=3, window=0), dict(group=3, window=11), dict(group=True, window=2)):
        with pytest.raises(InputError):
            held_out_queries(Q, **bad)


@pytest.mark.parametrize("bad", [dict(signs=np.array([1.0, 0.0, 1.0])), dict(signs=np.ones(4)),
                                 dict(Q=np.ones((2, 5))), dict(weights=-np.ones(3)), dict(V=np.ones((4, 2))),
                                 dict(K=np.full((3, 2), 1e308))])
def test_refuses_bad_input(bad):
    kw = dict(signs=np.ones(3), K=np.ones((3, 2)), V=np.ones((3, 2)), Q=np.ones((2, 2)))
    kw.update(bad)
    with pytest.raises(InputError):
        query_discrepancy(kw.pop("signs"), kw.pop("K"), kw.pop("V"), kw.pop("Q"), **kw)


def test_block_diagnostics_report_each_rules_query_side():
    """Given held-out queries, every rule's numbers; a rule whose signs are random signs' reads random signs' numbers
    (the walk at the theorem's c on these blocks), and the summary carries the means."""
    rng = np.random.default_rng(3)
    K = rng.standard_normal((3, 32, 8)) * 3.0
    V = rng.standard_normal((3, 32, 4))
    Q = rng.standard_normal((3, 9, 8)) * 3.0
    out = wd.block_diagnostics(K, V, rng=rng, Q=Q)
    for rule in wd.RULES:
        assert out[f"{rule}_query_num"].shape == (3,) and out[f"{rule}_query_den"].shape == (3,)
    same = out["theorem_equal_random"] == 1.0
    assert same.any()
    assert np.array_equal(out["theorem_query_num"][same], out["random_query_num"][same])
    summary = wd.summarize_diagnostics(out)
    assert summary["greedy_query_num"]["mean"] == pytest.approx(float(out["greedy_query_num"].mean()))
    assert "greedy_query_num" not in wd.summarize_diagnostics(wd.block_diagnostics(K, V, rng=rng))
    cause = wd.blockwise_walk_cause(K, V, block_size=8, rng=rng, kernels=("released-t1",), Q=Q)
    assert cause["released-t1"]["centred"]["released_query_num"]["mean"] > 0
    with pytest.raises(InputError):
        wd.blockwise_walk_cause(K, V, block_size=8, rng=rng, Q=Q[:2])
    assert math.isfinite(cause["released-t1"]["raw"]["released_query_den"]["mean"])
