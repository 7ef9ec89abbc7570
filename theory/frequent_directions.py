"""Frequent Directions bounds (Subspace-FD-draft Sec. 8 "FD linkage"; claims FD.covariance, FD.residual).

Notation: A (n x d) the stream, S the FD sketch, Delta its total shrinkage (the certificate),
sigma_i(.) singular values in decreasing order (sigma_i = 0 beyond the rank), A_r the best rank-r
approximation, P the orthogonal projector onto the top-r right singular space of S, P_r that of A.

FD.covariance (GLPW16 Thm 1.1; Liberty 2013) [proven]: for every r < l,
    0 <= A^T A - S^T S <= Delta I   and   Delta <= ||A - A_r||_F^2 / (l - r) =: eps_r.

FD.residual, the draft's statement (Subspace-FD-draft Sec. 8) [stated]:
    ||A (I - P)||_op <= sqrt(eps_r) + eta,  eta "from Davis-Kahan in terms of eps and the spectral gap".
Read with the most generous eta the Davis-Kahan theorem allows, eta = ||A||_op min(1, 2 eps_r / gap_r),
gap_r = sigma_r(A)^2 - sigma_{r+1}(A)^2 (Yu, Wang, Samworth 2015, operator-norm form: ||sin Theta(P, P_r)||
<= 2 ||A^T A - S^T S|| / gap_r, and ||A (P_r - P)|| <= ||A|| ||sin Theta||). It is false: when the sketch is
exact (no shrink yet, Delta = 0) then P = P_r, ||A (I - P)|| = sigma_{r+1}(A), while eps_r can be far below
sigma_{r+1}(A)^2 (eps_r = sum_{i>r} sigma_i^2 / (l - r), small when the tail has fewer than l - r
directions). Smallest instance: A = diag(4, 1) (n = d = 2), l = 3, r = 1: ||A(I-P)|| = 1 while
sqrt(eps) + eta = sqrt(1/2) + 4/15 = 0.974. The error is the substitution of sqrt(eps) for the residual
sigma_{r+1}(A) of the true top-r space.

Theorem R (the tighter statement, proven here) [proven]:
    sigma_{r+1}(A)  <=  ||A (I - P)||_op  <=  sqrt(sigma_{r+1}(S)^2 + Delta)  <=  sqrt(sigma_{r+1}(A)^2 + eps_r).
The middle quantity is computable from the sketch alone (a certificate); no spectral gap is needed.

Proof. (lower) rank(A P) <= r, so ||A - A P|| >= sigma_{r+1}(A) (Eckart-Young-Mirsky).
(middle) I - P is an orthogonal projector, so ||A (I - P)||_op = max ||A x|| over unit x in range(I - P).
Such an x is orthogonal to the top-r right singular vectors of S, hence x^T S^T S x <= sigma_{r+1}(S)^2
(Courant-Fischer). From A^T A <= S^T S + Delta I: ||A x||^2 = x^T A^T A x <= sigma_{r+1}(S)^2 + Delta.
(right) S^T S <= A^T A gives sigma_{r+1}(S) <= sigma_{r+1}(A) (Weyl monotonicity), and Delta <= eps_r. QED.

Tightness. (i) With no shrink (Delta = 0) the lower and upper ends coincide: equality. (ii) The Delta term
cannot be dropped: :func:`residual_adversarial_stream` builds a stream where FD's shrinkage eats the top
direction e1 (sketch mass sigma_1^2 - Delta), a later direction e2 with sigma_2^2 just above that wins the
sketch's top-1 space, and ||A (I - P)|| = sigma_1(A) > sigma_2(A), with ratio to sqrt(sigma_2^2 + Delta) -> 1.
"""
from __future__ import annotations

import math

import numpy as np
from kvbounds.algorithms.frequent_directions import FrequentDirections

__all__ = ["singular_values", "covariance_bound_from_sv", "covariance_bound", "covariance_error", "top_right_projector",
           "residual", "davis_kahan_eta", "measured_eta", "residual_bound", "residual_bound_tight",
           "residual_certificate", "residual_lower_bound", "draft_counterexample", "residual_adversarial_stream"]


def singular_values(A) -> np.ndarray:
    A = np.asarray(A, dtype=float)
    return np.linalg.svd(A, compute_uv=False) if A.size else np.zeros(0)


def _sv(s, i: int) -> float:
    """sigma_i (1-indexed), 0 beyond the rank."""
    return float(s[i - 1]) if 1 <= i <= len(s) else 0.0


def covariance_bound_from_sv(s, ell: int, r: int | None = None) -> float:
    """||A - A_r||_F^2 / (l - r) from A's singular values; ``r=None``: the minimum over r = 0..l-1. [proven]"""
    s2 = np.asarray(s, float) ** 2
    tails = np.concatenate([np.cumsum(s2[::-1])[::-1], [0.0]])    # tails[r] = sum_{i>r} sigma_i^2
    def eps(r):
        if not 0 <= r < ell:
            raise ValueError(f"r must satisfy 0 <= r < l = {ell}, got {r}")
        return float(tails[min(r, len(s2))]) / (ell - r)
    return eps(r) if r is not None else min(eps(k) for k in range(ell))


def covariance_bound(A, ell: int, r: int | None = None) -> float:
    """FD.covariance: ||A^T A - S^T S||_op <= Delta <= ||A - A_r||_F^2 / (l - r) (GLPW16 Thm 1.1). [proven]"""
    return covariance_bound_from_sv(singular_values(A), ell, r)


def covariance_error(A, S) -> tuple[float, float]:
    """(||A^T A - S^T S||_op, smallest eigenvalue of A^T A - S^T S), in float64."""
    A, S = np.asarray(A, float), np.asarray(S, float)
    ev = np.linalg.eigvalsh(A.T @ A - S.T @ S)
    return float(np.abs(ev).max()), float(ev.min())


def top_right_projector(X, r: int) -> np.ndarray:
    """Orthogonal projector onto the top-r right singular space of X (d x d)."""
    X = np.asarray(X, float)
    d = X.shape[1]
    if r == 0:
        return np.zeros((d, d))
    Vt = np.linalg.svd(X, full_matrices=True)[2] if X.shape[0] else np.eye(d)
    return Vt[:r].T @ Vt[:r]


def residual(A, P) -> float:
    """||A (I - P)||_op."""
    A = np.asarray(A, float)
    return float(np.linalg.norm(A - A @ P, 2)) if A.size else 0.0


def davis_kahan_eta(A, ell: int, r: int, eps: float | None = None) -> float:
    """eta = ||A||_op min(1, 2 eps / (sigma_r^2 - sigma_{r+1}^2)): the largest perturbation term the Davis-Kahan
    theorem (Yu-Wang-Samworth form, ||A^T A - S^T S|| <= eps) allows; ||A|| if there is no gap."""
    s = singular_values(A)
    eps = covariance_bound_from_sv(s, ell, r) if eps is None else eps
    if r == 0:
        return 0.0
    gap = _sv(s, r) ** 2 - _sv(s, r + 1) ** 2
    sin = 1.0 if gap <= 0 else min(1.0, 2.0 * eps / gap)
    return _sv(s, 1) * sin


def measured_eta(A, S, r: int) -> float:
    """eta read as the actual perturbation: ||A||_op ||P - P_r||_op (sin of the largest principal angle)."""
    P, Pr = top_right_projector(S, r), top_right_projector(A, r)
    return float(np.linalg.norm(np.asarray(A, float), 2) * np.linalg.norm(P - Pr, 2)) if np.asarray(A).size else 0.0


def residual_bound(A, ell: int, r: int, eta: float | None = None) -> float:
    """FD.residual as the draft states it: sqrt(eps_r) + eta, eta defaulting to :func:`davis_kahan_eta`. [stated]"""
    eps = covariance_bound(A, ell, r)
    return math.sqrt(eps) + (davis_kahan_eta(A, ell, r, eps) if eta is None else eta)


def residual_bound_tight(A, ell: int, r: int) -> float:
    """Theorem R, a-priori form: sqrt(sigma_{r+1}(A)^2 + ||A - A_r||_F^2/(l - r)). [proven]"""
    s = singular_values(A)
    return math.sqrt(_sv(s, r + 1) ** 2 + covariance_bound_from_sv(s, ell, r))


def residual_certificate(S, delta: float, r: int) -> float:
    """Theorem R, certificate form (from the sketch alone): sqrt(sigma_{r+1}(S)^2 + Delta). [proven]"""
    return math.sqrt(_sv(singular_values(S), r + 1) ** 2 + delta)


def residual_lower_bound(A, r: int) -> float:
    """sigma_{r+1}(A) <= ||A (I - P)|| for every rank-r projector P (Eckart-Young-Mirsky)."""
    return _sv(singular_values(A), r + 1)


def draft_counterexample() -> dict:
    """The smallest instance found where the draft's FD.residual bound fails (see the module docstring)."""
    return dict(A=np.diag([4.0, 1.0]), ell=3, r=1)


def residual_adversarial_stream(ell: int, *, top: float = 10.0, noise: float = 1.0, rounds: int = 8,
                                margin: float = 1e-3) -> tuple[np.ndarray, dict]:
    """A stream (rows in order, d = 2 ell + 2) where the Delta term of Theorem R is needed (r = 1).

    Row top*e1 first; then ``rounds`` buffers of noise rows noise*e_j cycling over 2 ell other axes (each shrink
    subtracts its delta from e1's sketch mass); then one row b*e2 with b^2 = (sketch mass of e1) + margin, so
    the sketch's top-1 direction is e2 while A's is e1. Returns (A, info) with the predicted Delta."""
    d = 2 * ell + 2
    rows = [top * np.eye(d)[0]]
    noise_axes = np.arange(2, d)
    k = 0
    for _ in range(rounds * 2 * ell):
        rows.append(noise * np.eye(d)[noise_axes[k % len(noise_axes)]])
        k += 1
    fd = FrequentDirections(d, ell).update(np.array(rows))
    S = fd.sketch()
    e1_mass = float(np.sum((S @ np.eye(d)[0]) ** 2))
    rows.append(math.sqrt(e1_mass + margin) * np.eye(d)[1])
    return np.array(rows), dict(d=d, ell=ell, r=1, e1_sketch_mass=e1_mass, delta_before_e2=fd.certificate())
