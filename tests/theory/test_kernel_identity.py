"""SBW.kernel-identity (001 A.2, proof of Thm 3.3): theory/kernel_identity.py, its check module's smoke
profile, and the exact walk law of theory/sbw_exact.py (001 Alg. 3)."""
import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import sympy as sp

from kvbounds.claims import get_claim
from kvbounds.proofs_checks import sbw_kernel_identity as check
from kvbounds.theory.kernel_identity import (exact_tensor_power, exact_truncated_inner, exp_taylor,
                                    feature_dim, symbolic_residuals, tensor_power_inner, terms_needed,
                                    truncated_feature_map, truncated_inner_is_taylor, truncation_tail_bound)
from kvbounds.theory.sbw_exact import exact_sign_distribution, sign_probability, walk_branches

F = Fraction


# ---- the feature map --------------------------------------------------------------------------------

def test_truncated_feature_map_shape_and_identity():
    g = np.random.default_rng(0)
    k, q = g.standard_normal(3) * 0.7, g.standard_normal(3) * 0.7
    assert truncated_feature_map(k, 0).tolist() == [1.0]
    pk = truncated_feature_map(k, 9)
    assert pk.shape == (feature_dim(3, 9),) == (sum(3**i for i in range(10)),)
    x = k @ q / math.sqrt(3)
    assert pk @ truncated_feature_map(q, 9) == pytest.approx(math.exp(x), rel=1e-7)
    assert pk @ pk == pytest.approx(math.exp(k @ k / math.sqrt(3)), rel=1e-6)     # ||phi(k)||^2
    # degree-1 block is k / d^{1/4}
    np.testing.assert_allclose(pk[1:4], k / 3**0.25)


def test_truncated_feature_map_rejects_huge_and_bad_input():
    with pytest.raises(ValueError, match="entries"):
        truncated_feature_map(np.ones(10), 7)                 # 11 million entries
    with pytest.raises(ValueError, match="vector"):
        truncated_feature_map(np.ones((2, 2)), 2)
    with pytest.raises(ValueError):
        truncated_feature_map(np.ones(2), -1)


def test_exact_tensor_powers():
    k, q = [F(1, 2), F(-2, 3), F(3)], [F(5, 7), F(1, 4), F(-1, 6)]
    dot = sum(a * b for a, b in zip(k, q))
    for i in range(5):
        assert len(exact_tensor_power(k, i)) == 3**i
        assert tensor_power_inner(k, q, i) == dot**i


def test_exact_truncated_inner_is_taylor_polynomial():
    k, q = [F(1, 2), F(-2, 3)], [F(3, 4), F(1, 5)]
    x = sp.Rational(3, 8) - sp.Rational(2, 15)       # <k,q> = 3/8 - 2/15
    expected = sum((x / sp.sqrt(2))**i / sp.factorial(i) for i in range(6))
    assert sp.expand(exact_truncated_inner(k, q, 5) - expected) == 0
    assert truncated_inner_is_taylor(k, q, 5) and truncated_inner_is_taylor(k, k, 7)
    # power: degree m against degree m - 1 differs
    assert sp.expand(exact_truncated_inner(k, q, 5) - exp_taylor(x / sp.sqrt(2), 4)) != 0
    # the exact value agrees with the float map
    fk, fq = np.array([float(a) for a in k]), np.array([float(a) for a in q])
    assert float(exact_truncated_inner(k, q, 5)) == pytest.approx(truncated_feature_map(fk, 5) @ truncated_feature_map(fq, 5))


def test_symbolic_residuals_vanish():
    res = symbolic_residuals(2, 3)
    assert set(res) >= {"series", "norm", "tensor i=3"}
    assert all(r == 0 for r in res.values()), res


# ---- truncation tail --------------------------------------------------------------------------------

@pytest.mark.parametrize("m", [0, 1, 2, 5, 10])
def test_tail_bound_holds_exactly_computed(m):
    with mpmath.workdps(60):                         # the remainder to 60 digits, not in float64
        for x in [-6.0, -1.5, -0.3, 0.0, 0.2, 1.0, 3.5]:
            partial = sum(mpmath.mpf(x)**i / mpmath.factorial(i) for i in range(m + 1))
            assert abs(mpmath.exp(x) - partial) <= truncation_tail_bound(x, m) * (1 + 1e-12)
    assert truncation_tail_bound(0.0, m) == 0.0


def test_tail_bound_array_and_tightness():
    xs = np.array([-1.0, 0.0, 0.5])
    b = truncation_tail_bound(xs, 3)
    assert b.shape == (3,) and b[1] == 0
    assert b[0] == pytest.approx(1 / 24) and b[2] == pytest.approx(0.5**4 / 24 * math.exp(0.5))
    # Lagrange is nearly tight for small x
    assert abs(math.exp(1e-2) - (1 + 1e-2)) / truncation_tail_bound(1e-2, 1) > 0.99
    with pytest.raises(ValueError):
        truncation_tail_bound(1.0, -1)


def test_terms_needed():
    for x_max, tol in [(0.5, 1e-6), (2.0, 1e-10), (6.0, 1e-3)]:
        m = terms_needed(x_max, tol)
        assert truncation_tail_bound(x_max, m) <= tol
        assert m == 0 or truncation_tail_bound(x_max, m - 1) > tol
        assert truncation_tail_bound(-x_max, m) <= tol
    assert terms_needed(0.0, 1e-12) == 0
    with pytest.raises(ValueError):
        terms_needed(1.0, 0.0)


# ---- the check module -------------------------------------------------------------------------------

def test_registry_points_here():
    claim = get_claim("SBW.kernel-identity")
    assert claim.check_module() is check and claim.bound_function() is truncation_tail_bound


def test_check_smoke_profile():
    records = []
    for i, params in enumerate(check.trials("smoke")):
        out = check.run_trial(params, 1000 + i, "numpy")
        records += out if isinstance(out, list) else [out]
    assert {r.check for r in records} == {"tensor-power exact", "symbolic", "truncation", check.CONTROL}
    for r in records:
        assert r.holds is (not r.control), (r.check, r.params, r.measured, r.bound)
    v = check.summarize(records)
    assert v.status.startswith("holds") and v.figures and v.figures[0].x == "m"


# ---- exact walk law (001 Alg. 3) -------------------------------------------------------------------

def test_exact_walk_by_hand():
    assert exact_sign_distribution([[F(1)]], F(2), F(1)) == ({(1,): F(1, 2), (-1,): F(1, 2)}, 0)
    # two equal unit vectors, c = 2: after eps_0, <w,u_1> = eps_0, p_1 = 1/2 - eps_0/4
    dist, fail = exact_sign_distribution([[F(1), F(0)]] * 2, F(2), F(1))
    assert fail == 0 and dist == {(1, 1): F(1, 8), (1, -1): F(3, 8), (-1, 1): F(3, 8), (-1, -1): F(1, 8)}
    assert sign_probability(F(1), F(2), F(1)) == F(1, 4)


def test_exact_walk_fail_and_boundary():
    # c = 1: |<w,u_1>| = 1 = c r^2 is not FAIL (strict >) and forces p_1 in {0, 1}; then |<w,u_2>| = 0
    dist, fail = exact_sign_distribution([[F(1)]] * 3, F(1), F(1))
    assert fail == 0 and dist == {(1, -1, 1): F(1, 4), (1, -1, -1): F(1, 4), (-1, 1, 1): F(1, 4), (-1, 1, -1): F(1, 4)}
    # c = 1/2: every walk fails at step 1
    branches = list(walk_branches([[F(1)]] * 3, F(1, 2), F(1)))
    assert [b.failed_at for b in branches] == [1, 1] and sum(b.prob for b in branches) == 1
    assert exact_sign_distribution([[F(1)]] * 3, F(1, 2), F(1)) == ({}, 1)


def test_exact_walk_bad_input():
    with pytest.raises(ValueError, match="below the largest"):
        exact_sign_distribution([[F(1), F(1)]], F(1), F(1))
    with pytest.raises(ValueError, match="empty"):
        exact_sign_distribution([], F(1), F(1))
    with pytest.raises(ValueError, match="same length"):
        exact_sign_distribution([[F(0)], [F(0), F(0)]], F(1), F(1))
    with pytest.raises(ValueError, match="> 0"):
        exact_sign_distribution([[F(0)]], F(0), F(1))
