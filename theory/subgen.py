"""Bounds of the SubGen/ClusterGen family (SubGen, ClusterGen) as functions of their parameters.

Paper convention: exp(<q, k>) without 1/sqrt(d). Constants: every Omega(.) in Thm 1 / Thm 2.4 is returned
as its shape times a constant ``C``; the functions suffixed ``_proven`` give a constant that a textbook
inequality makes sufficient (labelled proven), the checks fit the rest.

* SG.reservoir  - :func:`reservoir_probability` (SubGen Lemma 1 / ClusterGen Lemma 2.2), and the exact law of the
  reservoir propagated through the pseudocode with rationals (:func:`exact_reservoir_distribution`).
* SG.clusters   - :func:`cluster_count_bound` (m' <= m, SubGen Lemma 2 / ClusterGen Lemma 2.3 and the pigeonhole
  argument of Thm 1's memory part), :func:`exact_cluster_slot_distribution` (invariant (5)).
* SG.partition  - :func:`partition_bound`, :func:`partition_t`, :func:`partition_t_proven`.
* SG.matprod    - :func:`matprod_bound`, :func:`matprod_s`, :func:`matprod_s_proven`,
  :func:`matprod_error_second_moment` (the exact E||z - a^T V||^2 of l2 sampling).
* SG.attention  - :func:`attention_bound`, :func:`combination_factor` (the proof's step (5)+(6) => (4)),
  :func:`memory_shape`.
* SG.clusterability - :func:`kcenter_radius` (greedy k-center radius and Gonzalez's 2-approximation).
"""
from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Sequence

import numpy as np
from kvbounds.algorithms.kcenter import covering_radius_curve

__all__ = ["PARTITION_FAIL", "MATPROD_FAIL", "ATTENTION_FAIL", "reservoir_probability", "exact_reservoir_distribution",
           "cluster_count_bound", "exact_cluster_slot_distribution", "partition_bound", "partition_t_shape",
           "partition_t", "partition_t_proven", "matprod_bound", "matprod_s", "matprod_s_proven",
           "matprod_error_second_moment", "attention_bound", "combination_factor", "memory_shape", "kcenter_radius"]

PARTITION_FAIL = 0.005     # Thm 1 eq. (5)
MATPROD_FAIL = 0.005       # Thm 1 eq. (6)
ATTENTION_FAIL = 0.01      # Thm 1: "with probability at least 0.99"


# ------------------------------------------------------------------------------------ SG.reservoir

def reservoir_probability(weights: Sequence, i: int | None = None):
    """Pr[M(j) = (k_i, v_i)] = w_i / sum_l w_l with w = ||v||^2 (SubGen Lemma 1, ClusterGen Lemma 2.2).

    ``weights`` the squared norms (Fractions stay exact). Returns the whole vector, or entry ``i``."""
    total = sum(weights)
    if total == 0:
        raise ValueError("all weights are 0: the distribution is undefined")
    probs = [w / total for w in weights]
    return probs if i is None else probs[i]


def exact_reservoir_distribution(weights: Sequence[Fraction], s: int) -> dict[tuple[int, ...], Fraction]:
    """The joint law of M's s slots (stream indices) after the whole stream, propagated through the
    pseudocode with exact rationals: SubGen Alg. 1 lines 5-6 and 24-28 (slot i <- token j with probability
    w_j / (mu + w_j), mu the sum of the earlier weights; p = 1 while mu + w_j = 0, as in
    :class:`kvbounds.algorithms.subgen.SubGen`). Each slot's coin is independent, so the propagation is per
    slot and the joint law is assembled as the product; the check compares the assembled law with an
    enumeration of the implementation's coins."""
    slot: dict[int, Fraction] = {}
    mu = Fraction(0)
    for j, w in enumerate(weights):
        w = Fraction(w)
        p = w / (mu + w) if mu + w > 0 else Fraction(1)
        slot = {i: pr * (1 - p) for i, pr in slot.items()}
        slot[j] = slot.get(j, Fraction(0)) + p
        slot = {i: pr for i, pr in slot.items() if pr}
        mu += w
    out: dict[tuple[int, ...], Fraction] = {}
    for combo in itertools.product(slot.items(), repeat=s):
        out[tuple(i for i, _ in combo)] = math.prod((pr for _, pr in combo), start=Fraction(1))
    return out


# ------------------------------------------------------------------------------------ SG.clusters

def cluster_count_bound(m: int) -> int:
    """m' <= m when the keys are (m, delta)-clusterable (SubGen Thm 1 memory part, via Lemma 2 (1), (4)). [exact]"""
    return int(m)


def exact_cluster_slot_distribution(n_i: int) -> list[Fraction]:
    """Law of one slot of S_i after n_i members joined, propagated through lines 16-17 (replace with
    probability 1/n_i'): invariant (5) says it is uniform, 1/n_i each."""
    law = [Fraction(1)]
    for c in range(2, n_i + 1):
        p = Fraction(1, c)
        law = [x * (1 - p) for x in law] + [p]
    return law


# ------------------------------------------------------------------------------------ SG.partition

def partition_bound(eps: float) -> float:
    """|tau / Z - 1| <= eps / 3 with Z = sum_j exp(<k_j, q>) (Thm 1 eq. (5)); returns eps / 3."""
    return eps / 3.0


def partition_t_shape(eps: float, delta: float, r: float, n: int) -> float:
    """eps^-2 e^{2 delta r} log n (Thm 1's condition on t, constant 1)."""
    return math.exp(2 * delta * r) * math.log(max(n, 2)) / eps**2


def partition_t(eps: float, delta: float, r: float, n: int, C: float = 1.0) -> int:
    """t = ceil(C eps^-2 e^{2 delta r} log n)."""
    return max(1, math.ceil(C * partition_t_shape(eps, delta, r, n)))


def partition_t_proven(eps: float, delta: float, r: float, m: int, fail: float = PARTITION_FAIL) -> int:
    """A t that the proof's argument makes sufficient, with explicit constants. [proven]

    Within a cluster every term exp(<k, q>) lies in [L, L e^{2 delta r}] (Lemma 2 (3) + triangle
    inequality), so with R = e^{2 delta r} a cluster's mean mu and largest term b satisfy mu / b >= 1/R; the
    multiplicative Chernoff bound for t i.i.d. samples in [0, b] gives
    Pr[|mean - mu| > (eps/3) mu] <= 2 exp(-t (eps/3)^2 / (3R)); a union bound over the m' <= m clusters
    then needs t >= 27 R log(2 m / fail) / eps^2 (eps <= 3)."""
    return math.ceil(27.0 * math.exp(2 * delta * r) * math.log(2 * m / fail) / eps**2)


# ------------------------------------------------------------------------------------ SG.matprod

def matprod_bound(eps: float, a_norm: float, v_op: float) -> float:
    """(eps/3) ||exp(K q)||_2 ||V||_op (Thm 1 eq. (6))."""
    return eps / 3.0 * a_norm * v_op


def matprod_s(eps: float, d: int, C: float = 1.0) -> int:
    """s = ceil(C eps^-2 d) (Thm 1's condition on s)."""
    return max(1, math.ceil(C * d / eps**2))


def matprod_s_proven(eps: float, stable_rank: float, fail: float = MATPROD_FAIL) -> int:
    """A sufficient s with explicit constants. [proven]

    l2 sampling (p_i = ||v_i||^2 / ||V||_F^2, weights 1/(s p_i)) has E||z - a^T V||^2 <= ||a||^2 ||V||_F^2 / s
    (Drineas-Kannan), and ||V||_F^2 = sr ||V||_op^2 with sr <= d the stable rank; Markov's inequality
    gives Pr[||z - a^T V|| > (eps/3) ||a|| ||V||_op] <= 9 sr / (s eps^2), so s >= 9 sr / (fail eps^2)."""
    return math.ceil(9.0 * stable_rank / (fail * eps**2))


def matprod_error_second_moment(a: np.ndarray, V: np.ndarray, probs: np.ndarray, s: int) -> float:
    """E||z - a^T V||^2 = (sum_i a_i^2 ||v_i||^2 / p_i - ||a^T V||^2) / s for s i.i.d. samples from
    ``probs`` with weights 1/(s p_i) (identity; the terms with p_i = 0 must have a_i v_i = 0)."""
    a, V, probs = np.asarray(a, float), np.asarray(V, float), np.asarray(probs, float)
    pos = probs > 0
    first = float(np.sum(a[pos] ** 2 * np.sum(V[pos] ** 2, axis=1) / probs[pos]))
    return (first - float(np.sum((a @ V) ** 2))) / s


# ------------------------------------------------------------------------------------ SG.attention

def attention_bound(eps: float, softmax_norm: float, v_op: float) -> float:
    """eps ||softmax(K q)||_2 ||V||_op (SubGen eq. (4), Thm 1)."""
    return eps * softmax_norm * v_op


def combination_factor(eps: float) -> float:
    """The worst ||z/tau - Attn|| / (eps ||softmax|| ||V||_op) over all z, tau meeting (5) and (6).

    (5) and (6) give ||z/tau - a^T V / Z|| <= (2 eps/3) / (1 - eps/3) ||a|| ||V||_op / Z, attained by a
    1-token stream with z = (1 + eps/3) a v, tau = (1 - eps/3) Z; divided by eps this is
    (2/3) / (1 - eps/3): <= 1 exactly when eps <= 1 (and undefined for eps >= 3, where tau may be 0)."""
    if eps >= 3:
        return math.inf
    return (2.0 / 3.0) / (1.0 - eps / 3.0)


def memory_shape(d: int, m: int, t: int, s: int) -> float:
    """d (m t + s): Thm 1's memory and per-step time shape."""
    return float(d * (m * t + s))


# ------------------------------------------------------------------------------------ SG.clusterability

def kcenter_radius(X, k: int) -> dict:
    """Greedy k-center on the rows of X (n, d): its covering radius r_k and the interval
    [r_k / 2, r_k] that contains the optimal k-center radius (Gonzalez's 2-approximation)."""
    r = float(covering_radius_curve(X, k)[-1])
    return {"radius": r, "opt_lower": r / 2.0, "opt_upper": r}
