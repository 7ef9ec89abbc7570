"""Where the walk's regime starts (SB.discrepancy, MR.error; issue 47): the eigen-directions of E[y y^T] that the
onset counts, derived by the Funk-Hecke formula (theory.balancekv.kernel_eigen_groups), checked against closed forms
and against the spectrum of a sampled Gram matrix, and the onset computed from them."""
import math

import numpy as np
import pytest
from scipy import special

from kvbounds.theory.balancekv import (harmonic_multiplicity, kernel_eigen_groups, kernel_feature_spectrum,
                                       merge_reduce_rate_onset, walk_constant, walk_saturation_steps)


def test_harmonic_multiplicities():
    """Spherical harmonics of degree l on S^(d-1): 2 on the circle, 2l + 1 on S^2, (l + 1)^2 on S^3."""
    assert [harmonic_multiplicity(2, l) for l in range(5)] == [1, 2, 2, 2, 2]
    assert [harmonic_multiplicity(3, l) for l in range(5)] == [1, 3, 5, 7, 9]
    assert [harmonic_multiplicity(4, l) for l in range(5)] == [1, 4, 9, 16, 25]
    # the harmonics of degree <= L are the polynomials of degree <= L restricted to the sphere:
    # C(L + d, d) - C(L - 2 + d, d) of them
    for d in (2, 3, 5, 8):
        for L in range(2, 6):
            assert sum(harmonic_multiplicity(d, l) for l in range(L + 1)) == math.comb(L + d, d) - math.comb(L - 2 + d, d)


@pytest.mark.parametrize("d,s,r", [(2, 1, 1.0), (4, 1, 1.0), (8, 4, 1.0), (3, 2, 2.0), (16, 1, 0.5)])
def test_eigenvalues_sum_to_the_trace(d, s, r):
    """sum of the eigenvalues with multiplicity = E||y||^2 = e^(r^2/sqrt d) E||v||^2 = e^(r^2/sqrt d)."""
    groups = kernel_eigen_groups(d, s, r)
    assert sum(lam * m for _, lam, m in groups) == pytest.approx(math.exp(r * r / math.sqrt(d)), rel=1e-12)
    lams = [lam for _, lam, _ in groups]
    assert all(a > b for a, b in zip(lams, lams[1:]))          # decreasing in the degree
    assert [m for _, _, m in groups[:3]] == [s * harmonic_multiplicity(d, l) for l in range(3)]


def test_closed_forms():
    """d = 2: I_l(a) (the Jacobi-Anger expansion of e^(a cos theta)); d = 3: the modified spherical Bessel i_l(a);
    d = 4: 4 I_(l+1)(a) / a... all at a = r^2 / sqrt d, divided by s."""
    a2 = 1 / math.sqrt(2)
    assert [lam for _, lam, _ in kernel_eigen_groups(2, 1, 1.0)[:4]] == pytest.approx([special.iv(l, a2) for l in range(4)])
    a3 = 4 / math.sqrt(3)
    assert [lam for _, lam, _ in kernel_eigen_groups(3, 2, 2.0)[:4]] == pytest.approx(
        [special.spherical_in(l, a3) / 2 for l in range(4)])
    assert kernel_eigen_groups(4, 1, 1.0)[1][1] == pytest.approx(4 * special.iv(2, 0.5), rel=1e-14)   # 0.1276
    assert kernel_eigen_groups(5, 1, 0.0) == ((0, 1.0, 1),)                                           # constant kernel


@pytest.mark.parametrize("d,s", [(2, 1), (4, 1), (8, 4)])
def test_spectrum_agrees_with_a_sampled_gram(d, s):
    """The Gram matrix exp(<k_i, k_j>/sqrt d) <v_i, v_j> / m of m sampled pairs has the non-zero eigenvalues of
    the sample's E[y y^T]; its leading eigenvalues estimate the exact ones, each within a sampling error of a few
    lam sqrt(2/m) (the spread of a sample eigenvalue of a covariance, Anderson 1963) plus the mixing of a
    degenerate group with its neighbours; measured here over 4 samples of m = 1500: within 5 standard errors."""
    exact = np.array(kernel_feature_spectrum(d, s, 1.0))
    m = 1500
    est = []
    for seed in range(4):
        rng = np.random.default_rng(seed)
        K = rng.standard_normal((m, d))
        K /= np.linalg.norm(K, axis=1, keepdims=True)
        V = rng.standard_normal((m, s)) / math.sqrt(s)
        est.append(np.linalg.eigvalsh(np.exp(K @ K.T / math.sqrt(d)) * (V @ V.T) / m)[::-1])
    top = 1 + harmonic_multiplicity(d, 1) * s if s == 1 else s        # the leading group(s)
    mean = np.mean(est, axis=0)[:top]
    se = exact[:top] * math.sqrt(2 / m) / math.sqrt(len(est))
    # a degenerate group's sample eigenvalues spread around its value: compare group means
    assert abs(mean.sum() - exact[:top].sum()) <= 5 * math.sqrt((se ** 2).sum()) + 0.02 * exact[:top].sum()
    assert np.sum(est, axis=1).mean() == pytest.approx(exact.sum(), rel=0.05)    # the trace, E||y||^2


def test_onset_counts_the_directions_holding_ninety_percent():
    """d = 4, s = 1, r = 1: degree 0 holds 62.6% of E||y||^2, with the four of degree 1 93.5%: 5 directions,
    the fifth's eigenvalue 4 I_2(1/2); t* is the fixed point of t = c(t) R^2(t) / (2 lam)."""
    on = merge_reduce_rate_onset(4, 1, 1.0, 0.01)
    assert on["directions"] == 5 and on["eigenvalue"] == pytest.approx(4 * special.iv(2, 0.5), rel=1e-12)
    assert on["t_star"] == pytest.approx(walk_saturation_steps(on["eigenvalue"], walk_constant(int(on["t_star"]), 0.01),
                                                               on["R2"]), rel=1e-3)
    assert 5e4 < on["t_star"] < 6e4 and on["t_top_direction"] < on["t_star"] / 5
    groups = kernel_eigen_groups(4, 1, 1.0)
    total = sum(lam * m for _, lam, m in groups)
    assert groups[0][1] / total == pytest.approx(0.626, abs=1e-3)
    assert (groups[0][1] + 4 * groups[1][1]) / total == pytest.approx(0.935, abs=1e-3)
    # d = 2: degree 0 (55.7%) and the two of degree 1 (92.8%): 3 directions; d = 8, s = 4: 4 of degree 0 (70.8%)
    # and 25 of the 128 of degree 1
    assert merge_reduce_rate_onset(2, 1, 1.0, 0.01)["directions"] == 3
    assert merge_reduce_rate_onset(8, 4, 1.0, 0.01)["directions"] == 29
    # the onset grows with d (smaller eigenvalues to saturate) and is monotone in the share
    assert merge_reduce_rate_onset(2, 1, 1.0, 0.01)["t_star"] < merge_reduce_rate_onset(4, 1, 1.0, 0.01)["t_star"] \
        < merge_reduce_rate_onset(8, 4, 1.0, 0.01)["t_star"]
    assert merge_reduce_rate_onset(4, 1, 1.0, 0.01, share=0.5)["t_star"] == pytest.approx(
        merge_reduce_rate_onset(4, 1, 1.0, 0.01)["t_top_direction"], rel=0.05)


def test_mean_field_curve_bends_at_the_onset():
    """The mean-field D/shape: random-walk growth well below the onset (sqrt(n) over log n and max||v||: slope
    ~0.3 at n ~ 1e3), flat past it (|slope| < 0.06 on n*/2..2n*), and -1/(2 ln(n/delta)) far past it (sqrt(c) over
    log(n/delta): every direction holding mass saturated)."""
    from kvbounds.theory.balancekv import mean_field_slope, rate_onset
    for d in (2, 4):
        on = rate_onset(d, 1, 1.0, 0.01)
        assert 0.25 < mean_field_slope(256, 2048, d, 1, 1.0, 0.01) < 0.45
        assert abs(mean_field_slope(on / 2, 2 * on, d, 1, 1.0, 0.01)) < 0.06
        far = mean_field_slope(1e9, 1e10, d, 1, 1.0, 0.01)
        assert far == pytest.approx(-1 / (2 * math.log(3e9 / 0.01)), abs=0.01)
