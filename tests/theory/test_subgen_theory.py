"""theory/subgen.py: the exact laws, the t/s formulas, the identities the SG checks lean on."""
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, strategies as st

from kvbounds.theory.subgen import (combination_factor, exact_cluster_slot_distribution, exact_reservoir_distribution,
                           kcenter_radius, matprod_bound, matprod_error_second_moment, matprod_s, matprod_s_proven,
                           memory_shape, partition_bound, partition_t, partition_t_proven, reservoir_probability)


@given(w=st.lists(st.integers(0, 9), min_size=1, max_size=5), s=st.integers(1, 3))
def test_propagated_reservoir_law_is_the_lemma(w, s):
    """SubGen's Lemma 1 symbolically: the pseudocode's law is the product of w_i / sum w over the slots."""
    if sum(w) == 0:
        return
    w = [Fraction(x) for x in w]
    law = exact_reservoir_distribution(w, s)
    p = reservoir_probability(w)
    assert sum(law.values()) == 1
    for combo, pr in law.items():
        assert pr == math.prod(p[i] for i in combo)
    assert reservoir_probability(w, 0) == p[0]


def test_reservoir_probability_needs_mass():
    with pytest.raises(ValueError):
        reservoir_probability([0, 0])


@given(n=st.integers(1, 12))
def test_cluster_slot_law_uniform(n):
    assert exact_cluster_slot_distribution(n) == [Fraction(1, n)] * n


def test_formulas():
    assert partition_bound(0.3) == pytest.approx(0.1)
    assert partition_t(1.0, 0.5, 1.0, 100, C=1) == math.ceil(math.e * math.log(100))
    assert partition_t_proven(1.0, 0.5, 1.0, 4) == math.ceil(27 * math.e * math.log(2 * 4 / 0.005))
    assert matprod_s(0.5, 8, C=2) == 64 and matprod_s_proven(1.0, 2.0) == 3600
    assert matprod_bound(3.0, 2.0, 5.0) == pytest.approx(10.0)
    assert memory_shape(4, 3, 5, 7) == 4 * (15 + 7)


def test_chernoff_constant_is_sufficient():
    """At t = partition_t_proven, the multiplicative Chernoff tail 2 m exp(-t (eps/3)^2 / (3R)) is <= 0.005."""
    for eps, delta, r, m in [(1.0, 0.5, 1.0, 4), (0.5, 0.2, 3.0, 16), (0.1, 1.0, 0.5, 1)]:
        t = partition_t_proven(eps, delta, r, m)
        R = math.exp(2 * delta * r)
        assert 2 * m * math.exp(-t * (eps / 3) ** 2 / (3 * R)) <= 0.005


@given(n=st.integers(1, 6), s=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_matprod_second_moment_identity(n, s, seed):
    """E||z - a^T V||^2 by exhaustive enumeration of the s i.i.d. l2 samples equals the closed form."""
    rng = np.random.default_rng(seed)
    a, V = rng.random(n) + 0.1, rng.standard_normal((n, 2))
    p = np.sum(V**2, 1) / np.sum(V**2)
    exact = 0.0
    for combo in itertools.product(range(n), repeat=s):
        z = sum(a[i] * V[i] / (s * p[i]) for i in combo)
        exact += math.prod(p[i] for i in combo) * np.sum((z - a @ V) ** 2)
    assert matprod_error_second_moment(a, V, p, s) == pytest.approx(exact, rel=1e-9, abs=1e-12)


def test_combination_factor():
    assert combination_factor(1.0) == pytest.approx(1.0)
    assert combination_factor(0.5) < 1 < combination_factor(1.01)
    assert combination_factor(3.0) == math.inf


def test_kcenter_radius_brackets_the_optimum():
    X = np.array([[0.0], [1.0], [10.0], [11.0]])
    out = kcenter_radius(X, 2)
    assert out["opt_lower"] <= 1.0 <= out["opt_upper"]
