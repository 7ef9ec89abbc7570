"""The bounds of theory/subspace.py and theory/frequent_directions.py (seed 004 Sec. 8): each stated inequality on
random instances, the equality cases that show tightness, the counterexamples that break the stated versions, and
the symbolic identities."""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvbounds.algorithms.frequent_directions import FrequentDirections
from kvbounds.algorithms.subspace_attention import top_basis
from kvbounds.algorithms.validation import InputError
from kvbounds.theory.frequent_directions import (davis_kahan_eta, draft_counterexample, measured_eta, residual,
                                        residual_adversarial_stream, residual_bound, residual_bound_tight,
                                        residual_certificate, residual_lower_bound, top_right_projector)
from kvbounds.theory.subspace import (blockwise_softmax_identity, cost_model, energy_at_rank, logit_error_bound,
                             logit_error_bound_corrected, logit_error_counterexample, logit_error_exact_bound,
                             output_error_bound, softmax_sensitivity_bound, softmax_sensitivity_extremal,
                             softmax_sensitivity_symbolic)


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


# -- SUB.softmax-sensitivity -------------------------------------------------------------------------------

@given(st.integers(2, 50), st.floats(1e-4, 40), st.floats(0.01, 100), st.integers(0, 10**6))
def test_softmax_sensitivity_holds(n, t, scale, seed):
    rng = np.random.default_rng(seed)
    l = rng.standard_normal(n) * scale
    delta = rng.uniform(-1, 1, n)
    delta *= t / np.abs(delta).max()
    l1 = np.abs(softmax(l) - softmax(l + delta)).sum()
    assert l1 <= softmax_sensitivity_bound(t) * (1 + 1e-12) + 1e-15
    assert softmax_sensitivity_bound(t) <= t + 1e-15


@given(st.floats(1e-3, 30), st.integers(2, 20))
def test_softmax_sensitivity_equality_case(t, n):
    l, lh = softmax_sensitivity_extremal(t, n)
    assert np.abs(lh - l).max() == pytest.approx(t)
    assert np.abs(softmax(l) - softmax(lh)).sum() == pytest.approx(softmax_sensitivity_bound(t), rel=1e-9)


def test_softmax_sensitivity_symbolic():
    res = softmax_sensitivity_symbolic()
    assert res["verified"] and str(res["max"]) == "tanh(t/2)"


# -- SUB.logit-error / SUB.output-error --------------------------------------------------------------------

def test_logit_counterexample_breaks_the_draft_bound():
    c = logit_error_counterexample()
    assert c["bound"] == 0.0 and c["error"] == pytest.approx((1 - math.sqrt(0.5)) / math.sqrt(2))
    lhat = c["gamma"] * c["q"] @ c["P"] @ c["K"][0] / math.sqrt(2)
    assert abs(c["q"] @ c["K"][0] / math.sqrt(2) - lhat) == pytest.approx(c["error"])


@given(st.integers(1, 7), st.floats(0.05, 3.0), st.integers(0, 10**6))
def test_corrected_logit_bound_holds_and_draft_holds_at_gamma_1(r, gamma, seed):
    d = 8
    rng = np.random.default_rng(seed)
    K, q = rng.standard_normal((30, d)), rng.standard_normal(d)
    B = top_basis(rng.standard_normal((r + 2, d)), r)
    P = B.T @ B
    err = np.abs(K @ q - gamma * K @ P @ q).max() / math.sqrt(d)
    qn, dK, KP = np.linalg.norm(q), np.linalg.norm(K - K @ P, 2), np.linalg.norm(K @ P, 2)
    tight = logit_error_exact_bound(qn, K, P, d, gamma)
    assert err <= tight * (1 + 1e-12) <= logit_error_bound_corrected(qn, dK, KP, d, gamma) * (1 + 1e-12) + 1e-15
    err1 = np.abs(K @ q - K @ P @ q).max() / math.sqrt(d)
    assert err1 <= logit_error_bound(qn, dK, d, 1.0) * (1 + 1e-12)
    # the tight form is attained by q along the worst (I - gamma P) k_i
    R = K - gamma * K @ P
    i = int(np.argmax(np.linalg.norm(R, axis=1)))
    qa = R[i] / np.linalg.norm(R[i])
    assert np.abs(K @ qa - gamma * K @ P @ qa).max() / math.sqrt(d) == pytest.approx(
        logit_error_exact_bound(1.0, K, P, d, gamma), rel=1e-9)


@given(st.integers(1, 7), st.floats(0.05, 3.0), st.integers(0, 10**6))
def test_output_bound_with_the_measured_logit_error(r_v, gamma, seed):
    d, n = 8, 25
    rng = np.random.default_rng(seed)
    K, V, q = rng.standard_normal((n, d)), rng.standard_normal((n, d)) * 3, rng.standard_normal(d) * 2
    B, E = top_basis(rng.standard_normal((4, d)), 3), top_basis(rng.standard_normal((r_v + 1, d)), r_v)
    P, Pe = B.T @ B, E.T @ E
    l, lh = K @ q / math.sqrt(d), gamma * K @ P @ q / math.sqrt(d)
    o, oh = softmax(l) @ V, softmax(lh) @ V @ Pe
    bound = output_error_bound(np.abs(l - lh).max(), np.linalg.norm(V, axis=1).max(), np.linalg.norm(V - V @ Pe, 2))
    assert np.linalg.norm(o - oh) <= bound * (1 + 1e-12)


# -- SUB.blockwise, SUB.cost, energy ----------------------------------------------------------------------

@pytest.mark.parametrize("sizes", [(1,), (2, 1), (0, 1, 2)])
def test_blockwise_identity_symbolic(sizes):
    res = blockwise_softmax_identity(sizes)
    assert res["verified"], res


@given(st.integers(1, 64), st.sampled_from([32, 64, 128]), st.integers(1, 32), st.integers(1, 32))
def test_cost_model_ratios(J, d, r, r_v):
    T = J * 512
    m = cost_model(T, d, r, r_v, J=J)
    assert m["ours_flops"] == 2 * T * (r + r_v) + 2 * J * (r + r_v) * d + J * r + 4 * T + d
    assert m["flops_ratio"] >= m["leading_ratio"] * (4 * T * d) / m["baseline_flops"]
    big = cost_model(10**12, d, r, r_v, J=1)
    assert big["flops_ratio"] == pytest.approx((2 * (r + r_v) + 4) / (4 * d + 5), rel=1e-6)
    assert big["bytes_ratio"] == pytest.approx((r + r_v) / (2 * d), rel=1e-6)


@given(st.integers(1, 8), st.integers(0, 10**6))
def test_energy_at_rank(rank, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((40, rank)) @ rng.standard_normal((rank, 8))
    e = [energy_at_rank(X, r) for r in range(9)]
    assert e[0] == 0.0 and all(a <= b + 1e-12 for a, b in zip(e, e[1:]))
    assert e[rank] == pytest.approx(1.0) and e[8] == pytest.approx(1.0)


@pytest.mark.parametrize("call", [lambda: energy_at_rank(np.zeros((3, 3)), 1), lambda: energy_at_rank(np.ones(3), 1),
                                  lambda: energy_at_rank(np.ones((2, 2)), -1),
                                  lambda: energy_at_rank(np.array([[np.nan, 1.0]]), 1)])
def test_energy_at_rank_bad_input(call):
    with pytest.raises(InputError):
        call()


# -- FD.residual -------------------------------------------------------------------------------------------

@given(st.integers(2, 60), st.integers(2, 10), st.integers(0, 10**6), st.sampled_from(["gauss", "lowrank"]))
def test_theorem_R_holds(n, ell, seed, kind):
    rng = np.random.default_rng(seed)
    d = 12
    A = rng.standard_normal((n, d)) if kind == "gauss" else rng.standard_normal((n, 3)) @ rng.standard_normal((3, d))
    fd = FrequentDirections(d, ell).update(A)
    S, delta = fd.sketch(), fd.certificate()
    for r in range(ell):
        P = top_right_projector(S, r)
        res = residual(A, P)
        tol = 1e-9 * (np.linalg.norm(A, 2) + 1)
        assert residual_lower_bound(A, r) <= res + tol
        assert res <= residual_certificate(S, delta, r) + tol
        assert residual_certificate(S, delta, r) <= residual_bound_tight(A, ell, r) + tol


def test_draft_residual_bound_fails_on_the_smallest_instance():
    c = draft_counterexample()
    A, ell, r = c["A"], c["ell"], c["r"]
    fd = FrequentDirections(2, ell).update(A)
    res = residual(A, top_right_projector(fd.sketch(), r))
    assert res == pytest.approx(1.0)
    assert davis_kahan_eta(A, ell, r) == pytest.approx(4 / 15)
    assert res > residual_bound(A, ell, r)                               # DK eta
    assert res > residual_bound(A, ell, r, eta=measured_eta(A, fd.sketch(), r))   # actual perturbation (0)
    assert res <= residual_bound_tight(A, ell, r) + 1e-12


@pytest.mark.parametrize("ell", [2, 4, 8])
def test_delta_term_is_needed(ell):
    A, info = residual_adversarial_stream(ell, noise=2.0)
    fd = FrequentDirections(info["d"], ell).update(A)
    S, delta = fd.sketch(), fd.certificate()
    res = residual(A, top_right_projector(S, 1))
    assert delta > 0 and res > residual_lower_bound(A, 1) * 1.1           # sigma_2(A) alone is not a bound
    assert res / residual_certificate(S, delta, 1) == pytest.approx(1.0, abs=1e-6)


def test_decode_time_model_terms():
    """decode_time_model: with only the streaming term it is cost_model's byte ratio; the exponentials (equal on
    both sides) pull the ratio towards 1; every term is the product its docstring states."""
    from kvbounds.theory.subspace import decode_time_model
    T, d, r, r_v, J = 16384, 64, 16, 16, 32
    m = cost_model(T, d, r, r_v, J=J, bytes_per_float=4)
    base = decode_time_model(T, d, r, r_v, J=J, s_per_byte_exact=1e-10, s_per_byte_ours=1e-10, s_per_exp=0.0,
                             s_per_pass=0.0)
    assert base["ratio"] == pytest.approx(m["bytes_ratio"], rel=1e-12)
    full = decode_time_model(T, d, r, r_v, J=J, s_per_byte_exact=1e-10, s_per_byte_ours=1e-10, s_per_exp=3e-9,
                             s_per_pass=4e-10, call_s_exact=2e-5, call_s_ours=3e-5)
    assert m["bytes_ratio"] < full["ratio"] < 1.0
    assert full["terms"]["ours"] == pytest.approx(dict(stream=m["ours_bytes"] * 1e-10, exp=T * 3e-9,
                                                       passes=3 * T * 4e-10, call=3e-5))
    assert full["exact_s"] == pytest.approx(m["baseline_bytes"] * 1e-10 + T * 3e-9 + 4 * T * 4e-10 + 2e-5)
