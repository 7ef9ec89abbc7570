"""The self-balancing walk (001 Alg. 3; claim SBW.balance) against its exact law, across backends, on
FAIL and on bad input. The exact law comes from theory/sbw_exact.py (Fractions, all 2^n sign sequences)."""
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from kvbounds.algorithms.self_balancing_walk import (WalkFailed, self_balancing_walk, self_balancing_walk_result,
                                            smaller_side)
from kvbounds.algorithms.validation import InputError
from kvbounds.algorithms.arrays import asarray, to_numpy
from kvbounds.theory.sbw_exact import exact_sign_distribution, walk_branches

F = Fraction


def rational_vectors(seed: int, n: int, d: int, den: int = 7) -> list[list[Fraction]]:
    """n vectors with entries k/den and norm <= 1 (rejection sampling, fixed seed)."""
    g = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        v = [F(int(a), den) for a in g.integers(-den, den + 1, d)]
        if 0 < sum(x * x for x in v) <= 1:
            out.append(v)
    return out


def to_float(U) -> np.ndarray:
    return np.array([[float(x) for x in u] for u in U])


# c = 21/10: inner products <w, u_i> have denominator 49, so |<w,u_i>| = c r^2 (a tie between the exact and
# the float FAIL test) cannot happen, and p_i = 1/2 - <w,u_i>/(2c) is far from 1/2.
C = F(21, 10)


def test_sampled_walk_matches_exact_distribution():
    n, d, reps = 6, 2, 20000
    U = rational_vectors(3, n, d)
    dist, fail = exact_sign_distribution(U, C, F(1))
    assert fail > 0                                   # the FAIL cell is exercised too
    Ub = np.broadcast_to(to_float(U), (reps, n, d))
    res = self_balancing_walk_result(Ub, delta=0.5, rng=np.random.default_rng(2024), r=1.0, c=float(C),
                                     on_fail="continue")
    signs, failed = to_numpy(res.signs).astype(int), np.asarray(res.failed)
    counts = Counter(tuple(s) for s in signs[~failed])
    assert set(counts) <= set(dist), "the walk produced a sign sequence of exact probability 0"
    cells = list(dist)
    obs = np.array([counts[c] for c in cells] + [int(failed.sum())], float)
    exp = np.array([float(dist[c]) for c in cells] + [float(fail)]) * reps
    small = exp < 5                                   # pool sparse cells into one
    if small.any():
        obs, exp = np.append(obs[~small], obs[small].sum()), np.append(exp[~small], exp[small].sum())
    assert stats.chisquare(obs, exp).pvalue > 1e-4
    # power: the same counts are far from independent fair signs (the walk's drift is visible)
    uniform = np.array([counts.get(tuple(s), 0) for s in np.array(np.meshgrid(*[[1, -1]] * n)).reshape(n, -1).T])
    assert stats.chisquare(uniform).pvalue < 1e-10


def test_exact_probabilities_sum_to_one():
    for seed, c in [(0, F(21, 10)), (1, F(1, 2)), (2, F(50))]:
        dist, fail = exact_sign_distribution(rational_vectors(seed, 5, 3), c, F(1))
        assert sum(dist.values()) + fail == 1
        assert all(p > 0 for p in dist.values())
    assert exact_sign_distribution(rational_vectors(1, 6, 2), F(50), F(1))[1] == 0   # c >= n: no FAIL


small_rational = st.fractions(min_value=-2, max_value=2, max_denominator=5)


@given(st.integers(1, 6).flatmap(lambda n: st.integers(1, 3).flatmap(
           lambda d: st.lists(st.lists(small_rational, min_size=d, max_size=d), min_size=n, max_size=n))),
       st.fractions(min_value=F(1, 4), max_value=4, max_denominator=8).filter(lambda c: c > 0))
def test_exact_step_probabilities_are_probabilities(U, c):
    r = F(1)                                         # smallest integer radius >= max ||u_i||
    while max(sum(x * x for x in u) for u in U) > r * r:
        r += 1
    total = F(0)
    for b in walk_branches(U, c, r):
        total += b.prob
        assert all(0 <= p <= 1 for p in b.ps)        # the steps taken before any FAIL
        assert len(b.ps) == (len(U) if b.failed_at is None else b.failed_at)
    assert total == 1
    if c >= len(U):                                  # |<w,u_i>| <= (i-1) r^2 < c r^2
        assert all(b.failed_at is None for b in walk_branches(U, c, r))


def test_backends_agree_and_batched_shapes(backend):
    U = np.random.default_rng(7).standard_normal((3, 10, 4))
    U /= np.linalg.norm(U, axis=-1).max()
    kw = dict(delta=0.1, r=1.0, c=3.0, on_fail="continue")
    ref = self_balancing_walk_result(U, rng=np.random.default_rng(11), **kw)
    got = self_balancing_walk_result(asarray(U, backend), rng=np.random.default_rng(11), **kw)
    assert to_numpy(got.signs).shape == (3, 10) and got.failed.shape == (3,) and got.fail_index.shape == (3,)
    np.testing.assert_array_equal(to_numpy(got.signs), to_numpy(ref.signs))
    np.testing.assert_array_equal(got.failed, ref.failed)
    single = self_balancing_walk(asarray(U[0], backend), delta=0.1, rng=np.random.default_rng(11), r=1.0, c=50.0)
    assert to_numpy(single).shape == (10,) and set(np.unique(to_numpy(single))) <= {-1.0, 1.0}


def test_fail_event_raises_and_is_flagged():
    # identical vectors and c < 1: after step 0, |<w, u_1>| = r^2 > c r^2 whatever the first sign
    U = np.tile([[0.6, 0.8]], (5, 1))
    assert exact_sign_distribution([[F(3, 5), F(4, 5)]] * 5, F(1, 2), F(1))[1] == 1
    with pytest.raises(WalkFailed) as e:
        self_balancing_walk(U, delta=0.5, rng=np.random.default_rng(0), r=1.0, c=0.5)
    assert e.value.index == 1
    with pytest.raises(WalkFailed):
        self_balancing_walk_result(U, delta=0.5, rng=np.random.default_rng(0), r=1.0, c=0.5)   # default "raise"
    res = self_balancing_walk_result(np.broadcast_to(U, (4, 5, 2)), delta=0.5, rng=np.random.default_rng(0),
                                     r=1.0, c=0.5, on_fail="continue")
    assert res.failed.all() and (res.fail_index == 1).all() and (res.max_abs_inner > 1).all()


def test_walk_failed_reports_inner_product_and_threshold():
    U = np.tile([[2.0, 0.0]], (3, 1))                 # <w, u_1> = +-4, c r^2 = 0.5 * 4 = 2
    with pytest.raises(WalkFailed) as e:
        self_balancing_walk(U, delta=0.5, rng=np.random.default_rng(0), r=2.0, c=0.5)
    assert (abs(e.value.inner), e.value.threshold) == (4.0, 2.0)


@pytest.mark.parametrize("U, kw, match", [
    (np.array([[np.nan, 0.0], [0.1, 0.2]]), {}, "NaN or Inf"),
    (np.array([[np.inf, 0.0]]), {}, "NaN or Inf"),
    (np.ones(3), {}, "dimension"),
    (np.ones((3, 2), dtype=np.int64), {}, "floating dtype"),
    (np.ones((0, 2)), {}, "0 rows"),
    (np.ones((3, 2)), {"r": 1.0}, "below the largest vector norm"),
    (np.ones((3, 2)), {"delta": 0.0}, "delta must be in"),
    (np.ones((3, 2)), {"delta": 1.0}, "delta must be in"),
    (np.ones((3, 2)), {"delta": -0.5}, "delta must be in"),
])
def test_bad_inputs(U, kw, match):
    args = {"delta": 0.1, "rng": np.random.default_rng(0), **kw}
    with pytest.raises(InputError, match=match):
        self_balancing_walk(U, **args)


@given(st.lists(st.sampled_from([1.0, -1.0]), min_size=1, max_size=40))
def test_smaller_side_is_at_most_half(signs):
    s = np.array(signs)
    mask = smaller_side(s)
    assert 2 * mask.sum() <= len(s)
    assert np.array_equal(mask, s > 0) or np.array_equal(mask, s < 0)   # one whole side of the split


def test_gram_walk_and_smaller_side_agree_with_numpy(backend):
    """gram_walk on the backend (the batched array path) against numpy's (the scalar fast path for one (n, n)
    Gram, the array path for a batch): the same signs, FAIL flags and first failing step from the same uniforms."""
    from backend_helpers import assert_close, assert_equal, assert_on_device_of
    from kvbounds.algorithms.self_balancing_walk import gram_walk
    X = np.random.default_rng(4).standard_normal((2, 24, 5))
    G = X @ np.swapaxes(X, -1, -2)
    G /= np.abs(G).max()
    u = np.random.default_rng(5).random((2, 24))
    for Gx, ux in ((G, u), (G[0], u[0])):
        ref = gram_walk(Gx, ux, 1.5, on_fail="continue")
        got = gram_walk(asarray(Gx, backend), asarray(ux, backend), 1.5, on_fail="continue")
        assert_on_device_of(got.signs, asarray(Gx, backend))
        assert_equal(got.signs, ref.signs)
        np.testing.assert_array_equal(got.failed, ref.failed)
        np.testing.assert_array_equal(got.fail_index, ref.fail_index)
        assert_close(got.max_abs_inner, ref.max_abs_inner)
        mask = smaller_side(got.signs)
        assert_on_device_of(mask, asarray(Gx, backend))
        assert_equal(mask, smaller_side(ref.signs))
