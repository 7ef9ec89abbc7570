"""Exact law of the self-balancing walk's signs on tiny inputs (BalanceKV-NeurIPS Alg. 3; claim SBW.balance).

Every sign sequence is enumerated with its exact probability, in Fractions, following Alg. 3 line by line:
with ``w = sum_{U+} u - sum_{U-} u`` over the vectors already placed,

    if |<w, u_i>| > c r^2: FAIL                  (lines 5-6; the branch stops)
    p_i = 1/2 - <w, u_i> / (2 c r^2)             (line 8)
    eps_i = +1 with probability p_i, else -1     (line 9)

Used by the tests as the reference for the sampled walk of ``kvbounds.algorithms.self_balancing_walk``.
The enumeration has up to 2^n leaves: keep n small (n <= 16).
"""
from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Iterator, Sequence

__all__ = ["Vector", "Branch", "sign_probability", "walk_branches", "exact_sign_distribution"]

Vector = Sequence[Fraction]


@dataclasses.dataclass(frozen=True)
class Branch:
    """One leaf of the walk's decision tree: the signs drawn, their probability, the p_i used at each
    step, and the step at which FAIL occurred (None if the walk finished; the signs then stop there)."""
    signs: tuple[int, ...]
    prob: Fraction
    ps: tuple[Fraction, ...]
    failed_at: int | None = None


def _dot(a: Vector, b: Vector) -> Fraction:
    return sum((x * y for x, y in zip(a, b)), Fraction(0))


def _validate(U: Sequence[Vector], c: Fraction, r: Fraction) -> tuple[list[list[Fraction]], Fraction, Fraction]:
    U = [[Fraction(x) for x in u] for u in U]
    c, r = Fraction(c), Fraction(r)
    if not U:
        raise ValueError("U is empty: at least one vector is needed")
    if len({len(u) for u in U}) != 1:
        raise ValueError(f"all vectors of U must have the same length, got lengths {sorted({len(u) for u in U})}")
    if len(U) > 20:
        raise ValueError(f"exact enumeration has 2^n leaves; n = {len(U)} is too large (n <= 20)")
    if c <= 0 or r <= 0:
        raise ValueError(f"c and r must be > 0, got c = {c}, r = {r}")
    big = max(_dot(u, u) for u in U)
    if big > r * r:    # Alg. 3 line 1: max_j ||u_j|| <= r (compared squared, exactly)
        raise ValueError(f"r = {r} is below the largest vector norm (||u||^2 = {big} > r^2 = {r * r})")
    return U, c, r


def sign_probability(inner: Fraction, c: Fraction, r: Fraction) -> Fraction:
    """p = 1/2 - <w, u_i> / (2 c r^2) (BalanceKV-NeurIPS Alg. 3 line 8)."""
    return Fraction(1, 2) - Fraction(inner) / (2 * Fraction(c) * Fraction(r) ** 2)


def walk_branches(U: Sequence[Vector], c: Fraction, r: Fraction) -> Iterator[Branch]:
    """All leaves of positive probability (finished walks and FAIL branches), depth first, +1 before -1."""
    U, c, r = _validate(U, c, r)
    thr = c * r * r
    d = len(U[0])

    def rec(i, w, signs, prob, ps):
        if i == len(U):
            yield Branch(tuple(signs), prob, tuple(ps))
            return
        x = _dot(w, U[i])
        if abs(x) > thr:
            yield Branch(tuple(signs), prob, tuple(ps), failed_at=i)
            return
        p = sign_probability(x, c, r)
        for eps, pe in ((1, p), (-1, 1 - p)):
            if pe > 0:
                yield from rec(i + 1, [a + eps * b for a, b in zip(w, U[i])], signs + [eps], prob * pe, ps + [p])

    yield from rec(0, [Fraction(0)] * d, [], Fraction(1), [])


def exact_sign_distribution(U: Sequence[Vector], c: Fraction, r: Fraction) -> tuple[dict[tuple[int, ...], Fraction], Fraction]:
    """(dist, fail_prob): dist maps each complete sign sequence of positive probability to its exact
    probability; fail_prob is the total probability of the FAIL event. sum(dist) + fail_prob == 1 exactly."""
    dist: dict[tuple[int, ...], Fraction] = {}
    fail = Fraction(0)
    for b in walk_branches(U, c, r):
        if b.failed_at is None:
            dist[b.signs] = b.prob
        else:
            fail += b.prob
    return dist, fail
