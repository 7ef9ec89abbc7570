"""kvbounds.theory.lower_bound: the shape of Thm 3.2, Lemma C.3 exactly, the proof's constants (claim LB.index, 001 App. C)."""
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, strategies as st

from kvbounds.algorithms.validation import InputError
from kvbounds.theory import lower_bound as lb


def test_space_lower_bound_shape_and_errors():
    assert lb.space_lower_bound(0.1, 16, 4.0) == pytest.approx(100.0)                 # 1/eps^2 < d e^{2a}
    assert lb.space_lower_bound(1e-6, 16, 1.0) == pytest.approx(16 * math.exp(0.5))  # d e^{2 r^2/sqrt d}
    assert lb.space_lower_bound(0, 4, 2.0) == pytest.approx(4 * math.exp(4))         # exact attention
    with pytest.raises(InputError, match="r\\^2"):
        lb.space_lower_bound(0.1, 4, 2.5)
    for bad in (-0.1, math.nan, math.inf):
        with pytest.raises(InputError, match="eps"):
            lb.space_lower_bound(bad, 4, 1.0)
    with pytest.raises(InputError, match="d must"):
        lb.space_lower_bound(0.1, 0, 1.0)
    with pytest.raises(InputError, match="multiple of d"):
        lb.check_length(10, 4)


@pytest.mark.parametrize("d", range(1, 6))
def test_lemma_c3_exact_identity(d):
    res = lb.lemma_c3_residuals(d)
    assert res == {"one coordinate": 0, "enumeration": 0}


def test_lemma_c3_control_is_caught():
    assert lb.lemma_c3_residuals(3, variant="wrong-power")["enumeration"] != 0
    with pytest.raises(InputError):
        lb.lemma_c3_formula(3, variant="other")


@pytest.mark.parametrize("d", range(1, 7))
def test_enumeration_counts(d):
    counts = lb.sign_product_counts(d)
    assert sum(counts.values()) == 4**d
    for s, c in counts.items():       # s = d - 2 (number of disagreeing coordinates): 2^d C(d, k) pairs
        assert c == 2**d * math.comb(d, (d - s) // 2)


@given(C=st.floats(0.1, 5), d=st.integers(1, 5), frac=st.floats(0.05, 1.0))
def test_lemma_c3_expectation_matches_brute_force(C, d, frac):
    r = math.sqrt(frac * d)
    signs = np.array(list(itertools.product((-1.0, 1.0), repeat=d)))
    X = signs * r / math.sqrt(d)
    brute = np.exp(C * (X @ X.T) / math.sqrt(d)).mean()
    assert brute == pytest.approx(lb.lemma_c3_expectation(C, d, r), rel=1e-12)


def test_step2_threshold_certified_and_matches_the_chain():
    lo, hi = lb.lemma_c3_step2_threshold()
    assert 3.11 < lo < hi < 3.112
    assert lb.lemma_c3_steps(4, 1, 1) == ["holds", "fails", "holds", "holds"]      # A = 4 > A*
    assert lb.lemma_c3_steps(3, 1, 1)[1] == "holds"                                # A = 3 < A*
    assert lb.lemma_c3_statement(4, 1, 1) == "holds"                               # the Theta(1) conclusion survives
    assert lb.lemma_c3_steps(2, 16, 16) == ["holds"] * 4                           # C = 2, as in Lemma C.4


@given(C=st.fractions(Fraction(1, 8), 8, max_denominator=8), d=st.integers(1, 64),
       frac=st.fractions(Fraction(1, 16), 1, max_denominator=16))
def test_chain_steps_1_3_4_always_hold(C, d, frac):
    steps = lb.lemma_c3_steps(C, d, frac * d)
    assert steps[0] == steps[2] == steps[3] == "holds"
    A = float(C * frac * d) / d**1.5
    if A < 3.1:
        assert steps[1] == "holds"
    elif A > 3.12:
        assert steps[1] == "fails"


def test_symbolic_facts_for_steps_2_3():
    s = lb.lemma_c3_log_bounds_symbolic()
    assert s["g(0)"] == 0 and s["g'(0)"] == 0 and s["g'' - tanh^2"] == 0
    A = sp.symbols("A", positive=True)
    assert sp.simplify(s["h'"] - (sp.tanh(A) - A / 2)) == 0


def test_group_ones_probability_exact():
    for d in range(1, 9):
        brute = Fraction(sum(sum(x) >= 0.4 * d for x in itertools.product((0, 1), repeat=d)), 2**d)
        assert lb.group_ones_probability(d) == brute
        given1 = Fraction(sum(1 + sum(x) >= 0.4 * d for x in itertools.product((0, 1), repeat=d - 1)), 2 ** (d - 1))
        assert lb.group_ones_probability(d, given_bit_one=True) == given1
    assert lb.group_ones_probability(4) == Fraction(11, 16)
    assert lb.smallest_d_group_ones() == 44
    assert lb.group_ones_probability(43) < Fraction(9, 10) <= lb.group_ones_probability(44)


def test_conclusion_ranges():
    d, r = 16, 2.0
    ea = math.exp(lb.exponent(d, r))
    lo, hi = lb.denominator_range(d, int(d * ea) + 1, d, r)       # |U^i| = d, |U| > d e^a
    clo, chi = lb.denominator_container(int(d * ea) + 1, d, r)
    assert hi > chi                                                # the stated containment fails ...
    assert hi <= 21 / 20 * chi                                     # ... by at most a factor 21/20
    nlo, _ = lb.numerator_range(8, 100, d, r)
    slo, _ = lb.numerator_range_squared(8, 100, d, r)
    assert nlo == pytest.approx(math.sqrt(8) * ea**2 + 20) and slo == pytest.approx(8 * ea**2 + 20)


def test_bob_threshold_and_constants():
    d, r = 16, 4.0
    ea = math.exp(4.0)
    assert lb.bob_threshold(d, r, 10) == pytest.approx(ea / 40 / (d * ea))
    assert lb.bob_threshold(d, r, 10**6) == pytest.approx(ea / 40 / 1e6)
    assert lb.lemma_c4_chebyshev(5, 100, lb.lemma_c4_lambda_for_stated()) == pytest.approx(lb.lemma_c4_stated_failure(5, 100))
    assert lb.lemma_c6_noise_constant() == pytest.approx(math.sqrt(1e7 * math.exp(4)))
    assert lb.proof_constant_case1() == pytest.approx((2000 * 10000 * math.sqrt(20) * 5) ** 2)


@given(p=st.floats(0.001, 0.5))
def test_inverse_binary_entropy(p):
    assert lb.inverse_binary_entropy(lb.binary_entropy(p)) == pytest.approx(p, abs=1e-9)


def test_fano_ceiling():
    assert lb.fano_success_ceiling(0, 100) == pytest.approx(0.5)
    assert lb.fano_success_ceiling(100, 100) == 1.0
    vals = [lb.fano_success_ceiling(b, 1000) for b in (0, 10, 100, 500, 900)]
    assert all(x < y for x, y in zip(vals, vals[1:]))
    # success 0.8 needs at least (1 - H(0.2)) n bits
    assert lb.fano_success_ceiling((1 - lb.binary_entropy(0.2)) * 1000, 1000) == pytest.approx(0.8, abs=1e-6)
